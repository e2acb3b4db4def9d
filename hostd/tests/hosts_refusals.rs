//! Issue 9 on a real host: refusals that leave everything in place (deletes of a tampered
//! snapshot or an edited account marker, prepares refused for a foreign unit, a full port range
//! or a missing gateway), and what "served" means while a candidate is not ready.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::{AgentObservation, OperationResult};
use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::{Value, json};

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

fn port(r: &OperationResult) -> u16 {
    match r {
        OperationResult::PrepareRevision(p) => p.observation.port.unwrap(),
        other => panic!("{other:?}"),
    }
}

fn exists(host: &TestHost, path: impl std::fmt::Display) -> bool {
    host.run(&format!("test -e {path}"))
        .unwrap()
        .status
        .success()
}

fn delete(n: &str, a: &str) -> Operation {
    Operation::DeleteAgent(AgentArgs {
        namespace: ns(n),
        agent: agent(a),
    })
}

/// `hostd status --json` on the host.
fn status(host: &TestHost) -> Value {
    serde_json::from_str(&host.run_ok("hostd status --json").unwrap()).unwrap()
}

/// The Agent as `hostd status` shows it.
fn status_agent(host: &TestHost, a: &str) -> Option<Value> {
    status(host)["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["agents"].as_array().unwrap().clone())
        .find(|x| x["id"] == a)
}

/// Unit, directory, account, its marker and the port are all still there, the gateway still
/// runs, and `hostd status` shows the Agent and a problem at `problem_path`.
fn assert_intact(host: &TestHost, a: &str, port: u16, problem_path: &str) {
    let p = layout().agent(&id("ns1"), &id(a));
    assert!(exists(host, p.unit_file.display()), "unit file");
    assert!(exists(host, p.dir.display()), "directory");
    assert!(exists(host, p.revisions.display()), "snapshots");
    host.run_ok(&format!("id {}", p.account)).unwrap();
    host.run_ok(&format!("getent group {}", p.account)).unwrap();
    assert!(
        exists(host, layout().account_marker(&p.account).display()),
        "account marker"
    );
    assert!(exists(host, layout().port_file(port).display()), "port");
    assert_eq!(
        host.run_ok(&format!("systemctl is-active {}", p.unit_name))
            .unwrap()
            .trim(),
        "active"
    );
    assert!(status_agent(host, a).is_some(), "status shows the Agent");
    let st = status(host);
    assert!(
        st["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["path"] == problem_path),
        "status shows the problem at {problem_path}: {}",
        st["problems"]
    );
}

/// Nothing of a never-created Agent is on the host.
fn assert_nothing_of(host: &TestHost, a: &str) {
    let p = layout().agent(&id("ns1"), &id(a));
    assert!(
        !host
            .run(&format!("getent passwd {}", p.account))
            .unwrap()
            .status
            .success(),
        "no user"
    );
    assert!(
        !host
            .run(&format!("getent group {}", p.account))
            .unwrap()
            .status
            .success(),
        "no group"
    );
    assert!(!exists(host, layout().account_marker(&p.account).display()));
    assert!(!exists(host, p.dir.display()), "no directory");
    assert!(!exists(host, p.lock.display()), "no lock file");
    let ports = host
        .run_ok(&format!(
            "grep -l '\"{a}\"' /var/lib/clawfleet/ports/*.json || true"
        ))
        .unwrap();
    assert!(ports.trim().is_empty(), "no port: {ports}");
}

#[test]
fn refused_deletes_and_prepares_leave_everything_in_place_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "port_range = [18700, 18701]");
    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "a1-rev-1"}));
    let p1 = port(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    let a1 = layout().agent(&id("ns1"), &id("a1"));
    let rdir = a1.revision_dir(&id("rev-1")).display().to_string();
    let rmarker = format!("{rdir}/revision.json");

    // A tampered snapshot: revisionId, then configurationHash.
    for (sed, code) in [
        (
            "s/\"revisionId\": \"rev-1\"/\"revisionId\": \"rev-9\"/",
            FailureCode::OwnershipMismatch,
        ),
        (
            "s/\"configurationHash\": \"[0-9a-f]*\"/\"configurationHash\": \"0000000000000000000000000000000000000000000000000000000000000000\"/",
            FailureCode::SnapshotMismatch,
        ),
    ] {
        host.run_ok(&format!(
            "cp -p {rmarker} /root/revision.json.orig && sed -i '{sed}' {rmarker} && ! cmp -s {rmarker} /root/revision.json.orig"
        ))
        .unwrap();
        for _ in 0..2 {
            let f = occ.fails(&host, delete("ns1", "a1"));
            assert_eq!(f.code, code, "{f}");
            assert!(!f.is_retryable(), "{f}");
            assert_intact(&host, "a1", p1, &rdir);
        }
        host.run_ok(&format!("cp -p /root/revision.json.orig {rmarker}"))
            .unwrap();
    }

    // An account marker whose uid was edited.
    let amarker = layout().account_marker(&a1.account).display().to_string();
    host.run_ok(&format!(
        "cp -p {amarker} /root/account.json.orig && sed -i 's/\"uid\": [0-9]*/\"uid\": 4242/' {amarker} && grep -q 4242 {amarker}"
    ))
    .unwrap();
    for _ in 0..2 {
        let f = occ.fails(&host, delete("ns1", "a1"));
        assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
        assert!(f.message.contains("4242"), "{f}");
        assert_intact(&host, "a1", p1, &amarker);
    }
    host.run_ok(&format!("cp -p /root/account.json.orig {amarker}"))
        .unwrap();
    assert!(
        status(&host)["problems"].as_array().unwrap().is_empty(),
        "{}",
        status(&host)["problems"]
    );

    // A foreign unit file at a new Agent's unit name, while a port is still free.
    let a2 = layout().agent(&id("ns1"), &id("a2"));
    let unit = a2.unit_file.display().to_string();
    host.write_file(&unit, b"[Service]\nExecStart=/bin/true\n", 0o644)
        .unwrap();
    let f = occ.fails(&host, prepare("ns1", "a2", &r1));
    assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
    assert_nothing_of(&host, "a2");
    assert_eq!(
        host.run_ok(&format!("cat {unit}")).unwrap(),
        "[Service]\nExecStart=/bin/true\n"
    );
    host.run_ok(&format!("rm {unit}")).unwrap();

    // The port range runs out.
    occ.ok(&host, prepare("ns1", "a2", &r1));
    let f = occ.fails(&host, prepare("ns1", "a3", &r1));
    assert_eq!(f.code, FailureCode::PortRangeExhausted, "{f}");
    assert_nothing_of(&host, "a3");

    // The shipped default gateway command, on a host without Node.
    assert!(!exists(&host, "/usr/bin/node"));
    let name = host.name().to_owned();
    host.write_file(
        "/etc/clawfleet/hostd.toml",
        format!("host_name = \"{name}\"\nport_range = [18700, 18702]\n").as_bytes(),
        0o644,
    )
    .unwrap();
    match occ.ok(&host, Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => {
            assert_eq!(p.missing_tools, vec!["/usr/bin/node".to_owned()]);
        }
        other => panic!("{other:?}"),
    }
    let f = occ.fails(&host, prepare("ns1", "a3", &r1));
    assert_eq!(f.code, FailureCode::GatewayCommandMissing, "{f}");
    assert!(!f.is_retryable());
    assert!(f.message.contains("/usr/bin/node"), "{f}");
    assert_nothing_of(&host, "a3");

    // Everything deletes once it is whole again.
    occ.ok(&host, delete("ns1", "a1"));
    occ.ok(&host, delete("ns1", "a2"));
    assert!(!exists(&host, a1.dir.display()));
    assert!(!exists(&host, a1.lock.display()));
}

