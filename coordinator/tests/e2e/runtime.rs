//! Issue 14 end to end on a real test host, through `occ` and the API: `occ agent runtime`
//! (restarts, memory where the host's cgroups have it, the served revision, the main process
//! running as the Agent's account), `occ agent logs` (redaction of what a gateway leaks, paging
//! by cursor, `--previous`, NDJSON with `--output json`), the failure evidence of a crash loop
//! in `occ agent status`, the audit of every log read, 403 for another Namespace's read token,
//! and 429 with Retry-After once a token's read budget is spent. Issue 26, N6: a host whose
//! state root limits no Agent takes one Namespace only (`HOST_NOT_QUOTA_LIMITED`), and one
//! whose state root has btrfs quota groups is shared.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use coordinator::client::{Client, ClientError, percent_encode};
use fleet::{Fleet, FleetOptions, NS, Want, document};
use serde_json::{Value, json};

const SECRETS: [&str; 4] = [
    "abcdefghijklmnop0123456789",
    "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "hunter2secret",
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
];

fn leaky_lines(run: &str) -> Value {
    let mut lines = vec![
        "-----BEGIN OPENSSH PRIVATE KEY-----".to_owned(),
        "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW".to_owned(),
        "-----END OPENSSH PRIVATE KEY-----".to_owned(),
        "Authorization: Bearer abcdefghijklmnop0123456789".to_owned(),
        "key sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345 loaded".to_owned(),
        "GET https://api.example.com/v1?api_key=hunter2secret&x=1".to_owned(),
        "gateway password ${PASSWORD} must not show".to_owned(),
    ];
    for n in 0..20 {
        lines.push(format!("{run} line {n:02}"));
    }
    json!(lines)
}

fn logs_api(fleet: &Fleet, agent: &str, query: &str) -> Value {
    fleet
        .api
        .request(
            "GET",
            &format!("/namespaces/{NS}/agents/{agent}/runtime/logs?{query}"),
            None,
        )
        .unwrap_or_else(|e| panic!("logs {query}: {e}"))
}

