//! `occ`'s command line: one module per resource over the typed API client
//! (`coordinator::client::Api` on `coordinator::client::Client`: one method per route of the
//! route table, sending the API's request types and answering its response types), so no
//! command writes a method, a path or a JSON field name of its own. `main.rs` only calls
//! [`main`].

mod agent;
mod cluster;
mod configuration;
mod db;
mod host;
mod namespace;
mod out;
mod rollout;
mod runtime;
mod secret;
mod setup;
mod table;
mod token;
mod wait;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use clawfleet_api::types::{AuditEvent, AuditQuery, DriftQuery, DriftRow};
use coordinator::client::{Api, Client};
use coordinator::config::{Config, DEFAULT_CONFIG_PATH};
use serde_json::Value;
use table::{Column, col, opt, raw_cell};

const DRIFT_COLUMNS: &[Column<DriftRow>] = &[
    col("TARGET", |r| r.target.clone()),
    col("NAMESPACE", |r| r.namespace_id.clone()),
    col("AGENT", |r| r.agent_id.clone()),
    col("STATE", |r| r.state.as_str().to_owned()),
    col("REASON", |r| opt(&r.reason.map(|x| x.as_str()))),
    col("MESSAGE", |r| r.message.clone()),
];

const AUDIT_COLUMNS: &[Column<AuditEvent>] = &[
    col("ID", |e| e.id.to_string()),
    col("AT", |e| e.at.to_string()),
    col("ACTOR", |e| e.actor.clone()),
    col("ACTION", |e| e.action.clone()),
    col("TARGET", |e| e.target.clone()),
    col("DETAIL", |e| raw_cell(&e.detail)),
];

#[derive(Parser, Debug)]
#[command(name = "occ", version, about = "clawfleet coordinator")]
pub(crate) struct Cli {
    /// Configuration file (default /etc/clawfleet/occ.toml, or OCC_CONFIG_PATH).
    #[arg(long, global = true)]
    pub(crate) config: Option<PathBuf>,
    /// Coordinator URL for client commands (default: from the configuration's listen).
    #[arg(long, global = true)]
    pub(crate) server: Option<String>,
    /// API token for client commands (default: OCC_TOKEN, then the file --token-file names).
    #[arg(long, global = true)]
    pub(crate) token: Option<String>,
    /// File holding the API token for client commands (default: OCC_TOKEN_FILE).
    #[arg(long, global = true)]
    pub(crate) token_file: Option<PathBuf>,
    /// Output format of client commands.
    #[arg(long, global = true, value_enum, default_value = "table")]
    pub(crate) output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the state directory, the SSH login and signing keys and the database
    /// (idempotent), and the first admin token when the database has none: printed once when
    /// stdout is a terminal, or handed as --admin-token-file says; never kept by occ.
    Init {
        /// Write the new admin token to this new file (0600; never replaced; not in the state
        /// directory), or `-`: print it alone on stdout.
        #[arg(long)]
        admin_token_file: Option<PathBuf>,
        /// Create an admin token although the database has tokens already (needs access to
        /// the database itself, as occ init does; e.g. every admin token was lost).
        #[arg(long)]
        new_admin_token: bool,
    },
    /// Run the API and the deployment worker.
    Serve,
    /// Print the `hostd enrol` command that authorises this coordinator on a host.
    #[command(name = "enrol-command")]
    PrintEnrol {
        /// For a host that forbids root login: the user hostd sets up to log in as (enrol the
        /// host with the same `occ host enrol --login-user`).
        #[arg(long)]
        login_user: Option<String>,
    },
    /// Namespaces.
    #[command(subcommand)]
    Namespace(namespace::NamespaceCmd),
    /// Configurations (native openclaw.json documents).
    #[command(subcommand)]
    Configuration(configuration::ConfigurationCmd),
    /// Agents.
    #[command(subcommand)]
    Agent(agent::AgentCmd),
    /// Secrets of a Namespace: write-only values that configurations refer to.
    #[command(subcommand)]
    Secret(secret::SecretCmd),
    /// Rollouts: one Configuration to many Agents, canary first, then waves.
    #[command(subcommand)]
    Rollout(rollout::RolloutCmd),
    /// Hosts.
    #[command(subcommand)]
    Host(host::HostCmd),
    /// Kubernetes clusters.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// API tokens.
    #[command(subcommand)]
    Token(token::TokenCmd),
    /// The drift sweep's findings per Agent (it never repairs; see `occ agent reconcile`).
    Drift {
        /// Run a sweep now instead of showing the last one.
        #[arg(long)]
        now: bool,
        /// Only rows of this state: synced, drift, unreachable, converging.
        #[arg(long)]
        state: Option<String>,
    },
    /// The database: copy the embedded SQLite database into PostgreSQL.
    #[command(subcommand)]
    Db(db::DbCmd),
    /// The newest audit events: who changed or read what (global admin).
    Audit {
        /// Most events, newest first (1 to 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only events of this action (e.g. agent.logs.read).
        #[arg(long)]
        action: Option<String>,
    },
}

pub(crate) fn load_config(cli: &Cli) -> Result<Config> {
    let (path, explicit) = match (&cli.config, std::env::var_os("OCC_CONFIG_PATH")) {
        (Some(p), _) => (p.clone(), true),
        (None, Some(p)) => (PathBuf::from(p), true),
        (None, None) => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
    };
    Ok(Config::load(&path, explicit)?)
}

