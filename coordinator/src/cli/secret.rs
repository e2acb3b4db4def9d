//! `occ secret`: secrets of a Namespace. A value is read from a file or standard input, never
//! from the command line (where `ps` and shell history would show it), and never printed.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use coordinator::client::{Client, percent_encode};
use coordinator::service::NewSecret;
use zeroize::Zeroizing;

use super::Cli;
use super::out::say;
use super::table::print;

/// Where a value comes from: exactly one of a file or standard input.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub(crate) struct ValueSource {
    /// Read the value from this file (one trailing newline is dropped).
    #[arg(long, value_name = "FILE")]
    from_file: Option<PathBuf>,
    /// Read the value from standard input (one trailing newline is dropped).
    #[arg(long)]
    from_stdin: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum SecretCmd {
    /// Write a new version of a secret; Agents bind it at their next deploy.
    Set {
        namespace: String,
        name: String,
        #[command(flatten)]
        source: ValueSource,
    },
    /// Write a new version and deploy it: a new revision, bound to it, for every Agent whose
    /// current revision binds an older version (through the ordinary deploy path).
    Rotate {
        namespace: String,
        name: String,
        #[command(flatten)]
        source: ValueSource,
    },
    /// List a Namespace's secrets: versions, fingerprints, writers, users (never values).
    List { namespace: String },
    /// Show one secret: every version and which Agents' revisions use which (never a value).
    Get { namespace: String, name: String },
    /// Delete every version of a secret (refused while Agents' current revisions bind it).
    Delete { namespace: String, name: String },
}

const LIST_COLUMNS: &[(&str, &str)] = &[
    ("SECRET", "name"),
    ("VERSION", "version"),
    ("FINGERPRINT", "fingerprint"),
    ("WRITTEN BY", "writtenBy"),
    ("WRITTEN AT", "writtenAt"),
];

const VERSION_COLUMNS: &[(&str, &str)] = &[
    ("SECRET", "name"),
    ("VERSION", "version"),
    ("FINGERPRINT", "fingerprint"),
    ("WRITTEN BY", "writtenBy"),
    ("WRITTEN AT", "writtenAt"),
];

const DEPLOY_COLUMNS: &[(&str, &str)] = &[
    ("AGENT", "agentId"),
    ("REVISION", "revisionId"),
    ("WORK", "workId"),
    ("CODE", "code"),
    ("MESSAGE", "message"),
];

const USE_COLUMNS: &[(&str, &str)] = &[
    ("AGENT", "agentId"),
    ("REVISION", "revisionId"),
    ("VERSION", "version"),
    ("ACTIVE", "active"),
    ("NEWEST", "newest"),
];

/// The value, without one trailing newline (as OpenClaw reads a single-value file).
fn read_value(source: &ValueSource) -> Result<Zeroizing<String>> {
    let mut raw = Zeroizing::new(Vec::new());
    match (&source.from_file, source.from_stdin) {
        (Some(path), false) => {
            std::fs::File::open(path)
                .and_then(|mut f| f.read_to_end(&mut raw))
                .with_context(|| format!("--from-file {}", path.display()))?;
        }
        (None, true) => {
            std::io::stdin()
                .read_to_end(&mut raw)
                .context("--from-stdin")?;
        }
        _ => bail!("give exactly one of --from-file FILE or --from-stdin"),
    }
    let value = clawfleet_protocol::secret::strip_one_newline(&raw);
    let text = std::str::from_utf8(value)
        .map_err(|e| anyhow::anyhow!("the value is not UTF-8 (at byte {})", e.valid_up_to()))?;
    Ok(Zeroizing::new(text.to_owned()))
}

fn set(c: &Client, namespace: &str, name: &str, source: &ValueSource) -> Result<serde_json::Value> {
    let value = read_value(source)?;
    let body = NewSecret {
        name: name.to_owned(),
        value: String::from(value.as_str()),
    };
    let answer = c.send(
        "POST",
        &format!("/namespaces/{}/secrets", percent_encode(namespace)),
        &body,
    );
    // The request's copy of the value goes now, not when the allocator reuses it.
    let mut body = body;
    zeroize::Zeroize::zeroize(&mut body.value);
    Ok(answer?)
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &SecretCmd) -> Result<()> {
    match cmd {
        SecretCmd::Set {
            namespace,
            name,
            source,
        } => {
            let v = set(c, namespace, name, source)?;
            print(cli, &v, VERSION_COLUMNS);
        }
        SecretCmd::Rotate {
            namespace,
            name,
            source,
        } => {
            let v = set(c, namespace, name, source)?;
            let json_out = cli.output == super::Output::Json;
            if !json_out {
                say(&format!(
                    "secret {name} version {} ({})",
                    v["version"],
                    v["fingerprint"].as_str().unwrap_or("-")
                ));
            }
            let started = c.request(
                "POST",
                &format!(
                    "/namespaces/{}/secrets/{}/deploy",
                    percent_encode(namespace),
                    percent_encode(name)
                ),
                None,
            )?;
            if json_out {
                // One document: the version written and what was started for it.
                print(
                    cli,
                    &serde_json::json!({"secret": v, "deploys": started}),
                    &[],
                );
            } else {
                print(cli, &started, DEPLOY_COLUMNS);
            }
        }
        SecretCmd::List { namespace } => {
            let v = c.request(
                "GET",
                &format!("/namespaces/{}/secrets", percent_encode(namespace)),
                None,
            )?;
            print(cli, &v, LIST_COLUMNS);
        }
        SecretCmd::Get { namespace, name } => {
            let v = c.request(
                "GET",
                &format!(
                    "/namespaces/{}/secrets/{}",
                    percent_encode(namespace),
                    percent_encode(name)
                ),
                None,
            )?;
            if cli.output == super::Output::Json {
                print(cli, &v, &[]);
            } else {
                print(cli, &v["versions"], VERSION_COLUMNS);
                print(cli, &v["usedBy"], USE_COLUMNS);
            }
        }
        SecretCmd::Delete { namespace, name } => {
            c.request(
                "DELETE",
                &format!(
                    "/namespaces/{}/secrets/{}",
                    percent_encode(namespace),
                    percent_encode(name)
                ),
                None,
            )?;
            say(&format!("secret {name} deleted"));
        }
    }
    Ok(())
}
