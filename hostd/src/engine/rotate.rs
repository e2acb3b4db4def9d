//! Secret rotation without a restart: activating a revision that differs from the one the
//! running gateway serves only in its secrets.
//!
//! A rotation makes a new revision whose rendered configuration is the served one's (the
//! managed providers name fixed paths; only the versions the revision records differ), and
//! `put-secrets` has already replaced the files the running gateway reads. Restarting it would
//! only drop every WebSocket; instead `current` moves to the new revision, the gateway is asked
//! to re-read its secrets (`secrets.reload` over its loopback RPC, with the port and managed
//! password from hostd's own state), and what it then holds is compared with the fingerprints
//! `put-secrets` recorded.
//!
//! Taken only when all of this holds (anything else restarts as before): the unit file is
//! unchanged, `served.json` names a revision other than the candidate whose snapshot has the
//! candidate's configuration hash, harness and managed password, `current` names that served
//! revision or the candidate (a retry after a crash half way), the Agent has secrets, the
//! password file is there, and the unit is active with `/readyz` answering on a listener the
//! Agent owns.
//!
//! Crash consistency: `served.json` keeps naming the served revision until the gateway holds
//! the new secrets. A crash after `current` moved leaves `current` on the candidate and
//! `served.json` on the old revision (the observation says "not served"); the gateway runs the
//! same configuration either way and holds the old or the new secrets, and a retried activate
//! takes this path again. A refusal or a mismatch puts `current` back on the served revision
//! before it is answered (the gateway keeps its last good snapshot), and the set of secrets
//! `put-secrets` replaced goes back at rest and into the unit's files, so a later start reads
//! what the gateway serves.

use std::time::Duration;

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::ActivateArgs;
use clawfleet_protocol::result::{ActivateResult, Step};
use clawfleet_protocol::sealed::SecretVersion;
use clawfleet_protocol::secret::provider_name;
use serde_json::{Value, json};
use zeroize::Zeroizing;

use super::secrets::secrets_failure;
use super::{Ctx, Engine, fs_failure, system_failure};
use crate::fsutil;
use crate::gateway_rpc::{GatewayRpc, RpcError};
use crate::layout::AgentPaths;
use crate::markers::RevisionMarker;
use crate::secrets as at_rest;
use crate::system::Ids;

/// How long each RPC read or write may wait.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest password file read.
const PASSWORD_FILE_MAX: u64 = 4096;
/// The line the password file holds.
const PASSWORD_VAR: &str = "OPENCLAW_GATEWAY_PASSWORD=";
/// The test gateway's report of the fingerprints it holds (OpenClaw has none).
const STATUS_METHOD: &str = "x-clawfleet-test.secrets.status";

/// What a secrets-only activation has to reload.
pub(crate) struct Reload {
    /// The revision the gateway serves now.
    served: Ident,
    /// The secrets `put-secrets` delivered (never empty).
    secrets: Vec<SecretVersion>,
    port: u16,
    /// The Agent's account, which owns the files in the unit's runtime directory.
    ids: Ids,
}

/// Whether the gateway's fingerprints were compared with the delivered ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verified {
    /// Every delivered secret's file fingerprint is what the gateway holds.
    Fingerprints,
    /// The gateway has no fingerprint report (OpenClaw): it answered the reload without a
    /// warning, and nothing more could be checked.
    Unverifiable,
}

fn reload_failed(detail: String) -> Failure {
    Failure::new(FailureCode::SecretReloadFailed, detail)
}