fn observation(occ: &Coordinator, host: &TestHost, rev: &RevisionSpec) -> AgentObservation {
    match occ.ok(host, Operation::VerifyRevision(rargs("ns1", "a1", rev))) {
        OperationResult::VerifyRevision(v) => v.observation,
        other => panic!("{other:?}"),
    }
}

fn invocation(host: &TestHost, unit: &str) -> String {
    host.run_ok(&format!("systemctl show -p InvocationID --value {unit}"))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn a_candidate_that_is_not_ready_is_not_served_and_retries_do_not_restart_it_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, QUICK_READINESS);
    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "rev-1"}));
    let p1 = port(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    let a1 = layout().agent(&id("ns1"), &id("a1"));
    assert_eq!(observation(&occ, &host, &r1).served, Some(id("rev-1")));

    // A candidate that never becomes ready.
    let r2 = spec("rev-2", 2, json!({"label": "rev-2", "neverReady": true}));
    occ.ok(&host, prepare("ns1", "a1", &r2));
    let f = occ.fails(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
    );
    assert_eq!(f.code, FailureCode::ReadinessTimeout, "{f}");
    let o = observation(&occ, &host, &r2);
    assert_eq!(o.current, Some(id("rev-2")));
    assert_eq!(
        o.served, None,
        "rev-1 no longer runs and rev-2 is not ready"
    );
    assert!(!exists(&host, a1.served.display()));
    let st = status_agent(&host, "a1").unwrap();
    assert_eq!(st["observation"]["served"], Value::Null, "{st}");
    let (_, info) = curl(&host, p1, "/info");
    assert!(
        info.contains("rev-2"),
        "the unit runs the candidate: {info}"
    );

    // A retry waits for the running candidate again: the same process, no restart.
    let before = invocation(&host, &a1.unit_name);
    let f = occ.fails(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
    );
    assert_eq!(f.code, FailureCode::ReadinessTimeout, "{f}");
    assert_eq!(invocation(&host, &a1.unit_name), before, "not restarted");

    // A candidate that is ready only after the first attempt gave up: the retry serves it
    // without restarting it.
    let r3 = spec("rev-3", 3, json!({"label": "rev-3", "readyAfterMs": 6000}));
    occ.ok(&host, prepare("ns1", "a1", &r3));
    let f = occ.fails(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r3))),
    );
    assert_eq!(f.code, FailureCode::ReadinessTimeout, "{f}");
    assert_eq!(observation(&occ, &host, &r3).served, None);
    let before = invocation(&host, &a1.unit_name);
    match occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r3))),
    ) {
        OperationResult::ActivateRevision(r) => {
            assert!(!r.restarted, "{r:?}");
            assert_eq!(r.observation.served, Some(id("rev-3")));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(invocation(&host, &a1.unit_name), before, "not restarted");
    let st = status_agent(&host, "a1").unwrap();
    assert_eq!(st["observation"]["served"], "rev-3", "{st}");
}
