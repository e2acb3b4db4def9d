//! Issue 29 (clusters), against the real OpenClaw 2026.9.6 secret resolution code: what the
//! Kubernetes backend renders for an Agent that binds secrets (the init container's script and
//! the cluster `openclaw.json`'s exec provider) resolves a value from a Secret volume laid out
//! as the kubelet projects it (root-owned files, mode 0440 to the Pod's fsGroup, reached
//! through `..data` symlinks), and follows a rotation (the kubelet swapping `..data`) at the
//! next resolution; OpenClaw's own file provider refuses that projection, which is why the
//! exec provider is rendered.
//!
//! No kubelet runs here: a private mount namespace gets a tmpfs on `/run` holding the
//! projection and the memory emptyDir, the script runs as the Pod's uid 1000 (group 1000, the
//! fsGroup), and so does a Node process that imports OpenClaw's resolver module from the
//! cached bundle (the one the real-gateway tests use) and resolves the references.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use clawfleet_kube::{ClusterSettings, names, render};
use clawfleet_protocol::operation::{AgentRef, RevisionNumber, RevisionRef};
use clawfleet_protocol::{Configuration, Ident, Sha256Hex};
use serde_json::{Value, json};

const FIRST: &str = "xoxb-resolver-first-61c2";
const SECOND: &str = "xoxb-resolver-second-93fa";

fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

/// The init container's script and the rendered `secrets.providers`, as the backend renders
/// them for an Agent binding `slack-bot`.
fn rendered() -> (String, Value) {
    let host_form = Configuration::new(json!({
        "channels": { "slack": { "botToken":
            { "source": "file", "provider": "clawfleet-slack-bot", "id": "value" } } },
        "secrets": { "providers": { "clawfleet-slack-bot":
            { "source": "file", "path": "/run/clawfleet/secrets/slack-bot", "mode": "singleValue" } } },
    }))
    .unwrap();
    let text = render::cluster_configuration(&host_form).unwrap();
    let cluster: Value = serde_json::from_str(&text).unwrap();
    let rev = RevisionRef {
        id: id("r1"),
        number: RevisionNumber::new(1).unwrap(),
        configuration_hash: Sha256Hex::new("a".repeat(64)).unwrap(),
    };
    let agent = AgentRef {
        id: id("a"),
        service_principal_id: id("sp"),
    };
    let settings = ClusterSettings::new(format!("r.example/gw@sha256:{}", "b".repeat(64)));
    let template = render::Template {
        revision: &rev,
        secrets: true,
    };
    let tenant = names::Tenant::managed(&id("ns"));
    let d = render::deployment_for(&tenant, &agent, &rev, template, &settings, None).unwrap();
    let d = serde_json::to_value(&d).unwrap();
    let init = d["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == clawfleet_kube::secrets::INIT_CONTAINER)
        .unwrap()
        .clone();
    assert_eq!(init["command"][0], "/bin/sh");
    (
        init["command"][2].as_str().unwrap().to_owned(),
        cluster["secrets"]["providers"].clone(),
    )
}

/// OpenClaw's bundled module holding `resolveSecretRefValues`, and the name it exports it as.
fn resolver_module(openclaw_mjs: &Path) -> (PathBuf, String) {
    let dist = openclaw_mjs.parent().unwrap().join("dist");
    for e in std::fs::read_dir(&dist).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("resolve-") && name.ends_with(".mjs")) {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        if !text.contains("async function resolveExecRefs") {
            continue;
        }
        let export = text
            .lines()
            .rev()
            .find(|l| l.starts_with("export {"))
            .unwrap();
        let alias = export
            .split(',')
            .find_map(|part| {
                let part = part.trim().trim_start_matches("export {").trim();
                part.strip_prefix("resolveSecretRefValues as ")
                    .map(|a| a.trim_end_matches(['}', ';', ' ']).to_owned())
            })
            .unwrap_or_else(|| panic!("no resolveSecretRefValues export in {name}: {export}"));
        return (e.path(), alias);
    }
    panic!("no OpenClaw resolver module in {}", dist.display());
}

