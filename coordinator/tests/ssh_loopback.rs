//! The SSH backend against a real OpenSSH sshd on loopback, with the real hostd as the
//! forced command (probe, status, ensure-namespace and prepare need no systemd).
//!
//! Needs root and /usr/sbin/sshd; prints SKIP otherwise (fails under CI=true). hostd is built
//! with cargo on first use (or taken from $CLAWFLEET_HOSTD_BIN).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ssh_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawfleet_protocol::FailureCode;
use clawfleet_protocol::result::{OperationResult, OperationState};
use coordinator::backend::{Backend, CallError, CallOptions};
use coordinator::ssh::SshSettings;
use ssh_support::*;

fn short(deadline_s: u64) -> CallOptions {
    CallOptions {
        deadline: Duration::from_secs(deadline_s),
        ..CallOptions::default()
    }
}

#[test]
fn probe_and_status_reuse_one_connection() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        let started = Instant::now();
        for i in 0..20 {
            match backend.call(&target, probe(), CallOptions::default()).await {
                Ok(OperationResult::Probe(p)) => {
                    assert_eq!(p.host_key.as_str(), lo.fingerprint());
                    assert_eq!(p.protocol_versions, vec![1]);
                }
                other => panic!("probe {i}: {other:?}"),
            }
        }
        let elapsed = started.elapsed();
        match backend
            .call(&target, status(), CallOptions::default())
            .await
        {
            Ok(OperationResult::Status(inv)) => assert!(inv.namespaces.is_empty()),
            other => panic!("status: {other:?}"),
        }
        let stats = backend.stats();
        assert_eq!(stats.connections_opened, 1, "{stats:?}");
        assert_eq!(stats.sessions_opened, 21, "{stats:?}");
        // No call needed a second attempt.
        assert_eq!(stats.calls, 21, "{stats:?}");
        assert_eq!(stats.recoveries, 0, "{stats:?}");
        assert_eq!(backend.host_connections_opened(&target), 1);
        assert!(backend.connection_local_addr(&target).await.is_some());
        eprintln!("20 probes over one connection: {elapsed:?}");
    });
    assert_eq!(lo.accepted_logins(), 1, "sshd log: {}", lo.log());
}

#[test]
fn concurrent_calls_share_the_connection() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        // 8 at once, then 20 at once (more than the per-host channel limit of 8 and
        // OpenSSH's MaxSessions of 10: the backend queues them).
        for n in [8usize, 20] {
            let mut tasks = Vec::new();
            for i in 0..n {
                let backend = backend.clone();
                let target = target.clone();
                let op = if i % 2 == 0 {
                    probe()
                } else {
                    ensure(&format!("ns{i}"))
                };
                tasks.push(tokio::spawn(async move {
                    backend.call(&target, op, CallOptions::default()).await
                }));
            }
            for t in tasks {
                let r = t.await.unwrap();
                assert!(r.is_ok(), "{r:?}");
            }
        }
        let stats = backend.stats();
        assert_eq!(stats.connections_opened, 1, "{stats:?}");
        assert_eq!(stats.sessions_opened, 28, "{stats:?}");
    });
    assert_eq!(lo.accepted_logins(), 1);
}

#[test]
fn changed_or_missing_host_key_is_refused() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let mut lo = Loopback::start(&keys);
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        backend.call(&target, probe(), short(10)).await.unwrap();
        lo.stop_sshd();
        let other = lo.start_sshd_with_other_key();
        match backend.call(&target, probe(), short(10)).await {
            Err(CallError::HostKeyMismatch {
                host,
                presented,
                expected,
            }) => {
                assert_eq!(host, lo.name);
                assert_eq!(presented, other);
                assert_eq!(expected, lo.fingerprint());
            }
            other => panic!("expected a host key mismatch: {other:?}"),
        }
        // Never pinned: refused too, naming the key presented.
        let mut unpinned = target.clone();
        unpinned.host_key = String::new();
        match backend.call(&unpinned, probe(), short(10)).await {
            Err(CallError::HostKeyMismatch {
                presented,
                expected,
                ..
            }) => {
                assert_eq!(presented, other);
                assert!(expected.contains("no usable key"), "{expected}");
            }
            other => panic!("expected a host key mismatch: {other:?}"),
        }
        let e = backend.call(&target, probe(), short(10)).await.unwrap_err();
        assert!(!e.is_retryable());
        assert_eq!(e.code(), "HOST_KEY_MISMATCH");
        eprintln!("{e}");
    });
    // No login ever happened with the wrong key.
    assert_eq!(lo.accepted_logins(), 1);
}

