//! The SSH backend against a real test host (systemd-nspawn Debian with sshd, hostd enrolled
//! with `hostd enrol`, the test gateway as workload): the lifecycle with progress, concurrent
//! activations of two Agents over the one connection, and sessions that drop mid-activation
//! (cut from the host's side and from the coordinator's side), whose recorded outcome the
//! backend learns with operation-status.
//!
//! Needs root and the vm-tests runner packages; prints SKIP otherwise (fails under CI=true).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::ssh_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawfleet_protocol::operation::RevisionSpec;
use clawfleet_protocol::result::{OperationResult, OperationState, Progress, Step};
use clawfleet_protocol::{FailureCode, Ident, OperationId};
use clawfleet_vm_tests::{TestHost, TestHosts, skip_unless_hosts};
use coordinator::backend::{Backend, CallError, CallOptions, HostTarget, ProgressSink};
use coordinator::model::Jump;
use coordinator::ssh::{SshBackend, SshSettings};
use serde_json::json;
use ssh_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

fn opts() -> CallOptions {
    CallOptions {
        deadline: Duration::from_secs(60),
        ..CallOptions::default()
    }
}

/// A sink that forwards every progress event to a channel.
fn channel_sink() -> (ProgressSink, mpsc::UnboundedReceiver<Progress>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink: ProgressSink = Arc::new(move |_host, p: &Progress| {
        let _ = tx.send(p.clone());
    });
    (sink, rx)
}

fn served(backend_result: OperationResult, ns: &str, agent: &str) -> Option<String> {
    let OperationResult::Status(inv) = backend_result else {
        panic!("not a status result: {backend_result:?}");
    };
    inv.namespaces
        .iter()
        .find(|n| n.id.as_str() == ns)?
        .agents
        .iter()
        .find(|a| a.id.as_str() == agent)?
        .observation
        .served
        .as_ref()
        .map(|s| s.to_string())
}

/// Prepares and activates `rev` of `agent` in Namespace ns1; returns the activation's result
/// and the steps hostd reported on the way.
async fn deploy(
    backend: &SshBackend,
    target: &HostTarget,
    agent: &str,
    rev: &RevisionSpec,
) -> (OperationResult, Vec<Step>) {
    backend
        .call(target, prepare("ns1", agent, rev), opts())
        .await
        .unwrap();
    let (sink, mut rx) = channel_sink();
    let r = backend
        .call_with_progress(target, activate("ns1", agent, rev), opts(), Some(&sink))
        .await
        .unwrap();
    let mut steps = Vec::new();
    while let Ok(p) = rx.try_recv() {
        steps.push(p.step);
    }
    (r, steps)
}

/// Kills, inside the host, the sshd processes serving the TCP connection from `local_port`
/// (found with `ss`, killed by pid): the session drops as if the network or sshd died.
fn cut_from_host_side(host: &TestHost, local_port: u16) {
    let out = host
        .run_ok(&format!(
            "ss -tnpH state established '( sport = :22 and dport = :{local_port} )'"
        ))
        .unwrap();
    let pids: Vec<String> = out
        .split("pid=")
        .skip(1)
        .filter_map(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        !pids.is_empty(),
        "no sshd process for port {local_port}: {out}"
    );
    host.run_ok(&format!("kill -KILL {}", pids.join(" ")))
        .unwrap();
}

/// Starts an activation whose gateway needs 4 s to become ready, waits until hostd reports
/// the readiness step, cuts the session with `cut`, and checks that the backend returns the
/// outcome hostd recorded (learned with operation-status), and that it is what
/// operation-status says.
async fn activation_cut_mid_readiness<F, Fut>(
    backend: &SshBackend,
    target: &HostTarget,
    rev: &RevisionSpec,
    cut: F,
) -> Result<OperationResult, CallError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let (sink, mut rx) = channel_sink();
    let before = backend.stats();
    let task = {
        let backend = backend.clone();
        let target = target.clone();
        let op = activate("ns1", "a1", rev);
        tokio::spawn(async move {
            backend
                .call_with_progress(&target, op, opts(), Some(&sink))
                .await
        })
    };
    let until = Instant::now() + Duration::from_secs(30);
    let id: OperationId = loop {
        let p = tokio::time::timeout_at(until.into(), rx.recv())
            .await
            .expect("no readiness step within 30 s")
            .expect("progress channel closed");
        if p.step == Step::Readiness {
            break p.operation_id;
        }
    };
    cut().await;
    let started = Instant::now();
    let result = task.await.unwrap();
    let after = backend.stats();
    eprintln!(
        "cut mid-readiness: {result:?} after {:?}; {} operation-status queries",
        started.elapsed(),
        after.status_queries - before.status_queries
    );
    assert_eq!(after.recoveries - before.recoveries, 1, "{after:?}");
    // The answer is exactly what the host recorded.
    let recorded = backend.operation_status(target, &id).await.unwrap();
    match (&result, &recorded) {
        (Ok(r), OperationState::Succeeded { result, .. }) => assert_eq!(r, result.as_ref()),
        (Err(CallError::Failed(f)), OperationState::Failed { failure, .. }) => {
            assert_eq!(f, failure)
        }
        other => panic!("the call's outcome and the recorded one differ: {other:?}"),
    }
    result
}