impl Engine<'_> {
    /// The read-only check: `Some` when the activation of `candidate` is a secrets-only
    /// change of the running, served revision (see the module's conditions).
    pub(crate) fn reload_plan(
        &self,
        args: &ActivateArgs,
        paths: &AgentPaths,
        current: Option<&Ident>,
        candidate: &RevisionMarker,
        port: u16,
        ids: Ids,
    ) -> Result<Option<Reload>, Failure> {
        let rev = &args.revision.id;
        let Some(served) = self.read_served(paths)? else {
            return Ok(None);
        };
        if &served.revision_id == rev || !candidate.needs_password {
            return Ok(None);
        }
        if current.is_none_or(|c| c != &served.revision_id && c != rev) {
            return Ok(None);
        }
        let dir = paths.revision_dir(&served.revision_id);
        if !fsutil::dir_exists(&dir).map_err(fs_failure)? {
            return Ok(None);
        }
        let old = self.read_snapshot(&args.namespace.id, &args.agent.id, &dir)?;
        if old.configuration_hash != candidate.configuration_hash
            || old.harness != candidate.harness
            || old.needs_password != candidate.needs_password
        {
            return Ok(None);
        }
        let secrets = at_rest::read_manifest(&paths.dir)
            .map_err(secrets_failure)?
            .secrets;
        if secrets.is_empty() || !fsutil::file_exists(&paths.password_file).map_err(fs_failure)? {
            return Ok(None);
        }
        let state = self
            .system
            .unit_state(&paths.unit_name)
            .map_err(system_failure)?;
        if !state.is_active() || !self.ready_and_owned(paths, port, ids.uid)? {
            return Ok(None);
        }
        Ok(Some(Reload {
            served: served.revision_id,
            secrets,
            port,
            ids,
        }))
    }

    /// Moves `current` to the candidate, reloads the gateway's secrets and verifies them;
    /// on failure `current` names the served revision again.
    pub(crate) fn reload_secrets(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
        plan: Reload,
    ) -> Result<ActivateResult, Failure> {
        let rev = &args.revision;
        ctx.step(Step::PointerFlip)?;
        fsutil::replace_symlink(&paths.current, &AgentPaths::current_target(&rev.id))
            .map_err(fs_failure)?;
        ctx.step(Step::SecretReload)?;
        let verified = match self.reload_and_verify(paths, &plan) {
            Ok(v) => v,
            Err(f) => {
                tracing::warn!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %rev.id, served = %plan.served, code = %f.code, "secret reload failed: {}; the gateway keeps its last good secrets and revision {} stays current", f.message, plan.served);
                fsutil::replace_symlink(&paths.current, &AgentPaths::current_target(&plan.served))
                    .map_err(|e| {
                        Failure::new(
                            f.code,
                            format!(
                                "{}; putting revision {} back as current failed too: {e}",
                                f.message, plan.served
                            ),
                        )
                    })?;
                return Err(self.restore_served_secrets(ctx, args, paths, &plan, f));
            }
        };
        let names: Vec<String> = plan
            .secrets
            .iter()
            .map(|v| format!("{}@{} {}", v.name, v.version, v.fingerprint))
            .collect();
        match verified {
            Verified::Fingerprints => {
                tracing::info!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %rev.id, secrets = ?names, "secrets reloaded without a restart; the gateway holds the delivered fingerprints");
            }
            Verified::Unverifiable => {
                tracing::warn!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %rev.id, secrets = ?names, "secrets reloaded without a restart; the gateway reports no fingerprints, so what it holds is NOT verified");
            }
        }
        self.record_started(ctx, paths, rev)?;
        self.record_served(ctx, paths, rev)?;
        Ok(ActivateResult {
            restarted: false,
            unit_changed: false,
            observation: self.observe(&args.namespace.id, &args.agent.id, paths),
            restored: None,
            secrets_reload: Some(match verified {
                Verified::Fingerprints => clawfleet_protocol::result::SecretsReload::Verified,
                Verified::Unverifiable => clawfleet_protocol::result::SecretsReload::Unverified,
            }),
        })
    }

    /// After a refused reload: the set `put-secrets` replaced goes back at rest and into the
    /// running unit's files, so a later start of the gateway reads the values it serves, not
    /// the refused ones. Answers `failure`, with what could not be put back added to it.
    fn restore_served_secrets(
        &self,
        ctx: &Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
        plan: &Reload,
        failure: Failure,
    ) -> Failure {
        let restored = at_rest::restore_previous(&paths.dir).and_then(|manifest| {
            let Some(manifest) = manifest else {
                return Ok(None);
            };
            let runtime = at_rest::runtime_dir(&self.layout.run_dir, &paths.unit_name);
            if fsutil::kind(&runtime)? == fsutil::Kind::Dir {
                let values = at_rest::load(&paths.dir, &at_rest::creds_decrypt)?;
                at_rest::write_files(&runtime, plan.ids, &values)?;
            }
            Ok(Some(manifest))
        });
        match restored {
            Ok(Some(m)) => {
                let names: Vec<String> = m
                    .secrets
                    .iter()
                    .map(|v| format!("{}@{} {}", v.name, v.version, v.fingerprint))
                    .collect();
                tracing::info!(operation_id = %ctx.operation_id, agent = %args.agent.id, secrets = ?names, "the secrets the gateway serves are back at rest and in its files");
                failure
            }
            Ok(None) => {
                tracing::warn!(operation_id = %ctx.operation_id, agent = %args.agent.id, "no earlier set of secrets is kept: the refused values stay at rest until the next put-secrets");
                failure
            }
            Err(e) => {
                tracing::warn!(operation_id = %ctx.operation_id, agent = %args.agent.id, "cannot put the served secrets back: {e}");
                Failure::new(
                    failure.code,
                    format!(
                        "{}; putting the served secrets back at rest failed too: {e}",
                        failure.message
                    ),
                )
            }
        }
    }

    fn reload_and_verify(&self, paths: &AgentPaths, plan: &Reload) -> Result<Verified, Failure> {
        let password = self.managed_password(paths)?;
        let mut rpc = GatewayRpc::connect(plan.port, &password, RPC_TIMEOUT).map_err(|e| {
            reload_failed(format!(
                "cannot reach the gateway to reload its secrets: {e}"
            ))
        })?;
        drop(password);
        let answer = rpc
            .request("secrets.reload", json!({}))
            .map_err(|e| match &e {
                RpcError::Refused { details, .. } => reload_failed(format!(
                    "the gateway refused to reload its secrets and keeps its last good ones: {e}{}",
                    details
                        .as_ref()
                        .and_then(|d| d["reason"].as_str())
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                )),
                _ => reload_failed(format!("secrets.reload did not answer: {e}")),
            })?;
        if answer["ok"] != true {
            return Err(reload_failed(format!(
                "secrets.reload answered without ok: true (ok = {})",
                answer["ok"]
            )));
        }
        // OpenClaw keeps a stale value and still answers ok when a credential owner failed.
        let warnings = answer["warningCount"].as_u64().unwrap_or(0);
        if warnings > 0 {
            return Err(reload_failed(format!(
                "secrets.reload answered with {warnings} warnings: the gateway may keep a stale secret"
            )));
        }
        let status = match rpc.request(STATUS_METHOD, json!({})) {
            Ok(status) => status,
            Err(RpcError::Refused { code, .. }) if code == "INVALID_REQUEST" => {
                return Ok(Verified::Unverifiable);
            }
            Err(e) => {
                return Err(Failure::new(
                    FailureCode::SecretFingerprintMismatch,
                    format!("cannot read the fingerprints the gateway holds: {e}"),
                ));
            }
        };
        check_fingerprints(&status, &plan.secrets)?;
        Ok(Verified::Fingerprints)
    }

    /// The managed gateway password from the Agent's password file.
    fn managed_password(&self, paths: &AgentPaths) -> Result<Zeroizing<String>, Failure> {
        let bytes = Zeroizing::new(
            fsutil::read_small(&paths.password_file, PASSWORD_FILE_MAX).map_err(fs_failure)?,
        );
        let text = std::str::from_utf8(&bytes).map_err(|_| {
            Failure::new(
                FailureCode::OwnershipMismatch,
                format!("{} is not UTF-8", paths.password_file.display()),
            )
        })?;
        text.trim_end_matches('\n')
            .strip_prefix(PASSWORD_VAR)
            .filter(|p| !p.is_empty() && !p.contains('\n'))
            .map(|p| Zeroizing::new(p.to_owned()))
            .ok_or_else(|| {
                Failure::new(
                    FailureCode::OwnershipMismatch,
                    format!(
                        "{} is not the line {PASSWORD_VAR}<password> hostd writes",
                        paths.password_file.display()
                    ),
                )
            })
    }
}

