//! Config-only revisions applied live (issue 28): activating a revision whose configuration
//! differs from the served one only at paths the gateway applies without a restart
//! (`clawfleet_protocol::live_config`).
//!
//! The gateway's `OPENCLAW_CONFIG_PATH` is `config/openclaw.json`, a copy of `current`'s
//! configuration that every cutover replaces by rename ([`AgentPaths::live_config`]); the
//! gateway watches that file, re-reads it when it is replaced and applies what changed. So
//! `current` moves to the candidate, the copy is replaced with the candidate's configuration,
//! and the gateway's `config.get` is polled until it reports the file it read as the
//! candidate's, valid, and applied (`appliedConfigHash` equal to `configRevisionHash`). Open
//! connections stay open; no process starts.
//!
//! Taken only when all of this holds (anything else restarts as before): the unit file is
//! unchanged, `served.json` names a revision other than the candidate whose snapshot has the
//! candidate's harness and password use (the managed password is how hostd asks), `current`
//! names the served revision or the candidate (a retry), the copy holds the served
//! configuration (the running gateway read it), every changed path applies live, and the unit
//! is active with `/readyz` answering on a listener the Agent owns.
//!
//! If the gateway does not confirm within [`APPLY_TIMEOUT`] (it refused the file as invalid,
//! or restarted itself), activation goes on as a restart-class cutover of the same candidate:
//! the same outcome a deploy had before, never less. The operator's start hooks do not run for
//! a live change: no workload starts.

use std::time::{Duration, Instant};

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::Failure;
use clawfleet_protocol::live_config;
use clawfleet_protocol::operation::ActivateArgs;
use clawfleet_protocol::result::{ActivateResult, ConfigReload, Step};
use serde_json::{Value, json};

use super::checks::MAX_SNAPSHOT;
use super::{Ctx, Engine, fs_failure, system_failure};
use crate::fsutil;
use crate::gateway_rpc::GatewayRpc;
use crate::layout::AgentPaths;
use crate::system::Ids;

/// How long the gateway has to report the new configuration as applied. OpenClaw waits for
/// the file to settle (200 ms) and applies a change in about a second, but on a busy host, or
/// right after its start, it was seen to take over 10 s; a restart would take longer still.
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two `config.get` calls.
const POLL: Duration = Duration::from_millis(100);
/// Each RPC read or write.
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// The revision to activate, as the check needs it (from its snapshot when activating, from
/// the request when planning).
#[derive(Debug)]
pub(crate) struct Candidate<'a> {
    pub(crate) namespace: &'a Ident,
    pub(crate) agent: &'a Ident,
    pub(crate) id: &'a Ident,
    pub(crate) harness: &'a clawfleet_protocol::operation::Harness,
    pub(crate) needs_password: bool,
    /// The request's configuration when planning; `None` when activating: the prepared
    /// snapshot's is read, and only once the cheaper conditions hold, since every activation
    /// of an unchanged unit asks.
    pub(crate) configuration: Option<&'a Value>,
}

/// What a live activation applies.
#[derive(Debug)]
pub(crate) struct LivePlan {
    /// The configuration paths that differ from the served revision's.
    pub(crate) changed: Vec<String>,
    port: u16,
}

