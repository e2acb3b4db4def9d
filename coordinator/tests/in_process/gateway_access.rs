//! Gateway streams through the coordinator's API (issue 30), with hostd's engine in process
//! behind it and an in-memory echo gateway as the backend's dialer: `occ agent connect`
//! round-trips bytes, the role is enforced (403), a foreign Origin and a plain GET are
//! refused, the per-token cap holds, a revoked token's stream and a stopped Agent's stream
//! close within the re-check interval, and every stream has its audit record.
//!
//! The same streams over a real SSH relay to hostd are `tests/ssh/relay.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support::{self, Served};
use crate::hostd_engine;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::Ident;
use clawfleet_protocol::result::OperationResult;
use coordinator::backend::{
    Backend, CallError, CallOptions, GatewayDialer, GatewayIo, GatewayOpen, Target,
};
use coordinator::client::{Api, ClientError};
use coordinator::config::ApiSettings;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};

use crate::fixtures::HOST_KEY;

/// hostd's engine for operations; an echo gateway for streams, recording each open.
struct EchoBackend {
    engine: EngineBackend,
    opens: Mutex<Vec<(String, String, String, String)>>,
}

impl GatewayDialer for EchoBackend {
    fn open<'a>(
        &'a self,
        target: &'a Target,
        namespace: &'a Ident,
        agent: &'a Ident,
        caller: &'a str,
    ) -> GatewayOpen<'a> {
        self.opens.lock().unwrap().push((
            target.name().to_owned(),
            namespace.to_string(),
            agent.to_string(),
            caller.to_owned(),
        ));
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(theirs);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
            Ok(Box::new(ours) as Box<dyn GatewayIo>)
        })
    }
}

impl Backend for EchoBackend {
    fn gateway(&self) -> Option<&dyn GatewayDialer> {
        Some(self)
    }

    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: clawfleet_protocol::Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        self.engine.call(target, operation, options).await
    }
}

/// The API and a worker on the echo backend ([`Served`]).
struct Fleet(Served<EchoBackend>);

impl std::ops::Deref for Fleet {
    type Target = Served<EchoBackend>;
    fn deref(&self) -> &Served<EchoBackend> {
        &self.0
    }
}

impl Fleet {
    /// Host h1, Namespace ns1, Agent a1 deployed; streams re-checked every second, at most
    /// 3 per token.
    async fn start() -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let backend = Arc::new(EchoBackend {
            engine: EngineBackend::new(),
            opens: Mutex::new(Vec::new()),
        });
        let api = ApiSettings {
            gateway_recheck: Duration::from_secs(1),
            gateway_streams_per_token: 3,
            ..ApiSettings::default()
        };
        let f = Self(Served::start(store, admin, backend, api).await);
        f.add_host(HOST_KEY).await;
        f.deploy_agent(&["ns1"]).await;
        f
    }

    /// A token with `role` in ns1: (id, secret).
    async fn token(&self, role: &str) -> (String, String) {
        let v = self
            .call(
                "POST",
                "/tokens",
                json!({"name": format!("t-{role}"), "grants": [{"namespace": "ns1", "role": role}]}),
            )
            .await;
        (
            v["id"].as_str().unwrap().to_owned(),
            v["token"].as_str().unwrap().to_owned(),
        )
    }

    /// Opens a stream the way `occ agent connect` does, off the runtime.
    async fn stream(&self, token: &str) -> Result<TcpStream, ClientError> {
        let c = self.client(token);
        tokio::task::spawn_blocking(move || {
            let path = c.gateway_tunnel(["ns1", "a1"])?.path;
            c.upgrade(&path)
        })
        .await
        .unwrap()
    }

    async fn audit(&self) -> Vec<Value> {
        let v = self
            .call("GET", "/audit?action=agent.gateway-stream", Value::Null)
            .await;
        v.as_array().unwrap().clone()
    }
}

/// Echo `n` bytes through `s`.
fn echo(s: &mut TcpStream, n: usize) {
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk: Vec<u8> = (0..65_536u32).map(|i| (i % 253) as u8).collect();
        let mut sent = 0;
        while sent < n {
            let k = chunk.len().min(n - sent);
            w.write_all(&chunk[..k]).unwrap();
            sent += k;
        }
    });
    let mut got = 0;
    let mut buf = vec![0u8; 65_536];
    while got < n {
        let k = s.read(&mut buf).unwrap();
        assert!(k > 0, "the stream ended after {got} of {n} bytes");
        for (i, b) in buf[..k].iter().enumerate() {
            assert_eq!(*b, (((got + i) % 65_536) % 253) as u8, "byte {}", got + i);
        }
        got += k;
    }
    writer.join().unwrap();
}

/// Waits until the stream's far end closes it; how long that took.
fn closes_within(s: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) if started.elapsed() < limit => return started.elapsed(),
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e) => panic!("the stream was not closed within {limit:?}: {e}"),
        }
    }
}

/// The head and first bytes of the answer to a hand-written upgrade request.
async fn raw_upgrade(server: &str, token: &str, extra: &str) -> String {
    let server = server.trim_start_matches("http://").to_owned();
    let (token, extra) = (token.to_owned(), extra.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(&server).unwrap();
        write!(
            s,
            "GET /namespaces/ns1/agents/a1/gateway-tunnel HTTP/1.1\r\nHost: {server}\r\n\
             Authorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: clawfleet-gateway\r\n\
             {extra}\r\n"
        )
        .unwrap();
        let mut head = [0u8; 1024];
        let n = s.read(&mut head).unwrap();
        String::from_utf8_lossy(&head[..n]).into_owned()
    })
    .await
    .unwrap()
}

