//! Initial workspace files on a cluster: a Secret per Agent (`gw-workspace-<suffix>`) holding
//! the manifest and, until the first successful activation, the contents; and an init
//! container in the gateway Pod that writes them once into the state volume's workspace
//! (`$OPENCLAW_STATE_DIR/workspace`) before the gateway runs, as the gateway's own uid, then
//! writes a completion marker on the volume. Later Pods see the marker and write nothing, so
//! live edits are kept; a Pod whose marker is missing and whose contents are gone fails its
//! init container (exit 78), so the gateway never starts without its setup.
//!
//! Differences from a host, named: the marker lives on the Agent's own volume (a cluster has
//! no root-owned place the gateway cannot write), and the files are written as the gateway's
//! uid (existing files are never overwritten: `set -C`, and a link or other file in a file's
//! place fails the init container).

use base64::Engine as _;
use clawfleet_protocol::operation::AgentRef;
use clawfleet_protocol::workspace::{WorkspaceFileMeta, WorkspaceSetup};
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use crate::names::{self, Tenant};
use crate::render::{RenderError, STATE_MOUNT};

/// The Secret key of the manifest (names, sizes, digests).
pub const MANIFEST_KEY: &str = "manifest.json";
/// Annotation on the Secret: `held` while it carries the contents, `dropped` after.
pub const CONTENTS: &str = "clawfleet.dev/workspace-contents";
/// Where the init container sees the Secret.
const SETUP_MOUNT: &str = "/clawfleet/workspace-setup";
/// The completion marker on the state volume (outside `state/`, the gateway's directory).
pub const MARKER: &str = ".clawfleet-workspace-applied";
/// The init container's name.
pub const INIT_CONTAINER: &str = "initialize-workspace";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The Secret key of the `i`-th file of the manifest.
fn key(i: usize) -> String {
    format!("f{i:02}")
}

/// The Agent's workspace Secret: the manifest, and the contents when `setup` carries them.
pub fn secret(
    ns: &Tenant,
    agent: &AgentRef,
    setup: &WorkspaceSetup,
) -> Result<Secret, RenderError> {
    let manifest = serde_json::to_string(&setup.manifest).map_err(|e| RenderError::Shape {
        object: "Secret".into(),
        reason: e.to_string(),
    })?;
    let mut data = serde_json::Map::new();
    data.insert(MANIFEST_KEY.into(), json!(b64(manifest.as_bytes())));
    if let Some(files) = &setup.files {
        for (i, meta) in setup.manifest.iter().enumerate() {
            if let Some(f) = files.iter().find(|f| f.name == meta.name) {
                data.insert(key(i), json!(b64(&f.content)));
            }
        }
    }
    let mut meta = crate::render::agent_meta(ns, agent, &names::agent(&agent.id).workspace);
    meta["annotations"][CONTENTS] = json!(if setup.files.is_some() {
        "held"
    } else {
        "dropped"
    });
    crate::render::typed(
        "Secret",
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": meta,
            "type": "Opaque",
            "data": Value::Object(data),
        }),
    )
}

/// The manifest a workspace Secret holds, or why it cannot be read.
pub fn manifest_of(secret: &Secret) -> Result<Vec<WorkspaceFileMeta>, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(MANIFEST_KEY))
        .ok_or_else(|| format!("the workspace Secret has no {MANIFEST_KEY}"))?;
    let manifest: Vec<WorkspaceFileMeta> = serde_json::from_slice(&bytes.0)
        .map_err(|e| format!("the workspace Secret's {MANIFEST_KEY} is invalid: {e}"))?;
    clawfleet_protocol::workspace::check_set(
        manifest
            .iter()
            .map(|m| (&m.name, usize::try_from(m.size).unwrap_or(usize::MAX))),
    )
    .map_err(|e| format!("the workspace Secret's {MANIFEST_KEY}: {e}"))?;
    Ok(manifest)
}

/// Whether the Secret still carries file contents.
pub fn holds_contents(secret: &Secret) -> bool {
    secret
        .data
        .as_ref()
        .is_some_and(|d| d.keys().any(|k| k != MANIFEST_KEY))
}

/// The init container's script. Names are checked (`[A-Za-z0-9._-/]` only), so they are safe
/// inside single quotes.
fn script(manifest: &[WorkspaceFileMeta]) -> String {
    let mut s = format!(
        "set -eu\nmarker='{STATE_MOUNT}/{MARKER}'\n[ -f \"$marker\" ] && exit 0\n\
         ws='{STATE_MOUNT}/state/workspace'\nmkdir -p \"$ws\"\nchmod 700 \"$ws\"\nset -C\n"
    );
    for f in manifest {
        let name = f.name.as_str();
        let dir = name.rsplit_once('/').map(|(d, _)| d);
        if let Some(d) = dir {
            s.push_str(&format!("mkdir -p \"$ws/{d}\"\n"));
        }
        s.push_str(&format!(
            "src='{SETUP_MOUNT}/{name}'; dst=\"$ws/{name}\"\n\
             if [ ! -f \"$src\" ]; then echo 'workspace file {name}: its content is no longer held and it was never applied; the gateway stays stopped' >&2; exit 78; fi\n\
             if [ -L \"$dst\" ] || {{ [ -e \"$dst\" ] && {{ [ ! -f \"$dst\" ] || {{ command -v cmp >/dev/null && ! cmp -s \"$src\" \"$dst\"; }}; }}; }}; then echo 'workspace file {name}: something else is in its place in the workspace; nothing was replaced' >&2; exit 78; fi\n\
             if [ ! -e \"$dst\" ]; then cat \"$src\" > \"$dst\"; chmod 600 \"$dst\"; fi\n"
        ));
    }
    s.push_str(": > \"$marker\"\n");
    s
}

/// The init container and its Secret volume, for a Pod whose Agent has a workspace setup.
pub fn init_container_and_volume(
    agent: &AgentRef,
    manifest: &[WorkspaceFileMeta],
    image: &str,
    security: &Value,
) -> (Value, Value) {
    let items: Vec<Value> = manifest
        .iter()
        .enumerate()
        .map(|(i, f)| json!({ "key": key(i), "path": f.name.as_str(), "mode": 0o400 }))
        .collect();
    let container = json!({
        "name": INIT_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script(manifest)],
        "securityContext": security,
        "resources": {
            "requests": { "cpu": "10m", "memory": "16Mi" },
            "limits": { "cpu": "100m", "memory": "64Mi" },
        },
        "volumeMounts": [
            { "name": "state", "mountPath": STATE_MOUNT },
            { "name": "workspace-setup", "mountPath": SETUP_MOUNT, "readOnly": true },
        ],
    });
    // Optional: once the contents are dropped the keys are gone, and the marker decides.
    let volume = json!({ "name": "workspace-setup", "secret": {
        "secretName": names::agent(&agent.id).workspace,
        "optional": true,
        "items": items,
    } });
    (container, volume)
}
