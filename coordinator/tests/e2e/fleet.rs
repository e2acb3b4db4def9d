//! End to end on three real test hosts (issue 5's acceptance): hostd installed and enrolled on
//! each, one `occ serve` child process, a Namespace whose pool is the three hosts. The test
//! deploys ten Agents across the pool, replaces half, stops two, deletes two, kills the
//! coordinator with SIGKILL mid-deployment and restarts it, refuses a host whose SSH host key
//! changed, and finally deletes every Agent and then the Namespace. After each phase the state
//! on every host (`hostd status --json` and the test gateway's `/info`) must equal the desired
//! state held by the coordinator.
//!
//! The [`fleet`] helpers live in `fleet_support/`, shared with `tests/e2e/defects.rs` and `benches/fleet.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

#[test]
fn fleet_end_to_end_on_three_hosts() {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use coordinator::client::ClientError;
    use fleet::{Fleet, Model, NS, Want, document, phase_done, pin_in_known_hosts};
    use serde_json::json;

    clawfleet_vm_tests::skip_unless_hosts!();
    let total = Instant::now();
    let converge = Duration::from_secs(180);

    let t = Instant::now();
    let mut fleet = Fleet::start(3);
    phase_done(
        "setup (build hostd, 3 hosts, hostd + gateway, occ init/serve, enrol)",
        t,
    );

    // 1. Ten Agents across the pool.
    let t = Instant::now();
    let agents: Vec<String> = (0..10).map(|i| format!("a{i:02}")).collect();
    let mut model = Model::new();
    for a in &agents {
        fleet.create_agent(a, &document(&format!("{a}-v1"), json!({})));
    }
    let t_deploy = Instant::now();
    let mut wants = Vec::new();
    for a in &agents {
        let rev = fleet.deploy(a);
        assert_eq!(rev_num(Some(&rev)), Some(1), "{a}: first revision");
        let want = Want::Running {
            rev,
            label: format!("{a}-v1"),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    let times = fleet.wait_converged(&wants, t_deploy, converge);
    eprintln!(
        "10 Agents converged in {:.1} s (slowest)",
        times
            .values()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    );
    let per_host = fleet.check_hosts(&model, true);
    eprintln!("placement: {per_host:?}");
    assert_eq!(
        per_host.len(),
        3,
        "placement covers every host: {per_host:?}"
    );
    assert!(
        per_host.values().all(|n| *n >= 1),
        "Agents are spread over all three hosts: {per_host:?}"
    );
    assert_eq!(per_host.values().sum::<usize>(), 10);
    phase_done("1: deploy 10 Agents", t);

    // 2. Replace half: a new Configuration generation (label v2) and a deploy.
    let t = Instant::now();
    let mut wants = Vec::new();
    for a in &agents[..5] {
        fleet.update_configuration(a, &document(&format!("{a}-v2"), json!({})));
        let rev = fleet.deploy(a);
        assert_eq!(rev_num(Some(&rev)), Some(2), "{a}: second revision");
        let want = Want::Running {
            rev,
            label: format!("{a}-v2"),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    fleet.wait_converged(&wants, t, converge);
    fleet.check_hosts(&model, true);
    for a in &agents[..5] {
        let revs = fleet.occ_json(&["agent", "revisions", NS, a]);
        let statuses: Vec<(Option<u64>, &str)> = revs
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (rev_num(r["id"].as_str()), r["status"].as_str().unwrap()))
            .collect();
        assert_eq!(
            statuses,
            vec![(Some(1), "retired"), (Some(2), "active")],
            "{a}: revision statuses after the replacement"
        );
    }
    phase_done("2: replace 5 Agents (v2)", t);

    // 3. Stop two.
    let t = Instant::now();
    let mut wants = Vec::new();
    for a in &agents[5..7] {
        let out = fleet.occ_ok(&["agent", "stop", NS, a]);
        assert!(out.contains("stop requested"), "occ agent stop: {out}");
        let Some(Want::Running { rev, .. }) = model.get(a.as_str()).cloned() else {
            panic!("{a} was running its first revision");
        };
        let want = Want::Stopped { rev };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    fleet.wait_converged(&wants, t, converge);
    fleet.check_hosts(&model, true);
    phase_done("3: stop 2 Agents", t);

    // 4. Delete two (one running v1, one running v1 on whatever host).
    let t = Instant::now();
    for a in &agents[7..9] {
        fleet.occ_ok(&["agent", "delete", NS, a]);
        model.remove(a);
    }
    let deleted: Vec<&str> = agents[7..9].iter().map(String::as_str).collect();
    fleet.wait_deleted(&deleted, converge);
    fleet.check_hosts(&model, true);
    for h in fleet.hosts.iter() {
        // No unit or account of a deleted Agent is left behind.
        let units = h
            .run_ok("ls /etc/systemd/system | grep -c '^clawfleet-agent-' || true")
            .unwrap();
        let accounts = h.run_ok("grep -c '^cfa-' /etc/passwd || true").unwrap();
        let n = fleet.inventory(h)["namespaces"][0]["agents"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(units.trim(), n.to_string(), "{}: unit files", h.name());
        assert_eq!(accounts.trim(), n.to_string(), "{}: accounts", h.name());
    }
    phase_done("4: delete 2 Agents", t);

    // 5. kill -9 the coordinator mid-deployment, restart it on the same state dir.
    let t = Instant::now();
    let crash: Vec<String> = (0..6).map(|i| format!("c{i:02}")).collect();
    for (i, a) in crash.iter().enumerate() {
        // All but the first take 3 s to become ready, so they are in flight at the kill.
        let delay = if i == 0 { 0 } else { 3000 };
        fleet.create_agent(
            a,
            &document(&format!("{a}-v1"), json!({"readyAfterMs": delay})),
        );
    }
    let mut wants = Vec::new();
    for a in &crash {
        let rev = fleet.deploy(a);
        let want = Want::Running {
            rev,
            label: format!("{a}-v1"),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    let first = Instant::now();
    let converged_at_kill = loop {
        let converged: Vec<&str> = wants
            .iter()
            .filter(|(a, w)| fleet.status(a).is_ok_and(|s| fleet::matches_want(&s, w)))
            .map(|(a, _)| *a)
            .collect();
        if !converged.is_empty() {
            break converged;
        }
        assert!(
            first.elapsed() < Duration::from_secs(120),
            "no crash-phase Agent converged within 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let pid = fleet.kill_serve();
    eprintln!(
        "kill -9 occ serve (pid {pid}) {:.1} s after the deploys, with {converged_at_kill:?} converged",
        first.elapsed().as_secs_f64()
    );
    assert!(
        converged_at_kill.len() < crash.len(),
        "work must be in flight at the kill (all converged already)"
    );
    let restart = Instant::now();
    fleet.start_serve();
    let times = fleet.wait_converged(&wants, restart, converge);
    eprintln!(
        "after the restart (pid {}), all {} converged in {:.1} s",
        fleet.serve_pid(),
        crash.len(),
        times
            .values()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    );
    fleet.check_hosts(&model, true);
    phase_done("5: kill -9 mid-deployment and restart", t);

    // 6. A changed host key is refused, and nothing changes on that host.
    let t = Instant::now();
    let api = fleet.api_agents();
    let host_of = |a: &str| api[a]["host"].as_str().unwrap().to_owned();
    let victim_agent = "a00";
    let x = host_of(victim_agent);
    let other_agent = agents[..5]
        .iter()
        .find(|a| host_of(a) != x)
        .cloned()
        .or_else(|| {
            ["a09", "c00", "c01", "c02", "c03", "c04", "c05"]
                .iter()
                .find(|a| host_of(a) != x)
                .map(|a| (*a).to_owned())
        })
        .expect("an Agent on another host");
    let before = fleet.inventory(fleet.host(&x));
    // The coordinator keeps one connection per host open; stop it so that the next call
    // makes a new connection and sees the new key.
    fleet.stop_serve();
    let new_key = fleet
        .host(&x)
        .run_ok(
            "set -e; mkdir -p /root/cf-old-hostkey; \
             cp -a /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub /root/cf-old-hostkey/; \
             rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub; \
             ssh-keygen -q -t ed25519 -N '' -C rekeyed -f /etc/ssh/ssh_host_ed25519_key; \
             systemctl restart ssh; cat /etc/ssh/ssh_host_ed25519_key.pub",
        )
        .expect("cannot re-key the host's sshd");
    let address = fleet.host(&x).address().to_string();
    pin_in_known_hosts(fleet.host(&x).known_hosts_path(), &address, &new_key);
    fleet.start_serve();
    // (i) probe: 409 HOST_KEY_MISMATCH over the API and through the CLI.
    match fleet
        .api
        .request("POST", &format!("/hosts/{x}/probe"), None)
    {
        Err(ClientError::Api {
            status,
            code,
            message,
        }) => {
            assert_eq!(
                code, "HOST_KEY_MISMATCH",
                "probe of the re-keyed host: {message}"
            );
            assert!(status == 409 || status == 502, "HTTP status {status}");
            eprintln!("probe {x}: HTTP {status} {code}: {message}");
        }
        other => panic!("probe of the re-keyed host {x} must be refused, got {other:?}"),
    }
    let out = fleet.occ(&["--output", "json", "host", "probe", &x]);
    assert!(!out.status.success(), "occ host probe {x} must fail");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("HOST_KEY_MISMATCH"),
        "occ host probe {x}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (ii) a deploy to an Agent on that host fails permanently with HOST_KEY_MISMATCH ...
    fleet.update_configuration(
        victim_agent,
        &document(&format!("{victim_agent}-v3"), json!({})),
    );
    let failed_rev = fleet.deploy(victim_agent);
    // ... while an Agent on another host still deploys.
    fleet.update_configuration(
        &other_agent,
        &document(&format!("{other_agent}-v3"), json!({})),
    );
    let other_rev = fleet.deploy(&other_agent);
    let start = Instant::now();
    let last_attempt = loop {
        let s = fleet.occ_json(&["agent", "status", NS, victim_agent]);
        let rev = s["revisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == json!(failed_rev))
            .cloned()
            .expect("the new revision is listed");
        let idle = s["openWork"].as_array().is_some_and(|w| w.is_empty());
        if rev["status"] == "failed" && idle {
            assert_eq!(
                rev_num(s["activeRevisionId"].as_str()),
                Some(2),
                "the active revision is unchanged"
            );
            assert_eq!(
                rev_num(s["servedRevisionId"].as_str()),
                Some(2),
                "the served revision is unchanged"
            );
            break rev["lastAttempt"].clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the deploy to the re-keyed host did not fail within 60 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{victim_agent} {failed_rev} on {x}: lastAttempt {last_attempt}");
    assert_eq!(
        last_attempt["code"], "HOST_KEY_MISMATCH",
        "lastAttempt: {last_attempt}"
    );
    let other_want = Want::Running {
        rev: other_rev,
        label: format!("{other_agent}-v3"),
    };
    fleet.wait_converged(&[(other_agent.as_str(), other_want.clone())], t, converge);
    model.insert(other_agent.clone(), other_want);
    // Nothing changed on the re-keyed host: the same inventory, a00 still serves v2.
    let after = fleet.inventory(fleet.host(&x));
    assert_eq!(
        after, before,
        "hostd status on the re-keyed host {x} changed"
    );
    fleet.check_hosts(&model, true);
    // The operator re-pins the host's new key (PUT /hosts/{host}, `occ host enrol --replace`):
    // the coordinator talks to the host again, with the new key pinned.
    let current = fleet
        .api
        .request("GET", &format!("/hosts/{x}"), None)
        .expect("cannot read the host record");
    let repinned = fleet
        .api
        .request(
            "PUT",
            &format!("/hosts/{x}"),
            Some(&serde_json::json!({
                "address": address,
                "port": current["port"],
                "maxAgents": current["maxAgents"],
                "hostKey": new_key.trim(),
            })),
        )
        .expect("cannot re-pin the host key");
    assert_ne!(
        repinned["fingerprint"], current["fingerprint"],
        "re-pinning must change the pinned fingerprint"
    );
    let start = Instant::now();
    loop {
        match fleet
            .api
            .request("POST", &format!("/hosts/{x}/probe"), None)
        {
            Ok(_) => break,
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(30),
                "probe of {x} after re-pinning its key still fails: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // And a new deploy to the Agent on that host converges.
    let rev = fleet.deploy(victim_agent);
    let want = Want::Running {
        rev,
        label: format!("{victim_agent}-v3"),
    };
    fleet.wait_converged(&[(victim_agent, want.clone())], Instant::now(), converge);
    model.insert(victim_agent.to_owned(), want);
    fleet.check_hosts(&model, true);
    phase_done("6: changed host key refused, nothing changed, re-pinned", t);

    // 7. Delete everything: the Namespace first (409 while it has Agents), then every Agent,
    // then the Namespace.
    let t = Instant::now();
    match fleet
        .api
        .request("DELETE", &format!("/namespaces/{NS}"), None)
    {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!(status, 409, "DELETE of a non-empty Namespace");
            assert_eq!(code, "NAMESPACE_NOT_EMPTY");
        }
        other => panic!("DELETE of a non-empty Namespace must answer 409, got {other:?}"),
    }
    let out = fleet.occ(&["namespace", "delete", NS]);
    assert!(
        !out.status.success(),
        "occ namespace delete of a non-empty Namespace"
    );
    let all: Vec<String> = model.keys().cloned().collect();
    for a in &all {
        fleet.occ_ok(&["agent", "delete", NS, a]);
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    fleet.wait_deleted(&refs, converge);
    model.clear();
    fleet.check_hosts(&model, true);
    let answer = fleet.occ_json(&["namespace", "delete", NS]);
    assert_eq!(answer["deleting"], true, "{answer}");
    let start = Instant::now();
    loop {
        match fleet.api.request("GET", &format!("/namespaces/{NS}"), None) {
            Err(ClientError::Api { status: 404, .. }) => break,
            Ok(ns) => assert!(
                start.elapsed() < converge,
                "Namespace {NS} not deleted after {converge:?}: {ns}"
            ),
            Err(e) => panic!("GET /namespaces/{NS}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let empty: BTreeMap<String, usize> = fleet.check_hosts(&model, false);
    assert!(empty.values().all(|n| *n == 0));
    for h in fleet.hosts.iter() {
        let left = h
            .run_ok(
                "ls /etc/systemd/system | grep '^clawfleet-agent-' || true; \
                 grep '^cfa-' /etc/passwd || true",
            )
            .unwrap();
        assert_eq!(
            left.trim(),
            "",
            "{}: units or accounts left behind",
            h.name()
        );
    }
    phase_done("7: delete all Agents, 409, then the Namespace", t);
    let errors = fleet.serve_log_lines("ERROR");
    eprintln!("occ serve logged {} ERROR lines", errors.len());
    for l in errors.iter().take(20) {
        eprintln!("  {l}");
    }
    let panics = fleet.serve_log_lines("panicked");
    assert!(panics.is_empty(), "occ serve panicked: {panics:?}");
    eprintln!(
        "e2e fleet: all phases passed in {:.1} s",
        total.elapsed().as_secs_f64()
    );
}

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}
