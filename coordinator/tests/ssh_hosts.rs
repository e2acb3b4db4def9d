//! The SSH backend against a real test host (systemd-nspawn Debian with sshd, hostd enrolled
//! with `hostd enrol`, the test gateway as workload): the lifecycle with progress, concurrent
//! activations of two Agents over the one connection, and sessions that drop mid-activation
//! (cut from the host's side and from the coordinator's side), whose recorded outcome the
//! backend learns with operation-status.
//!
//! Needs root and the vm-tests runner packages; prints SKIP otherwise (fails under CI=true).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ssh_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawfleet_protocol::operation::RevisionSpec;
use clawfleet_protocol::result::{OperationResult, OperationState, Progress, Step};
use clawfleet_protocol::{FailureCode, OperationId};
use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use coordinator::backend::{Backend, CallError, CallOptions, HostTarget, ProgressSink};
use coordinator::ssh::SshBackend;
use serde_json::json;
use ssh_support::*;
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
        backend
            .call(&target, prepare("ns1", "a1", &r1), opts())
            .await
            .unwrap();
        let (sink, mut rx) = channel_sink();
        let r = backend
            .call_with_progress(&target, activate("ns1", "a1", &r1), opts(), Some(&sink))
            .await
            .unwrap();
        assert!(
            matches!(r, OperationResult::ActivateRevision(ref a) if a.restarted),
            "{r:?}"
        );
        let mut steps = Vec::new();
        while let Ok(p) = rx.try_recv() {
            steps.push(p.step);
        }
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
        let (rb, rc) = tokio::join!(
            backend.call(&target, activate("ns1", "b", &b1), opts()),
            backend.call(&target, activate("ns1", "c", &c1), opts())
        );
        let both = t.elapsed();
        rb.unwrap();
        rc.unwrap();
        eprintln!("two 3 s activations at once took {both:?}");
        // One after the other would take at least 6 s.
        assert!(
            both < Duration::from_millis(5500),
            "they ran one after the other: {both:?}"
        );
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
