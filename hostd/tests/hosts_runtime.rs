//! `agent-runtime` and `agent-logs` on a real host (systemd, journald, sshd): what the unit
//! reports, the main process's uid, redaction of secrets a gateway logs (its own password
//! included), paging by cursor with every line exactly once, the previous run after a restart,
//! failure evidence of a crash loop, and the bounds of a page over a large log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::runtime::{
    ExitKind, LogCursor, LogPage, LogStart, LogsArgs, MAX_PAGE_BYTES, MAX_PAGE_LINES, PageLines,
    RuntimeArgs, RuntimeReport,
};
use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::json;

const PEM: [&str; 4] = [
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
    "QyNTUxOQAAACBsZWFrZWQta2V5LWZvci10ZXN0cy1vbmx5LW5vdC1yZWFsLQAAAJgAAAAA",
    "-----END OPENSSH PRIVATE KEY-----",
];

fn runtime(occ: &Coordinator, host: &TestHost, a: &str, evidence: u32) -> RuntimeReport {
    match occ.ok(
        host,
        Operation::AgentRuntime(RuntimeArgs {
            namespace: ns("ns1"),
            agent: agent(a),
            evidence_lines: evidence,
        }),
    ) {
        OperationResult::AgentRuntime(r) => *r,
        other => panic!("{other:?}"),
    }
}

fn logs_op(a: &str, start: LogStart, previous: bool, limit: u32) -> Operation {
    Operation::AgentLogs(LogsArgs {
        namespace: ns("ns1"),
        agent: agent(a),
        start,
        previous,
        limit: PageLines::new(limit).unwrap(),
    })
}

fn page(occ: &Coordinator, host: &TestHost, op: Operation) -> LogPage {
    match occ.ok(host, op) {
        OperationResult::AgentLogs(p) => p,
        other => panic!("{other:?}"),
    }
}

fn gateway_lines(p: &LogPage) -> Vec<String> {
    p.entries
        .iter()
        .filter(|e| e.source == clawfleet_protocol::runtime::LogSource::Gateway)
        .map(|e| e.message.clone())
        .collect()
}