pub(crate) fn client(cli: &Cli) -> Result<Client> {
    let config = load_config(cli)?;
    let server = cli
        .server
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.listen));
    let token = match (&cli.token, std::env::var("OCC_TOKEN")) {
        (Some(t), _) => Some(t.clone()),
        (None, Ok(t)) => Some(t),
        (None, Err(_)) => match cli
            .token_file
            .clone()
            .or_else(|| std::env::var_os("OCC_TOKEN_FILE").map(PathBuf::from))
        {
            Some(path) => Some(
                std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read the token file {}", path.display()))?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        },
    };
    Ok(Client::new(&server, token)?)
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

fn run_client(cli: &Cli) -> Result<()> {
    let c = client(cli)?;
    match &cli.command {
        Command::Namespace(cmd) => namespace::run(cli, &c, cmd),
        Command::Configuration(cmd) => configuration::run(cli, &c, cmd),
        Command::Agent(cmd) => agent::run(cli, &c, cmd),
        Command::Rollout(cmd) => rollout::run(cli, &c, cmd),
        Command::Host(cmd) => host::run(cli, &c, cmd),
        Command::Cluster(cmd) => cluster::run(cli, &c, cmd),
        Command::Token(cmd) => token::run(cli, &c, cmd),
        Command::Secret(cmd) => secret::run(cli, &c, cmd),
        Command::Drift { now, state } => {
            let rows = if *now {
                let mut all = c.sweep_now([])?;
                if let Some(s) = state {
                    all.retain(|r| r.state.as_str() == s.as_str());
                }
                all
            } else {
                c.drift(
                    [],
                    &DriftQuery {
                        state: state.clone(),
                    },
                )?
            };
            table::print_rows(cli, &rows, DRIFT_COLUMNS);
            Ok(())
        }
        Command::Audit { limit, action } => {
            let events = c.audit(
                [],
                &AuditQuery {
                    limit: Some(*limit),
                    action: action.clone(),
                },
            )?;
            table::print_rows(cli, &events, AUDIT_COLUMNS);
            Ok(())
        }
        Command::Init { .. } | Command::Serve | Command::PrintEnrol { .. } | Command::Db(_) => {
            Ok(())
        }
    }
}

/// The async runtime of `occ init` and `occ serve`.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Whether log lines may carry ANSI colour codes: only for a terminal, and never when
/// `NO_COLOR` is set (<https://no-color.org>: set and not empty). A pipe, a file or the
/// packaged service's journal gets plain text.
fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The whole of `occ`: parses the command line and runs it.
pub(crate) fn main() -> ExitCode {
    use std::io::IsTerminal;
    let cli = Cli::parse();
    let colours = log_colours(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    // Fails only when a subscriber is already set, which `main` never does.
    let _already_set = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OCC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(colours)
        .with_writer(std::io::stderr)
        .try_init();
    let result = match &cli.command {
        Command::Init {
            admin_token_file,
            new_admin_token,
        } => load_config(&cli).and_then(|c| {
            runtime()?.block_on(setup::init(
                &c,
                admin_token_file.as_deref(),
                *new_admin_token,
            ))
        }),
        Command::PrintEnrol { login_user } => load_config(&cli).and_then(|c| {
            let line = setup::enrol_command(&c, login_user.as_deref())?;
            match cli.output {
                Output::Json => out::json(&serde_json::json!({ "command": line })),
                Output::Table => out::say(&line),
            }
            Ok(())
        }),
        Command::Serve => {
            load_config(&cli).and_then(|config| runtime()?.block_on(setup::serve(config)))
        }
        Command::Db(cmd) => runtime().and_then(|rt| rt.block_on(db::run(&cli, cmd))),
        _ => run_client(&cli),
    };
    match result {
        Ok(()) => ExitCode::from(wait::exit::OK),
        Err(e) => {
            out::note(&format!("occ: {e:#}"));
            match e.downcast_ref::<wait::WaitFailure>() {
                Some(w) => ExitCode::from(w.exit),
                None => ExitCode::from(wait::exit::ERROR),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{Cli, log_colours};

    /// `occ` reaches the API only through the typed client generated from the route table:
    /// no command writes a method, a path, or a raw request of its own (the client's
    /// `request` and `get_page` are for tests).
    #[test]
    fn no_command_writes_a_method_a_path_or_a_raw_request() {
        // Tests run in the package's directory.
        let dir = std::path::Path::new("src/cli");
        // Built from pieces so that this file does not match itself.
        let q = "\"";
        let mut forbidden = vec![
            format!("{q}/"),
            format!(".{}(", "request"),
            format!(".{}(", "get_page"),
        ];
        for r in clawfleet_api::ROUTES {
            forbidden.push(format!("{q}{}{q}", r.method.as_http()));
        }
        let mut found = Vec::new();
        let mut files = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                for f in &forbidden {
                    if line.contains(f.as_str()) {
                        found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
                    }
                }
            }
        }
        assert!(files > 10, "no CLI sources under {}", dir.display());
        assert!(found.is_empty(), "{}", found.join("\n"));
    }

    #[test]
    fn log_lines_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_colours(true, None));
        assert!(log_colours(true, Some("".as_ref())));
        assert!(!log_colours(true, Some("1".as_ref())));
        assert!(!log_colours(false, None));
    }

    /// Every verb has a one-line help, and so has every option.
    #[test]
    fn every_verb_and_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in cmd.get_subcommands() {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_name() == "help" {
                    continue;
                }
                if sub.get_about().is_none() {
                    missing.push(format!("{here}: no help"));
                }
                for arg in sub.get_arguments() {
                    if !arg.is_positional() && arg.get_help().is_none() && arg.get_id() != "help" {
                        missing.push(format!("{here} --{}: no help", arg.get_id()));
                    }
                }
                walk(sub, &here, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "occ", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
