//! Issue 15's initial workspace files on a real test host, through `occ` and the API: three
//! files are in the workspace, owned by the Agent with mode 0600, before the gateway starts
//! (the test gateway lists them as it found them at start); an edit in the live workspace
//! survives revision 2; the coordinator drops the contents after the activation (the database
//! files hold none of a file's unique marker); the marker string appears nowhere in snapshots,
//! the host's journal, hostd's operation journal, the coordinator's log or audit; the start
//! guard keeps the gateway from starting when the completion marker is removed by hand; a link
//! the Agent planted at its workspace makes setup fail with WORKSPACE_SETUP_FAILED without
//! touching the link's target, and the next pass applies the files once it is gone; bad
//! requests are refused naming the file, storing nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::time::{Duration, Instant};

use fleet::{Fleet, NS, Want, document};
use serde_json::{Value, json};

/// In every file's content; must never show up outside the workspace.
const MARK: &str = "cf-ws-marker-4d1c9e7b";

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

fn paths(agent: &str) -> hostd::layout::AgentPaths {
    let id = |s: &str| clawfleet_protocol::Ident::new(s).unwrap();
    layout().agent(&id(NS), &id(agent))
}

fn sha256_hex(bytes: &[u8]) -> String {
    clawfleet_protocol::ident::hex(&clawfleet_protocol::ident::sha256(bytes))
}