#[test]
fn lifecycle_concurrency_and_dropped_sessions_on_a_real_host() {
    skip_unless_hosts!();
    init_tracing();
    let keys = Keys::new();
    let host = TestHost::start().unwrap();
    install_hostd(&host, &keys);
    let target = host_target(&host);
    runtime().block_on(async {
        let backend = keys.backend(fast_settings());

        match backend.call(&target, probe(), opts()).await.unwrap() {
            OperationResult::Probe(p) => {
                assert_eq!(p.host_key.as_str(), host.host_key_fingerprint());
                assert!(p.systemd_version.is_some(), "{p:?}");
                assert!(p.missing_tools.is_empty(), "{p:?}");
            }
            other => panic!("{other:?}"),
        }
        backend.call(&target, ensure("ns1"), opts()).await.unwrap();

        // Prepare and activate with progress.
        let r1 = spec("r1", 1, json!({}));
        let (r, steps) = deploy(&backend, &target, "a1", &r1).await;
        assert!(
            matches!(r, OperationResult::ActivateRevision(ref a) if a.restarted),
            "{r:?}"
        );
        for s in [
            Step::PointerFlip,
            Step::Restart,
            Step::Readiness,
            Step::ServedRecord,
        ] {
            assert!(steps.contains(&s), "{s:?} missing from {steps:?}");
        }
        let inv = backend.call(&target, status(), opts()).await.unwrap();
        assert_eq!(served(inv, "ns1", "a1").as_deref(), Some("r1"));

        // Two Agents activated at once over the one connection (one channel each), each
        // gateway taking 3 s to become ready.
        let b1 = spec("b1", 1, json!({"readyAfterMs": 3000}));
        let c1 = spec("c1", 1, json!({"readyAfterMs": 3000}));
        backend
            .call(&target, prepare("ns1", "b", &b1), opts())
            .await
            .unwrap();
        backend
            .call(&target, prepare("ns1", "c", &c1), opts())
            .await
            .unwrap();
        let t = Instant::now();
        let since_us = host_now_us(&host);
        let since = since_us / 1_000_000;
        let (rb, rc) = tokio::join!(
            backend.call(&target, activate("ns1", "b", &b1), opts()),
            backend.call(&target, activate("ns1", "c", &c1), opts())
        );
        let both = t.elapsed();
        rb.unwrap();
        rc.unwrap();
        eprintln!("two 3 s activations at once took {both:?}");
        // They ran at once, each in its own hostd: each started before the other finished.
        // The journal is read from the whole second: r1's activation may share it.
        let runs: Vec<HostdOp> = hostd_ops(&host, since)
            .into_iter()
            .filter(|o| o.op == "activate-revision" && o.received_us >= since_us)
            .collect();
        assert_eq!(runs.len(), 2, "{runs:#?}");
        assert_ne!(runs[0].pid, runs[1].pid, "{runs:#?}");
        for (a, b) in [(&runs[0], &runs[1]), (&runs[1], &runs[0])] {
            assert!(
                b.received_us < a.finished_us.unwrap(),
                "they ran one after the other: {runs:#?}"
            );
        }
        assert_eq!(backend.stats().connections_opened, 1);

        // The session is cut from the host's side (its sshd processes killed) while hostd
        // waits for readiness: the backend reconnects and returns the recorded outcome.
        let r2 = spec("r2", 2, json!({"readyAfterMs": 4000}));
        backend
            .call(&target, prepare("ns1", "a1", &r2), opts())
            .await
            .unwrap();
        let port = backend.connection_local_addr(&target).await.unwrap().port();
        let cut = activation_cut_mid_readiness(&backend, &target, &r2, || async {
            cut_from_host_side(&host, port)
        })
        .await;
        match cut {
            Err(CallError::Failed(f)) => {
                assert_eq!(f.code, FailureCode::SessionClosed, "{f}");
                assert!(f.is_retryable());
            }
            other => panic!("expected the recorded SESSION_CLOSED: {other:?}"),
        }
        assert_eq!(backend.stats().connections_opened, 2);
        // The retry (a new id) completes the cutover.
        let r = backend
            .call(&target, activate("ns1", "a1", &r2), opts())
            .await
            .unwrap();
        assert!(matches!(r, OperationResult::ActivateRevision(_)));
        let inv = backend.call(&target, status(), opts()).await.unwrap();
        assert_eq!(served(inv, "ns1", "a1").as_deref(), Some("r2"));

        // The same, cut from the coordinator's side.
        let r3 = spec("r3", 3, json!({"readyAfterMs": 4000}));
        backend
            .call(&target, prepare("ns1", "a1", &r3), opts())
            .await
            .unwrap();
        let cut = activation_cut_mid_readiness(&backend, &target, &r3, || async {
            assert!(backend.drop_connection(&target).await);
        })
        .await;
        assert!(
            matches!(&cut, Err(CallError::Failed(f)) if f.code == FailureCode::SessionClosed),
            "{cut:?}"
        );
        assert_eq!(backend.stats().connections_opened, 3);

        // A changed host key is refused.
        let mut other = target.clone();
        other.host_key = keys.signing_public();
        match backend.call(&other, probe(), opts()).await {
            Err(CallError::HostKeyMismatch {
                presented,
                expected,
                ..
            }) => {
                assert_eq!(presented, host.host_key_fingerprint());
                assert_ne!(expected, presented);
            }
            other => panic!("{other:?}"),
        }
        backend.close_all().await;
    });
}

