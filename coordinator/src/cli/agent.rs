//! `occ agent`: Agents, their deploys, stops, deletes, status and revisions.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use clawfleet_api::types::{
    AgentPatch, DeployQuery, Deployment, DeploymentStatus, NewAgent, NewWorkspaceFile,
    RestorePolicy, Revision,
};
use clawfleet_protocol::egress::Egress;
use coordinator::client::{Api, Client, all_pages};
use serde::Serialize;

use super::out::say;
use super::table::{AGENT_COLUMNS, Column, col, opt, print_fields, print_one, print_rows};
use super::wait::{WaitArgs, Waited, wait};
use super::{Cli, Output};

#[derive(Subcommand, Debug)]
pub(crate) enum AgentCmd {
    /// Create an Agent with a Configuration (nothing runs until it is deployed).
    Create {
        namespace: String,
        id: String,
        /// The Configuration the Agent runs.
        #[arg(long)]
        configuration: String,
        /// The service principal the Agent acts as (default: the Agent's id).
        #[arg(long)]
        service_principal: Option<String>,
        /// What a failed activation does: none (the candidate stays selected) or last-served
        /// (the host puts the last served revision back at once).
        #[arg(long, value_parser = parse_restore)]
        restore: Option<RestorePolicy>,
        /// An initial workspace file, NAME=PATH (repeatable): PATH's bytes are written once to
        /// NAME in the Agent's workspace before its gateway first starts.
        #[arg(long = "workspace-file", value_name = "NAME=PATH", value_parser = parse_workspace_file)]
        workspace_files: Vec<(String, std::path::PathBuf)>,
        #[command(flatten)]
        egress: EgressArgs,
    },
    /// List a Namespace's Agents.
    List { namespace: String },
    /// Show an Agent: desired state, host or cluster, active and served revision.
    Get { namespace: String, id: String },
    /// Change the Agent's Configuration, restore policy or egress settings (deploy
    /// afterwards).
    ///
    /// The egress flags replace the Agent's egress settings from its next deploy on; a list
    /// not given is its target's.
    Set {
        namespace: String,
        id: String,
        /// The Configuration the Agent runs from its next deploy on.
        #[arg(long, required_unless_present_any = [
            "restore", "egress_ports", "no_egress_ports", "egress_allow", "no_egress_allow",
            "target_egress",
        ])]
        configuration: Option<String>,
        /// What a failed activation does from the next deploy on: none or last-served.
        #[arg(long, value_parser = parse_restore)]
        restore: Option<RestorePolicy>,
        #[command(flatten)]
        egress: EgressArgs,
        /// Drop the Agent's own egress settings: its target's policy applies from its next
        /// deploy on.
        #[arg(long, conflicts_with_all = [
            "egress_ports", "no_egress_ports", "egress_allow", "no_egress_allow",
        ])]
        target_egress: bool,
    },
    /// Deploy a new revision of the Agent's Configuration (or, with --plan, show what it would
    /// change on the host without changing anything).
    Deploy {
        namespace: String,
        id: String,
        /// Show what the deploy would change (account, port, snapshot, unit, daemon-reload,
        /// restart, restore) and the plan token; deploy nothing.
        #[arg(long, conflicts_with_all = ["apply_plan", "wait"])]
        plan: bool,
        /// Deploy only if the plan with this token is still current (else PLAN_STALE).
        #[arg(long, value_name = "TOKEN")]
        apply_plan: Option<String>,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Stop the Agent's gateway (its revisions and state are kept).
    Stop {
        namespace: String,
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Delete the Agent from its host or cluster and from the coordinator.
    Delete {
        namespace: String,
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Deployment status: desired state, revisions, open work, the last code, and why the
    /// newest failed activation failed (its runtime evidence).
    #[command(alias = "deployment-status")]
    Status { namespace: String, id: String },
    /// The Agent's unit or Pod now: state, restarts, last exit, memory, CPU, tasks, main
    /// process uid, served revision.
    Runtime { namespace: String, id: String },
    /// The Agent's log, redacted: the newest lines, or since a time, or the previous run.
    Logs {
        namespace: String,
        id: String,
        #[command(flatten)]
        args: super::runtime::LogsArgs,
    },
    /// Re-apply the Agent's active revision (puts back a unit stopped or a `current` changed
    /// outside clawfleet; an audited deployment pass).
    Reconcile {
        namespace: String,
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// List the Agent's revisions with their status.
    Revisions { namespace: String, id: String },
    /// The Agent's initial workspace files (names, sizes, sha256) and their setup state.
    Workspace { namespace: String, id: String },
    /// Listen on 127.0.0.1 and tunnel each connection to the Agent's gateway through the
    /// coordinator (needs the deploy role; every connection is one audited gateway stream).
    Connect {
        namespace: String,
        id: String,
        /// The local port (default: any free one, printed).
        #[arg(long)]
        local_port: Option<u16>,
    },
}

/// An Agent's own egress settings, a narrowing of its target's policy (a host pool's
/// `[network]` in hostd.toml, a cluster's TCP 443 to public addresses).
#[derive(Args, Debug)]
pub(crate) struct EgressArgs {
    /// A TCP port the Agent may reach on public addresses (repeatable; each one its target
    /// allows). Without it or --no-egress-ports: the target's ports.
    #[arg(
        long = "egress-port",
        value_name = "PORT",
        conflicts_with = "no_egress_ports"
    )]
    egress_ports: Vec<u16>,
    /// No port to public addresses.
    #[arg(long)]
    no_egress_ports: bool,
    /// An IPv4 CIDR the Agent may reach on any port (repeatable; each inside one its target
    /// allows). Without it or --no-egress-allow: the target's ranges.
    #[arg(
        long = "egress-allow",
        value_name = "CIDR",
        conflicts_with = "no_egress_allow"
    )]
    egress_allow: Vec<String>,
    /// No range beyond the public ports.
    #[arg(long)]
    no_egress_allow: bool,
}

