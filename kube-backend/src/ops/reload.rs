//! A rotation reaching the running gateway without a new Pod (issue 29, clusters):
//! the activation of a secrets-only change ([`super::revision`]) reloads the running
//! gateway's secrets before the Deployment names the candidate;
//! [`crate::KubeBackend::reload_gateway_secrets`] does the same on its own.
//!
//! A secrets-only activation keeps the Pods ([`super::revision`]); the Agent's Secret already
//! holds the new versions (`put_secrets`), and the kubelet projects them into the Pod's
//! volume on its own schedule (its sync period, plus its Secret cache). Nothing exec's into
//! the Pod: the gateway is asked over its own RPC, through the API server's port-forward
//! ([`crate::gateway_stream`], [`crate::gateway_rpc`]), authenticated with the managed
//! password from the Agent's password Secret:
//!
//! 1. `secrets.reload`: the managed exec resolver reads the projected files afresh; a refusal
//!    keeps the gateway's last good snapshot and fails the activation
//!    (`SECRET_RELOAD_FAILED`), as on hosts.
//! 2. `secrets.resolve` at every rendered reference to a clawfleet secret
//!    (`{"source":"exec","provider":"clawfleet","id":<name>}`), each value hashed at once and
//!    compared with the fingerprint the Agent's Secret records for its version.
//! 3. While some reference still resolves to another value (the kubelet has not projected
//!    the new Secret yet), both steps are repeated every [`PAUSE`] until the activation's
//!    deadline; then `SECRET_FINGERPRINT_MISMATCH` (retryable) names the secrets still old.
//!
//! The answer is the protocol's [`SecretsReload`]: `Verified` when every reference was read
//! back and matches, `Unverified` when OpenClaw knows some reference by no credential surface
//! or reports it inactive (nothing to compare there), exactly as hostd reports it.

use std::time::{Duration, Instant};

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::result::SecretsReload;
use clawfleet_protocol::sealed::SecretVersion;
use clawfleet_protocol::secret::{SecretFingerprint, surface_ids};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use zeroize::Zeroizing;

use crate::client::Requests;
use crate::gateway_rpc::{GatewayRpc, RpcError};
use crate::names::{self, Markers};
use crate::objects::Obj;
use crate::settings::ClusterSettings;
use crate::{GatewayStreamError, secrets};

/// Between two reloads while the kubelet has not projected the new Secret.
const PAUSE: Duration = Duration::from_secs(1);
/// Each RPC step's limit.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// What `secrets.resolve` is told the caller is.
const COMMAND_NAME: &str = "clawfleet-kube";

/// A rendered reference to a clawfleet secret: its name and JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExecRef {
    pub(crate) name: String,
    pub(crate) path: Vec<String>,
}