/// The SSH banner of `address:22`, if an sshd answers within 2 s.
fn ssh_banner(address: &str) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect_timeout(
        &format!("{address}:22").parse().unwrap(),
        Duration::from_secs(2),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Waits for the first progress event of `step` on `rx`; returns its operation id.
async fn wait_for_step(rx: &mut mpsc::UnboundedReceiver<Progress>, step: Step) -> OperationId {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let p = tokio::time::timeout_at(until.into(), rx.recv())
            .await
            .expect("no such step within 30 s")
            .expect("progress channel closed");
        if p.step == step {
            return p.operation_id;
        }
    }
}

#[test]
fn persistent_sessions_on_a_real_host() {
    skip_unless_hosts!();
    init_tracing();
    let keys = Keys::new();
    let host = TestHost::start().unwrap();
    install_hostd(&host, &keys);
    let target = host_target(&host);
    runtime().block_on(async {
        let backend = keys.backend(SshSettings {
            max_sessions_per_host: 3,
            ..fast_settings()
        });
        let since = host_now(&host);

        // Many operations, one hostd.
        for _ in 0..10 {
            backend.call(&target, probe(), opts()).await.unwrap();
        }
        backend.call(&target, ensure("ns1"), opts()).await.unwrap();
        let agents = ["a1", "a2", "a3", "a4", "a5"];
        let revs: Vec<RevisionSpec> = agents
            .iter()
            .map(|a| spec(&format!("{a}-r1"), 1, json!({"readyAfterMs": 1500})))
            .collect();
        for (a, r) in agents.iter().zip(&revs) {
            backend
                .call(&target, prepare("ns1", a, r), opts())
                .await
                .unwrap();
        }
        let ops = hostd_ops(&host, since);
        assert_eq!(ops.len(), 16, "{ops:#?}");
        let pids: BTreeSet<u32> = ops.iter().map(|o| o.pid).collect();
        assert_eq!(pids.len(), 1, "one hostd served them all: {ops:#?}");
        assert_eq!(
            hostd_serve_pids(&host),
            pids.iter().copied().collect::<Vec<_>>()
        );

        // Five Agents activated at once (each gateway ready after 1.5 s) on a pool of three:
        // three sessions work at once, the other two activations wait for one.
        let t = Instant::now();
        let mut tasks = Vec::new();
        for (a, r) in agents.iter().zip(&revs) {
            let backend = backend.clone();
            let target = target.clone();
            let op = activate("ns1", a, r);
            tasks.push(tokio::spawn(async move {
                backend.call(&target, op, opts()).await
            }));
        }
        for task in tasks {
            let r = task.await.unwrap();
            assert!(
                matches!(r, Ok(OperationResult::ActivateRevision(_))),
                "{r:?}"
            );
        }
        let took = t.elapsed();
        let activations: Vec<HostdOp> = hostd_ops(&host, since)
            .into_iter()
            .filter(|o| o.op == "activate-revision")
            .collect();
        assert_eq!(activations.len(), 5, "{activations:#?}");
        let used: BTreeSet<u32> = activations.iter().map(|o| o.pid).collect();
        assert_eq!(
            used.len(),
            3,
            "sessions used by 5 activations: {activations:#?}"
        );
        assert!(used.is_superset(&pids), "the first session was reused");
        assert_eq!(backend.host_sessions(&target), (3, 3));
        assert_eq!(hostd_serve_pids(&host).len(), 3);
        assert!(
            took >= Duration::from_secs(3),
            "five 1.5 s activations on three sessions took {took:?}"
        );
        eprintln!("five 1.5 s activations on three sessions: {took:?}");
        let stats = backend.stats();
        assert_eq!(stats.sessions_opened, 3, "{stats:?}");
        assert_eq!(stats.connections_opened, 1, "{stats:?}");

        // Killed between operations: every idle hostd dies (by pid); the next operations run
        // on new sessions, once each.
        let idle = hostd_serve_pids(&host);
        host.run_ok(&format!(
            "kill -KILL {}",
            idle.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ))
        .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while !hostd_serve_pids(&host).is_empty() {
            assert!(Instant::now() < until, "hostd still runs");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = backend.stats();
        let since_kill_us = host_now_us(&host);
        let since_kill = since_kill_us / 1_000_000;
        match backend.call(&target, ensure("ns2"), opts()).await {
            Ok(OperationResult::EnsureNamespace(r)) => assert!(r.created),
            other => panic!("{other:?}"),
        }
        let after = backend.stats();
        assert_eq!(
            after.sessions_replaced - before.sessions_replaced,
            3,
            "{after:?}"
        );
        assert_eq!(after.recoveries, before.recoveries, "{after:?}");
        assert_eq!(
            after.sessions_opened - before.sessions_opened,
            1,
            "{after:?}"
        );
        let ensure_ops: Vec<HostdOp> = hostd_ops(&host, since_kill)
            .into_iter()
            .filter(|o| o.op == "ensure-namespace" && o.received_us >= since_kill_us)
            .collect();
        assert_eq!(ensure_ops.len(), 1, "{ensure_ops:#?}");
        assert!(!idle.contains(&ensure_ops[0].pid));
        let entry = journal_entry(&host, &ensure_ops[0].id).unwrap();
        assert_eq!(entry["state"]["state"], "succeeded", "{entry:#}");

        // Killed mid-operation (by pid, while the gateway starts): the backend learns the
        // recorded outcome with operation-status; the retry completes the cutover once.
        let r2 = spec("a1-r2", 2, json!({"readyAfterMs": 4000}));
        backend
            .call(&target, prepare("ns1", "a1", &r2), opts())
            .await
            .unwrap();
        let (sink, mut rx) = channel_sink();
        let before = backend.stats();
        let task = {
            let backend = backend.clone();
            let target = target.clone();
            let op = activate("ns1", "a1", &r2);
            tokio::spawn(async move {
                backend
                    .call_with_progress(&target, op, opts(), Some(&sink))
                    .await
            })
        };
        let id = wait_for_step(&mut rx, Step::Readiness).await;
        let ops = hostd_ops(&host, since_kill);
        let running = ops
            .iter()
            .find(|o| o.id == id.as_str())
            .unwrap_or_else(|| panic!("{id} not in hostd's journal: {ops:#?}"));
        host.run_ok(&format!("kill -KILL {}", running.pid)).unwrap();
        match task.await.unwrap() {
            Err(CallError::Failed(f)) => {
                assert_eq!(f.code, FailureCode::SessionClosed, "{f}");
                assert!(f.is_retryable());
            }
            other => panic!("expected the recorded SESSION_CLOSED: {other:?}"),
        }
        let after = backend.stats();
        assert_eq!(after.recoveries - before.recoveries, 1, "{after:?}");
        let entry = journal_entry(&host, id.as_str()).unwrap();
        assert_eq!(entry["state"]["state"], "failed", "{entry:#}");
        assert_eq!(
            entry["state"]["failure"]["code"], "SESSION_CLOSED",
            "{entry:#}"
        );
        assert_eq!(entry["state"]["after_step"], "readiness", "{entry:#}");
        let r = backend
            .call(&target, activate("ns1", "a1", &r2), opts())
            .await
            .unwrap();
        assert!(matches!(r, OperationResult::ActivateRevision(_)), "{r:?}");
        let inv = backend.call(&target, status(), opts()).await.unwrap();
        assert_eq!(served(inv, "ns1", "a1").as_deref(), Some("a1-r2"));
        // Every changing operation the coordinator sent has exactly one journal entry, and
        // each one ran in exactly one hostd.
        let all = hostd_ops(&host, since);
        let changing: Vec<&HostdOp> = all
            .iter()
            .filter(|o| !matches!(o.op.as_str(), "probe" | "status" | "operation-status"))
            .collect();
        let ids: BTreeSet<&str> = changing.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            ids.len(),
            changing.len(),
            "an operation ran twice: {changing:#?}"
        );
        let entries = journal_entries(&host);
        assert_eq!(entries.len(), changing.len(), "{entries:#?}");
        backend.close_all().await;
    });
}