#[test]
fn the_rendered_exec_provider_resolves_a_projected_secret_and_follows_a_rotation() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    if let Some(reason) = clawfleet_vm_tests::openclaw::skip_reason() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true: this test must run, but {reason}");
        }
        println!("SKIP: {reason}");
        return;
    }
    let harness = clawfleet_vm_tests::HarnessConfig::from_env().unwrap();
    let bundle = clawfleet_vm_tests::openclaw::ensure_cached(&harness).unwrap();
    let (module, alias) = resolver_module(&bundle.openclaw_mjs);
    let (install, providers) = rendered();
    let exec = &providers["clawfleet"];
    assert_eq!(exec["source"], "exec", "{providers}");

    // Readable by the Pod's uid, which runs the script and the probe.
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = |n: &str| dir.path().join(n).display().to_string();
    std::fs::write(path("install.sh"), &install).unwrap();
    let probe = format!(
        r#"const {{ {alias}: resolve }} = await import({module:?});
const tries = [
  ["exec", {{ clawfleet: {exec} }}, {{ source: "exec", provider: "clawfleet", id: "slack-bot" }}],
  ["file", {{ f: {{ source: "file", path: "/run/clawfleet/secrets/slack-bot", mode: "singleValue" }} }}, {{ source: "file", provider: "f", id: "value" }}],
  ["file-data", {{ f: {{ source: "file", path: "/run/clawfleet/secrets/..data/slack-bot", mode: "singleValue" }} }}, {{ source: "file", provider: "f", id: "value" }}],
];
const out = {{}};
for (const [label, providers, ref] of tries) {{
  try {{
    const m = await resolve([ref], {{ config: {{ secrets: {{ providers }} }}, env: {{}} }});
    out[label] = {{ ok: [...m.values()][0] }};
  }} catch (e) {{ out[label] = {{ error: String(e.message) }}; }}
}}
console.log(JSON.stringify(out));
"#,
        module = module.display().to_string(),
    );
    std::fs::write(path("probe.mjs"), probe).unwrap();
    let node = bundle.node.display().to_string();
    let node_dir = bundle.node.parent().unwrap().display().to_string();
    // As the kubelet projects a Secret volume: a timestamped directory, `..data` pointing at
    // it (swapped atomically on an update), each key a symlink through `..data`; files
    // root-owned, 0440, group the fsGroup. The memory emptyDir: root:<fsGroup>, setgid, 0777.
    let script = format!(
        r#"set -eu
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/clawfleet/secrets /run/clawfleet/bin
chown 0:1000 /run/clawfleet/bin; chmod 2777 /run/clawfleet/bin
project() {{
  d="/run/clawfleet/secrets/..$2"
  mkdir "$d"; printf '%s' "$1" > "$d/slack-bot"; chown 0:1000 "$d/slack-bot"; chmod 0440 "$d/slack-bot"
  ln -s "..$2" /run/clawfleet/secrets/..data_tmp
  mv -T /run/clawfleet/secrets/..data_tmp /run/clawfleet/secrets/..data
  [ -L /run/clawfleet/secrets/slack-bot ] || ln -s ..data/slack-bot /run/clawfleet/secrets/slack-bot
}}
as_pod() {{ setpriv --reuid=1000 --regid=1000 --groups=1000 env -i PATH={node_dir}:/usr/bin:/bin HOME=/tmp "$@"; }}
project '{FIRST}' 2026_12_04_18_00_00.1
as_pod /bin/sh {install}
stat -c 'resolver %U:%G %a %F' /run/clawfleet/bin/clawfleet-secrets | sed 's/^/# /'
as_pod {node} {probe}
project '{SECOND}' 2026_12_04_18_01_00.2
as_pod {node} {probe}
"#,
        install = path("install.sh"),
        probe = path("probe.mjs"),
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "/bin/sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let runs: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "{stdout}\n{stderr}");
    // The resolver is the Pod uid's, 0500: OpenClaw's exec-command checks pass.
    assert!(stdout.contains("# resolver "), "{stdout}");
    assert!(stdout.contains(" 500 regular file"), "{stdout}");
    assert_eq!(runs[0]["exec"]["ok"], FIRST, "{stdout}\n{stderr}");
    assert_eq!(
        runs[1]["exec"]["ok"], SECOND,
        "the rotation is read at the next resolution: {stdout}\n{stderr}"
    );
    for run in &runs {
        let link = run["file"]["error"].as_str().unwrap_or_default();
        assert!(link.contains("must not be a symlink"), "{run}");
        let data = run["file-data"]["error"].as_str().unwrap_or_default();
        assert!(
            data.contains("too open") || data.contains("owned by"),
            "{run}"
        );
    }
}
