//! Secret rotation without a restart: activating a revision that differs from the one the
//! running gateway serves only in its secrets.
//!
//! A rotation makes a new revision whose rendered configuration is the served one's (the
//! managed providers name fixed paths; only the versions the revision records differ), and
//! `put-secrets` has already replaced the files the running gateway reads. Restarting it would
//! only drop every WebSocket; instead `current` moves to the new revision, the gateway is asked
//! to re-read its secrets (`secrets.reload` over its loopback RPC, with the port and managed
//! password from hostd's own state), and what it then holds is compared with the fingerprints
//! `put-secrets` recorded: from the test gateway's fingerprint report, or, from OpenClaw, which
//! has none, by asking `secrets.resolve` for the value each rendered reference resolved to
//! (hashed at once and dropped; see [`verify_by_resolve`]).
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
use clawfleet_protocol::sealed::{SecretFingerprint, SecretVersion};
use clawfleet_protocol::secret::{SINGLE_VALUE_ID, provider_name, surface_ids};
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
/// OpenClaw's read of what its active snapshot resolved a reference to.
const RESOLVE_METHOD: &str = "secrets.resolve";
/// Largest snapshot configuration read for its references (the protocol's limit).
const CONFIGURATION_MAX: u64 = clawfleet_protocol::configuration::CONFIGURATION_MAX_BYTES as u64;

/// What a secrets-only activation has to reload.
pub(crate) struct Reload {
    /// The revision the gateway serves now.
    served: Ident,
    /// The secrets `put-secrets` delivered (never empty).
    secrets: Vec<SecretVersion>,
    port: u16,
    /// The Agent's account, which owns the files in the unit's runtime directory.
    ids: Ids,
    /// The rendered references to clawfleet secrets in the served configuration.
    refs: Vec<SecretRef>,
}

/// A rendered reference to a clawfleet secret in a configuration
/// (`{"source": "file", "provider": "clawfleet-<name>", "id": "value"}`): the provider it
/// names and the JSON path where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SecretRef {
    provider: String,
    path: Vec<String>,
}

/// Whether the gateway's fingerprints were compared with the delivered ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verified {
    /// Every delivered secret's file fingerprint is what the gateway holds.
    Fingerprints,
    /// Some reference could not be checked (OpenClaw knows no credential surface by its
    /// path, or the reference is inactive), or the configuration refers to none of the
    /// delivered secrets: the gateway answered the reload without a warning, and every
    /// reference that could be checked holds its delivered value. The references not checked.
    Unverifiable(Vec<String>),
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
        let Some((old, dir)) = self.served_for_in_place_change(
            &args.namespace.id,
            &args.agent.id,
            paths,
            &args.revision.id,
            current,
            &candidate.harness,
            candidate.needs_password,
        )?
        else {
            return Ok(None);
        };
        if old.configuration_hash != candidate.configuration_hash {
            return Ok(None);
        }
        let served = old.revision_id;
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
        // The snapshot was verified against its hash just above; a configuration that does
        // not parse has no references to check.
        let bytes = fsutil::read_small(&dir.join("openclaw.json"), CONFIGURATION_MAX)
            .map_err(fs_failure)?;
        let refs = serde_json::from_slice::<Value>(&bytes)
            .map(|config| rendered_refs(&config))
            .unwrap_or_default();
        Ok(Some(Reload {
            served,
            secrets,
            port,
            ids,
            refs,
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
        match &verified {
            Verified::Fingerprints => {
                tracing::info!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %rev.id, secrets = ?names, "secrets reloaded without a restart; the gateway holds the delivered fingerprints");
            }
            Verified::Unverifiable(unchecked) => {
                tracing::warn!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %rev.id, secrets = ?names, unchecked = ?unchecked, "secrets reloaded without a restart; not every reference could be read back from the gateway, so what it holds there is NOT verified");
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
                Verified::Unverifiable(_) => clawfleet_protocol::result::SecretsReload::Unverified,
            }),
            config_reload: None,
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
                return verify_by_resolve(&mut rpc, &plan.refs, &plan.secrets);
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
    pub(super) fn managed_password(
        &self,
        paths: &AgentPaths,
    ) -> Result<Zeroizing<String>, Failure> {
        managed_password(paths)
    }
}