/// Every delivered secret's provider in the gateway's report holds its fingerprint.
fn check_fingerprints(status: &Value, secrets: &[SecretVersion]) -> Result<(), Failure> {
    let mut wrong = Vec::new();
    for s in secrets {
        let held = status["providers"][provider_name(&s.name)]["fingerprint"].as_str();
        if held != Some(s.fingerprint.as_str()) {
            wrong.push(format!(
                "{} version {} ({}): the gateway holds {}",
                s.name,
                s.version,
                s.fingerprint,
                held.unwrap_or("nothing")
            ));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(Failure::new(
        FailureCode::SecretFingerprintMismatch,
        format!(
            "after secrets.reload the gateway does not hold the delivered secrets: {}",
            wrong.join("; ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawfleet_protocol::sealed::{SecretFingerprint, SecretName};

    fn version(name: &str, value: &[u8]) -> SecretVersion {
        SecretVersion {
            name: SecretName::new(name).unwrap(),
            version: 2,
            fingerprint: SecretFingerprint::of(value),
        }
    }

    #[test]
    fn fingerprints_must_all_match_the_providers_the_gateway_holds() {
        let want = vec![version("bot", b"v2"), version("key", b"k1")];
        let fp = |v: &[u8]| SecretFingerprint::of(v).as_str().to_owned();
        let good = json!({"providers": {
            "clawfleet-bot": {"fingerprint": fp(b"v2")},
            "clawfleet-key": {"fingerprint": fp(b"k1")},
        }});
        assert!(check_fingerprints(&good, &want).is_ok());
        let stale = json!({"providers": {
            "clawfleet-bot": {"fingerprint": fp(b"v1")},
            "clawfleet-key": {"fingerprint": fp(b"k1")},
        }});
        let f = check_fingerprints(&stale, &want).unwrap_err();
        assert_eq!(f.code, FailureCode::SecretFingerprintMismatch);
        assert!(f.message.contains("bot version 2"), "{}", f.message);
        assert!(!f.message.contains("key version"), "{}", f.message);
        let missing = json!({"providers": {"clawfleet-bot": {"fingerprint": fp(b"v2")}}});
        let f = check_fingerprints(&missing, &want).unwrap_err();
        assert!(f.message.contains("holds nothing"), "{}", f.message);
    }
}