/// Waits until the journal holds `marker` for the Agent (journald writes asynchronously).
fn wait_for_line(occ: &Coordinator, host: &TestHost, a: &str, marker: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let p = page(
            occ,
            host,
            logs_op(
                a,
                LogStart::Tail {
                    lines: PageLines::max(),
                    since_unix: None,
                },
                false,
                1000,
            ),
        );
        if p.entries.iter().any(|e| e.message.contains(marker)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{marker} never logged: {p:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn runtime_logs_redaction_paging_and_previous_run_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    occ.ok(&host, ensure("ns1"));
    let mut lines: Vec<String> = PEM.iter().map(|s| (*s).to_owned()).collect();
    lines.extend([
        "auth header Authorization: Bearer abcdefghijklmnop0123456789".to_owned(),
        "using key sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345 for openai".to_owned(),
        "fetching https://api.example.com/v1/items?api_key=hunter2secret&page=2 now".to_owned(),
        "my own password is ${PASSWORD} (do not log this)".to_owned(),
    ]);
    for n in 0..40 {
        lines.push(format!("plain line {n:03} of run one"));
    }
    let r1 = spec("rev-1", 1, json!({"label": "rev-1", "logLines": lines}));
    occ.ok(&host, prepare("ns1", "a1", &r1));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    wait_for_line(&occ, &host, "a1", "plain line 039 of run one");

    // Runtime: the unit runs, as the Agent's account, serving rev-1.
    let rt = runtime(&occ, &host, "a1", 5);
    let w = rt.workload.clone().expect("a loaded unit");
    assert_eq!(w.active_state, "active");
    assert_eq!(w.sub_state, "running");
    assert_eq!(w.restarts, 0);
    assert!(w.main_pid.is_some(), "{w:?}");
    assert!(rt.account_uid.is_some());
    assert_eq!(
        w.main_uid, rt.account_uid,
        "the main process runs as the Agent's account"
    );
    // The unit's cgroup figures, where the host's cgroup tree has the controllers (a
    // container may not delegate them; systemd then reports nothing, and so does hostd).
    let controllers = host
        .run_ok("cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null || true")
        .unwrap();
    println!(
        "cgroup controllers on the test host: {}",
        controllers.trim()
    );
    assert!(w.cpu_usage_nanos.is_some_and(|c| c > 0), "{w:?}");
    if controllers.contains("memory") {
        assert!(w.memory_current_bytes.is_some_and(|m| m > 0), "{w:?}");
    }
    if controllers.contains("pids") {
        assert!(w.tasks_current.is_some_and(|t| t > 0), "{w:?}");
    }
    assert!(w.started_at.as_deref().is_some_and(|s| s.ends_with('Z')));
    assert_eq!(rt.observation.served, Some(id("rev-1")));
    assert_eq!(rt.recent_lines.len(), 5);
    println!("runtime: {}", serde_json::to_string(&rt).unwrap());

    // Redaction: every secret is gone, the rest intact, and the password appears nowhere.
    let paths = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
        .agent(&id("ns1"), &id("a1"));
    let pw = host
        .run_ok(&format!("cat {}", paths.password_file.display()))
        .unwrap();
    let pw = pw.trim().split_once('=').unwrap().1.to_owned();
    let all = page(
        &occ,
        &host,
        logs_op(
            "a1",
            LogStart::Tail {
                lines: PageLines::max(),
                since_unix: None,
            },
            false,
            1000,
        ),
    );
    let text = gateway_lines(&all);
    let joined = text.join("\n");
    for secret in [
        "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
        "QyNTUxOQAAACBsZWFrZWQta2V5",
        "abcdefghijklmnop0123456789",
        "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        "hunter2secret",
        pw.as_str(),
    ] {
        assert!(!joined.contains(secret), "{secret} leaked: {joined}");
    }
    assert!(
        text.contains(&"auth header Authorization: Bearer [REDACTED]".to_owned()),
        "{text:?}"
    );
    assert!(text.contains(&"using key [REDACTED] for openai".to_owned()));
    assert!(
        text.contains(
            &"fetching https://api.example.com/v1/items?api_key=[REDACTED]&page=[REDACTED] now"
                .to_owned()
        )
    );
    assert!(text.contains(&"my own password is [REDACTED] (do not log this)".to_owned()));
    assert!(all.redactions >= 8, "{}", all.redactions);
    assert!(
        all.entries
            .iter()
            .all(|e| e.at.ends_with('Z') && e.at.len() == 27)
    );

    // Paging by cursor, 7 at a time from the start: every plain line exactly once, in order.
    let mut seen = Vec::new();
    let mut start = LogStart::Since { since_unix: 0 };
    let mut pages = 0;
    loop {
        let p = page(&occ, &host, logs_op("a1", start, false, 7));
        assert!(p.entries.len() <= 7);
        pages += 1;
        seen.extend(gateway_lines(&p));
        let Some(cursor) = p.cursor.clone() else {
            panic!("no cursor: {p:?}")
        };
        start = LogStart::After { cursor };
        if !p.more {
            break;
        }
    }
    let plain: Vec<&String> = seen
        .iter()
        .filter(|l| l.starts_with("plain line"))
        .collect();
    assert_eq!(plain.len(), 40, "{seen:?}");
    for (n, l) in plain.iter().enumerate() {
        assert_eq!(**l, format!("plain line {n:03} of run one"));
    }
    assert!(pages >= 7, "{pages}");
    println!("paged {} entries in {pages} pages of 7", seen.len());

    // A cursor the journal does not know.
    let f = occ.fails(
        &host,
        logs_op(
            "a1",
            LogStart::After {
                cursor: LogCursor::new("s=0000;i=1;b=0000;m=1;t=1;x=1").unwrap(),
            },
            false,
            10,
        ),
    );
    assert_eq!(f.code, FailureCode::LogCursorInvalid, "{f}");

    // A cutover onto rev-2, in place (hostd/src/supervise.rs): --previous reads run one only.
    let r2 = spec(
        "rev-2",
        2,
        json!({"label": "rev-2", "logLines": ["this is run two"]}),
    );
    occ.ok(&host, prepare("ns1", "a1", &r2));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
    );
    wait_for_line(&occ, &host, "a1", "this is run two");
    let prev = page(
        &occ,
        &host,
        logs_op("a1", LogStart::Since { since_unix: 0 }, true, 1000),
    );
    let prev_text = gateway_lines(&prev);
    assert!(
        prev_text.iter().any(|l| l == "plain line 039 of run one"),
        "{prev_text:?}"
    );
    assert!(
        !prev_text.iter().any(|l| l.contains("run two")),
        "{prev_text:?}"
    );
    assert!(prev.invocation_id.is_some());
    // The same unit run: the gateway's run before is the span up to the launcher's relaunch
    // line in it.
    let rt2 = runtime(&occ, &host, "a1", 0);
    assert_eq!(
        rt2.workload.as_ref().unwrap().invocation_id,
        prev.invocation_id,
        "the cutover restarted the unit instead of relaunching its gateway in place"
    );

    // A restart of the unit (an operator's `systemctl restart`): its new run has no relaunch
    // line, so --previous reads the unit's run before from its last relaunch line on, run
    // two only.
    let unit = rt2.workload.unwrap().name;
    host.run_ok(&format!("systemctl restart {unit}")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while runtime(&occ, &host, "a1", 0)
        .workload
        .unwrap()
        .invocation_id
        == prev.invocation_id
    {
        assert!(
            std::time::Instant::now() < deadline,
            "systemctl restart did not start a new run of {unit}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let prev2 = page(
        &occ,
        &host,
        logs_op("a1", LogStart::Since { since_unix: 0 }, true, 1000),
    );
    let prev2_text = gateway_lines(&prev2);
    assert!(
        prev2_text.iter().any(|l| l.contains("this is run two")),
        "{prev2_text:?}"
    );
    assert!(
        !prev2_text.iter().any(|l| l.contains("run one")),
        "{prev2_text:?}"
    );
    assert_eq!(prev2.invocation_id, prev.invocation_id);
}

/// The Agent's own secrets never show in `agent-logs` on a real host: the values of its
/// operator env file and its gateway password, printed by the gateway whole and in a line so
/// long that journald cuts it inside the password (`_LINE_BREAK=line-max`).
#[test]
fn env_values_and_a_password_cut_by_journald_never_show_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    occ.ok(&host, ensure("ns1"));
    let paths = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
        .agent(&id("ns1"), &id("e1"));
    // journald's default LineMax (48K): the cut falls 12 characters into the password.
    let long = format!(
        "{}${{PASSWORD}} end of the long line",
        "x".repeat(48 * 1024 - 12)
    );
    let r1 = spec(
        "rev-1",
        1,
        json!({"label": "rev-1", "logLines": [
            "upstream token ${ENV:UPSTREAM_TOKEN} in use",
            "db password ${ENV:DB_PASSWORD} ok",
            long,
            "marker: all lines written",
        ]}),
    );
    occ.ok(&host, prepare("ns1", "e1", &r1));
    host.run_ok(&format!(
        "printf '%s\\n' 'UPSTREAM_TOKEN=\"tok value with spaces 123\"' 'DB_PASSWORD=hunter2hunter2' > {0} && chmod 600 {0}",
        paths.operator_env.display()
    ))
    .unwrap();
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "e1", &r1))),
    );
    wait_for_line(&occ, &host, "e1", "marker: all lines written");
    let pw = host
        .run_ok(&format!("cat {}", paths.password_file.display()))
        .unwrap();
    let pw = pw.trim().split_once('=').unwrap().1.to_owned();
    let all = page(
        &occ,
        &host,
        logs_op(
            "e1",
            LogStart::Tail {
                lines: PageLines::max(),
                since_unix: None,
            },
            false,
            1000,
        ),
    );
    let text = gateway_lines(&all);
    let joined = text.join("\n");
    for secret in ["tok value with spaces 123", "hunter2hunter2"] {
        assert!(!joined.contains(secret), "{secret} leaked: {joined}");
    }
    // No eight characters of the password in a row, on either side of the cut.
    for window in pw.as_bytes().windows(8) {
        let w = std::str::from_utf8(window).unwrap();
        assert!(!joined.contains(w), "{w} of the password leaked");
    }
    assert!(
        text.contains(&"upstream token [REDACTED] in use".to_owned()),
        "{text:?}"
    );
    assert!(
        text.contains(&"db password [REDACTED] ok".to_owned()),
        "{text:?}"
    );
    assert!(
        text.contains(&"[REDACTED] end of the long line".to_owned()),
        "journald cut the long line elsewhere: {:?}",
        text.iter()
            .map(|l| l.chars().take(60).collect::<String>())
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_crash_loop_leaves_its_exit_status_and_last_lines_as_evidence() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, QUICK_READINESS);
    occ.ok(&host, ensure("ns1"));
    let bad = spec(
        "rev-1",
        1,
        json!({"crashAtStart": true, "logLines": ["fatal: cannot open store, TOKEN=abc123secret"]}),
    );
    occ.ok(&host, prepare("ns1", "c1", &bad));
    let f = occ.fails(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "c1", &bad))),
    );
    assert!(
        matches!(
            f.code,
            FailureCode::UnitFailed | FailureCode::ReadinessTimeout
        ),
        "{f}"
    );
    let rt = runtime(&occ, &host, "c1", 20);
    let w = rt.workload.expect("a loaded unit");
    let exit = w
        .last_exit
        .clone()
        .unwrap_or_else(|| panic!("no last exit: {w:?}"));
    assert_eq!(exit.kind, ExitKind::Exited);
    assert_eq!(exit.status, 1, "{exit:?}");
    let lines: Vec<&str> = rt.recent_lines.iter().map(|l| l.message.as_str()).collect();
    assert!(
        lines.contains(&"fatal: cannot open store, TOKEN=[REDACTED]"),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("abc123secret")));
    assert!(rt.recent_lines.len() <= 20);
    println!(
        "crash-loop evidence: {}",
        serde_json::to_string(&rt.recent_lines).unwrap()
    );
}