fn messages(page: &Value) -> Vec<String> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["source"] == "gateway")
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits until the Agent's log (through the API) holds `marker`.
fn wait_logged(fleet: &Fleet, agent: &str, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = logs_api(fleet, agent, "tailLines=1000");
        if messages(&page).iter().any(|m| m.contains(marker)) {
            return;
        }
        assert!(Instant::now() < deadline, "{marker} never logged: {page}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn runtime_logs_evidence_audit_and_limits_through_occ() {
    clawfleet_vm_tests::skip_unless_hosts!();
    // The host is shared by two Namespaces below: its state root enforces per-Agent quotas.
    let fleet = Fleet::start_with(FleetOptions {
        hosts: 1,
        btrfs_state_roots: Some(1 << 30),
        ..FleetOptions::default()
    });
    let host = fleet.hosts.iter().next().unwrap();
    let quotas = fleet.occ_json(&["host", "get", host.name()])["lastProbe"]["quotas"].clone();
    assert!(
        quotas
            .as_str()
            .is_some_and(|q| q.starts_with("enforced: btrfs quota groups")),
        "{quotas}"
    );

    // A healthy gateway that logs secrets.
    fleet.create_agent(
        "a1",
        &document("a1-r1", json!({"logLines": leaky_lines("run-one")})),
    );
    let rev1 = fleet.deploy("a1");
    fleet.wait_converged(
        &[(
            "a1",
            Want::Running {
                rev: rev1.clone(),
                label: "a1-r1".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(90),
    );
    wait_logged(&fleet, "a1", "run-one line 19");

    // occ agent runtime: the unit, its account, the served revision.
    let rt = fleet.occ_json(&["agent", "runtime", NS, "a1"]);
    let w = &rt["workload"];
    assert_eq!(w["activeState"], "active", "{rt}");
    assert_eq!(w["restarts"], 0, "{rt}");
    assert!(w["mainPid"].as_u64().is_some(), "{rt}");
    assert_eq!(
        w["mainUid"], rt["accountUid"],
        "the gateway runs as its account: {rt}"
    );
    assert_eq!(rt["observation"]["served"], json!(rev1), "{rt}");
    assert_eq!(rt["target"], json!(host.name()), "{rt}");
    let controllers = host
        .run_ok("cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null || true")
        .unwrap();
    if controllers.contains("memory") {
        assert!(
            w["memoryCurrentBytes"].as_u64().is_some_and(|m| m > 0),
            "{rt}"
        );
    } else {
        println!("the test host's cgroup tree has no memory controller; memory is not reported");
    }
    let table = fleet.occ_ok(&["agent", "runtime", NS, "a1"]);
    assert!(
        table.contains("workload.activeState") && table.contains("active"),
        "{table}"
    );

    // occ agent logs: redacted, the rest intact, the password nowhere.
    let pw_line = host
        .run_ok("cat /var/lib/clawfleet/namespaces/*/agents/*/gateway-password.env")
        .unwrap();
    let pw = pw_line.trim().split_once('=').unwrap().1.to_owned();
    let out = fleet.occ_ok(&["agent", "logs", NS, "a1", "--tail", "1000"]);
    for secret in SECRETS.iter().copied().chain([pw.as_str()]) {
        assert!(!out.contains(secret), "{secret} leaked:\n{out}");
    }
    for kept in [
        "Authorization: Bearer [REDACTED]",
        "key [REDACTED] loaded",
        "GET https://api.example.com/v1?api_key=[REDACTED]&x=[REDACTED]",
        "gateway password [REDACTED] must not show",
        "run-one line 07",
    ] {
        assert!(out.contains(kept), "{kept} missing:\n{out}");
    }
    // NDJSON, every line once.
    let ndjson = fleet.occ_ok(&[
        "--output", "json", "agent", "logs", NS, "a1", "--since", "1h",
    ]);
    let entries: Vec<Value> = ndjson
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let run_one: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.starts_with("run-one line"))
        .collect();
    assert_eq!(run_one.len(), 20, "{ndjson}");

    // Paging through the API with a cursor: no line twice, none missed.
    let mut seen = Vec::new();
    let mut query = "sinceSeconds=3600&limit=4".to_owned();
    for _ in 0..100 {
        let page = logs_api(&fleet, "a1", &query);
        assert!(page["entries"].as_array().unwrap().len() <= 4);
        seen.extend(messages(&page));
        if page["more"] != true {
            break;
        }
        let cursor = page["cursor"].as_str().unwrap();
        query = format!("cursor={}&limit=4", percent_encode(cursor));
    }
    let run_one_paged: Vec<&String> = seen
        .iter()
        .filter(|m| m.starts_with("run-one line"))
        .collect();
    assert_eq!(run_one_paged.len(), 20, "{seen:?}");
    assert_eq!(
        run_one_paged.iter().collect::<BTreeSet<_>>().len(),
        20,
        "a line came twice: {seen:?}"
    );
    // Bad parameters are refused with the parameter named.
    for (query, code) in [
        ("tailLines=0", "INVALID_LOG_QUERY"),
        ("tailLines=5&cursor=abc", "INVALID_LOG_QUERY"),
        ("bogus=1", "INVALID_QUERY"),
        ("cursor=s%3Dnope", "LOG_CURSOR_INVALID"),
    ] {
        match fleet.api.request(
            "GET",
            &format!("/namespaces/{NS}/agents/a1/runtime/logs?{query}"),
            None,
        ) {
            Err(ClientError::Api { code: c, .. }) => assert_eq!(c, code, "{query}"),
            other => panic!("{query}: {other:?}"),
        }
    }

    // `occ agent logs -f` follows by cursor: started now, it prints what run two logs.
    let mut follow = fleet
        .occ_command(&["agent", "logs", NS, "a1", "--tail", "1", "-f"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let follow_out = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(follow_out)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    // A new revision restarts the gateway: --previous shows run one only.
    fleet.update_configuration(
        "a1",
        &document("a1-r2", json!({"logLines": ["run-two here"]})),
    );
    let rev2 = fleet.deploy("a1");
    fleet.wait_converged(
        &[(
            "a1",
            Want::Running {
                rev: rev2,
                label: "a1-r2".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(90),
    );
    wait_logged(&fleet, "a1", "run-two here");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut followed = Vec::new();
    while !followed
        .iter()
        .any(|l: &String| l.ends_with("run-two here"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => followed.push(line),
            Err(_) => panic!("occ agent logs -f never printed run two: {followed:?}"),
        }
    }
    // Its own child: stopped by pid.
    let _ = follow.kill();
    let _ = follow.wait();
    let prev = fleet.occ_ok(&["agent", "logs", NS, "a1", "--previous", "--tail", "1000"]);
    assert!(
        prev.contains("run-one line 19") && !prev.contains("run-two"),
        "{prev}"
    );

    // Every log read was audited, naming the caller and the range.
    let audit = fleet.occ_json(&["audit", "--action", "agent.logs.read", "--limit", "200"]);
    let reads = audit.as_array().unwrap();
    assert!(reads.len() >= 8, "{audit}");
    assert!(reads.iter().all(|e| e["target"] == format!("{NS}/a1")));
    assert!(
        reads
            .iter()
            .any(|e| e["detail"]["range"]["tailLines"] == 1000),
        "{audit}"
    );
    assert!(
        reads
            .iter()
            .all(|e| e["actor"].as_str().is_some_and(|a| !a.is_empty()))
    );

    // A crash loop: the deployment status carries the evidence, redacted and bounded.
    fleet.create_agent(
        "c1",
        &document(
            "c1-r1",
            json!({"crashAtStart": true, "logLines": ["fatal: store locked, TOKEN=abc123secret"]}),
        ),
    );
    let crash_rev = fleet.deploy("c1");
    // And one that never becomes ready (the fleet's hosts wait 30 s for readiness).
    fleet.create_agent(
        "n1",
        &document(
            "n1-r1",
            json!({"neverReady": true, "logLines": ["waiting for upstream with api_key=zzz987secret"]}),
        ),
    );
    let never_rev = fleet.deploy("n1");
    let evidence = |agent: &str, rev: &str| {
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let s = fleet.status(agent).unwrap();
            let found = s["revisions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["id"] == json!(rev) && r["runtimeFailure"].is_object())
                .map(|r| r["runtimeFailure"].clone());
            if let Some(f) = found {
                break f;
            }
            assert!(
                Instant::now() < deadline,
                "no runtimeFailure for {agent}: {s}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let failure = evidence("c1", &crash_rev);
    let never = evidence("n1", &never_rev);
    assert_eq!(never["code"], "READINESS_TIMEOUT", "{never}");
    assert_eq!(never["check"], "readiness", "{never}");
    assert_eq!(never["activeState"], "active", "{never}");
    let never_text = never.to_string();
    assert!(
        never_text.contains("api_key=[REDACTED]") && !never_text.contains("zzz987secret"),
        "{never_text}"
    );
    assert!(
        never["lastLines"]
            .as_array()
            .is_some_and(|l| !l.is_empty() && l.len() <= 20)
    );
    fleet.occ_ok(&["agent", "stop", NS, "n1"]);
    assert_eq!(failure["component"], "gateway", "{failure}");
    assert_eq!(failure["lastExit"]["kind"], "exited", "{failure}");
    assert_eq!(failure["lastExit"]["status"], 1, "{failure}");
    let lines = failure["lastLines"].as_array().unwrap();
    assert!(!lines.is_empty() && lines.len() <= 20, "{failure}");
    let text = failure.to_string();
    assert!(
        text.contains("TOKEN=[REDACTED]") && !text.contains("abc123secret"),
        "{text}"
    );
    let shown = fleet.occ_ok(&["agent", "deployment-status", NS, "c1"]);
    assert!(
        shown.contains(&format!("runtime failure of {crash_rev}"))
            && shown.contains("last exit: exited status 1")
            && shown.contains("fatal: store locked, TOKEN=[REDACTED]"),
        "{shown}"
    );
    fleet.occ_ok(&["agent", "stop", NS, "c1"]);

    // Another Namespace's read token: 403. A token's budget: 429 with Retry-After.
    fleet.occ_ok(&["namespace", "create", "other", "--hosts", host.name()]);
    let created = fleet.occ_json(&["token", "create", "reader", "--grant", "other:read"]);
    let other = Client::new(
        &format!("http://127.0.0.1:{}", fleet.port),
        Some(created["token"].as_str().unwrap().to_owned()),
    )
    .unwrap();
    for path in ["runtime", "runtime/logs"] {
        match other.request("GET", &format!("/namespaces/{NS}/agents/a1/{path}"), None) {
            Err(ClientError::Api { status: 403, .. }) => {}
            other => panic!("{path}: {other:?}"),
        }
    }
    let created = fleet.occ_json(&[
        "token",
        "create",
        "hammer",
        "--grant",
        &format!("{NS}:read"),
    ]);
    let hammer = Client::new(
        &format!("http://127.0.0.1:{}", fleet.port),
        Some(created["token"].as_str().unwrap().to_owned()),
    )
    .unwrap();
    let mut limited = None;
    for n in 0..400 {
        match hammer.request("GET", &format!("/namespaces/{NS}/agents/a1/runtime"), None) {
            Ok(_) => {}
            Err(ClientError::RateLimited { retry_after, .. }) => {
                limited = Some((n, retry_after));
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let (n, retry_after) = limited.expect("never rate limited");
    assert!(n >= 100, "limited after only {n} reads");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    // The admin token's own budget is untouched by another token's.
    fleet.occ_ok(&["agent", "runtime", NS, "a1"]);

    // Issue 26: the shared host loses its quotas (the operator disables them): the next
    // probe says so, and `occ host probe` warns that two Namespaces share a host that no
    // longer limits their Agents; a third Namespace is refused there.
    let mount = host.state_fs().expect("a btrfs state root").to_path_buf();
    let out = std::process::Command::new("btrfs")
        .args(["quota", "disable"])
        .arg(&mount)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let probed = fleet.occ(&["host", "probe", host.name()]);
    let said = String::from_utf8_lossy(&probed.stderr);
    assert!(
        probed.status.success()
            && said.contains(&format!("host {} cannot limit", host.name()))
            && said.contains("does not have quotas enabled")
            && said.contains("yet Namespaces")
            && said.contains(NS)
            && said.contains("other"),
        "{said}"
    );
    let out = fleet.occ(&["namespace", "create", "third", "--hosts", host.name()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("HOST_NOT_QUOTA_LIMITED"),
        "{said}"
    );
}

/// Issue 26, N6, fail closed on a real host: a test host's state root is its overlay file
/// system, on which hostd limits no Agent's disk use (`quotas: unavailable: …`, shown by
/// `occ host get` with a warning). A second Namespace naming it is refused with
/// `HOST_NOT_QUOTA_LIMITED`, naming the host, what it lacks and the Namespace already there,
/// and nothing is created; the first Namespace keeps deploying there.
#[test]
fn a_host_without_per_agent_quotas_takes_one_namespace_only() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let fleet = Fleet::start(1);
    let host = fleet.hosts.iter().next().unwrap().name().to_owned();
    let probe = fleet.occ_json(&["host", "get", &host])["lastProbe"].clone();
    let quotas = probe["quotas"].as_str().unwrap_or_default().to_owned();
    assert!(quotas.starts_with("unavailable: "), "{probe}");
    assert_eq!(probe["networkIsolation"], "namespaces", "{probe}");
    let shown = fleet.occ(&["host", "get", &host]);
    let said = String::from_utf8_lossy(&shown.stderr);
    assert!(
        shown.status.success()
            && said.contains(&format!("host {host} cannot limit each Agent's disk"))
            && said.contains("HOST_NOT_QUOTA_LIMITED"),
        "{said}"
    );

    let out = fleet.occ(&["namespace", "create", "other", "--hosts", &host]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second Namespace was placed: {said}"
    );
    let why = quotas.trim_start_matches("unavailable: ");
    assert!(
        said.contains("HOST_NOT_QUOTA_LIMITED")
            && said.contains(&format!("host {host} cannot limit"))
            && said.contains(why)
            && said.contains(&format!("Namespace {NS} uses it")),
        "{said}"
    );
    match fleet.api.request("GET", "/namespaces/other", None) {
        Err(ClientError::Api { status: 404, .. }) => {}
        other => panic!("Namespace other exists: {other:?}"),
    }
    // The host's own Namespace deploys there as before.
    fleet.create_agent("q1", &document("q1-r1", json!({})));
    let rev = fleet.deploy("q1");
    fleet.wait_converged(
        &[(
            "q1",
            Want::Running {
                rev,
                label: "q1-r1".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(120),
    );
}