impl EgressArgs {
    /// The settings the flags name, or `None` when no egress flag was given.
    fn egress(&self) -> Option<Egress> {
        fn list<T: Clone>(given: &[T], none: bool) -> Option<Vec<T>> {
            (none || !given.is_empty()).then(|| given.to_vec())
        }
        let e = Egress {
            ports: list(&self.egress_ports, self.no_egress_ports),
            allow: list(&self.egress_allow, self.no_egress_allow),
        };
        (e != Egress::default()).then_some(e)
    }
}

/// An Agent's egress settings as one cell: `-` for its target's.
pub(crate) fn egress_cell(egress: Option<&Egress>) -> String {
    egress.map_or_else(|| "-".to_owned(), Egress::to_string)
}

/// `occ agent connect`: each local connection becomes one gateway stream.
fn connect(c: &Client, namespace: &str, id: &str, local_port: Option<u16>) -> Result<()> {
    use std::io::Write;
    use std::net::{Shutdown, TcpListener, TcpStream};
    let path = c.gateway_tunnel([namespace, id])?.path;
    let listener = TcpListener::bind(("127.0.0.1", local_port.unwrap_or(0)))
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", local_port.unwrap_or(0)))?;
    let addr = listener
        .local_addr()
        .context("the listener has no address")?;
    // One line a script can read: where to connect.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "listening on {addr} for the gateway of Agent {namespace}/{id}"
    )?;
    out.flush()?;
    drop(out);
    for local in listener.incoming() {
        let local = match local {
            Ok(s) => s,
            Err(e) => {
                eprintln!("occ agent connect: accept failed: {e}");
                continue;
            }
        };
        let c = c.clone();
        let path = path.clone();
        std::thread::spawn(move || {
            let remote = match c.upgrade(&path) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("occ agent connect: {e}");
                    let _ = local.shutdown(Shutdown::Both);
                    return;
                }
            };
            let _ = local.set_nodelay(true);
            let join = |mut from: TcpStream, to: TcpStream| {
                std::thread::spawn(move || {
                    let mut to_w = &to;
                    let _ = std::io::copy(&mut from, &mut to_w);
                    let _ = to.shutdown(Shutdown::Write);
                })
            };
            let (Ok(local2), Ok(remote2)) = (local.try_clone(), remote.try_clone()) else {
                return;
            };
            let up = join(local, remote);
            let down = join(remote2, local2);
            let _ = up.join();
            let _ = down.join();
        });
    }
    Ok(())
}

fn parse_workspace_file(text: &str) -> std::result::Result<(String, std::path::PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_owned(), std::path::PathBuf::from(path)))
        }
        _ => Err(format!(
            "{text:?} is not NAME=PATH (for example AGENTS.md=./agents.md)"
        )),
    }
}