/// Not a timed test: prints the figures of one page over a large log, and checks only the
/// page's own bounds.
#[test]
fn a_page_over_a_large_log_stays_within_its_bounds() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    occ.ok(&host, ensure("ns1"));
    // 40 KB lines stay under journald's line limit and its rate limit (few messages).
    let big = spec(
        "rev-1",
        1,
        json!({"logBytes": 50_000_000u64, "label": "big"}),
    );
    occ.ok(&host, prepare("ns1", "b1", &big));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "b1", &big))),
    );
    let unit = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
        .agent(&id("ns1"), &id("b1"))
        .unit_name;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut stored = String::new();
    while std::time::Instant::now() < deadline {
        stored = host
            .run_ok(&format!("journalctl -u {unit} -o cat --no-pager | wc -c"))
            .unwrap();
        if stored.trim().parse::<u64>().unwrap_or(0) > 40_000_000 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    for (name, start) in [
        (
            "tail 1000",
            LogStart::Tail {
                lines: PageLines::max(),
                since_unix: None,
            },
        ),
        ("since 0", LogStart::Since { since_unix: 0 }),
    ] {
        let op = logs_op("b1", start, false, MAX_PAGE_LINES);
        let id = occ.next_id();
        let signed = occ.sign(&occ.envelope(&host, &id, op));
        host.write_file("/tmp/logs-op.json", &signed.body, 0o600)
            .unwrap();
        host.write_file("/tmp/logs-op.json.sig", signed.signature.as_bytes(), 0o600)
            .unwrap();
        // Peak RSS of `hostd apply` for the read, sampled from /proc until it exits.
        let out = host
            .run_ok(
                "hostd apply /tmp/logs-op.json > /tmp/logs-out.json 2>/dev/null & p=$!; m=0; \
                 while [ -e /proc/$p/status ]; do h=$(awk '/VmHWM/{print $2}' /proc/$p/status 2>/dev/null); \
                 [ -n \"$h\" ] && [ \"$h\" -gt \"$m\" ] && m=$h; sleep 0.002; done; wait $p; echo $m",
            )
            .unwrap();
        let peak_kib: u64 = out
            .trim()
            .lines()
            .last()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        let reply = host.run_ok("cat /tmp/logs-out.json").unwrap();
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        let p = match serde_json::from_value(reply["outcome"]["result"].clone()) {
            Ok(OperationResult::AgentLogs(p)) => p,
            other => panic!(
                "{other:?}: {}",
                reply.to_string().chars().take(2000).collect::<String>()
            ),
        };
        let bytes: usize = p.entries.iter().map(|e| e.page_bytes()).sum();
        assert!(p.entries.len() <= MAX_PAGE_LINES as usize);
        assert!(bytes <= MAX_PAGE_BYTES, "{bytes}");
        println!(
            "large log ({} bytes in the journal), {name}: {} entries, {bytes} bytes, more={}, hostd peak RSS {:.1} MiB",
            stored.trim(),
            p.entries.len(),
            p.more,
            peak_kib as f64 / 1024.0
        );
    }
}