/// The managed gateway password from the Agent's password file (the line
/// `OPENCLAW_GATEWAY_PASSWORD=<password>` hostd writes); also the relay's, for the gateway
/// route's last hop.
pub(crate) fn managed_password(paths: &AgentPaths) -> Result<Zeroizing<String>, Failure> {
    {
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

/// Every rendered reference in `config`, depth first, with its JSON path (object keys, and
/// array indices as decimal).
fn rendered_refs(config: &Value) -> Vec<SecretRef> {
    fn walk(v: &Value, path: &mut Vec<String>, out: &mut Vec<SecretRef>) {
        match v {
            Value::Object(map) => {
                if map.len() == 3
                    && map.get("source").and_then(Value::as_str) == Some("file")
                    && map.get("id").and_then(Value::as_str) == Some(SINGLE_VALUE_ID)
                    && let Some(provider) = map.get("provider").and_then(Value::as_str)
                    && provider.starts_with("clawfleet-")
                {
                    out.push(SecretRef {
                        provider: provider.to_owned(),
                        path: path.clone(),
                    });
                    return;
                }
                for (k, child) in map {
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    path.push(i.to_string());
                    walk(child, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(config, &mut Vec::new(), &mut out);
    out
}

/// What the gateway holds at one reference.
enum Held {
    /// The fingerprint of the value it resolved the reference to.
    Value(SecretFingerprint),
    /// It reports the reference inactive (its owner is turned off), or knows no credential
    /// surface by its path: nothing to compare.
    Unchecked,
    /// It resolved nothing there.
    Nothing,
}

/// Asks OpenClaw's `secrets.resolve` for the value the reference at `path` resolved to in its
/// active snapshot, trying the credential-surface ids of [`surface_ids`] (shared with the Kubernetes backend), and keeps only the
/// value's fingerprint.
fn held_at(rpc: &mut GatewayRpc, path: &[String]) -> Result<Held, Failure> {
    let concrete = path.join(".");
    for id in surface_ids(path) {
        let params = json!({
            "commandName": "clawfleet-hostd",
            "targetIds": [id],
            "allowedPaths": [concrete],
        });
        let answer = match rpc.request(RESOLVE_METHOD, params) {
            Ok(answer) => answer,
            Err(RpcError::Refused { code, message, .. })
                if code == "INVALID_REQUEST" && message.contains("unknown target id") =>
            {
                continue;
            }
            Err(e) => {
                return Err(Failure::new(
                    FailureCode::SecretFingerprintMismatch,
                    format!("cannot read what the gateway holds at {concrete}: {e}"),
                ));
            }
        };
        let value = answer["assignments"].as_array().and_then(|a| {
            a.iter()
                .find(|x| x["path"].as_str() == Some(concrete.as_str()))
                .and_then(|x| x["value"].as_str())
        });
        if let Some(v) = value {
            return Ok(Held::Value(SecretFingerprint::of(v.as_bytes())));
        }
        let inactive = answer["inactiveRefPaths"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p.as_str() == Some(concrete.as_str())));
        return Ok(if inactive {
            Held::Unchecked
        } else {
            Held::Nothing
        });
    }
    Ok(Held::Unchecked)
}

/// OpenClaw's check: every rendered reference to a delivered secret resolved, in the
/// gateway's active snapshot, to the delivered value (by fingerprint). The values come over
/// the loopback RPC authenticated with the managed password, are hashed at once and dropped.
fn verify_by_resolve(
    rpc: &mut GatewayRpc,
    refs: &[SecretRef],
    secrets: &[SecretVersion],
) -> Result<Verified, Failure> {
    let (mut checked, mut unchecked, mut wrong) = (0, Vec::new(), Vec::new());
    for s in secrets {
        let provider = provider_name(&s.name);
        for r in refs.iter().filter(|r| r.provider == provider) {
            let at = r.path.join(".");
            match held_at(rpc, &r.path)? {
                Held::Value(fp) if fp == s.fingerprint => checked += 1,
                Held::Value(fp) => wrong.push(format!(
                    "{} version {} ({}) at {at}: the gateway holds {fp}",
                    s.name, s.version, s.fingerprint
                )),
                Held::Nothing => wrong.push(format!(
                    "{} version {} ({}) at {at}: the gateway holds nothing",
                    s.name, s.version, s.fingerprint
                )),
                Held::Unchecked => unchecked.push(at),
            }
        }
    }
    if !wrong.is_empty() {
        return Err(Failure::new(
            FailureCode::SecretFingerprintMismatch,
            format!(
                "after secrets.reload the gateway does not hold the delivered secrets: {}",
                wrong.join("; ")
            ),
        ));
    }
    if checked > 0 && unchecked.is_empty() {
        Ok(Verified::Fingerprints)
    } else {
        Ok(Verified::Unverifiable(unchecked))
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
    fn rendered_references_are_found_with_their_paths() {
        let config = json!({
            "gateway": {"auth": {"password": {"source": "env", "provider": "default", "id": "X"}}},
            "models": {"providers": {"acme": {"apiKey":
                {"source": "file", "provider": "clawfleet-model-key", "id": "value"}}}},
            "list": [{"token": {"source": "file", "provider": "clawfleet-bot", "id": "value"}}],
            "other": {"source": "file", "provider": "someone-else", "id": "value"},
            "extra": {"source": "file", "provider": "clawfleet-x", "id": "value", "more": 1},
        });
        let found = rendered_refs(&config);
        let path = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            found,
            vec![
                SecretRef {
                    provider: "clawfleet-bot".into(),
                    path: path(&["list", "0", "token"]),
                },
                SecretRef {
                    provider: "clawfleet-model-key".into(),
                    path: path(&["models", "providers", "acme", "apiKey"]),
                },
            ]
        );
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
