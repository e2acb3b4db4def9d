//! Issue 9's coordinator defects, reproduced on a real test host through `occ`: each one told an
//! operator something untrue. Here, `occ agent deploy --wait` must exit non-zero when the
//! requested revision fails permanently while an older one still serves (OWNERSHIP_MISMATCH,
//! SNAPSHOT_MISMATCH, HOST_KEY_MISMATCH); a failed stop must be visible in deployment status and
//! end `occ agent stop --wait` at once with its code; and while a committed candidate is not
//! ready, status must say nothing is served and no revision is called active, and the
//! worker's retries must not restart the gateway; a refused configuration never reaches the
//! host; and a host without the gateway command says so at probe time and fails a deploy at
//! once with GATEWAY_COMMAND_MISSING.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::process::Output;
use std::time::{Duration, Instant};

use fleet::{Fleet, NS, document};
use serde_json::{Value, json};

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

const AGENT: &str = "a1";
/// A valid Ed25519 key that is not the test host's.
const OTHER_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtlzZ3MFfuteL1oS3yr1Yx72/TNBkiGm1NN+JwrXN+M";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

/// `occ agent deploy NS a1 --wait`: the exit code and everything it printed.
fn deploy_wait(fleet: &Fleet) -> (i32, String) {
    let out = fleet.occ(&["agent", "deploy", NS, AGENT, "--wait", "--timeout", "90"]);
    (out.status.code().unwrap_or(-1), text(&out))
}

/// Runs a shell command on the test host; panics on failure.
fn on_host(fleet: &Fleet, command: &str) -> String {
    let host = fleet.hosts.iter().next().expect("one host");
    host.run_ok(command)
        .unwrap_or_else(|e| panic!("{command}: {e}"))
}

/// The path of the revision.json that `current` points at.
fn current_marker(fleet: &Fleet) -> String {
    on_host(
        fleet,
        "readlink -f /var/lib/clawfleet/namespaces/*/agents/*/current/revision.json",
    )
    .trim()
    .to_owned()
}

/// Edits a marker on the host with sed, keeping the original at /root/marker.orig.
fn tamper(fleet: &Fleet, path: &str, sed: &str) {
    on_host(
        fleet,
        &format!(
            "cp -a {path} /root/marker.orig && sed -i -E '{sed}' {path} && ! cmp -s {path} /root/marker.orig"
        ),
    );
}

fn untamper(fleet: &Fleet, path: &str) {
    on_host(fleet, &format!("mv /root/marker.orig {path}"));
}

fn status(fleet: &Fleet) -> Value {
    fleet.status(AGENT).expect("deployment-status")
}

/// A unit property of the Agent's unit on the host (`systemctl show`, read only).
fn unit_property(fleet: &Fleet, property: &str) -> String {
    on_host(
        fleet,
        &format!("systemctl show -p {property} --value 'clawfleet-agent-*.service' | head -1"),
    )
    .trim()
    .to_owned()
}

/// The Agent's gateway: the child of its launcher, the unit's main process
/// (hostd/src/supervise.rs).
fn gateway_pid(fleet: &Fleet) -> String {
    let main = unit_property(fleet, "MainPID");
    on_host(
        fleet,
        &format!("cut -d' ' -f1 /proc/{main}/task/{main}/children"),
    )
    .trim()
    .to_owned()
}

