//! An Agent's secrets on a cluster: one Secret per Agent (`gw-secrets-<suffix>`), mounted as a
//! volume in the gateway Pod (never as environment variables), resolved by the gateway through
//! a managed `exec` provider.
//!
//! Why an exec provider. OpenClaw's `file` provider (2026.9.6, `@openclaw/fs-safe`
//! `readSecureFile`) refuses a path that is a symlink, a file others may read or write, and a
//! file not owned by the gateway's effective uid. The kubelet projects a Secret volume as
//! root-owned files reached through symlinks (`<key>` -> `..data/<key>`), group-readable
//! through `fsGroup`: every one of those checks fails, whatever `defaultMode` and `fsGroup`
//! say, and a `subPath` mount (no symlink) never receives updates. An init step copying the
//! values into a memory emptyDir passes the checks but runs once per Pod, so it cannot follow a
//! rotation. So the gateway resolves through one exec provider, `clawfleet`, whose command is a
//! small fixed resolver ([`RESOLVER_SOURCE`]): it reads `/run/clawfleet/secrets/<name>` (the
//! kubelet's current projection) each time the gateway resolves (at start and on every
//! `secrets.reload`), so a rotation reaches the gateway without a new Pod.
//!
//! OpenClaw's checks on an exec command (`assertSecureExecCommandPath`): an absolute path to a
//! regular file, not a symlink, inside `trustedDirs`, neither group- nor world-writable, and
//! owned by the gateway's effective uid. An image's own binaries are root-owned, so the
//! resolver is written at Pod start by the init container [`INIT_CONTAINER`] (the gateway's
//! uid, umask 077, mode 0500) into a memory emptyDir that the gateway container mounts
//! read-only. Its first line names the image's `node` (found on `PATH`), so the gateway image
//! needs `/bin/sh` and `node` on `PATH`, as the workspace init container and the default
//! gateway command do. The resolver holds no value; the values reach the Pod only through the
//! Secret volume.
//!
//! Values travel from the coordinator's store to the API server's TLS connection and nowhere
//! else: [`SecretValue`]'s `Debug` omits them, the Secret's annotations carry names, versions
//! and `sha256:` fingerprints only ([`VERSIONS`]), and nothing here logs an object.

use std::collections::BTreeMap;
use std::fmt;

use clawfleet_protocol::operation::{AgentRef, NamespaceRef};
use clawfleet_protocol::sealed::SecretVersion;
use clawfleet_protocol::secret::{self, SecretFingerprint, SecretName};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Map, Value, json};
use zeroize::Zeroizing;

use crate::names::{self, Tenant};
use crate::render::{RenderError, agent_meta, typed};

/// Annotation on the Agent's secrets Secret: the names, versions and fingerprints it holds
/// (JSON, sorted by name), never a value.
pub const VERSIONS: &str = "clawfleet.dev/secret-versions";
/// The one secret provider the cluster rendering of `openclaw.json` configures.
pub const PROVIDER: &str = "clawfleet";
/// Where the Secret volume is mounted in the gateway container: the protocol's fixed
/// directory, so a secret's file is at [`secret::path`] on hosts and clusters alike.
pub const MOUNT: &str = secret::DIRECTORY;
/// The memory emptyDir holding the resolver (read-only in the gateway container).
pub const RESOLVER_DIR: &str = "/run/clawfleet/bin";
/// The resolver: the exec provider's command.
pub const RESOLVER: &str = "/run/clawfleet/bin/clawfleet-secrets";
/// The init container that writes the resolver.
pub const INIT_CONTAINER: &str = "install-secret-resolver";
/// Volume names in the Pod.
pub const VOLUME: &str = "secrets";
pub const RESOLVER_VOLUME: &str = "secret-resolver";
/// How long one resolution may take (a node start on a busy node, with room).
const RESOLVER_TIMEOUT_MS: u64 = 10_000;

/// The resolver (CommonJS, run by the image's node): reads the request on stdin, answers the
/// value of each requested secret from the Secret volume, or an error naming the secret (never
/// a value in an error). Ids are secret names, so they cannot leave the directory.
pub const RESOLVER_SOURCE: &str = r#"'use strict';
const fs = require('fs');
const DIR = '/run/clawfleet/secrets';
const NAME = /^[a-z][a-z0-9-]{0,47}$/;
let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  input += chunk;
  if (input.length > 1048576) {
    process.stderr.write('clawfleet-secrets: the request is too large\n');
    process.exit(2);
  }
});
process.stdin.on('end', () => {
  let request;
  try {
    request = JSON.parse(input);
  } catch (e) {
    process.stderr.write('clawfleet-secrets: the request is not JSON\n');
    process.exit(2);
  }
  const values = {};
  const errors = {};
  for (const id of Array.isArray(request.ids) ? request.ids : []) {
    if (typeof id !== 'string' || !NAME.test(id)) {
      errors[String(id)] = { message: 'not a clawfleet secret name' };
      continue;
    }
    try {
      values[id] = fs.readFileSync(DIR + '/' + id, 'utf8');
    } catch (e) {
      errors[id] = { message: 'secret ' + id + ' is not in this Pod (' + (e.code || 'unreadable') + ')' };
    }
  }
  process.stdout.write(JSON.stringify({ protocolVersion: 1, values: values, errors: errors }));
});
"#;

