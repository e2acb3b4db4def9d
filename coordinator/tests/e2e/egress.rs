//! Issue 28's per-Agent egress through `occ` on a real test host (its pool allows TCP 443 to
//! public addresses, hostd's default): an Agent created with no ports gets a net unit that
//! opens none; setting 443 is planned as a unit change and applied to the running namespace
//! by reloading its net unit; asking for 22 fails the deploy with EGRESS_NOT_ALLOWED naming
//! the entry, and the Agent keeps serving what it served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use fleet::{Fleet, NS, document};
use serde_json::json;

/// The text of the Agent's network unit on the host.
fn net_unit(fleet: &Fleet, agent: &str) -> String {
    let layout = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system");
    let paths = layout.agent(
        &clawfleet_protocol::Ident::new(NS).unwrap(),
        &clawfleet_protocol::Ident::new(agent).unwrap(),
    );
    let net = hostd::unit::AgentNet::for_unit(&paths.unit_name, 0);
    let host = fleet.hosts.iter().next().unwrap();
    host.run_ok(&format!("cat /etc/systemd/system/{}", net.net_unit))
        .unwrap()
}

fn deploy_wait(fleet: &Fleet, agent: &str) -> std::process::Output {
    fleet.occ(&["agent", "deploy", NS, agent, "--wait", "--timeout", "120"])
}

#[test]
fn an_agents_egress_reaches_its_net_unit_and_a_wider_one_is_refused() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let fleet = Fleet::start(1);
    let docs = tempfile::tempdir().unwrap();
    let file = docs.path().join("e.json");
    std::fs::write(&file, document("e-v1", json!({})).to_string()).unwrap();
    let file = file.display().to_string();
    fleet.occ_ok(&["configuration", "create", NS, "ec", "--file", &file]);
    fleet.occ_ok(&[
        "agent",
        "create",
        NS,
        "e1",
        "--configuration",
        "ec",
        "--no-egress-ports",
    ]);
    let got = fleet.occ_json(&["agent", "get", NS, "e1"]);
    assert_eq!(got["egress"], json!({"ports": []}), "{got}");
    let out = deploy_wait(&fleet, "e1");
    assert!(out.status.success(), "{out:?}");
    let unit = net_unit(&fleet, "e1");
    assert!(!unit.contains("--egress-port"), "no port opened:\n{unit}");

    // 443, which the pool allows: planned as a unit change with a restart, then applied.
    fleet.occ_ok(&["agent", "set", NS, "e1", "--egress-port", "443"]);
    let plan = fleet.occ_json(&["agent", "deploy", NS, "e1", "--plan"]);
    let ch = &plan["agents"][0]["changes"];
    assert_eq!(ch["unitFile"], "replace", "{plan}");
    assert_eq!(ch["restart"], true, "{plan}");
    let out = deploy_wait(&fleet, "e1");
    assert!(out.status.success(), "{out:?}");
    let unit = net_unit(&fleet, "e1");
    assert!(
        unit.contains(" --egress-port 443\n"),
        "port 443 opened:\n{unit}"
    );
    let host = fleet.hosts.iter().next().unwrap();
    let journal = host
        .run_ok("journalctl -b --no-pager -o cat -t hostd")
        .unwrap();
    assert!(
        journal.contains("applying the Agent's changed network settings"),
        "the running net unit was reloaded:\n{journal}"
    );
    let served = fleet.occ_json(&["agent", "get", NS, "e1"])["servedRevisionId"].clone();

    // 22, which it does not: the deploy fails with the host's code, nothing else moves.
    fleet.occ_ok(&["agent", "set", NS, "e1", "--egress-port", "22"]);
    let out = deploy_wait(&fleet, "e1");
    assert!(!out.status.success(), "{out:?}");
    let status = fleet.status("e1").unwrap().to_string();
    assert!(status.contains("EGRESS_NOT_ALLOWED"), "{status}");
    assert!(status.contains("egress.ports[0] is 22"), "{status}");
    assert_eq!(
        fleet.occ_json(&["agent", "get", NS, "e1"])["servedRevisionId"],
        served
    );
    assert!(net_unit(&fleet, "e1").contains(" --egress-port 443\n"));

    // Back to the pool's policy.
    fleet.occ_ok(&["agent", "set", NS, "e1", "--target-egress"]);
    let out = deploy_wait(&fleet, "e1");
    assert!(out.status.success(), "{out:?}");
    assert!(fleet.occ_json(&["agent", "get", NS, "e1"])["egress"].is_null());
}