/// Reads the workspace files named on the command line (each at most the per-file limit, so
/// a wrong path to a large file is refused here, not after uploading it).
fn read_workspace_files(files: &[(String, std::path::PathBuf)]) -> Result<Vec<NewWorkspaceFile>> {
    use base64ct::{Base64, Encoding};
    use std::io::Read;
    let max = clawfleet_protocol::workspace::WORKSPACE_MAX_FILE_BYTES;
    files
        .iter()
        .map(|(name, path)| {
            let mut bytes = Vec::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(max as u64 + 1).read_to_end(&mut bytes))
                .with_context(|| {
                    format!("--workspace-file {name}: cannot read {}", path.display())
                })?;
            if bytes.len() > max {
                anyhow::bail!(
                    "--workspace-file {name}: {} is larger than {max} bytes",
                    path.display()
                );
            }
            Ok(NewWorkspaceFile {
                name: name.clone(),
                content: None,
                content_base64: Some(Base64::encode_string(&bytes)),
            })
        })
        .collect()
}

fn parse_restore(text: &str) -> std::result::Result<RestorePolicy, String> {
    RestorePolicy::parse(text)
        .ok_or_else(|| format!("{text:?} is not a restore policy; use none or last-served"))
}

const STATUS_COLUMNS: &[Column<DeploymentStatus>] = &[
    col("AGENT", |s| s.agent_id.clone()),
    col("DESIRED", |s| s.desired_state.as_str().to_owned()),
    col("HOST", |s| opt(&s.host)),
    col("PORT", |s| opt(&s.port)),
    col("ACTIVE", |s| opt(&s.active_revision_id)),
    col("SERVED", |s| opt(&s.served_revision_id)),
    col("CONVERGED", |s| s.converged.to_string()),
    col("LAST CODE", |s| opt(&s.last_code)),
];

const DEPLOYMENT_COLUMNS: &[Column<Deployment>] = &[
    col("REVISION", |d| d.revision.id.to_string()),
    col("NUMBER", |d| d.revision.number.to_string()),
    col("STATUS", |d| d.revision.status.as_str().to_owned()),
    col("HASH", |d| d.revision.configuration_hash.to_string()),
];

const REVISION_COLUMNS: &[Column<Revision>] = &[
    col("REVISION", |r| r.id.to_string()),
    col("NUMBER", |r| r.number.to_string()),
    col("STATUS", |r| r.status.as_str().to_owned()),
    col("CONFIGURATION", |r| r.configuration_id.to_string()),
    col("GEN", |r| r.configuration_generation.to_string()),
];

/// The deployment status after `deploy --wait` converged.
const WAITED_STATUS_COLUMNS: &[Column<DeploymentStatus>] = &[
    col("AGENT", |s| s.agent_id.clone()),
    col("HOST", |s| opt(&s.host)),
    col("PORT", |s| opt(&s.port)),
    col("ACTIVE", |s| opt(&s.active_revision_id)),
    col("SERVED", |s| opt(&s.served_revision_id)),
    col("CONVERGED", |s| s.converged.to_string()),
];

const WORKSPACE_FILE_COLUMNS: &[Column<clawfleet_api::types::WorkspaceFileInfo>] = &[
    col("NAME", |f| f.name.to_string()),
    col("SIZE", |f| f.size.to_string()),
    col("SHA256", |f| f.sha256.to_string()),
    col("HELD", |f| f.content_held.to_string()),
];