#[test]
fn login_user_through_sudo_and_a_shared_jump_host() {
    skip_unless_hosts!();
    init_tracing();
    let keys = Keys::new();
    let _sudo = SudoDownload;
    let hosts = TestHosts::start(3).unwrap();
    let (jump, t1, t2) = (&hosts[0], &hosts[1], &hosts[2]);
    let link1 = HostLink::new(jump, t1, 0);
    let link2 = HostLink::new(jump, t2, 1);
    for t in [t1, t2] {
        install_hostd(t, &keys);
        add_login_user(t, "occlogin", &keys);
    }
    add_jump_user(
        jump,
        "occjump",
        &keys,
        &[
            format!("{}:22", link1.b_address),
            format!("{}:22", link2.b_address),
        ],
    );
    // The hosts' link addresses exist only between the test hosts: from the runner no sshd
    // answers there (a connect may still succeed: the runner's default gateway accepts any
    // TCP connection, and says nothing).
    for address in [&link1.b_address, &link2.b_address] {
        assert!(
            ssh_banner(address).is_none(),
            "the runner reaches sshd on {address} directly"
        );
    }
    assert!(ssh_banner(&t1.address().to_string()).is_some());
    let jump_host = Jump {
        address: jump.address().to_string(),
        port: 22,
        host_key: jump.host_public_key().trim().to_owned(),
        login_user: Some("occjump".to_owned()),
    };
    let behind = |t: &TestHost, address: &str| HostTarget {
        address: address.to_owned(),
        login_user: Some("occlogin".to_owned()),
        jump: Some(jump_host.clone()),
        ..host_target(t)
    };
    let target1 = behind(t1, &link1.b_address);
    let target2 = behind(t2, &link2.b_address);
    let since: Vec<u64> = [jump, t1, t2].iter().map(|h| host_now(h)).collect();
    runtime().block_on(async {
        let backend = keys.backend(fast_settings());

        // Root no longer takes the coordinator's key; the login user does, directly too.
        match backend.call(&host_target(t1), probe(), opts()).await {
            Err(e @ CallError::AuthenticationRefused { .. }) => eprintln!("root: {e}"),
            other => panic!("root login should be refused: {other:?}"),
        }
        let direct = HostTarget {
            login_user: Some("occlogin".to_owned()),
            ..host_target(t1)
        };
        match backend.call(&direct, probe(), opts()).await.unwrap() {
            OperationResult::Probe(p) => assert_eq!(p.host_key.as_str(), t1.host_key_fingerprint()),
            other => panic!("{other:?}"),
        }
        backend.close_all().await;

        // Both hosts behind the jump host, over one jump connection.
        let backend = keys.backend(fast_settings());
        for (t, target) in [(t1, &target1), (t2, &target2)] {
            match backend.call(target, probe(), opts()).await.unwrap() {
                OperationResult::Probe(p) => {
                    assert_eq!(p.host_key.as_str(), t.host_key_fingerprint())
                }
                other => panic!("{other:?}"),
            }
            backend.call(target, ensure("ns1"), opts()).await.unwrap();
        }
        let r1 = spec("r1", 1, json!({}));
        let (r, steps) = deploy(&backend, &target1, "a1", &r1).await;
        assert!(matches!(r, OperationResult::ActivateRevision(_)), "{r:?}");
        assert!(steps.contains(&Step::Readiness), "{steps:?}");
        let inv = backend.call(&target1, status(), opts()).await.unwrap();
        assert_eq!(served(inv, "ns1", "a1").as_deref(), Some("r1"));
        let stats = backend.stats();
        assert_eq!(stats.jump_connections_opened, 1, "{stats:?}");
        assert_eq!(stats.connections_opened, 2, "{stats:?}");
        assert_eq!(stats.sessions_opened, 2, "{stats:?}");
        // The relay channel through the login user (its forced command runs `hostd relay`
        // through sudo when asked), behind the jump host: the gateway answers.
        let mut stream = backend
            .open_gateway_stream(
                &target1,
                &Ident::new("ns1").unwrap(),
                &Ident::new("a1").unwrap(),
                "token:test",
            )
            .await
            .unwrap_or_else(|e| panic!("a relay stream through the login user: {e}"));
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        drop(stream);

        // The hosts saw the coordinator come from the jump host, as the login user, and
        // sudo started hostd once per session.
        for (i, (t, link)) in [(t1, &link1), (t2, &link2)].into_iter().enumerate() {
            let sshd = t
                .run_ok(&format!(
                    "journalctl -u ssh --no-pager --since @{} -o cat",
                    since[i + 1]
                ))
                .unwrap();
            assert!(
                sshd.contains(&format!(
                    "Accepted publickey for occlogin from {}",
                    link.a_address
                )),
                "{sshd}"
            );
            let sudo = t
                .run_ok(&format!(
                    "journalctl _COMM=sudo --no-pager --since @{} -o cat",
                    since[i + 1]
                ))
                .unwrap();
            let starts = sudo
                .lines()
                .filter(|l| l.contains("COMMAND=/usr/sbin/hostd serve"))
                .count();
            // t1: the direct login's session and the one through the jump host.
            assert_eq!(starts, if i == 0 { 2 } else { 1 }, "{sudo}");
        }
        let jump_log = jump
            .run_ok(&format!(
                "journalctl -u ssh --no-pager --since @{} -o cat",
                since[0]
            ))
            .unwrap();
        assert_eq!(
            jump_log.matches("Accepted publickey for occjump").count(),
            1,
            "{jump_log}"
        );

        // Both keys are pinned: a wrong jump host key and a wrong host key are refused.
        let mut wrong_jump = target2.clone();
        if let Some(j) = &mut wrong_jump.jump {
            j.host_key = t1.host_public_key().trim().to_owned();
        }
        match backend.call(&wrong_jump, probe(), opts()).await {
            Err(CallError::HostKeyMismatch {
                host, presented, ..
            }) => {
                assert_eq!(
                    host,
                    format!("{}:22 (the jump host of {})", jump.address(), t2.name())
                );
                assert_eq!(presented, jump.host_key_fingerprint());
            }
            other => panic!("{other:?}"),
        }
        let mut wrong_host = target2.clone();
        wrong_host.host_key = t1.host_public_key().trim().to_owned();
        match backend.call(&wrong_host, probe(), opts()).await {
            Err(CallError::HostKeyMismatch {
                host, presented, ..
            }) => {
                assert_eq!(host, t2.name());
                assert_eq!(presented, t2.host_key_fingerprint());
            }
            other => panic!("{other:?}"),
        }

        // The jump connection dies (its sshd processes on the jump host killed, by pid):
        // both hosts are reached again through a new one.
        let sshd = jump.run_ok("ps -o pid=,args= -C sshd").unwrap();
        let occjump: Vec<&str> = sshd
            .lines()
            .filter(|l| l.contains("occjump"))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(!occjump.is_empty(), "{sshd}");
        jump.run_ok(&format!("kill -KILL {}", occjump.join(" ")))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        for target in [&target1, &target2] {
            backend.call(target, probe(), opts()).await.unwrap();
        }
        let stats = backend.stats();
        assert_eq!(stats.jump_connections_opened, 2, "{stats:?}");
        assert_eq!(stats.connections_opened, 4, "{stats:?}");
        backend.close_all().await;
    });
    drop((link1, link2));
}