#[test]
fn unauthorised_login_key_is_refused() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let stranger = Keys::new();
    let backend = stranger.backend(fast_settings());
    runtime().block_on(async {
        match backend.call(&lo.target(), probe(), short(10)).await {
            Err(e @ CallError::AuthenticationRefused { .. }) => {
                assert_eq!(e.code(), "HOST_AUTH_REFUSED");
                assert!(!e.is_retryable());
            }
            other => panic!("expected AuthenticationRefused: {other:?}"),
        }
    });
}

#[test]
fn reconnects_after_sshd_is_killed_and_restarted() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let mut lo = Loopback::start(&keys);
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        backend.call(&target, probe(), short(10)).await.unwrap();
        lo.stop_sshd();
        // Down: a transport error, quickly.
        let t = Instant::now();
        let e = backend.call(&target, probe(), short(10)).await.unwrap_err();
        assert!(matches!(e, CallError::Transport { .. }), "{e:?}");
        assert!(e.is_retryable());
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        lo.start_sshd();
        // Back: the next call reconnects (after at most the short backoff).
        match backend.call(&target, probe(), short(10)).await {
            Ok(OperationResult::Probe(_)) => {}
            other => panic!("after restart: {other:?}"),
        }
        backend.call(&target, probe(), short(10)).await.unwrap();
        assert_eq!(backend.host_connections_opened(&target), 2);
        // A connection dropped from this side is replaced too.
        assert!(backend.drop_connection(&target).await);
        backend.call(&target, probe(), short(10)).await.unwrap();
        assert_eq!(backend.host_connections_opened(&target), 3);
    });
    assert_eq!(lo.accepted_logins(), 3);
}

#[test]
fn unreachable_host_fails_fast_with_backoff() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let mut target = lo.target();
    target.port = free_port();
    let settings = SshSettings {
        connect_timeout: Duration::from_millis(300),
        reconnect_backoff_base: Duration::from_secs(2),
        reconnect_backoff_max: Duration::from_secs(8),
        ..fast_settings()
    };
    let backend = keys.backend(settings);
    runtime().block_on(async {
        let t = Instant::now();
        let e = backend.call(&target, probe(), short(10)).await.unwrap_err();
        let first = t.elapsed();
        let CallError::Transport { message, .. } = &e else {
            panic!("{e:?}");
        };
        assert!(message.contains("cannot connect"), "{message}");
        assert!(first < Duration::from_secs(1), "{first:?}");
        assert_eq!(e.code(), "HOST_UNREACHABLE");
        // Inside the backoff window (longer than the connect timeout): no new attempt.
        let t = Instant::now();
        let e = backend.call(&target, probe(), short(10)).await.unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("backing off"), "{e}");
        assert_eq!(backend.stats().connect_attempts, 1);
        eprintln!("{e}");
    });
}