/// The answer of a request that queued work: the API's answer with `--output json`, else
/// one line for people.
fn answer<T: Serialize>(cli: &Cli, v: &T, line: &str) {
    match cli.output {
        Output::Json => super::out::json(&super::table::to_json(v)),
        Output::Table => say(line),
    }
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &AgentCmd) -> Result<()> {
    match cmd {
        AgentCmd::Create {
            namespace,
            id,
            configuration,
            service_principal,
            restore,
            workspace_files,
            egress,
        } => {
            let workspace_files = read_workspace_files(workspace_files)?;
            let v = c.create_agent(
                [namespace],
                &NewAgent {
                    id: id.clone(),
                    configuration_id: configuration.clone(),
                    service_principal_id: service_principal.clone(),
                    harness_auth: None,
                    restore: *restore,
                    workspace_files,
                    egress: egress.egress(),
                },
            )?;
            print_one(cli, &v, AGENT_COLUMNS);
        }
        AgentCmd::List { namespace } => print_rows(
            cli,
            &all_pages(None, |q| c.list_agents([namespace], q))?,
            AGENT_COLUMNS,
        ),
        AgentCmd::Get { namespace, id } => {
            print_one(cli, &c.get_agent([namespace, id])?, AGENT_COLUMNS)
        }
        AgentCmd::Set {
            namespace,
            id,
            configuration,
            restore,
            egress,
            target_egress,
        } => {
            let egress = if *target_egress {
                Some(Egress::default())
            } else {
                egress.egress()
            };
            let v = c.patch_agent(
                [namespace, id],
                &AgentPatch {
                    configuration_id: configuration.clone(),
                    restore: *restore,
                    egress,
                },
            )?;
            print_one(cli, &v, AGENT_COLUMNS);
        }
        AgentCmd::Deploy {
            namespace,
            id,
            plan: true,
            ..
        } => {
            let plan = c.plan_deploy([namespace, id])?;
            super::rollout::print_plan(cli, &plan, &plan.token, &plan.agents);
        }
        AgentCmd::Deploy {
            namespace,
            id,
            apply_plan,
            wait: w,
            ..
        } => {
            let rev = c.deploy(
                [namespace, id],
                &DeployQuery {
                    plan_token: apply_plan.clone(),
                },
            )?;
            if w.wait {
                // Table: the revision now, the status once it converged. JSON: one document,
                // when the wait ends (see `WaitEnd`).
                if cli.output == Output::Table {
                    print_one(cli, &rev, DEPLOYMENT_COLUMNS);
                }
                wait(c, namespace, id, rev.work_id, Waited::Deploy, w)?.finish(cli, |status| {
                    if let Some(status) = status {
                        print_one(cli, status, WAITED_STATUS_COLUMNS);
                    }
                })?;
            } else {
                print_one(cli, &rev, DEPLOYMENT_COLUMNS);
            }
        }
        AgentCmd::Stop {
            namespace,
            id,
            wait: w,
        } => {
            let v = c.stop([namespace, id])?;
            if w.wait {
                wait(c, namespace, id, v.work_id, Waited::Stop, w)?
                    .finish(cli, |_| say(&format!("{id}: stopped")))?;
            } else {
                answer(cli, &v, &format!("{id}: stop requested"));
            }
        }
        AgentCmd::Delete {
            namespace,
            id,
            wait: w,
        } => {
            let v = c.delete_agent([namespace, id])?;
            if w.wait {
                wait(c, namespace, id, v.work_id, Waited::Delete, w)?
                    .finish(cli, |_| say(&format!("{id}: deleted")))?;
            } else {
                answer(cli, &v, &format!("{id}: deletion requested"));
            }
        }
        AgentCmd::Reconcile {
            namespace,
            id,
            wait: w,
        } => {
            let v = c.reconcile([namespace, id])?;
            let rev = &v.revision_id;
            if w.wait {
                wait(c, namespace, id, v.work_id, Waited::Deploy, w)?
                    .finish(cli, |_| say(&format!("{id}: {rev} re-applied")))?;
            } else {
                answer(cli, &v, &format!("{id}: re-applying {rev}"));
            }
        }
        AgentCmd::Runtime { namespace, id } => super::runtime::show(cli, c, namespace, id)?,
        AgentCmd::Logs {
            namespace,
            id,
            args,
        } => {
            super::runtime::logs(cli, c, namespace, id, args)?;
        }
        AgentCmd::Status { namespace, id } => {
            let status = c.deployment_status([namespace, id])?;
            print_one(cli, &status, STATUS_COLUMNS);
            super::runtime::print_failure(cli, &status);
        }
        AgentCmd::Revisions { namespace, id } => print_rows(
            cli,
            &all_pages(None, |q| c.list_revisions([namespace, id], q))?,
            REVISION_COLUMNS,
        ),
        AgentCmd::Connect {
            namespace,
            id,
            local_port,
        } => {
            connect(c, namespace, id, *local_port)?;
        }
        AgentCmd::Workspace { namespace, id } => {
            let v = c.get_workspace([namespace, id])?;
            if cli.output == Output::Json {
                print_fields(cli, &v);
            } else {
                say(&format!(
                    "setup: {}{}",
                    v.state.as_str(),
                    v.failure_code
                        .as_ref()
                        .map(|c| format!(" ({c}: {})", v.failure_message.as_deref().unwrap_or("")))
                        .unwrap_or_default()
                ));
                super::table::table(&v.files, WORKSPACE_FILE_COLUMNS);
            }
        }
    }
    Ok(())
}
