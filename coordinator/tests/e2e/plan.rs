//! Issue 16's plans on a real test host, through `occ`: for a new Agent, an unchanged
//! configuration, a changed configuration and a changed unit setting on the host,
//! `occ agent deploy --plan` predicts exactly what the following `--apply-plan` deploy then
//! does, as the host's own operation journal records it (a new snapshot or not, the unit file
//! written and daemon-reload or not, a restart or not); a plan writes nothing on the host; a
//! stale token is refused with PLAN_STALE and changes nothing; a rollout plan works the same.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::collections::BTreeSet;

use fleet::{Fleet, NS, document};
use serde_json::{Value, json};

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

/// The names of the host's operation journal entries.
fn journal_names(fleet: &Fleet) -> BTreeSet<String> {
    let host = fleet.hosts.iter().next().unwrap();
    host.run_ok(&format!("ls -1 {}", layout().journal_dir().display()))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What the host recorded for the operations of one deploy (the entries new since
/// `before`): (a snapshot created, the unit file written with daemon-reload, a restart).
fn what_the_host_did(fleet: &Fleet, before: &BTreeSet<String>) -> (bool, bool, bool) {
    let host = fleet.hosts.iter().next().unwrap();
    let mut created = false;
    let mut activation: Option<(bool, bool)> = None;
    let dir = layout().journal_dir();
    for name in journal_names(fleet).difference(before) {
        let text = host
            .run_ok(&format!("cat {}/{name}", dir.display()))
            .unwrap();
        let e: Value = serde_json::from_str(&text).unwrap();
        let result = &e["state"]["result"];
        match e["kind"].as_str() {
            Some("prepare-revision") => created |= result["created"] == true,
            Some("activate-revision") if e["state"]["state"] == "succeeded" => {
                activation = Some((result["unitChanged"] == true, result["restarted"] == true));
            }
            _ => {}
        }
    }
    let (reload, restart) = activation.expect("the host journal has no succeeded activation");
    (created, reload, restart)
}

/// A plan's prediction: (new snapshot, daemon-reload, restart).
fn predicted(plan: &Value) -> (bool, bool, bool) {
    let ch = &plan["agents"][0]["changes"];
    assert!(ch["refusal"].is_null(), "{plan}");
    (
        matches!(ch["snapshot"].as_str(), Some("create" | "replace")),
        ch["daemonReload"] == true,
        ch["restart"] == true,
    )
}

/// The host's Agent tree and unit files, to prove a plan writes nothing.
fn host_tree(fleet: &Fleet) -> String {
    let host = fleet.hosts.iter().next().unwrap();
    host.run_ok(
        "find /var/lib/clawfleet/namespaces /etc/systemd/system -xdev \
         -printf '%p %s %T@ %l\\n' 2>/dev/null | grep -v /journal/ | sort",
    )
    .unwrap()
}

/// `occ agent deploy --plan`, then `--apply-plan TOKEN --wait`; returns (prediction, what the
/// host did).
fn plan_then_deploy(fleet: &Fleet, agent: &str) -> ((bool, bool, bool), (bool, bool, bool)) {
    let tree = host_tree(fleet);
    let plan = fleet.occ_json(&["agent", "deploy", NS, agent, "--plan"]);
    assert_eq!(host_tree(fleet), tree, "a plan changed the host");
    let token = plan["token"].as_str().unwrap().to_owned();
    let before = journal_names(fleet);
    fleet.occ_ok(&[
        "agent",
        "deploy",
        NS,
        agent,
        "--apply-plan",
        &token,
        "--wait",
        "--timeout",
        "120",
    ]);
    (predicted(&plan), what_the_host_did(fleet, &before))
}

#[test]
fn plans_predict_what_the_deploy_then_does_on_a_real_host() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let mut fleet = Fleet::start(1);
    let docs = tempfile::tempdir().unwrap();
    let write = |name: &str, doc: &Value| {
        let p = docs.path().join(format!("{name}.json"));
        std::fs::write(&p, doc.to_string()).unwrap();
        p.display().to_string()
    };
    let v1 = write("v1", &document("p-v1", json!({})));
    fleet.occ_ok(&["configuration", "create", NS, "pc", "--file", &v1]);
    fleet.occ_ok(&["agent", "create", NS, "p1", "--configuration", "pc"]);

    // A new Agent: account, directory, port, snapshot and unit are all created.
    let plan = fleet.occ_json(&["agent", "deploy", NS, "p1", "--plan"]);
    let ch = &plan["agents"][0]["changes"];
    assert_eq!(plan["agents"][0]["placed"], false, "{plan}");
    for (field, want) in [
        ("account", "create"),
        ("agentDirectory", "create"),
        ("snapshot", "create"),
        ("unitFile", "create"),
    ] {
        assert_eq!(ch[field], want, "{field}: {plan}");
    }
    let (p, did) = plan_then_deploy(&fleet, "p1");
    assert_eq!(p, (true, true, true));
    assert_eq!(p, did, "new Agent: plan {p:?}, host {did:?}");

    // The same configuration again: a new revision (snapshot, restart), no daemon-reload.
    let (p, did) = plan_then_deploy(&fleet, "p1");
    assert_eq!(p, (true, false, true));
    assert_eq!(p, did, "unchanged configuration: plan {p:?}, host {did:?}");

    // A changed configuration.
    let v2 = write("v2", &document("p-v2", json!({})));
    fleet.occ_ok(&["configuration", "update", NS, "pc", "--file", &v2]);
    let (p, did) = plan_then_deploy(&fleet, "p1");
    assert_eq!(p, (true, false, true));
    assert_eq!(p, did, "changed configuration: plan {p:?}, host {did:?}");

    // A changed unit setting on the host (hostd reads it per session: restart occ serve so
    // no session from before the change is reused).
    let host = fleet.hosts.iter().next().unwrap();
    let toml = host.run_ok("cat /etc/clawfleet/hostd.toml").unwrap();
    let changed = format!("{toml}\n[unit]\ntasks_max = 777\n");
    host.write_file("/etc/clawfleet/hostd.toml", changed.as_bytes(), 0o644)
        .unwrap();
    fleet.stop_serve();
    fleet.start_serve();
    let plan = fleet.occ_json(&["agent", "deploy", NS, "p1", "--plan"]);
    assert_eq!(
        plan["agents"][0]["changes"]["unitFile"], "replace",
        "{plan}"
    );
    let (p, did) = plan_then_deploy(&fleet, "p1");
    assert_eq!(p, (true, true, true));
    assert_eq!(p, did, "changed unit setting: plan {p:?}, host {did:?}");

    // A stale token: the configuration moved after the plan. Refused, nothing changes.
    let plan = fleet.occ_json(&["agent", "deploy", NS, "p1", "--plan"]);
    let token = plan["token"].as_str().unwrap().to_owned();
    let v3 = write("v3", &document("p-v3", json!({})));
    fleet.occ_ok(&["configuration", "update", NS, "pc", "--file", &v3]);
    let revisions = fleet.status("p1").unwrap()["revisions"]
        .as_array()
        .unwrap()
        .len();
    let journal = journal_names(&fleet);
    let out = fleet.occ(&["agent", "deploy", NS, "p1", "--apply-plan", &token]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("PLAN_STALE"), "{err}");
    assert_eq!(
        fleet.status("p1").unwrap()["revisions"]
            .as_array()
            .unwrap()
            .len(),
        revisions
    );
    assert_eq!(
        journal_names(&fleet),
        journal,
        "a refused deploy reached the host"
    );
    let out = fleet.occ(&["agent", "deploy", NS, "p1", "--apply-plan", "not-a-token"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("INVALID_PLAN_TOKEN"),
        "{out:?}"
    );

    // A rollout plan: per Agent, with its token; stale after the configuration moves.
    let rollout = [
        "rollout",
        "create",
        NS,
        "--configuration",
        "pc",
        "--canary",
        "0",
    ];
    let mut args = rollout.to_vec();
    args.push("--plan");
    let plan = fleet.occ_json(&args);
    assert_eq!(plan["agents"].as_array().unwrap().len(), 1, "{plan}");
    assert_eq!(plan["agents"][0]["changes"]["restart"], true, "{plan}");
    let token = plan["token"].as_str().unwrap().to_owned();
    let v4 = write("v4", &document("p-v4", json!({})));
    fleet.occ_ok(&["configuration", "update", NS, "pc", "--file", &v4]);
    let mut stale = rollout.to_vec();
    stale.extend(["--apply-plan", &token]);
    let out = fleet.occ(&stale);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("PLAN_STALE"),
        "{out:?}"
    );
    assert_eq!(fleet.occ_json(&["rollout", "list", NS]), json!([]));
    let plan = fleet.occ_json(&args);
    let token = plan["token"].as_str().unwrap().to_owned();
    let mut fresh = rollout.to_vec();
    fresh.extend(["--apply-plan", &token, "--wait", "--timeout", "120"]);
    fleet.occ_ok(&fresh);
}