fn occ_binary() -> std::path::PathBuf {
    std::env::var_os("CLAWFLEET_OCC_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_occ").into())
}

struct Connect(Child);

impl Drop for Connect {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn occ_agent_connect_tunnels_bytes_and_each_stream_is_audited() {
    let f = Fleet::start().await;
    let (_, deploy) = f.token("deploy").await;
    let mut child = Command::new(occ_binary())
        .args(["--server", &f.server, "--token", &deploy])
        .args(["agent", "connect", "ns1", "a1"])
        .env("OCC_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _child = Connect(child);
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let addr = line
        .strip_prefix("listening on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("occ agent connect printed {line:?}"))
        .to_owned();
    tokio::task::spawn_blocking(move || {
        // Two connections one after the other, 32 MiB each way on the first.
        let mut s = TcpStream::connect(&addr).unwrap();
        echo(&mut s, 32 << 20);
        drop(s);
        let mut s = TcpStream::connect(&addr).unwrap();
        echo(&mut s, 1000);
    })
    .await
    .unwrap();
    // The dialer was asked for the Agent's own target, never an address from the caller.
    let opens = f.backend.opens.lock().unwrap().clone();
    assert_eq!(opens.len(), 2, "{opens:?}");
    assert_eq!(
        (
            opens[0].0.as_str(),
            opens[0].1.as_str(),
            opens[0].2.as_str()
        ),
        ("h1", "ns1", "a1")
    );
    // Each stream's audit record, once it closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let audit = loop {
        let a = f.audit().await;
        if a.len() >= 2 || Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(audit.len(), 2, "{audit:?}");
    let big = audit
        .iter()
        .find(|e| e["detail"]["bytesToGateway"] == json!(32 << 20))
        .unwrap_or_else(|| panic!("no record of the 32 MiB stream: {audit:?}"));
    assert_eq!(big["detail"]["bytesFromGateway"], json!(32 << 20));
    assert_eq!(big["target"], "ns1/a1");
    assert!(big["actor"].as_str().unwrap().starts_with("token:"));
    assert!(big["detail"]["revision"].is_string(), "{big}");
    assert_eq!(big["detail"]["closeReason"], "closed");
    assert!(big["detail"]["durationMs"].is_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn roles_origin_upgrade_and_the_per_token_cap_are_enforced() {
    let f = Fleet::start().await;
    let code = |r: Result<TcpStream, ClientError>| match r {
        Err(ClientError::Api { status, code, .. }) => (status, code),
        Err(ClientError::RateLimited { message, .. }) => (429, message),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("the stream opened"),
    };
    for role in ["read", "operate"] {
        let (_, t) = f.token(role).await;
        assert_eq!(
            code(f.stream(&t).await),
            (403, "FORBIDDEN".to_owned()),
            "{role}"
        );
    }
    // A plain GET is not a stream.
    let c = f.client(&f.admin);
    let plain = tokio::task::spawn_blocking(move || {
        c.request("GET", "/namespaces/ns1/agents/a1/gateway-tunnel", None)
    })
    .await
    .unwrap();
    match plain {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (426, "UPGRADE_REQUIRED"));
        }
        other => panic!("{other:?}"),
    }
    // Another site's page.
    let answer = raw_upgrade(&f.server, &f.admin, "Origin: https://evil.example\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("ORIGIN_REFUSED"), "{answer}");
    // Three streams per token, the fourth refused, one closed gives its place back.
    let (_, t) = f.token("deploy").await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(f.stream(&t).await.unwrap());
    }
    let (status, message) = code(f.stream(&t).await);
    assert_eq!(status, 429, "the fourth stream: {message}");
    let answer = raw_upgrade(&f.server, &t, "").await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("GATEWAY_STREAM_LIMIT"), "{answer}");
    let _ = open.pop().unwrap().shutdown(std::net::Shutdown::Both);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match f.stream(&t).await {
            Ok(s) => break open.push(s),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no place after a stream closed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revocation_and_stop_close_open_streams() {
    let f = Fleet::start().await;
    let (id, t) = f.token("deploy").await;
    let (_, other) = f.token("deploy").await;
    let mut revoked = f.stream(&t).await.unwrap();
    let mut kept = f.stream(&other).await.unwrap();
    f.call("DELETE", &format!("/tokens/{id}"), Value::Null)
        .await;
    let took = tokio::task::spawn_blocking(move || {
        let took = closes_within(&mut revoked, Duration::from_secs(30));
        // The other token's stream still echoes.
        echo(&mut kept, 1000);
        (took, kept)
    })
    .await
    .unwrap();
    assert!(took.0 < Duration::from_secs(5), "closed after {:?}", took.0);
    let mut kept = took.1;
    // A stop closes the Agent's streams.
    f.call("POST", "/namespaces/ns1/agents/a1/stop", Value::Null)
        .await;
    let took =
        tokio::task::spawn_blocking(move || closes_within(&mut kept, Duration::from_secs(30)))
            .await
            .unwrap();
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // A stopped Agent's gateway is not reached.
    match f.stream(&other).await {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (409, "GATEWAY_NOT_SERVING"));
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let reasons = loop {
        let reasons: Vec<String> = f
            .audit()
            .await
            .iter()
            .map(|e| e["detail"]["closeReason"].as_str().unwrap_or("").to_owned())
            .collect();
        if reasons.len() >= 2 || Instant::now() > deadline {
            break reasons;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(reasons.contains(&"token revoked".to_owned()), "{reasons:?}");
    assert!(reasons.contains(&"agent stopped".to_owned()), "{reasons:?}");
}
