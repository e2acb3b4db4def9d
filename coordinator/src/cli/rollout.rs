//! `occ rollout`: one Configuration generation to many Agents, canary first, then waves.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::{Args, Subcommand};
use coordinator::client::Client;
use coordinator::service::NewRollout;
use serde_json::Value;

use super::Cli;
use super::out::{note, say};
use super::table::print;
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

const ROLLOUT_COLUMNS: &[(&str, &str)] = &[
    ("ID", "id"),
    ("DEPLOYS", "deploys"),
    ("STATE", "state"),
    ("WAVE", "wave"),
    ("WAVES", "waves"),
    ("MESSAGE", "message"),
];

const AGENT_COLUMNS: &[(&str, &str)] = &[
    ("AGENT", "agentId"),
    ("WAVE", "wave"),
    ("STATE", "state"),
    ("REVISION", "revisionId"),
    ("CODE", "code"),
];

/// A rollout for the table: `deploys` says what it deploys, a Configuration generation
/// (`cfg@3`) or a secret's version (`secret slack-bot v4`).
fn for_table(rollout: &Value) -> Value {
    let mut row = rollout.clone();
    let deploys = match (&rollout["secret"], &rollout["configurationId"]) {
        (Value::Object(s), _) => format!(
            "secret {} v{}",
            s.get("name").and_then(Value::as_str).unwrap_or("-"),
            s.get("version").unwrap_or(&Value::Null)
        ),
        (_, Value::String(cfg)) => format!("{cfg}@{}", rollout["configurationGeneration"]),
        _ => "-".to_owned(),
    };
    if let Value::Object(m) = &mut row {
        m.insert("deploys".to_owned(), Value::String(deploys));
    }
    row
}

pub(crate) fn show(cli: &Cli, rollout: &Value) {
    if cli.output == super::Output::Json {
        print(cli, rollout, &[]);
        return;
    }
    print(cli, &for_table(rollout), ROLLOUT_COLUMNS);
    say("");
    print(cli, &rollout["agents"], AGENT_COLUMNS);
}

/// A plan: per Agent, what its deploy would change on its host, then the token.
pub(crate) fn print_plan(cli: &Cli, plan: &Value) {
    if cli.output == super::Output::Json {
        print(cli, plan, &[]);
        return;
    }
    let yes_no = |v: &Value| match v.as_bool() {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    };
    let rows: Vec<Value> = plan["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let ch = &a["changes"];
            serde_json::json!({
                "agent": a["agentId"],
                "target": if a["placed"] == true {
                    a["target"].clone()
                } else {
                    Value::String(format!("{} (new)", a["target"].as_str().unwrap_or("-")))
                },
                "revision": a["revision"]["id"],
                "account": ch["account"],
                "directory": ch["agentDirectory"],
                "port": ch["port"],
                "snapshot": ch["snapshot"],
                "unit": ch["unitFile"],
                "reload": yes_no(&ch["daemonReload"]),
                "restart": yes_no(&ch["restart"]),
                "restore": ch["restoreAvailable"],
                "refusal": ch["refusal"]["code"],
            })
        })
        .collect();
    print(
        cli,
        &Value::Array(rows),
        &[
            ("AGENT", "agent"),
            ("TARGET", "target"),
            ("REVISION", "revision"),
            ("ACCOUNT", "account"),
            ("DIRECTORY", "directory"),
            ("PORT", "port"),
            ("SNAPSHOT", "snapshot"),
            ("UNIT", "unit"),
            ("DAEMON-RELOAD", "reload"),
            ("RESTART", "restart"),
            ("RESTORE", "restore"),
            ("REFUSAL", "refusal"),
        ],
    );
    for a in plan["agents"].as_array().into_iter().flatten() {
        if let Some(m) = a["changes"]["refusal"]["message"].as_str() {
            say(&format!(
                "{}: would be refused: {m}",
                a["agentId"].as_str().unwrap_or("-")
            ));
        }
    }
    say(&format!(
        "plan token: {} (apply with --apply-plan; refused if anything moved meanwhile)",
        plan["token"].as_str().unwrap_or("-")
    ));
}

/// One line of progress: state, wave, and Agents per state.
fn progress(r: &Value) -> String {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for a in r["agents"].as_array().into_iter().flatten() {
        *counts
            .entry(a["state"].as_str().unwrap_or("-"))
            .or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(
        "{} · wave {}/{} · {}",
        r["state"].as_str().unwrap_or("-"),
        r["wave"].as_u64().unwrap_or(0) + 1,
        r["waves"].as_u64().unwrap_or(0),
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
) -> Result<(Value, Option<anyhow::Error>)> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let r = c.request("GET", &format!("/namespaces/{ns}/rollouts/{id}"), None)?;
        let line = progress(&r);
        if line != last {
            note(&format!(
                "[{:>5.1}s] rollout {id}: {line}",
                start.elapsed().as_secs_f64()
            ));
            last = line;
        }
        let failed: Vec<String> = r["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| matches!(a["state"].as_str(), Some("failed" | "restored")))
            .map(|a| {
                format!(
                    "{} {} ({})",
                    a["agentId"].as_str().unwrap_or("-"),
                    a["state"].as_str().unwrap_or("-"),
                    a["code"].as_str().unwrap_or("-")
                )
            })
            .collect();
        let message = r["message"].as_str().unwrap_or("");
        match r["state"].as_str() {
            Some("done") if failed.is_empty() => return Ok((r, None)),
            Some("done" | "halted") => {
                let failure = wait_failure(
                    exit::WORK_FAILED,
                    format!(
                        "rollout {id} {}: {message}; {}",
                        r["state"].as_str().unwrap_or("-"),
                        failed.join(", ")
                    ),
                );
                return Ok((r, Some(failure)));
            }
            Some("aborted") => {
                let failure = wait_failure(
                    exit::SUPERSEDED,
                    format!("rollout {id} was aborted: {message}"),
                );
                return Ok((r, Some(failure)));
            }
            _ => {}
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
    let action = |ns: &str, id: i64, verb: &str| -> Result<()> {
        let r = c.request(
            "POST",
            &format!("/namespaces/{ns}/rollouts/{id}/{verb}"),
            None,
        )?;
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
                let p = c.send(
                    "POST",
                    &format!("/namespaces/{namespace}/rollouts/plan"),
                    &body,
                )?;
                print_plan(cli, &p);
                return Ok(());
            }
            let r = c.send("POST", &format!("/namespaces/{namespace}/rollouts"), &body)?;
            let Some(id) = r["id"].as_i64() else {
                anyhow::bail!("the rollout answer has no id");
            };
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
            let all = c.request("GET", &format!("/namespaces/{namespace}/rollouts"), None)?;
            if cli.output == super::Output::Json {
                print(cli, &all, &[]);
            } else {
                let rows: Vec<Value> = all
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(for_table)
                    .collect();
                print(cli, &Value::Array(rows), ROLLOUT_COLUMNS);
            }
            Ok(())
        }
        RolloutCmd::Status { namespace, id } => {
            let r = c.request(
                "GET",
                &format!("/namespaces/{namespace}/rollouts/{id}"),
                None,
            )?;
            show(cli, &r);
            Ok(())
        }
        RolloutCmd::Pause { namespace, id } => action(namespace, *id, "pause"),
        RolloutCmd::Resume { namespace, id } => action(namespace, *id, "resume"),
        RolloutCmd::Promote { namespace, id } => action(namespace, *id, "promote"),
        RolloutCmd::Abort { namespace, id } => action(namespace, *id, "abort"),
    }
}