impl Engine<'_> {
    /// The read-only check: `Some` when activating `candidate` is a live configuration change
    /// of the running, served revision (see the module's conditions). Anything it cannot read
    /// (a damaged served snapshot, a bus error) only means no live change: the restart path
    /// checks and reports what it needs itself.
    pub(crate) fn live_plan(
        &self,
        candidate: &Candidate<'_>,
        paths: &AgentPaths,
        current: Option<&Ident>,
        port: u16,
        ids: Ids,
    ) -> Option<LivePlan> {
        match self.try_live_plan(candidate, paths, current, port, ids) {
            Ok(plan) => plan,
            Err(f) => {
                tracing::debug!(agent = %candidate.agent, revision = %candidate.id, "no live configuration change: {}: {}", f.code, f.message);
                None
            }
        }
    }

    fn try_live_plan(
        &self,
        candidate: &Candidate<'_>,
        paths: &AgentPaths,
        current: Option<&Ident>,
        port: u16,
        ids: Ids,
    ) -> Result<Option<LivePlan>, Failure> {
        let Some((_, served_dir)) = self.served_for_in_place_change(
            candidate.namespace,
            candidate.agent,
            paths,
            candidate.id,
            current,
            candidate.harness,
            candidate.needs_password,
        )?
        else {
            return Ok(None);
        };
        if !fsutil::file_exists(&paths.password_file).map_err(fs_failure)? {
            return Ok(None);
        }
        let old_bytes = fsutil::read_small(&served_dir.join("openclaw.json"), MAX_SNAPSHOT)
            .map_err(fs_failure)?;
        // The running gateway read the served configuration from the copy (an Agent whose unit
        // predates the copy has none, and restarts once onto it).
        match fsutil::read_small(&paths.live_config, MAX_SNAPSHOT) {
            Ok(copy) if copy == old_bytes => {}
            Ok(_) => return Ok(None),
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(fs_failure(e)),
        }
        let Ok(old_config) = serde_json::from_slice::<Value>(&old_bytes) else {
            return Ok(None);
        };
        let snapshot;
        let new_config = match candidate.configuration {
            Some(c) => c,
            None => {
                snapshot = self.snapshot_configuration(paths, candidate.id)?;
                &snapshot
            }
        };
        let Ok(changed) = live_config::live_change(&old_config, new_config) else {
            return Ok(None);
        };
        let state = self
            .system
            .unit_state(&paths.unit_name)
            .map_err(system_failure)?;
        if !state.is_active() || !self.ready_and_owned(paths, port, ids.uid)? {
            return Ok(None);
        }
        Ok(Some(LivePlan { changed, port }))
    }

    /// Moves `current` to the candidate, replaces the gateway's configuration file and waits
    /// for the gateway to apply it. `Err` when it does not confirm (`current` may name the
    /// candidate then): the caller restarts it instead.
    pub(crate) fn apply_live(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
        plan: &LivePlan,
    ) -> Result<ActivateResult, String> {
        let rev = &args.revision;
        let failed = |e: Failure| format!("{}: {}", e.code, e.message);
        let expected = fsutil::read_small(
            &paths.revision_dir(&rev.id).join("openclaw.json"),
            MAX_SNAPSHOT,
        )
        .map_err(|e| failed(fs_failure(e)))?;
        // What the gateway reports before the change: a gateway that cannot say what it read
        // and applied is restarted instead, before anything moves.
        let password = self.managed_password(paths).map_err(failed)?;
        let mut rpc = GatewayRpc::connect(plan.port, &password, RPC_TIMEOUT).map_err(|e| {
            format!("cannot reach the gateway to change its configuration live: {e}")
        })?;
        let before = rpc
            .request("config.get", json!({}))
            .map_err(|e| format!("config.get failed: {e}"))?;
        let Some(before) = revision_hash(&before) else {
            return Err(
                "the gateway's config.get reports no configRevisionHash and appliedConfigHash"
                    .to_owned(),
            );
        };
        ctx.step(Step::PointerFlip).map_err(failed)?;
        fsutil::replace_symlink(&paths.current, &AgentPaths::current_target(&rev.id))
            .map_err(|e| failed(fs_failure(e)))?;
        ctx.step(Step::ConfigReload).map_err(failed)?;
        let started = Instant::now();
        self.write_live_config(paths, &rev.id).map_err(failed)?;
        let deadline = Instant::now() + APPLY_TIMEOUT;
        let mut last;
        loop {
            match rpc.request("config.get", json!({})) {
                Ok(payload) => match applied(&payload, &before, &expected) {
                    Ok(()) => break,
                    Err(why) => last = why,
                },
                // A gateway that restarted itself, or closed the session: ask again on a new
                // one while there is time.
                Err(e) => {
                    last = format!("config.get failed: {e}");
                    if let Ok(again) = GatewayRpc::connect(plan.port, &password, RPC_TIMEOUT) {
                        rpc = again;
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the gateway did not report the new configuration as applied within {} s ({last})",
                    APPLY_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(POLL);
        }
        drop(password);
        tracing::info!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %rev.id, changed = ?plan.changed, millis = started.elapsed().as_millis() as u64, "configuration applied live; the gateway was not restarted");
        self.record_started(ctx, paths, rev).map_err(failed)?;
        self.record_served(ctx, paths, rev).map_err(failed)?;
        Ok(ActivateResult {
            restarted: false,
            unit_changed: false,
            observation: self.observe(&args.namespace.id, &args.agent.id, paths),
            restored: None,
            secrets_reload: None,
            config_reload: Some(ConfigReload {
                changed: plan.changed.clone(),
            }),
        })
    }
}

/// `configRevisionHash` of a `config.get` answer: the gateway's (keyed) hash of the file it
/// read last.
fn revision_hash(payload: &Value) -> Option<String> {
    payload["appliedConfigHash"].as_str()?;
    payload["configRevisionHash"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

/// Whether a `config.get` answer says the gateway read a file other than the one it reported
/// before (`before`, its hash), found it valid, and applied it. The gateway hashes with a key
/// of its own, so the new file is recognised by a new hash; where it shows the file's text
/// (`raw`: OpenClaw withholds it when the configuration refers to secrets), that must be the
/// expected bytes too.
fn applied(payload: &Value, before: &str, expected: &[u8]) -> Result<(), String> {
    let Some(read) = revision_hash(payload) else {
        return Err(
            "its config.get reports no configRevisionHash and appliedConfigHash".to_owned(),
        );
    };
    if read == before {
        return Err("it still reports the previous file".to_owned());
    }
    if let Some(raw) = payload["raw"].as_str()
        && raw.as_bytes() != expected
    {
        return Err("it reports a file other than the revision's".to_owned());
    }
    if payload["valid"] != true {
        return Err(format!(
            "it reports the new file as not valid: {}",
            payload["issues"]
        ));
    }
    if payload["appliedConfigHash"].as_str() != Some(read.as_str()) {
        return Err("it read the new file and has not applied it yet".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::applied;
    use serde_json::json;

    #[test]
    fn applied_needs_a_new_valid_file_applied() {
        let file = br#"{"a":1}"#;
        let ok = json!({"raw": "{\"a\":1}", "valid": true, "configRevisionHash": "h2", "appliedConfigHash": "h2"});
        assert_eq!(applied(&ok, "h1", file), Ok(()));
        let withheld = json!({"raw": null, "valid": true, "configRevisionHash": "h2", "appliedConfigHash": "h2"});
        assert_eq!(
            applied(&withheld, "h1", file),
            Ok(()),
            "raw is withheld with secrets"
        );
        assert!(applied(&ok, "h2", file).is_err_and(|e| e.contains("previous")));
        let other = json!({"raw": "{\"a\":2}", "valid": true, "configRevisionHash": "h3", "appliedConfigHash": "h3"});
        assert!(applied(&other, "h1", file).is_err_and(|e| e.contains("other than")));
        let pending = json!({"raw": "{\"a\":1}", "valid": true, "configRevisionHash": "h2", "appliedConfigHash": "h1"});
        assert!(applied(&pending, "h1", file).is_err_and(|e| e.contains("not applied")));
        let invalid = json!({"raw": "{\"a\":1}", "valid": false, "issues": ["x"], "configRevisionHash": "h2", "appliedConfigHash": "h1"});
        assert!(applied(&invalid, "h1", file).is_err_and(|e| e.contains("not valid")));
        let old_gateway = json!({"raw": "{\"a\":1}", "valid": true});
        assert!(
            applied(&old_gateway, "h1", file).is_err_and(|e| e.contains("no configRevisionHash"))
        );
    }
}