/// Every reference to [`secrets::PROVIDER`] in a cluster-rendered `openclaw.json`, depth
/// first, outside `secrets`.
pub(crate) fn exec_refs(rendered: &Value) -> Vec<ExecRef> {
    fn walk(v: &Value, path: &mut Vec<String>, out: &mut Vec<ExecRef>) {
        match v {
            Value::Object(map) => {
                if map.len() == 3
                    && map.get("source").and_then(Value::as_str) == Some("exec")
                    && map.get("provider").and_then(Value::as_str) == Some(secrets::PROVIDER)
                    && let Some(id) = map.get("id").and_then(Value::as_str)
                {
                    out.push(ExecRef {
                        name: id.to_owned(),
                        path: path.clone(),
                    });
                    return;
                }
                for (k, child) in map {
                    if path.is_empty() && k == "secrets" {
                        continue;
                    }
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
    walk(rendered, &mut Vec::new(), &mut out);
    out
}

fn reload_failed(detail: String) -> Failure {
    Failure::new(FailureCode::SecretReloadFailed, detail)
}

fn mismatch(detail: String) -> Failure {
    Failure::new(FailureCode::SecretFingerprintMismatch, detail)
}

/// What the gateway holds at one reference.
enum Held {
    Value(SecretFingerprint),
    Unchecked,
    Nothing,
}

async fn held_at<S: AsyncRead + AsyncWrite + Unpin>(
    rpc: &mut GatewayRpc<S>,
    path: &[String],
) -> Result<Held, Failure> {
    let concrete = path.join(".");
    for id in surface_ids(path) {
        let params = json!({
            "commandName": COMMAND_NAME,
            "targetIds": [id],
            "allowedPaths": [concrete],
        });
        let answer = match rpc.request("secrets.resolve", params).await {
            Ok(a) => a,
            Err(RpcError::Refused { code, message, .. })
                if code == "INVALID_REQUEST" && message.contains("unknown target id") =>
            {
                continue;
            }
            Err(e) => {
                return Err(mismatch(format!(
                    "cannot read what the gateway holds at {concrete}: {e}"
                )));
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

/// One round: reload, then compare. `Ok(Err(stale))` lists the references still old.
async fn round(
    r: &Requests,
    settings: &ClusterSettings,
    namespace_id: &Ident,
    agent: &Ident,
    password: &str,
    refs: &[ExecRef],
    want: &[SecretVersion],
) -> Result<Result<SecretsReload, Vec<String>>, Failure> {
    let limit = r.remaining().min(RPC_TIMEOUT);
    let conn = crate::gateway_stream::open(&r.cc, settings, namespace_id, agent, limit)
        .await
        .map_err(|e| match e {
            GatewayStreamError::Cluster(f) => f,
            GatewayStreamError::Forbidden { .. } => Failure::new(
                FailureCode::KubernetesApiRejected,
                format!("cannot reach the gateway to reload its secrets: {e}"),
            ),
            // No answer from the API server: worth another try.
            GatewayStreamError::Unavailable { .. } => Failure::new(
                FailureCode::KubernetesApiUnavailable,
                format!("cannot reach the gateway to reload its secrets: {e}"),
            ),
            // The Pods kept for the change are not there, not Ready, or refuse the forward:
            // the gateway cannot take the new secrets (hostd answers the same when its
            // gateway does not answer).
            other => reload_failed(format!(
                "cannot reach the gateway to reload its secrets: {other}"
            )),
        })?;
    let mut rpc = GatewayRpc::connect(conn.stream, password, RPC_TIMEOUT)
        .await
        .map_err(|e| {
            reload_failed(format!(
                "cannot reach the gateway to reload its secrets: {e}"
            ))
        })?;
    let answer = rpc
        .request("secrets.reload", json!({}))
        .await
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
    let warnings = answer["warningCount"].as_u64().unwrap_or(0);
    if warnings > 0 {
        return Err(reload_failed(format!(
            "secrets.reload answered with {warnings} warnings: the gateway may keep a stale secret"
        )));
    }
    let (mut checked, mut unchecked, mut stale) = (0, 0, Vec::new());
    for s in want {
        for at in refs.iter().filter(|x| x.name == s.name.as_str()) {
            let where_ = at.path.join(".");
            match held_at(&mut rpc, &at.path).await? {
                Held::Value(fp) if fp == s.fingerprint => checked += 1,
                Held::Value(fp) => stale.push(format!(
                    "{} version {} ({}) at {where_}: the gateway holds {fp}",
                    s.name, s.version, s.fingerprint
                )),
                Held::Nothing => stale.push(format!(
                    "{} version {} ({}) at {where_}: the gateway holds nothing",
                    s.name, s.version, s.fingerprint
                )),
                Held::Unchecked => unchecked += 1,
            }
        }
    }
    if !stale.is_empty() {
        return Ok(Err(stale));
    }
    Ok(Ok(if checked > 0 && unchecked == 0 {
        SecretsReload::Verified
    } else {
        SecretsReload::Unverified
    }))
}

/// The `openclaw.json` the Agent's Pods run: the ConfigMap of the revision their template
/// names.
async fn running_configuration(
    r: &Requests,
    settings: &ClusterSettings,
    namespace_id: &Ident,
    agent: &Ident,
) -> Result<String, Failure> {
    let t = settings.tenant(namespace_id);
    let n = names::agent(agent);
    let deployments: Obj<Deployment> = Obj::namespaced(r, &t.name, "Deployment");
    let not_running = || {
        Failure::new(
            FailureCode::RevisionNotPrepared,
            format!(
                "Agent {agent} has no Deployment {} in {}: nothing runs to reload",
                n.gateway, t.name
            ),
        )
    };
    let dep = deployments
        .get_owned(r, &n.gateway, &Markers::agent(&t.id, agent))
        .await?
        .ok_or_else(not_running)?;
    let running = crate::observe::pod_revision(&dep)?.ok_or_else(not_running)?;
    let name = names::revision_config_map(agent, &running);
    let cms: Obj<ConfigMap> = Obj::namespaced(r, &t.name, "ConfigMap");
    let cm = cms
        .get_owned(r, &name, &Markers::revision(namespace_id, agent, &running))
        .await?
        .ok_or_else(|| {
            Failure::new(
                FailureCode::RevisionNotPrepared,
                format!("the ConfigMap {name} of the running revision {running} is gone"),
            )
        })?;
    super::revision::rendered_of(&cm)
        .map(str::to_owned)
        .ok_or_else(|| {
            Failure::new(
                FailureCode::KubernetesConfigurationInvalid,
                format!("ConfigMap {name} holds no {}", names::CONFIG_KEY),
            )
        })
}

/// Reloads the running gateway's secrets and verifies them (see the module comment), within
/// the operation's deadline.
pub(crate) async fn reload_and_verify(
    r: &Requests,
    settings: &ClusterSettings,
    namespace_id: &Ident,
    agent: &Ident,
) -> Result<SecretsReload, Failure> {
    let rendered = running_configuration(r, settings, namespace_id, agent).await?;
    let t = settings.tenant(namespace_id);
    let n = names::agent(agent);
    let markers = Markers::agent(&t.id, agent);
    let objs: Obj<Secret> = Obj::namespaced(r, &t.name, "Secret");
    let want = objs
        .get_owned(r, &n.secrets, &markers)
        .await?
        .as_ref()
        .and_then(secrets::versions_of)
        .ok_or_else(|| {
            mismatch(format!(
                "Secret {} carries no {} annotation: nothing to verify the gateway against",
                n.secrets,
                secrets::VERSIONS
            ))
        })?;
    let password = objs
        .get_owned(r, &n.password, &markers)
        .await?
        .and_then(|s| s.data?.remove(names::PASSWORD_KEY))
        .and_then(|b| String::from_utf8(b.0).ok())
        .map(Zeroizing::new)
        .ok_or_else(|| {
            reload_failed(format!(
                "Secret {} holds no {}: the gateway's password is unknown",
                n.password,
                names::PASSWORD_KEY
            ))
        })?;
    let rendered: Value = serde_json::from_str(&rendered).map_err(|_| {
        Failure::new(
            FailureCode::KubernetesConfigurationInvalid,
            "the revision's openclaw.json is not JSON",
        )
    })?;
    let refs = exec_refs(&rendered);
    let started = Instant::now();
    let mut rounds = 0u32;
    loop {
        rounds += 1;
        match round(r, settings, namespace_id, agent, &password, &refs, &want).await? {
            Ok(done) => {
                let names: Vec<String> = want
                    .iter()
                    .map(|v| format!("{}@{} {}", v.name, v.version, v.fingerprint))
                    .collect();
                tracing::info!(agent = %agent, secrets = ?names, rounds, elapsed_ms = started.elapsed().as_millis() as u64, verified = matches!(done, SecretsReload::Verified), "the gateway reloaded its secrets without a restart");
                return Ok(done);
            }
            Err(stale) => {
                if r.remaining() <= PAUSE + RPC_TIMEOUT.min(Duration::from_secs(2)) {
                    return Err(mismatch(format!(
                        "after {rounds} reloads over {} s the gateway still holds other values \
                         (the kubelet had not projected the Agent's Secret yet): {}",
                        started.elapsed().as_secs(),
                        stale.join("; ")
                    )));
                }
                tracing::debug!(agent = %agent, rounds, "the gateway still holds the previous secrets; the kubelet has not projected the new ones yet");
                tokio::time::sleep(PAUSE).await;
            }
        }
    }
}

/// The Agent's managed gateway password from its password Secret (owned by the Agent),
/// `None` when there is no such Secret or key.
pub(crate) async fn managed_password(
    r: &Requests,
    settings: &ClusterSettings,
    namespace_id: &Ident,
    agent: &Ident,
) -> Result<Option<Zeroizing<String>>, Failure> {
    let t = settings.tenant(namespace_id);
    let n = names::agent(agent);
    let markers = Markers::agent(&t.id, agent);
    let objs: Obj<Secret> = Obj::namespaced(r, &t.name, "Secret");
    let bytes = objs
        .get_owned(r, &n.password, &markers)
        .await?
        .and_then(|s| s.data?.remove(names::PASSWORD_KEY));
    match bytes {
        None => Ok(None),
        Some(b) => String::from_utf8(b.0)
            .map(|p| Some(Zeroizing::new(p)))
            .map_err(|_| {
                Failure::new(
                    FailureCode::KubernetesConfigurationInvalid,
                    format!(
                        "Secret {} holds a {} that is not UTF-8",
                        n.password,
                        names::PASSWORD_KEY
                    ),
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn exec_refs_are_found_outside_the_secrets_section() {
        let v = json!({
            "secrets": {"providers": {"clawfleet": {"source": "exec", "command": "/x"}}},
            "models": {"providers": {"acme": {
                "apiKey": {"source": "exec", "provider": "clawfleet", "id": "model-key"}}}},
            "channels": {"x": {"tokens": [
                {"source": "exec", "provider": "other", "id": "a"},
                {"source": "exec", "provider": "clawfleet", "id": "bot"}]}},
        });
        let refs = exec_refs(&v);
        assert_eq!(
            refs,
            vec![
                ExecRef {
                    name: "bot".into(),
                    path: vec!["channels".into(), "x".into(), "tokens".into(), "1".into()],
                },
                ExecRef {
                    name: "model-key".into(),
                    path: vec![
                        "models".into(),
                        "providers".into(),
                        "acme".into(),
                        "apiKey".into()
                    ],
                },
            ]
        );
    }
}