#[test]
fn a_lost_result_is_recovered_with_operation_status() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        // hostd executes ensure-namespace and records success, but the result never
        // reaches the coordinator: operation-status returns the recorded result.
        lo.arm("lose-result");
        match backend.call(&target, ensure("lost"), short(10)).await {
            Ok(OperationResult::EnsureNamespace(r)) => {
                assert!(r.created);
                assert_eq!(r.namespace_id.as_str(), "lost");
            }
            other => panic!("expected the recorded success: {other:?}"),
        }
        assert_eq!(backend.stats().recoveries, 1);
        // It really ran: a second ensure finds the Namespace.
        match backend.call(&target, ensure("lost"), short(10)).await {
            Ok(OperationResult::EnsureNamespace(r)) => assert!(!r.created),
            other => panic!("{other:?}"),
        }
        // A recorded failure comes back as that failure.
        lo.arm("lose-result");
        let rev = spec("r1", 1, serde_json::json!({}));
        match backend
            .call(&target, prepare("nowhere", "a1", &rev), short(10))
            .await
        {
            Err(CallError::Failed(f)) => assert_eq!(f.code, FailureCode::NamespaceMissing),
            other => panic!("expected the recorded failure: {other:?}"),
        }
        assert_eq!(backend.stats().recoveries, 2);
        // A read-only operation is simply sent again.
        lo.arm("lose-result");
        let before = backend.stats();
        backend.call(&target, probe(), short(10)).await.unwrap();
        let after = backend.stats();
        assert_eq!(after.calls - before.calls, 2);
        assert_eq!(after.recoveries, before.recoveries);
        assert_eq!(backend.host_connections_opened(&target), 1);
    });
}

#[test]
fn an_envelope_that_never_arrived_is_a_transport_error() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        lo.arm("swallow");
        match backend.call(&target, ensure("gone"), short(10)).await {
            Err(CallError::Transport { message, .. }) => {
                assert!(message.contains("no record"), "{message}");
                assert!(message.contains("safe to retry"), "{message}");
            }
            other => panic!("expected a transport error: {other:?}"),
        }
        // Nothing happened on the host.
        match backend.call(&target, status(), short(10)).await {
            Ok(OperationResult::Status(inv)) => assert!(inv.namespaces.is_empty()),
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_silent_session_times_out_after_deadline_plus_grace_then_asks() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let settings = SshSettings {
        transport_grace: Duration::from_secs(1),
        ..fast_settings()
    };
    let backend = keys.backend(settings);
    let target = lo.target();
    runtime().block_on(async {
        lo.arm("hold");
        let t = Instant::now();
        let r = backend.call(&target, ensure("held"), short(1)).await;
        let took = t.elapsed();
        // The transport gave up at deadline (1 s) + grace (1 s), then operation-status found
        // the recorded success.
        assert!(
            matches!(r, Ok(OperationResult::EnsureNamespace(_))),
            "{r:?}"
        );
        assert!(took >= Duration::from_secs(2), "{took:?}");
        assert!(took < Duration::from_secs(6), "{took:?}");
        assert_eq!(backend.stats().recoveries, 1);
    });
}

#[test]
fn operation_status_reports_recorded_outcomes() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let backend = keys
        .backend(fast_settings())
        .with_progress(Arc::new(move |_host, p| {
            sink_seen.lock().unwrap().push(p.clone())
        }));
    let target = lo.target();
    runtime().block_on(async {
        backend
            .call(&target, ensure("ns1"), short(10))
            .await
            .unwrap();
        let progress = seen.lock().unwrap().clone();
        assert!(!progress.is_empty(), "progress events arrive");
        let id = progress[0].operation_id.clone();
        assert!(progress.iter().all(|p| p.operation_id == id));
        assert!(id.as_str().starts_with("occ-"), "{id}");
        match backend.operation_status(&target, &id).await.unwrap() {
            OperationState::Succeeded { result, .. } => {
                assert!(matches!(*result, OperationResult::EnsureNamespace(_)))
            }
            other => panic!("{other:?}"),
        }
        let unknown = clawfleet_protocol::OperationId::new("occ-never-sent").unwrap();
        assert_eq!(
            backend.operation_status(&target, &unknown).await.unwrap(),
            OperationState::Unknown
        );
    });
}
