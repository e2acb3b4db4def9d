//! The SSH backend against a real OpenSSH sshd on loopback, with the real hostd as the
//! forced command (probe, status, ensure-namespace and prepare need no systemd).
//!
//! Needs root and /usr/sbin/sshd; prints SKIP otherwise (fails under CI=true). hostd is built
//! with cargo on first use (or taken from $CLAWFLEET_HOSTD_BIN).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::ssh_support;

use std::collections::BTreeSet;
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
fn probe_and_status_reuse_one_session() {
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
    runtime().block_on(async {
        let started = Instant::now();
        for i in 0..20 {
            match backend.call(&target, probe(), CallOptions::default()).await {
                Ok(OperationResult::Probe(p)) => {
                    assert_eq!(p.host_key.as_str(), lo.fingerprint());
                    assert_eq!(
                        p.protocol_versions,
                        clawfleet_protocol::SUPPORTED_VERSIONS.to_vec()
                    );
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
        // One hostd for all 21 operations: its hello read once.
        assert_eq!(stats.sessions_opened, 1, "{stats:?}");
        assert_eq!(stats.sessions_reused, 20, "{stats:?}");
        // No call needed a second attempt.
        assert_eq!(stats.calls, 21, "{stats:?}");
        assert_eq!(stats.recoveries, 0, "{stats:?}");
        assert_eq!(backend.host_connections_opened(&target), 1);
        assert_eq!(backend.host_sessions(&target), (1, 1));
        assert!(backend.connection_local_addr(&target).await.is_some());
        eprintln!("20 probes over one session: {elapsed:?}");
    });
    assert_eq!(lo.accepted_logins(), 1, "sshd log: {}", lo.log());
    // sshd started hostd once.
    assert_eq!(lo.starts().len(), 1, "{:?}", lo.starts());
}

#[test]
fn concurrent_calls_share_the_connection() {
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
    let pool = backend.settings().max_sessions_per_host;
    runtime().block_on(async {
        // 8 at once, then 20 at once (more than the per-host session limit of 8 and
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
        assert!(
            stats.sessions_opened as usize <= pool,
            "more sessions than the pool allows: {stats:?}"
        );
        assert_eq!(
            stats.sessions_opened + stats.sessions_reused,
            28,
            "{stats:?}"
        );
        let (open, peak) = backend.host_sessions(&target);
        assert!(peak <= pool && open <= peak, "{open} open, {peak} at most");
    });
    assert_eq!(lo.accepted_logins(), 1);
    assert!(lo.starts().len() <= pool, "{:?}", lo.starts());
}

/// Ensures Namespaces `prefix0..n` at once; returns the hostd pid that ran each one's hook.
async fn ensure_at_once(
    backend: &coordinator::ssh::SshBackend,
    lo: &Loopback,
    prefix: &str,
    n: usize,
) -> BTreeSet<u32> {
    let before = lo.hook_runs().len();
    let mut tasks = Vec::new();
    for i in 0..n {
        let backend = backend.clone();
        let target = lo.target();
        let op = ensure(&format!("{prefix}{i}"));
        tasks.push(tokio::spawn(async move {
            backend.call(&target, op, short(30)).await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert!(
            matches!(r, Ok(OperationResult::EnsureNamespace(_))),
            "{r:?}"
        );
    }
    let runs = lo.hook_runs();
    assert_eq!(runs.len() - before, n, "{runs:?}");
    runs[before..].iter().map(|(hostd, _)| *hostd).collect()
}

#[test]
fn sessions_are_bounded_per_host_and_reused() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let settings = SshSettings {
        max_sessions_per_host: 3,
        ..fast_settings()
    };
    let backend = keys.backend(settings);
    runtime().block_on(async {
        // Six operations for six Namespaces at once, each held 1 s by its hook: three
        // sessions (three hostd processes) serve them, in two rounds.
        lo.hook_sleep(1);
        let t = Instant::now();
        let first = ensure_at_once(&backend, &lo, "a", 6).await;
        let took = t.elapsed();
        assert_eq!(
            first.len(),
            3,
            "hostd processes that ran the hooks: {first:?}"
        );
        assert_eq!(lo.starts().len(), 3, "{:?}", lo.starts());
        assert!(
            took >= Duration::from_secs(2),
            "six 1 s operations on three sessions finished in {took:?}"
        );
        assert_eq!(backend.host_sessions(&lo.target()), (3, 3));
        // The same three serve the next six: no new hostd.
        let second = ensure_at_once(&backend, &lo, "b", 6).await;
        assert_eq!(second, first);
        assert_eq!(lo.starts().len(), 3, "{:?}", lo.starts());
        // Fewer at once than the pool: still no new hostd.
        lo.hook_sleep(0);
        let third = ensure_at_once(&backend, &lo, "c", 2).await;
        assert!(third.is_subset(&first), "{third:?} not among {first:?}");
        let stats = backend.stats();
        assert_eq!(stats.sessions_opened, 3, "{stats:?}");
        assert_eq!(stats.sessions_reused, 11, "{stats:?}");
        // Every operation ran once.
        let journal = lo.journal();
        assert_eq!(journal.len(), 14, "{journal:#?}");
        assert!(
            journal.iter().all(|e| e["state"]["state"] == "succeeded"),
            "{journal:#?}"
        );
        eprintln!("six 1 s operations on three sessions: {took:?}");
    });
}

#[test]
fn idle_and_aged_sessions_are_closed() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let target = lo.target();
    runtime().block_on(async {
        // Idle for longer than the idle timeout: closed, and its hostd exits.
        let backend = keys.backend(SshSettings {
            session_idle_timeout: Duration::from_secs(1),
            ..fast_settings()
        });
        // The session's last use falls inside the call, so it cannot be closed before
        // `called + 1 s`: the checks below hold however slowly this machine runs.
        let called = Instant::now();
        backend.call(&target, probe(), short(10)).await.unwrap();
        let first = lo.starts()[0];
        // Open while idle, until the idle timeout.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let open_sessions = backend.host_sessions(&target).0;
        let was_alive = alive(first);
        if called.elapsed() < Duration::from_secs(1) {
            assert!(was_alive, "closed before its idle timeout");
            assert_eq!(open_sessions, 1);
        } else {
            eprintln!("this machine took over 1 s to get here: the open-while-idle check is moot");
        }
        wait_gone(first, Duration::from_secs(5));
        assert!(called.elapsed() >= Duration::from_secs(1));
        assert_eq!(backend.host_sessions(&target).0, 0);
        assert_eq!(backend.stats().sessions_retired, 1);
        backend.call(&target, probe(), short(10)).await.unwrap();
        assert_eq!(lo.starts().len(), 2);
        backend.close_all().await;

        // In use, but older than the maximum age: not reused (the idle timeout is far off).
        let backend = keys.backend(SshSettings {
            session_max_age: Duration::from_secs(3),
            ..fast_settings()
        });
        let before = lo.starts().len();
        let opened = Instant::now();
        backend.call(&target, probe(), short(10)).await.unwrap();
        backend.call(&target, probe(), short(10)).await.unwrap();
        // The session opens inside the first call, so it is younger than `opened.elapsed()`.
        if opened.elapsed() < Duration::from_secs(3) {
            assert_eq!(lo.starts().len() - before, 1);
        }
        tokio::time::sleep(Duration::from_millis(3300).saturating_sub(opened.elapsed())).await;
        backend.call(&target, probe(), short(10)).await.unwrap();
        let stats = backend.stats();
        assert_eq!(stats.sessions_opened, 2, "{stats:?}");
        assert_eq!(stats.sessions_retired, 1, "{stats:?}");
        assert_eq!(lo.starts().len() - before, 2);
        backend.close_all().await;
    });
}

#[test]
fn a_session_killed_between_operations_is_replaced() {
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
    runtime().block_on(async {
        backend
            .call(&target, ensure("k1"), short(10))
            .await
            .unwrap();
        let first = lo.starts();
        assert_eq!(first.len(), 1);
        // hostd of the idle session dies (SIGKILL, by its pid).
        signal(first[0], "-KILL");
        wait_gone(first[0], Duration::from_secs(5));
        // Give sshd a moment to report the end of the session.
        tokio::time::sleep(Duration::from_millis(200)).await;
        match backend.call(&target, ensure("k2"), short(10)).await {
            Ok(OperationResult::EnsureNamespace(r)) => assert!(r.created),
            other => panic!("{other:?}"),
        }
        let stats = backend.stats();
        // Found dead before anything was sent on it: replaced, nothing to recover.
        assert_eq!(stats.sessions_replaced, 1, "{stats:?}");
        assert_eq!(stats.recoveries, 0, "{stats:?}");
        assert_eq!(stats.sessions_opened, 2, "{stats:?}");
        assert_eq!(stats.connections_opened, 1, "{stats:?}");
        assert_eq!(lo.starts().len(), 2);
        // Both ran exactly once.
        let journal = lo.journal();
        assert_eq!(journal.len(), 2, "{journal:#?}");
        for e in &journal {
            assert_eq!(e["state"]["state"], "succeeded", "{e:#}");
            assert_eq!(e["state"]["result"]["created"], true, "{e:#}");
        }
    });
}

#[test]
fn an_envelope_written_into_a_dead_session_is_sent_again_once() {
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
    runtime().block_on(async {
        backend.call(&target, probe(), short(10)).await.unwrap();
        let hostd = lo.starts()[0];
        // The race: hostd dies, and the coordinator writes the next envelope into the session
        // before it learns of it. Freezing the sshd process that relays the session holds the
        // news back until the envelope is sent.
        let relay = lo.relay_of(hostd);
        signal(relay, "-STOP");
        signal(hostd, "-KILL");
        let call = {
            let backend = backend.clone();
            let target = target.clone();
            tokio::spawn(async move { backend.call(&target, ensure("again"), short(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        signal(relay, "-CONT");
        match call.await.unwrap() {
            Ok(OperationResult::EnsureNamespace(r)) => assert!(r.created),
            other => panic!("{other:?}"),
        }
        let stats = backend.stats();
        assert_eq!(stats.recoveries, 1, "{stats:?}");
        assert_eq!(stats.resends, 1, "{stats:?}");
        // One operation id, run once.
        let journal = lo.journal();
        assert_eq!(journal.len(), 1, "{journal:#?}");
        assert_eq!(journal[0]["state"]["state"], "succeeded");
        assert_eq!(journal[0]["state"]["result"]["created"], true);
        assert_eq!(lo.hook_runs().len(), 1);
    });
}

#[test]
fn a_session_killed_mid_operation_is_recovered_with_operation_status() {
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
    runtime().block_on(async {
        backend.call(&target, probe(), short(10)).await.unwrap();
        // ensure-namespace waits 5 s in its hook; its hostd is killed meanwhile.
        lo.hook_sleep(5);
        let call = {
            let backend = backend.clone();
            let target = target.clone();
            tokio::spawn(async move { backend.call(&target, ensure("mid"), short(30)).await })
        };
        let until = Instant::now() + Duration::from_secs(10);
        let hostd = loop {
            if let Some((hostd, _)) = lo.hook_runs().first() {
                break *hostd;
            }
            assert!(Instant::now() < until, "the hook never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(lo.starts(), vec![hostd], "the pooled session ran it");
        signal(hostd, "-KILL");
        let t = Instant::now();
        let r = call.await.unwrap();
        // operation-status reports what the host recorded: aborted after the hooks step.
        match &r {
            Err(CallError::Failed(f)) => {
                assert_eq!(f.code, FailureCode::SessionClosed, "{f}");
                assert!(f.is_retryable());
            }
            other => panic!("expected the recorded SESSION_CLOSED: {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        let stats = backend.stats();
        assert_eq!(stats.recoveries, 1, "{stats:?}");
        assert_eq!(stats.resends, 0, "{stats:?}");
        let journal = lo.journal();
        let ensures: Vec<&serde_json::Value> = journal
            .iter()
            .filter(|e| e["kind"] == "ensure-namespace")
            .collect();
        assert_eq!(ensures.len(), 1, "{journal:#?}");
        assert_eq!(ensures[0]["state"]["state"], "failed");
        assert_eq!(ensures[0]["state"]["failure"]["code"], "SESSION_CLOSED");
        // The retry (a new id, as the worker sends) runs on a new session and finds the
        // Namespace made once.
        lo.hook_sleep(0);
        match backend.call(&target, ensure("mid"), short(10)).await {
            Ok(OperationResult::EnsureNamespace(r)) => assert!(!r.created),
            other => panic!("{other:?}"),
        }
        let journal = lo.journal();
        assert_eq!(journal.len(), 2, "{journal:#?}");
        assert_eq!(
            journal
                .iter()
                .filter(|e| e["state"]["state"] == "succeeded")
                .count(),
            1
        );
        assert_eq!(lo.starts().len(), 2);
    });
}

#[test]
fn changed_or_missing_host_key_is_refused() {
    let Some(Started {
        keys: _keys,
        mut lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
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
    let Some(Started {
        keys: _keys,
        mut lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
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
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
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
        // A recorded failure comes back as that failure (modes apply to new sessions).
        backend.close_idle_sessions(&target).await;
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
        backend.close_idle_sessions(&target).await;
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
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(fast_settings())
    else {
        return;
    };
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
    let settings = SshSettings {
        transport_grace: Duration::from_secs(1),
        ..fast_settings()
    };
    let Some(Started {
        keys: _keys,
        lo,
        backend,
        target,
    }) = start(settings)
    else {
        return;
    };
    runtime().block_on(async {
        lo.arm("hold");
        let t = Instant::now();
        // A 3 s deadline: a 1 s one failed with DEADLINE_EXCEEDED on a loaded machine.
        let r = backend.call(&target, ensure("held"), short(3)).await;
        let took = t.elapsed();
        // The transport gave up at deadline (3 s) + grace (1 s), then operation-status found
        // the recorded success.
        assert!(
            matches!(r, Ok(OperationResult::EnsureNamespace(_))),
            "{r:?}"
        );
        assert!(took >= Duration::from_secs(4), "{took:?}");
        assert!(took < Duration::from_secs(8), "{took:?}");
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
