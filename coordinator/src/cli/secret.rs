//! `occ secret`: secrets of a Namespace. A value is read from a file or standard input, never
//! from the command line (where `ps` and shell history would show it), and never printed.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use clawfleet_api::types::{NewSecret, NewSecretRollout, SecretInfo, SecretUse, SecretVersion};
use coordinator::client::{Api, Client, ClientError};
use coordinator::codes::Code;
use zeroize::Zeroizing;

use super::Cli;
use super::out::{note, say};
use super::table::{Column, col, print_fields, print_one, print_rows, table};

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
    /// Write a new version and roll it out to every running Agent whose current revision binds
    /// an older one: canary first, then waves of at most --max-parallel, halting once more
    /// than --max-failures Agents failed. On a host the gateway reloads without a restart;
    /// a value it refuses fails that Agent, which keeps serving its last good value.
    Rotate {
        namespace: String,
        name: String,
        #[command(flatten)]
        source: ValueSource,
        #[command(flatten)]
        rollout: RolloutArgs,
    },
    /// List a Namespace's secrets: versions, fingerprints, writers, users (never values).
    List { namespace: String },
    /// Show one secret: every version and which Agents' revisions use which (never a value).
    Get { namespace: String, name: String },
    /// Delete every version of a secret (refused while Agents' current revisions bind it).
    Delete { namespace: String, name: String },
}

/// How `rotate` rolls the new version out (as `occ rollout create`).
#[derive(Args, Debug)]
pub(crate) struct RolloutArgs {
    #[command(flatten)]
    waves: super::rollout::Waves,
    /// Follow the rollout until it is done, halted or aborted (exit 0 only when it is done
    /// and none of its Agents failed).
    #[arg(long)]
    wait: bool,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
}

const LIST_COLUMNS: &[Column<SecretInfo>] = &[
    col("SECRET", |s| s.name.clone()),
    col("VERSION", |s| s.version.to_string()),
    col("FINGERPRINT", |s| s.fingerprint.clone()),
    col("WRITTEN BY", |s| s.written_by.clone()),
    col("WRITTEN AT", |s| s.written_at.to_string()),
];

const VERSION_COLUMNS: &[Column<SecretVersion>] = &[
    col("SECRET", |s| s.name.to_string()),
    col("VERSION", |s| s.version.to_string()),
    col("FINGERPRINT", |s| s.fingerprint.to_string()),
    col("WRITTEN BY", |s| s.written_by.clone()),
    col("WRITTEN AT", |s| s.written_at.to_string()),
];

const USE_COLUMNS: &[Column<SecretUse>] = &[
    col("AGENT", |u| u.agent_id.clone()),
    col("REVISION", |u| u.revision_id.clone()),
    col("VERSION", |u| u.version.to_string()),
    col("ACTIVE", |u| u.active.to_string()),
    col("NEWEST", |u| u.newest.to_string()),
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

fn set(c: &Client, namespace: &str, name: &str, source: &ValueSource) -> Result<SecretVersion> {
    let value = read_value(source)?;
    let body = NewSecret {
        name: name.to_owned(),
        value: String::from(value.as_str()),
    };
    let answer = c.set_secret([namespace], &body);
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
            print_one(cli, &v, VERSION_COLUMNS);
        }
        SecretCmd::Rotate {
            namespace,
            name,
            source,
            rollout,
        } => {
            let v = set(c, namespace, name, source)?;
            let json_out = cli.output == super::Output::Json;
            if !json_out {
                say(&format!(
                    "secret {name} version {} ({})",
                    v.version, v.fingerprint
                ));
            }
            let body = NewSecretRollout {
                canary: Some(rollout.waves.canary),
                max_parallel: Some(rollout.waves.max_parallel),
                max_failures: Some(rollout.waves.max_failures),
                pause_between_seconds: rollout.waves.pause_between,
                manual_promote: rollout.waves.manual_promote,
            };
            let created = c.roll_out_secret([namespace, name], &body);
            let r = match created {
                Ok(r) => r,
                // The version is written; no running Agent binds an older one.
                Err(ClientError::Api { code, message, .. })
                    if code == Code::RolloutEmpty.as_str() =>
                {
                    if json_out {
                        print_fields(cli, &serde_json::json!({"secret": v, "rollout": null}));
                    } else {
                        say(&format!("nothing to roll out: {message}"));
                    }
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            };
            let id = r.id;
            let (last, failure) = if rollout.wait {
                note(&format!("rollout {id} created"));
                super::rollout::wait(c, namespace, id, rollout.timeout)?
            } else {
                (r, None)
            };
            if json_out {
                // One document: the version written and its rollout.
                print_fields(cli, &serde_json::json!({"secret": v, "rollout": last}));
            } else {
                super::rollout::show(cli, &last);
            }
            if let Some(e) = failure {
                return Err(e);
            }
        }
        SecretCmd::List { namespace } => {
            print_rows(cli, &c.list_secrets([namespace])?, LIST_COLUMNS);
        }
        SecretCmd::Get { namespace, name } => {
            let v = c.get_secret([namespace, name])?;
            if cli.output == super::Output::Json {
                print_fields(cli, &v);
            } else {
                table(&v.versions, VERSION_COLUMNS);
                table(&v.used_by, USE_COLUMNS);
            }
        }
        SecretCmd::Delete { namespace, name } => {
            c.delete_secret([namespace, name])?;
            say(&format!("secret {name} deleted"));
        }
    }
    Ok(())
}
