//! `occ rollout`: one Configuration generation to many Agents, canary first, then waves.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::{Args, Subcommand};
use clawfleet_api::types::{
    AgentPlan, NewRollout, Rollout, RolloutAgent, RolloutAgentState, RolloutState,
};
use coordinator::client::{Api, Client};
use serde::Serialize;

use super::Cli;
use super::out::{note, say};
use super::table::{Column, col, opt, print_fields, table, text};
use super::wait::{exit, wait_failure};

#[derive(Subcommand, Debug)]
pub(crate) enum RolloutCmd {
    /// Roll a Configuration's latest generation out: canary first, then waves of at most
    /// --max-parallel, halting once more than --max-failures Agents failed.
    Create {
        namespace: String,
        /// The Configuration whose latest generation the Agents get.
        #[arg(long)]
        configuration: String,
        /// The Agents, in deploy order (default: every Agent on the Configuration).
        #[arg(long, value_delimiter = ',')]
        agents: Option<Vec<String>>,
        #[command(flatten)]
        waves: Waves,
        /// Follow the rollout until it is done, halted or aborted (exit 0 only when it is done
        /// and none of its Agents failed or was restored).
        #[arg(long)]
        wait: bool,
        /// Show what the rollout would change on each Agent's host and the plan token; create
        /// nothing.
        #[arg(long, conflicts_with_all = ["apply_plan", "wait"])]
        plan: bool,
        /// Create the rollout only if the plan with this token is still current.
        #[arg(long, value_name = "TOKEN")]
        apply_plan: Option<String>,
        /// Give up waiting after this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// List the Namespace's newest rollouts.
    List { namespace: String },
    /// A rollout's state, progress and every Agent's outcome.
    Status { namespace: String, id: i64 },
    /// Pause a running rollout (deploys in flight finish; nothing new starts).
    Pause { namespace: String, id: i64 },
    /// Resume a paused rollout.
    Resume { namespace: String, id: i64 },
    /// Start the next wave of a rollout waiting for promotion (or skip the pause).
    Promote { namespace: String, id: i64 },
    /// Abort a rollout: Agents not started are skipped; the others stay as they are.
    Abort { namespace: String, id: i64 },
}

/// How a rollout goes out, for `occ rollout create` and `occ secret rotate`.
#[derive(Args, Debug)]
pub(crate) struct Waves {
    /// Agents deployed first, as their own wave (0: none).
    #[arg(long, default_value_t = 1)]
    pub(crate) canary: u32,
    /// Most deploys at once, and the size of every wave after the canary.
    #[arg(long, default_value_t = 1)]
    pub(crate) max_parallel: u32,
    /// Failures (failed or restored Agents) tolerated; one more halts the rollout.
    #[arg(long, default_value_t = 0)]
    pub(crate) max_failures: u32,
    /// Seconds to wait after each wave before the next.
    #[arg(long, conflicts_with = "manual_promote")]
    pub(crate) pause_between: Option<u32>,
    /// Wait for `occ rollout promote` after each wave.
    #[arg(long)]
    pub(crate) manual_promote: bool,
}

const ROLLOUT_COLUMNS: &[Column<Rollout>] = &[
    col("ID", |r| r.id.to_string()),
    col("DEPLOYS", deploys),
    col("STATE", |r| r.state.as_str().to_owned()),
    col("WAVE", |r| r.wave.to_string()),
    col("WAVES", |r| r.waves.to_string()),
    col("MESSAGE", |r| opt(&r.message)),
];

const AGENT_COLUMNS: &[Column<RolloutAgent>] = &[
    col("AGENT", |a| a.agent_id.to_string()),
    col("WAVE", |a| a.wave.to_string()),
    col("STATE", |a| a.state.as_str().to_owned()),
    col("REVISION", |a| opt(&a.revision_id)),
    col("CODE", |a| opt(&a.code)),
];

/// What a rollout deploys, for the table: a Configuration generation (`cfg@3`) or a
/// secret's version (`secret slack-bot v4`).
fn deploys(r: &Rollout) -> String {
    match (&r.secret, &r.configuration_id) {
        (Some(s), _) => format!("secret {} v{}", s.name, s.version),
        (None, Some(cfg)) => format!("{cfg}@{}", opt(&r.configuration_generation)),
        (None, None) => "-".to_owned(),
    }
}

pub(crate) fn show(cli: &Cli, rollout: &Rollout) {
    if cli.output == super::Output::Json {
        print_fields(cli, rollout);
        return;
    }
    table(std::slice::from_ref(rollout), ROLLOUT_COLUMNS);
    say("");
    table(&rollout.agents, AGENT_COLUMNS);
}

/// "yes" or "no".
fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

const PLAN_COLUMNS: &[Column<AgentPlan>] = &[
    col("AGENT", |a| a.agent_id.clone()),
    col("TARGET", |a| {
        if a.placed {
            a.target.clone()
        } else {
            format!("{} (new)", a.target)
        }
    }),
    col("REVISION", |a| a.revision.id.clone()),
    col("ACCOUNT", |a| text(&a.changes.account)),
    col("DIRECTORY", |a| text(&a.changes.agent_directory)),
    col("PORT", |a| opt(&a.changes.port)),
    col("SNAPSHOT", |a| text(&a.changes.snapshot)),
    col("UNIT", |a| text(&a.changes.unit_file)),
    col("DAEMON-RELOAD", |a| yes_no(a.changes.daemon_reload)),
    col("RESTART", |a| yes_no(a.changes.restart)),
    // A configuration change the running gateway applies live (no restart), and where.
    col("LIVE", |a| {
        a.changes
            .config_live
            .as_ref()
            .map_or_else(|| "-".to_owned(), |paths| paths.join(","))
    }),
    col("RESTORE", |a| opt(&a.changes.restore_available)),
    col("REFUSAL", |a| {
        opt(&a.changes.refusal.as_ref().map(|f| f.code.as_str()))
    }),
];

/// A plan (`plan`, a deploy's or a rollout's, whose `token` and `agents` these are): per
/// Agent, what its deploy would change on its host, then the token.
pub(crate) fn print_plan<P: Serialize>(cli: &Cli, plan: &P, token: &str, agents: &[AgentPlan]) {
    if cli.output == super::Output::Json {
        print_fields(cli, plan);
        return;
    }
    table(agents, PLAN_COLUMNS);
    for a in agents {
        if let Some(f) = &a.changes.refusal {
            say(&format!("{}: would be refused: {}", a.agent_id, f.message));
        }
    }
    say(&format!(
        "plan token: {token} (apply with --apply-plan; refused if anything moved meanwhile)"
    ));
}

/// One line of progress: state, wave, and Agents per state.
fn progress(r: &Rollout) -> String {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for a in &r.agents {
        *counts.entry(a.state.as_str()).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(
        "{} · wave {}/{} · {}",
        r.state.as_str(),
        r.wave + 1,
        r.waves,
        counts.join(", ")
    )
}

/// Follows a rollout until it is no longer open; returns the rollout as last read and, unless
/// every Agent serves the new revision, why not (with its exit code).
pub(crate) fn wait(
    c: &Client,
    ns: &str,
    id: i64,
    timeout: u64,
) -> Result<(Rollout, Option<anyhow::Error>)> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let r = c.get_rollout([ns, &id.to_string()])?;
        let line = progress(&r);
        if line != last {
            note(&format!(
                "[{:>5.1}s] rollout {id}: {line}",
                start.elapsed().as_secs_f64()
            ));
            last = line;
        }
        let failed: Vec<String> = r
            .agents
            .iter()
            .filter(|a| {
                matches!(
                    a.state,
                    RolloutAgentState::Failed | RolloutAgentState::Restored
                )
            })
            .map(|a| {
                format!(
                    "{} {} ({})",
                    a.agent_id,
                    a.state.as_str(),
                    a.code.as_deref().unwrap_or("-")
                )
            })
            .collect();
        let message = r.message.as_deref().unwrap_or("");
        match r.state {
            RolloutState::Done if failed.is_empty() => return Ok((r, None)),
            RolloutState::Done | RolloutState::Halted => {
                let failure = wait_failure(
                    exit::WORK_FAILED,
                    format!(
                        "rollout {id} {}: {message}; {}",
                        r.state.as_str(),
                        failed.join(", ")
                    ),
                );
                return Ok((r, Some(failure)));
            }
            RolloutState::Aborted => {
                let failure = wait_failure(
                    exit::SUPERSEDED,
                    format!("rollout {id} was aborted: {message}"),
                );
                return Ok((r, Some(failure)));
            }
            RolloutState::Running | RolloutState::Paused | RolloutState::Waiting => {}
        }
        if start.elapsed() > Duration::from_secs(timeout) {
            let failure = wait_failure(
                exit::TIMED_OUT,
                format!("rollout {id} not finished after {timeout} s ({last})"),
            );
            return Ok((r, Some(failure)));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &RolloutCmd) -> Result<()> {
    let show_it = |r: Rollout| {
        show(cli, &r);
        Ok(())
    };
    match cmd {
        RolloutCmd::Create {
            namespace,
            configuration,
            agents,
            waves,
            wait: follow,
            timeout,
            plan,
            apply_plan,
        } => {
            let body = NewRollout {
                configuration_id: configuration.clone(),
                agents: agents.clone(),
                canary: Some(waves.canary),
                max_parallel: Some(waves.max_parallel),
                max_failures: Some(waves.max_failures),
                pause_between_seconds: waves.pause_between,
                manual_promote: waves.manual_promote,
                plan_token: apply_plan.clone(),
            };
            if *plan {
                let p = c.plan_rollout([namespace], &body)?;
                print_plan(cli, &p, &p.token, &p.agents);
                return Ok(());
            }
            let r = c.create_rollout([namespace], &body)?;
            let id = r.id;
            if *follow {
                note(&format!("rollout {id} created"));
                // One rule for every `--wait`: the final state, printed when the wait ends
                // whatever the outcome; the exit code says how it ended.
                let (last, failure) = wait(c, namespace, id, *timeout)?;
                show(cli, &last);
                if let Some(e) = failure {
                    return Err(e);
                }
            } else {
                show(cli, &r);
            }
            Ok(())
        }
        RolloutCmd::List { namespace } => {
            let all = c.list_rollouts([namespace])?;
            if cli.output == super::Output::Json {
                print_fields(cli, &all);
            } else {
                table(&all, ROLLOUT_COLUMNS);
            }
            Ok(())
        }
        RolloutCmd::Status { namespace, id } => {
            show_it(c.get_rollout([namespace, &id.to_string()])?)
        }
        RolloutCmd::Pause { namespace, id } => {
            show_it(c.pause_rollout([namespace, &id.to_string()])?)
        }
        RolloutCmd::Resume { namespace, id } => {
            show_it(c.resume_rollout([namespace, &id.to_string()])?)
        }
        RolloutCmd::Promote { namespace, id } => {
            show_it(c.promote_rollout([namespace, &id.to_string()])?)
        }
        RolloutCmd::Abort { namespace, id } => {
            show_it(c.abort_rollout([namespace, &id.to_string()])?)
        }
    }
}
