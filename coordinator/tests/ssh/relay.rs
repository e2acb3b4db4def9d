//! Gateway streams through the relay channel against a real OpenSSH sshd on loopback with the
//! real hostd as the forced command of a `restrict` key, and `AllowTcpForwarding no`
//! (issue 30): bytes in = bytes out, many parallel streams on one channel next to the
//! operation sessions, a stalled client does not slow the others, the Agent's port comes
//! from hostd's state, unknown Agents are refused with their code.
//!
//! Needs root and /usr/sbin/sshd; prints SKIP otherwise (fails under CI=true).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::ssh_support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use clawfleet_protocol::FailureCode;
use coordinator::backend::{Backend, CallError, CallOptions};
use ssh_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback echo server standing in for an Agent's host-held front.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    port
}

/// Writes the Agent's marker as hostd keeps it: the relay reads the port from there.
fn place_agent(lo: &Loopback, namespace: &str, agent: &str, port: u16) {
    let layout = hostd::layout::Layout::new(&lo.state_root, lo.state_root.join("units"));
    let paths = layout.agent(&id(namespace), &id(agent));
    std::fs::create_dir_all(&paths.dir).unwrap();
    let marker = hostd::markers::AgentMarker {
        schema: hostd::markers::SCHEMA,
        namespace_id: id(namespace),
        agent_id: id(agent),
        service_principal_id: id("sp-1"),
        account: hostd::layout::account_name(&id(namespace), &id(agent)),
        port,
    };
    std::fs::write(&paths.marker, serde_json::to_vec(&marker).unwrap()).unwrap();
}

async fn round_trip(stream: &mut tokio::io::DuplexStream, total: usize) -> Duration {
    let started = Instant::now();
    let (mut rd, mut wr) = tokio::io::split(stream);
    let pattern: Vec<u8> = (0..65_521u32).map(|i| (i * 7 % 256) as u8).collect();
    let writer = async {
        let mut sent = 0;
        while sent < total {
            let n = pattern.len().min(total - sent);
            wr.write_all(&pattern[..n]).await.unwrap();
            sent += n;
        }
    };
    let reader = async {
        let mut got = 0usize;
        let mut buf = vec![0u8; 256 * 1024];
        while got < total {
            let n = rd.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended after {got} of {total} bytes");
            for (i, b) in buf[..n].iter().enumerate() {
                let at = (got + i) % pattern.len();
                assert_eq!(*b, pattern[at], "byte {} differs", got + i);
            }
            got += n;
        }
    };
    tokio::join!(writer, reader);
    started.elapsed()
}

#[test]
fn streams_round_trip_in_parallel_beside_operations() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    place_agent(&lo, "team-a", "echo", echo_server());
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        // One stream, 64 MiB both ways.
        let mut s = backend
            .open_gateway_stream(&target, &id("team-a"), &id("echo"), "token:test")
            .await
            .unwrap();
        let took = round_trip(&mut s, 64 << 20).await;
        eprintln!("64 MiB echoed in {took:?}");
        drop(s);

        // 256 streams at once on the same channel, with operations going on beside them.
        let mut tasks = Vec::new();
        for i in 0..256 {
            let backend = backend.clone();
            let target = target.clone();
            tasks.push(tokio::spawn(async move {
                let mut s = backend
                    .open_gateway_stream(&target, &id("team-a"), &id("echo"), "token:test")
                    .await
                    .unwrap_or_else(|e| panic!("stream {i}: {e}"));
                round_trip(&mut s, 256 * 1024).await;
            }));
        }
        for _ in 0..5 {
            match backend.call(&target, probe(), CallOptions::default()).await {
                Ok(_) => {}
                other => panic!("probe beside the streams: {other:?}"),
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let stats = backend.stats();
        assert_eq!(stats.connections_opened, 1, "{stats:?}");
        // Streams took no operation session: the pool holds what the probes used.
        let (open, _) = backend.host_sessions(&target);
        assert!(open <= 1, "operation sessions open: {open}");
        // Closed streams leave the channel.
        let deadline = Instant::now() + Duration::from_secs(10);
        while backend.gateway_streams(&target).await > 0 {
            assert!(Instant::now() < deadline, "streams were not released");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[test]
fn a_stalled_client_does_not_slow_the_others() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    place_agent(&lo, "team-a", "echo", echo_server());
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        let (namespace, agent) = (id("team-a"), id("echo"));
        let open = || backend.open_gateway_stream(&target, &namespace, &agent, "token:test");
        // Baseline: 16 MiB on a lone stream.
        let mut alone = open().await.unwrap();
        let baseline = round_trip(&mut alone, 16 << 20).await;
        drop(alone);
        // A client that writes 32 MiB and never reads the echo: its window fills and stays full.
        let mut stalled = open().await.unwrap();
        let junk = vec![1u8; 1 << 20];
        let stall = tokio::spawn(async move {
            for _ in 0..32 {
                if stalled.write_all(&junk).await.is_err() {
                    break;
                }
            }
            // Hold it open (never read) while the others run.
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stalled);
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut other = open().await.unwrap();
        let beside = round_trip(&mut other, 16 << 20).await;
        eprintln!("16 MiB alone {baseline:?}, beside a stalled client {beside:?}");
        assert!(
            beside < baseline * 3 + Duration::from_secs(1),
            "a stalled client slowed another stream: {beside:?} against {baseline:?} alone"
        );
        stall.abort();
    });
}

#[test]
fn an_unknown_agent_is_refused_with_its_code() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    // An Agent whose gateway is not listening.
    let dead_port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    place_agent(&lo, "team-a", "down", dead_port);
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    runtime().block_on(async {
        let code = |r: Result<tokio::io::DuplexStream, CallError>| match r {
            Err(CallError::Failed(f)) => f.code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(
                backend
                    .open_gateway_stream(&target, &id("team-a"), &id("nobody"), "token:test")
                    .await
            ),
            FailureCode::AgentMissing
        );
        assert_eq!(
            code(
                backend
                    .open_gateway_stream(&target, &id("team-a"), &id("down"), "token:test")
                    .await
            ),
            FailureCode::GatewayUnreachable
        );
    });
}