/// Writes the three files locally; returns the `--workspace-file` arguments and contents.
fn files(dir: &std::path::Path) -> (Vec<String>, Vec<(&'static str, String)>) {
    let contents = vec![
        ("AGENTS.md", format!("# Agents\nalways {MARK} agents\n")),
        ("SOUL.md", format!("be kind {MARK}\n")),
        ("memory/notes.md", format!("first note {MARK}\n")),
    ];
    let mut args = Vec::new();
    for (i, (name, text)) in contents.iter().enumerate() {
        let p = dir.join(format!("f{i}"));
        std::fs::write(&p, text).unwrap();
        args.push("--workspace-file".to_owned());
        args.push(format!("{name}={}", p.display()));
    }
    (args, contents)
}

fn create_with_files(fleet: &Fleet, agent: &str, doc: &Value, file_args: &[String]) {
    let p = fleet.dir.path().join(format!("cfg-{agent}.json"));
    std::fs::write(&p, doc.to_string()).unwrap();
    let file = p.display().to_string();
    fleet.occ_ok(&["configuration", "create", NS, agent, "--file", &file]);
    let mut args = vec!["agent", "create", NS, agent, "--configuration", agent];
    args.extend(file_args.iter().map(String::as_str));
    fleet.occ_ok(&args);
}

fn workspace_info(fleet: &Fleet, agent: &str) -> Value {
    fleet.occ_json(&["agent", "workspace", NS, agent])
}

fn wait_workspace(fleet: &Fleet, agent: &str, state: &str, timeout: Duration) -> Value {
    let t = Instant::now();
    loop {
        let w = workspace_info(fleet, agent);
        if w["state"] == state {
            return w;
        }
        assert!(
            t.elapsed() < timeout,
            "workspace of {agent} never became {state}: {w}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn info(fleet: &Fleet, agent: &str) -> Value {
    let host = fleet.hosts.iter().next().unwrap();
    let port = fleet.api_agents()[agent]["port"].as_u64().unwrap();
    let out = host
        .run_ok(&format!("curl -sf http://127.0.0.1:{port}/info"))
        .unwrap();
    serde_json::from_str(&out).unwrap()
}

#[test]
fn workspace_files_are_applied_once_before_start_and_never_leak() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let mut fleet = Fleet::start(1);
    let host_name = fleet.host_names()[0].clone();
    let local = tempfile::tempdir().unwrap();
    let (file_args, contents) = files(local.path());

    // --- bad requests: refused naming the file, nothing stored ---
    let bad = local.path().join("bad.json");
    std::fs::write(&bad, document("bad", json!({})).to_string()).unwrap();
    fleet.occ_ok(&[
        "configuration",
        "create",
        NS,
        "bad-cfg",
        "--file",
        &bad.display().to_string(),
    ]);
    let agents_before = fleet.api_agents().len();
    for (files, want_code, want_text) in [
        (
            json!([{"name": "../escape", "content": "x"}]),
            "INVALID_WORKSPACE_FILE",
            "workspaceFiles[0].name",
        ),
        (
            json!([{"name": "/etc/passwd", "content": "x"}]),
            "INVALID_WORKSPACE_FILE",
            "relative path",
        ),
        (
            json!([{"name": "ok.md", "content": "x", "contentBase64": "eA=="}]),
            "INVALID_WORKSPACE_FILE",
            "exactly one of",
        ),
        (
            json!([{"name": "big.md", "content": "x".repeat(65 * 1024)}]),
            "INVALID_WORKSPACE_FILE",
            "\"big.md\" is 66560 bytes",
        ),
        (
            json!([{"name": "a.md", "content": "1"}, {"name": "a.md", "content": "2"}]),
            "INVALID_WORKSPACE_FILE",
            "twice",
        ),
        (
            json!([{"name": "b.md", "contentBase64": "***"}]),
            "INVALID_WORKSPACE_FILE",
            "not valid base64",
        ),
    ] {
        let err = fleet
            .api
            .request(
                "POST",
                &format!("/namespaces/{NS}/agents"),
                Some(&json!({"id": "bad", "configurationId": "bad-cfg", "workspaceFiles": files})),
            )
            .unwrap_err();
        match &err {
            coordinator::client::ClientError::Api {
                status,
                code,
                message,
            } => {
                assert_eq!((*status, code.as_str()), (400, want_code), "{err}");
                assert!(message.contains(want_text), "{message}");
            }
            other => panic!("{other}"),
        }
        assert_eq!(
            fleet.api_agents().len(),
            agents_before,
            "a refused create stored an Agent"
        );
    }

    // --- w1: three files, in place before the gateway starts ---
    create_with_files(&fleet, "w1", &document("w1-v1", json!({})), &file_args);
    let w = workspace_info(&fleet, "w1");
    assert_eq!(w["state"], "pending", "{w}");
    let names: Vec<&str> = w["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["AGENTS.md", "SOUL.md", "memory/notes.md"]);
    assert!(!w.to_string().contains(MARK), "{w}");
    let rev1 = fleet.deploy("w1");
    fleet.wait_converged(
        &[(
            "w1",
            Want::Running {
                rev: rev1.clone(),
                label: "w1-v1".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(90),
    );
    let gw = info(&fleet, "w1");
    let at_start = &gw["workspaceAtStart"];
    let uid = gw["uid"].as_u64().unwrap();
    for (name, text) in &contents {
        let f = &at_start[*name];
        assert_eq!(f["kind"], "file", "{name}: {at_start}");
        assert_eq!(f["sha256"], sha256_hex(text.as_bytes()), "{name}");
        assert_eq!(f["mode"], "600", "{name}");
        assert_eq!(f["uid"].as_u64(), Some(uid), "{name} is not the Agent's");
    }
    assert_eq!(at_start["memory"]["kind"], "dir");
    assert_eq!(at_start["memory"]["mode"], "700");
    let w = wait_workspace(&fleet, "w1", "applied", Duration::from_secs(10));
    assert!(w["appliedAt"].as_i64().is_some(), "{w}");
    assert!(
        w["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["contentHeld"] == false),
        "contents still held after the activation: {w}"
    );

    // --- an edit in the live workspace survives revision 2 ---
    let host = fleet.host(&host_name);
    let p1 = paths("w1");
    let soul = p1.workspace.join("SOUL.md");
    host.run_ok(&format!(
        "runuser -u {} -- sh -c 'echo edited-live > {}'",
        p1.account,
        soul.display()
    ))
    .unwrap();
    let before_rev2 = host
        .run_ok(&format!(
            "stat -c '%i %Y' {}",
            p1.workspace.join("AGENTS.md").display()
        ))
        .unwrap();
    fleet.update_configuration("w1", &document("w1-v2", json!({})));
    let rev2 = fleet.deploy("w1");
    fleet.wait_converged(
        &[(
            "w1",
            Want::Running {
                rev: rev2.clone(),
                label: "w1-v2".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(90),
    );
    let gw = info(&fleet, "w1");
    assert_eq!(
        gw["workspaceAtStart"]["SOUL.md"]["sha256"],
        sha256_hex(b"edited-live\n"),
        "the live edit was overwritten"
    );
    assert_eq!(
        host.run_ok(&format!(
            "stat -c '%i %Y' {}",
            p1.workspace.join("AGENTS.md").display()
        ))
        .unwrap(),
        before_rev2,
        "AGENTS.md was rewritten by revision 2"
    );

    // --- the start guard: no completion marker, no gateway ---
    host.run_ok(&format!(
        "mv {m} {m}.aside && systemctl restart {u} || true",
        m = p1.workspace_applied.display(),
        u = p1.unit_name
    ))
    .unwrap();
    let t = Instant::now();
    loop {
        let state = host
            .run_ok(&format!(
                "systemctl show -p ActiveState --value {}",
                p1.unit_name
            ))
            .unwrap();
        if state.trim() == "failed" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the unit started without the completion marker: {state}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let port = fleet.api_agents()["w1"]["port"].as_u64().unwrap();
    assert!(
        host.run(&format!("curl -sf http://127.0.0.1:{port}/readyz"))
            .map(|o| !o.status.success())
            .unwrap(),
        "the gateway answers without its completion marker"
    );
    let journal = host
        .run_ok(&format!("journalctl -u {} -o cat --no-pager", p1.unit_name))
        .unwrap();
    assert!(
        journal.contains("initial workspace files were requested and have not been applied"),
        "{journal}"
    );
    host.run_ok(&format!(
        "mv {m}.aside {m} && systemctl restart {u}",
        m = p1.workspace_applied.display(),
        u = p1.unit_name
    ))
    .unwrap();

    // --- w2: a link the Agent planted at its workspace ---
    // The first deploy's gateway crashes at start, so the contents stay held after the
    // host applied them; then the workspace is replaced by a link to /etc, as the Agent.
    create_with_files(
        &fleet,
        "w2",
        &document("w2-v1", json!({"crashAtStart": true})),
        &file_args,
    );
    fleet.deploy("w2");
    wait_workspace(&fleet, "w2", "applied", Duration::from_secs(60));
    let p2 = paths("w2");
    let etc_before = host.run_ok("ls -1 /etc | sha256sum").unwrap();
    host.run_ok(&format!(
        "rm -f {marker} && rm -rf {ws} && runuser -u {acct} -- ln -s /etc {ws}",
        marker = p2.workspace_applied.display(),
        ws = p2.workspace.display(),
        acct = p2.account
    ))
    .unwrap();
    fleet.update_configuration("w2", &document("w2-v2", json!({})));
    fleet.deploy("w2");
    let w = wait_workspace(&fleet, "w2", "failed", Duration::from_secs(60));
    assert_eq!(w["failureCode"], "WORKSPACE_SETUP_FAILED", "{w}");
    assert!(
        w["failureMessage"]
            .as_str()
            .unwrap()
            .contains("symbolic link"),
        "{w}"
    );
    assert!(
        !w.to_string().contains("/etc"),
        "the message names a path outside: {w}"
    );
    let status = fleet.status("w2").unwrap();
    assert!(
        status.to_string().contains("WORKSPACE_SETUP_FAILED"),
        "{status}"
    );
    assert_eq!(host.run_ok("ls -1 /etc | sha256sum").unwrap(), etc_before);
    assert!(
        host.run("test -e /etc/AGENTS.md")
            .map(|o| !o.status.success())
            .unwrap(),
        "setup wrote through the link"
    );
    // Once the link is gone the worker's next pass applies the files and the Agent serves.
    host.run_ok(&format!("rm {}", p2.workspace.display()))
        .unwrap();
    let rev = fleet.deploy("w2");
    fleet.wait_converged(
        &[(
            "w2",
            Want::Running {
                rev,
                label: "w2-v2".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(120),
    );
    let gw = info(&fleet, "w2");
    assert_eq!(
        gw["workspaceAtStart"]["AGENTS.md"]["sha256"],
        sha256_hex(contents[0].1.as_bytes())
    );
    wait_workspace(&fleet, "w2", "applied", Duration::from_secs(10));

    // --- the contents leak nowhere ---
    let on_host = host
        .run_ok(&format!(
            "{{ journalctl -o cat --no-pager; journalctl -o json --no-pager; \
               cat /var/lib/clawfleet/journal/* 2>/dev/null; \
               find /var/lib/clawfleet -path '*/revisions/*' -type f -exec cat {{}} +; \
               cat /var/lib/clawfleet/namespaces/*/agents/*/*.json; }} | grep -c {MARK} || true"
        ))
        .unwrap();
    assert_eq!(
        on_host.trim(),
        "0",
        "the marker string is on the host outside workspaces"
    );
    let audit = fleet.api.request("GET", "/audit?limit=500", None).unwrap();
    assert!(
        !audit.to_string().contains(MARK),
        "the audit holds file content"
    );
    assert!(
        audit.to_string().contains("memory/notes.md"),
        "the audit names no file"
    );
    let state = fleet.dir.path().join("state");
    let stop = fleet.stop_serve();
    assert!(stop > 0);
    let mut leaks = Vec::new();
    for entry in std::fs::read_dir(&state).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            if bytes.windows(MARK.len()).any(|w| w == MARK.as_bytes()) {
                leaks.push(p.display().to_string());
            }
        }
    }
    for run in 1..=2 {
        let log = fleet.dir.path().join(format!("serve-{run}.log"));
        if let Ok(text) = std::fs::read_to_string(&log)
            && text.contains(MARK)
        {
            leaks.push(log.display().to_string());
        }
    }
    assert!(leaks.is_empty(), "file content found in {leaks:?}");
    let db = rusqlite::Connection::open(state.join("occ.db")).unwrap();
    let held: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM agent_workspace_files WHERE content IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(held, 0, "the coordinator still holds contents");
    fleet.start_serve();
}