#[test]
fn coordinator_defects_on_a_real_host() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let mut fleet = Fleet::start(1);
    let host = fleet.host_names()[0].clone();
    fleet.create_agent(AGENT, &document("v1", json!({})));
    let (code, out) = deploy_wait(&fleet);
    assert_eq!(code, 0, "{out}");

    // 1. deploy --wait reports the requested revision's permanent failure (exit 3), while
    //    rev-1 keeps serving.
    let marker = current_marker(&fleet);
    let cases = [
        (
            "OWNERSHIP_MISMATCH",
            r#"s/"revisionId": ?"rev-1-[0-9a-f]+"/"revisionId":"rev-9-00000000"/"#,
        ),
        (
            "SNAPSHOT_MISMATCH",
            r#"s/"configurationHash": ?"[0-9a-f]{64}"/"configurationHash":"0000000000000000000000000000000000000000000000000000000000000000"/"#,
        ),
    ];
    for (n, (code_name, sed)) in cases.iter().enumerate() {
        tamper(&fleet, &marker, sed);
        fleet.update_configuration(AGENT, &document(&format!("bad-{n}"), json!({})));
        let (code, out) = deploy_wait(&fleet);
        assert_eq!(code, 3, "{code_name}: {out}");
        assert!(out.contains(&format!("failed: {code_name}")), "{out}");
        assert!(out.contains("(rev-1-") && out.contains(" serves)"), "{out}");
        let s = status(&fleet);
        assert_eq!(s["converged"], false, "{s}");
        assert_eq!(rev_num(s["servedRevisionId"].as_str()), Some(1), "{s}");
        untamper(&fleet, &marker);
    }
    // A changed host key: the coordinator refuses to talk to the host.
    let address = fleet.hosts.iter().next().unwrap().address().to_string();
    fleet.occ_ok(&[
        "host",
        "enrol",
        &host,
        "--replace",
        "--address",
        &address,
        "--host-key",
        OTHER_KEY,
    ]);
    let (code, out) = deploy_wait(&fleet);
    assert_eq!(code, 3, "HOST_KEY_MISMATCH: {out}");
    assert!(out.contains("failed: HOST_KEY_MISMATCH"), "{out}");
    assert!(out.contains("(rev-1-") && out.contains(" serves)"), "{out}");
    let real_key = fleet
        .hosts
        .iter()
        .next()
        .unwrap()
        .host_public_key()
        .trim()
        .to_owned();
    fleet.occ_ok(&[
        "host",
        "enrol",
        &host,
        "--replace",
        "--address",
        &address,
        "--host-key",
        &real_key,
    ]);

    // 2. A refused stop is visible: exit 3 at once with its code, and in deployment status.
    tamper(&fleet, &marker, cases[1].1);
    let started = Instant::now();
    let out = fleet.occ(&["agent", "stop", NS, AGENT, "--wait", "--timeout", "120"]);
    let printed = text(&out);
    assert_eq!(out.status.code(), Some(3), "{printed}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "stop --wait waited out its timeout: {printed}"
    );
    assert!(
        printed.contains(&format!("stop of {AGENT} failed: SNAPSHOT_MISMATCH")),
        "{printed}"
    );
    let s = status(&fleet);
    assert_eq!(s["recentWork"][0]["kind"], "stop", "{s}");
    assert_eq!(s["recentWork"][0]["state"], "failed", "{s}");
    assert_eq!(
        s["recentWork"][0]["lastAttempt"]["code"], "SNAPSHOT_MISMATCH",
        "{s}"
    );
    assert_eq!(s["converged"], false, "{s}");
    untamper(&fleet, &marker);

    // 3. A committed candidate that never becomes ready: nothing is served, no revision is
    //    called active, and the worker's retries wait for readiness without restarting it.
    fleet.update_configuration(AGENT, &document("good", json!({})));
    let (code, out) = deploy_wait(&fleet);
    assert_eq!(code, 0, "{out}");
    let good = status(&fleet)["servedRevisionId"]
        .as_str()
        .expect("a served revision")
        .to_owned();
    on_host(
        &fleet,
        "sed -i 's/readiness_timeout_ms = 30000/readiness_timeout_ms = 2000/' /etc/clawfleet/hostd.toml",
    );
    fleet.update_configuration(AGENT, &document("never", json!({"neverReady": true})));
    let candidate = fleet.deploy(AGENT);
    let deadline = Instant::now() + Duration::from_secs(60);
    let failed_once = loop {
        let s = status(&fleet);
        let rev = s["revisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == candidate.as_str())
            .cloned()
            .unwrap();
        if rev["lastAttempt"]["code"] == "REVISION_FINALIZATION_INCOMPLETE" {
            break s;
        }
        assert!(Instant::now() < deadline, "no failed activation yet: {s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(failed_once["activeRevisionId"], candidate.as_str());
    assert!(
        failed_once["servedRevisionId"].is_null(),
        "the previous revision no longer runs, yet it is reported as served: {failed_once}"
    );
    for r in failed_once["revisions"].as_array().unwrap() {
        let want_active = r["id"] == candidate.as_str();
        if !want_active {
            assert_ne!(r["status"], "active", "{r}");
        }
        if r["id"] == good.as_str() {
            assert_eq!(r["status"], "superseded", "{r}");
        }
    }
    let candidate_status = failed_once["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == candidate.as_str())
        .unwrap()["status"]
        .clone();
    assert_eq!(candidate_status, "activating", "{failed_once}");
    let pid = gateway_pid(&fleet);
    let restarts = unit_property(&fleet, "NRestarts");
    // Retries after the commit spend no attempt (the counter stays), so a retry pass is seen
    // as a new time of the candidate's lastAttempt (each pass waits out the 2 s readiness).
    let attempt_at = |s: &Value| -> i64 {
        s["revisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == candidate.as_str())
            .unwrap()["lastAttempt"]["at"]
            .as_i64()
            .unwrap()
    };
    let mut seen = attempt_at(&failed_once);
    let mut passes = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(&fleet);
        let at = attempt_at(&s);
        if at != seen {
            (seen, passes) = (at, passes + 1);
        }
        if passes >= 2 {
            assert!(s["servedRevisionId"].is_null(), "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "no retry seen: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        gateway_pid(&fleet),
        pid,
        "a retry of the activation restarted the unchanged gateway"
    );
    assert_eq!(unit_property(&fleet, "NRestarts"), restarts);

    // 4. A configuration the design refuses never reaches the host.
    let before = on_host(&fleet, "hostd status --json");
    let refused = fleet.dir.path().join("plugins.json");
    std::fs::write(
        &refused,
        json!({"plugins": {"entries": {"x": {"enabled": true}}}}).to_string(),
    )
    .unwrap();
    let out = fleet.occ(&[
        "configuration",
        "create",
        NS,
        "with-plugins",
        "--file",
        &refused.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("plugins"), "{}", text(&out));
    assert_eq!(on_host(&fleet, "hostd status --json"), before);

    // A good revision ends it; the host serves again.
    fleet.update_configuration(AGENT, &document("good-again", json!({})));
    let (code, out) = deploy_wait(&fleet);
    assert_eq!(code, 0, "{out}");
    let s = status(&fleet);
    assert_eq!(s["converged"], true, "{s}");
    assert_eq!(s["servedRevisionId"], s["activeRevisionId"], "{s}");
    let out = fleet.occ(&["agent", "delete", NS, AGENT, "--wait"]);
    assert!(out.status.success(), "{}", text(&out));

    // 5. A host without the gateway command: the probe names it, and a deploy there fails
    //    at once with its own code (it used to crash-loop into UNIT_FAILED).
    on_host(
        &fleet,
        r#"sed -i -E 's|^gateway_command = .*|gateway_command = ["/usr/local/bin/no-such-gateway"]|' /etc/clawfleet/hostd.toml"#,
    );
    let out = fleet.occ(&["host", "probe", &host]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains("/usr/local/bin/no-such-gateway"),
        "{printed}"
    );
    assert!(printed.contains("GATEWAY_COMMAND_MISSING"), "{printed}");
    fleet.create_agent("a2", &document("v1", json!({})));
    let started = Instant::now();
    let out = fleet.occ(&["agent", "deploy", NS, "a2", "--wait", "--timeout", "90"]);
    let printed = text(&out);
    assert_eq!(out.status.code(), Some(3), "{printed}");
    assert!(
        printed.contains("failed: GATEWAY_COMMAND_MISSING"),
        "{printed}"
    );
    assert!(printed.contains("(nothing serves)"), "{printed}");
    assert!(started.elapsed() < Duration::from_secs(30), "{printed}");
    fleet.kill_serve();
}

/// The drift sweep's row for the Agent (`occ drift --now`).
fn drift_row(fleet: &Fleet) -> Value {
    let rows = fleet.occ_json(&["drift", "--now"]);
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["namespaceId"] == NS && r["agentId"] == AGENT)
        .cloned()
        .unwrap_or_else(|| panic!("no drift row for {AGENT}: {rows}"))
}

/// Issue 27: a unit file edited by hand on the host (NoNewPrivileges removed, MemoryMax
/// raised) was reported `synced`. hostd compares it with the text it writes, and the sweep
/// shows `drift` with the reason and the lines; a redeploy of the Agent writes it back.
#[test]
fn a_hand_edited_unit_file_is_drift_on_a_real_host() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let fleet = Fleet::start(1);
    fleet.create_agent(AGENT, &document("v1", json!({})));
    let (code, out) = deploy_wait(&fleet);
    assert_eq!(code, 0, "{out}");
    let row = drift_row(&fleet);
    assert_eq!(row["state"], "synced", "{row}");
    on_host(
        &fleet,
        "sed -i -e '/^NoNewPrivileges=/d' -e 's/^MemoryMax=.*/MemoryMax=64G/' \
         /etc/systemd/system/clawfleet-agent-*.service",
    );
    let row = drift_row(&fleet);
    assert_eq!(row["state"], "drift", "{row}");
    assert_eq!(row["reason"], "unit-file-changed", "{row}");
    let message = row["message"].as_str().unwrap();
    assert!(
        message.contains("NoNewPrivileges=yes") && message.contains("MemoryMax=64G"),
        "{row}"
    );
}