/// One secret version's value, on its way from the coordinator's store to the cluster. `Debug`
/// shows its name, version and fingerprint, never the value; the value is wiped when dropped.
pub struct SecretValue {
    pub name: SecretName,
    pub version: u64,
    pub fingerprint: SecretFingerprint,
    pub value: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretValue")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl SecretValue {
    /// Its name, version and fingerprint.
    pub fn version(&self) -> SecretVersion {
        SecretVersion {
            name: self.name.clone(),
            version: self.version,
            fingerprint: self.fingerprint.clone(),
        }
    }
}

/// The Agent's whole set of secrets for `KubeBackend::put_secrets` (an empty set removes the
/// Secret), the cluster's counterpart of hostd's `put-secrets`.
#[derive(Debug)]
pub struct AgentSecrets {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
    pub secrets: Vec<SecretValue>,
}

impl AgentSecrets {
    /// Checks what the types cannot: at most [`MAX_SECRETS_PER_AGENT`](clawfleet_protocol::sealed::MAX_SECRETS_PER_AGENT), each name once,
    /// versions from 1, each value a valid secret value whose fingerprint is the stated one.
    /// The error is the field's path and a sentence, never a value.
    pub fn check(&self) -> Result<(), (String, String)> {
        clawfleet_protocol::sealed::check_set(self.secrets.iter().map(|s| (&s.name, s.version)))?;
        for (i, s) in self.secrets.iter().enumerate() {
            secret::check_value(&s.value).map_err(|e| {
                (
                    format!("secrets[{i}].value"),
                    format!("secret {}: the value {e}", s.name),
                )
            })?;
            if SecretFingerprint::of(&s.value) != s.fingerprint {
                return Err((
                    format!("secrets[{i}].fingerprint"),
                    format!(
                        "secret {} version {}: the value does not have fingerprint {}",
                        s.name, s.version, s.fingerprint
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The set's names, versions and fingerprints, by name.
    pub fn versions(&self) -> Vec<SecretVersion> {
        let mut v: Vec<_> = self.secrets.iter().map(SecretValue::version).collect();
        v.sort();
        v
    }
}

/// The Agent's secrets Secret: one key per secret (its name), the value as data; the
/// versions and fingerprints in [`VERSIONS`].
pub fn secret(ns: &Tenant, agent: &AgentRef, set: &AgentSecrets) -> Result<Secret, RenderError> {
    let versions = serde_json::to_string(&set.versions()).map_err(|e| RenderError::Shape {
        object: "Secret".into(),
        reason: e.to_string(),
    })?;
    let mut meta = agent_meta(ns, agent, &names::agent(&agent.id).secrets);
    meta["annotations"][VERSIONS] = json!(versions);
    // The data is set on the typed object, never through JSON text.
    let mut s: Secret = typed(
        "Secret",
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": meta,
            "type": "Opaque",
        }),
    )?;
    let data: BTreeMap<String, ByteString> = set
        .secrets
        .iter()
        .map(|v| (v.name.to_string(), ByteString(v.value.to_vec())))
        .collect();
    s.data = Some(data);
    Ok(s)
}

/// The versions a secrets Secret says it holds; `None` when the annotation is missing or not
/// clawfleet's.
pub fn versions_of(s: &Secret) -> Option<Vec<SecretVersion>> {
    recorded_versions(&s.metadata)
}

/// [`versions_of`] from a Secret's metadata alone (a metadata-only list has no `Secret`).
pub fn recorded_versions(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Vec<SecretVersion>> {
    let text = meta.annotations.as_ref()?.get(VERSIONS)?;
    serde_json::from_str(text).ok()
}

/// Whether a live Secret holds exactly what `want` holds (keys, values, versions, type).
pub fn same_content(live: &Secret, want: &Secret) -> bool {
    let empty = BTreeMap::new();
    live.data.as_ref().unwrap_or(&empty) == want.data.as_ref().unwrap_or(&empty)
        && live.string_data.as_ref().is_none_or(BTreeMap::is_empty)
        && live.type_ == want.type_
        && versions_of(live) == versions_of(want)
}

/// The provider `clawfleet-<name>` the coordinator rendered for a host (a single-value file
/// provider reading [`secret::path`]): the secret's name, or `None` when `provider` is
/// anything else.
fn host_provider(alias: &str, provider: &Value) -> Option<SecretName> {
    let name = SecretName::new(alias.strip_prefix("clawfleet-")?).ok()?;
    let expected = json!({"source": "file", "path": secret::path(&name), "mode": "singleValue"});
    (*provider == expected).then_some(name)
}

/// Rewrites the coordinator's secret providers for a Pod: every `clawfleet-<name>` file
/// provider goes, the one exec provider [`PROVIDER`] comes, and every reference
/// `{"source": "file", "provider": "clawfleet-<name>", "id": "value"}` becomes
/// `{"source": "exec", "provider": "clawfleet", "id": "<name>"}`. Any other provider is
/// refused (the coordinator renders only its own). Returns the secret names, sorted.
pub(crate) fn bind_for_cluster(
    root: &mut Map<String, Value>,
) -> Result<Vec<SecretName>, RenderError> {
    let refuse = |field: String, reason: &str| RenderError::Refused {
        field,
        reason: reason.to_owned(),
    };
    let Some(secrets) = root.get_mut("secrets") else {
        return Ok(Vec::new());
    };
    let secrets = secrets
        .as_object_mut()
        .ok_or_else(|| refuse("secrets".into(), "must be an object"))?;
    let Some(providers) = secrets.remove("providers") else {
        return Ok(Vec::new());
    };
    let providers = providers
        .as_object()
        .ok_or_else(|| refuse("secrets.providers".into(), "must be an object"))?;
    let mut names = Vec::new();
    for (alias, provider) in providers {
        let name = host_provider(alias, provider).ok_or_else(|| {
            refuse(
                format!("secrets.providers.{alias}"),
                "is not a provider clawfleet renders; on a cluster secrets resolve through \
                 clawfleet's own provider only",
            )
        })?;
        names.push(name);
    }
    names.sort();
    if names.is_empty() {
        return Ok(names);
    }
    secrets.insert(
        "providers".to_owned(),
        json!({ PROVIDER: {
            "source": "exec",
            "command": RESOLVER,
            "jsonOnly": true,
            "timeoutMs": RESOLVER_TIMEOUT_MS,
            "trustedDirs": [RESOLVER_DIR],
        } }),
    );
    fn walk(v: &mut Value, names: &[SecretName]) {
        match v {
            Value::Object(map) => {
                let target = (map.len() == 3
                    && map.get("source").and_then(Value::as_str) == Some("file")
                    && map.get("id").and_then(Value::as_str) == Some(secret::SINGLE_VALUE_ID))
                .then(|| map.get("provider").and_then(Value::as_str))
                .flatten()
                .and_then(|p| p.strip_prefix("clawfleet-"))
                .and_then(|n| names.iter().find(|x| x.as_str() == n));
                match target {
                    Some(name) => {
                        *v = json!({"source": "exec", "provider": PROVIDER, "id": name.as_str()});
                    }
                    None => map.values_mut().for_each(|v| walk(v, names)),
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, names)),
            _ => {}
        }
    }
    for (key, v) in root.iter_mut() {
        if key != "secrets" {
            walk(v, &names);
        }
    }
    Ok(names)
}

/// Whether a cluster-rendered `openclaw.json` resolves secrets through [`PROVIDER`] (its Pod
/// then mounts the Agent's secrets).
pub fn binds_secrets(rendered: &str) -> bool {
    serde_json::from_str::<Value>(rendered)
        .ok()
        .and_then(|v| v.get("secrets")?.get("providers")?.get(PROVIDER).cloned())
        .is_some()
}

/// The init container's script: writes the resolver with the image's node as interpreter.
fn install_script() -> String {
    format!(
        "set -eu\n\
         node=$(command -v node) || {{ echo 'clawfleet: the gateway image has no node on PATH; the secret resolver cannot be installed' >&2; exit 78; }}\n\
         umask 077\n\
         f='{RESOLVER}'\n\
         {{ printf '#!%s\\n' \"$node\"; cat <<'CLAWFLEET_RESOLVER_END'\n{RESOLVER_SOURCE}CLAWFLEET_RESOLVER_END\n}} > \"$f.new\"\n\
         chmod 500 \"$f.new\"\n\
         mv -f \"$f.new\" \"$f\"\n"
    )
}

/// The init container writing the resolver, the gateway container's two mounts (the Secret
/// read-only at [`MOUNT`], the resolver read-only at [`RESOLVER_DIR`]) and the Pod's two
/// volumes, for an Agent whose configuration binds secrets.
pub(crate) fn pod_parts(
    agent: &AgentRef,
    image: &str,
    security: &Value,
) -> (Value, Vec<Value>, Vec<Value>) {
    let init = json!({
        "name": INIT_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", install_script()],
        "securityContext": security,
        "resources": {
            "requests": { "cpu": "10m", "memory": "16Mi" },
            "limits": { "cpu": "100m", "memory": "64Mi" },
        },
        "volumeMounts": [{ "name": RESOLVER_VOLUME, "mountPath": RESOLVER_DIR }],
    });
    let mounts = vec![
        json!({ "name": VOLUME, "mountPath": MOUNT, "readOnly": true }),
        json!({ "name": RESOLVER_VOLUME, "mountPath": RESOLVER_DIR, "readOnly": true }),
    ];
    let volumes = vec![
        // 0440 root:<fsGroup>: the gateway's uid reads through the Pod's fsGroup; nobody else
        // runs in the Pod.
        json!({ "name": VOLUME, "secret": {
            "secretName": names::agent(&agent.id).secrets,
            "defaultMode": 0o440,
            "optional": false,
        } }),
        json!({ "name": RESOLVER_VOLUME, "emptyDir": { "medium": "Memory", "sizeLimit": "1Mi" } }),
    ];
    (init, mounts, volumes)
}
