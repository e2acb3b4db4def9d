//! The API's hardening over real HTTP on loopback, served by `api::serve` with short limits:
//! the header-read and request timeouts, the concurrency limit, the body limit before any
//! token lookup, token expiry, duplicate grants, host-pool choice by a Namespace-scoped admin,
//! and literal secrets in configuration documents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support;
use crate::hostd_engine;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coordinator::api::{AppState, router_with, serve};
use coordinator::client::{Client, ClientError};
use coordinator::config::ApiSettings;
use coordinator::model::{Grant, Role};
use coordinator::service::Service;
use coordinator::store::SharedStore;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};

use crate::fixtures::HOST_KEY;

struct Api {
    addr: String,
    store: SharedStore,
    admin: String,
}

impl Api {
    async fn start(settings: ApiSettings) -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let state = Arc::new(AppState {
            foreground: Default::default(),
            service: Service::new(store.clone()),
            backend: Arc::new(EngineBackend::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let router = router_with(state, &settings);
        tokio::spawn(
            async move { serve(listener, router, &settings, std::future::pending()).await },
        );
        Self { addr, store, admin }
    }

    async fn call_async(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (u16, String, String)> {
        let (addr, token, method, path) = (
            self.addr.clone(),
            token.map(str::to_owned),
            method.to_owned(),
            path.to_owned(),
        );
        tokio::task::spawn_blocking(move || {
            let c = Client::new(&format!("http://{addr}"), token).unwrap();
            c.request(&method, &path, body.as_ref())
                .map_err(|e| match e {
                    ClientError::Api {
                        status,
                        code,
                        message,
                    } => (status, code, message),
                    other => panic!("{method} {path}: {other}"),
                })
        })
        .await
        .unwrap()
    }

    /// Enrols a host under the admin token.
    async fn enrol(&self, name: &str) {
        let admin = self.admin.clone();
        self.call_async(
            Some(&admin),
            "POST",
            "/hosts",
            Some(json!({"name": name, "address": "127.0.0.1", "hostKey": HOST_KEY})),
        )
        .await
        .unwrap();
    }

    async fn table_counts(&self) -> Vec<(String, i64)> {
        self.store.row_counts().await.unwrap()
    }
}

/// Reads until the server closes the connection (or 15 s pass); returns what was read.
fn read_to_close(stream: &mut TcpStream) -> (String, Duration) {
    let t0 = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server kept the connection open: {e}"),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), t0.elapsed())
}

fn short() -> ApiSettings {
    ApiSettings {
        request_timeout: Duration::from_secs(2),
        header_timeout: Duration::from_secs(1),
        max_concurrent_requests: 4,
        allow_plaintext_listen: false,
        ..ApiSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_loris_client_is_cut_off_by_the_header_timeout() {
    let api = Api::start(short()).await;
    let addr = api.addr.clone();
    let (got, took) = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        // Headers that never end.
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")
            .unwrap();
        read_to_close(&mut s)
    })
    .await
    .unwrap();
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    assert!(!got.contains("200 OK"), "{got}");
    // The server still answers others.
    assert_eq!(
        api.call_async(None, "GET", "/healthz", None).await.unwrap()["status"],
        "ok"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_gets_408_and_stores_nothing() {
    let api = Api::start(short()).await;
    let before = api.table_counts().await;
    let (addr, admin) = (api.addr.clone(), api.admin.clone());
    let (got, took) = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        let head = format!(
            "POST /hosts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\": "
        );
        s.write_all(head.as_bytes()).unwrap();
        read_to_close(&mut s)
    })
    .await
    .unwrap();
    assert!(took < Duration::from_secs(6), "answered after {took:?}");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("REQUEST_TIMEOUT"), "{got}");
    assert_eq!(api.table_counts().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_refused_before_the_token_is_looked_up() {
    let api = Api::start(short()).await;
    let addr = api.addr.clone();
    let got = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        // No Authorization header at all: a 401 would mean the token was checked first.
        let head = format!(
            "POST /namespaces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            2 * 1024 * 1024
        );
        s.write_all(head.as_bytes()).unwrap();
        read_to_close(&mut s).0
    })
    .await
    .unwrap();
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("BODY_TOO_LARGE"), "{got}");
}

/// Opens a request whose body never finishes arriving (50 of 100 bytes) and keeps it.
fn slow_body(addr: &str, token: &str, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\": \"{}\"",
        "x".repeat(38)
    );
    s.write_all(head.as_bytes()).unwrap();
    s
}

/// The status line of the answer on `s`, or "" when none came within `wait`.
fn status_line(s: &mut TcpStream, wait: Duration) -> String {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !out.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

/// N9: one deploy-role token's slow-body requests took every permit of the API's global
/// concurrency limit, and the global admin got 503 (260 requests held it for most of 40 s).
/// Now a token has its own share (the requests over it are 429 at once), low-role tokens
/// together cannot take the admins' reserve, requests without a token have their own share,
/// and a body that does not arrive is cut off by the body-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_of_low_role_tokens_leave_the_admin_a_share() {
    let api = Api::start(ApiSettings {
        max_concurrent_requests: 6,
        admin_reserved_requests: 2,
        token_concurrent_requests: 3,
        unauthenticated_concurrent_requests: 2,
        // Longer than the test takes to open every request, so none ends before it is counted.
        body_timeout: Duration::from_secs(8),
        request_timeout: Duration::from_secs(20),
        ..short()
    })
    .await;
    let mut deployers = Vec::new();
    for name in ["d1", "d2", "d3"] {
        let (_, secret) = coordinator::tokens::create(
            &*api.store,
            name,
            &[Grant {
                namespace: "ns1".into(),
                role: Role::Deploy,
            }],
        )
        .await
        .unwrap();
        deployers.push(secret);
    }
    let path = "/namespaces/ns1/configurations";
    let (addr, d) = (api.addr.clone(), deployers.clone());
    let t0 = Instant::now();
    // d1 opens eight slow requests: three hold its share, five are refused at once.
    let (held, refused) = tokio::task::spawn_blocking(move || {
        let mut held = Vec::new();
        let mut refused = Vec::new();
        for _ in 0..8 {
            let mut s = slow_body(&addr, &d[0], path);
            match status_line(&mut s, Duration::from_millis(500)).as_str() {
                "" => held.push(s),
                line => refused.push(line.to_owned()),
            }
        }
        (held, refused)
    })
    .await
    .unwrap();
    assert_eq!(held.len(), 3, "refused: {refused:?}");
    assert!(
        refused.iter().all(|l| l.starts_with("HTTP/1.1 429")),
        "{refused:?}"
    );
    // The global admin is served while d1 holds its share.
    assert_eq!(
        api.call_async(Some(&api.admin.clone()), "GET", "/hosts", None)
            .await
            .unwrap(),
        json!([])
    );
    // d2 and d3 fill the rest of the tokens' share (6 - 2 reserved - 3 of d1 = 1).
    let (addr, d) = (api.addr.clone(), deployers.clone());
    let (more_held, busy) = tokio::task::spawn_blocking(move || {
        let mut held = Vec::new();
        let mut busy = Vec::new();
        for token in [&d[1], &d[1], &d[2]] {
            let mut s = slow_body(&addr, token, path);
            match status_line(&mut s, Duration::from_millis(500)).as_str() {
                "" => held.push(s),
                line => busy.push(line.to_owned()),
            }
        }
        (held, busy)
    })
    .await
    .unwrap();
    assert_eq!(more_held.len(), 1, "{busy:?}");
    assert!(
        busy.iter().all(|l| l.starts_with("HTTP/1.1 503")),
        "{busy:?}"
    );
    // Still the admin (from the reserve), and a request without a token (its own share).
    for _ in 0..3 {
        api.call_async(Some(&api.admin.clone()), "GET", "/hosts", None)
            .await
            .unwrap();
    }
    assert_eq!(
        api.call_async(None, "GET", "/healthz", None).await.unwrap()["status"],
        "ok"
    );
    // The held requests end with 408 at the body-read timeout, long before the request timeout.
    let lines = tokio::task::spawn_blocking(move || {
        held.into_iter()
            .chain(more_held)
            .map(|mut s| status_line(&mut s, Duration::from_secs(10)))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(
        lines.iter().all(|l| l.starts_with("HTTP/1.1 408")),
        "{lines:?}"
    );
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(8) && took < Duration::from_secs(16),
        "{took:?}"
    );
    // Given back: d1 is served again.
    let d1 = deployers[0].clone();
    let created = api
        .call_async(
            Some(&d1),
            "POST",
            "/namespaces/ns1/configurations",
            Some(json!({"name": "c"})),
        )
        .await;
    assert!(!matches!(&created, Err((429 | 503, _, _))), "{created:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_concurrency_limit_get_503_at_once() {
    let api = Api::start(ApiSettings {
        max_concurrent_requests: 1,
        admin_reserved_requests: 0,
        unauthenticated_concurrent_requests: 1,
        ..short()
    })
    .await;
    let (addr, admin) = (api.addr.clone(), api.admin.clone());
    let (_, other) = coordinator::tokens::create(
        &*api.store,
        "other",
        &[Grant {
            namespace: "*".into(),
            role: Role::Read,
        }],
    )
    .await
    .unwrap();
    // One request holds the tokens' only permit while its body trickles in.
    let holder = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        let head = format!(
            "POST /hosts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\nContent-Length: 50\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).unwrap();
        read_to_close(&mut s).0
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let busy = api
        .call_async(Some(&other), "GET", "/hosts", None)
        .await
        .unwrap_err();
    assert_eq!((busy.0, busy.1.as_str()), (503, "SERVER_BUSY"), "{busy:?}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(holder.await.unwrap().starts_with("HTTP/1.1 408"));
    assert_eq!(
        api.call_async(None, "GET", "/healthz", None).await.unwrap()["status"],
        "ok"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_expire_and_grants_are_checked_before_anything_is_stored() {
    let api = Api::start(short()).await;
    let admin = api.admin.clone();
    let now = coordinator::clock::now_seconds();
    let t = api
        .call_async(
            Some(&admin),
            "POST",
            "/tokens",
            Some(json!({"name": "brief", "grants": [{"namespace": "*", "role": "read"}], "expiresAt": now + 2})),
        )
        .await
        .unwrap();
    assert_eq!(t["expiresAt"], now + 2);
    let brief = t["token"].as_str().unwrap().to_owned();
    api.call_async(Some(&brief), "GET", "/namespaces", None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let (status, code, message) = api
        .call_async(Some(&brief), "GET", "/namespaces", None)
        .await
        .unwrap_err();
    assert_eq!((status, code.as_str()), (401, "UNAUTHENTICATED"));
    assert!(message.contains("expired"), "{message}");

    let before = api.table_counts().await;
    for (body, code, names) in [
        (
            json!({"name": "d", "grants": [{"namespace": "ns1", "role": "read"}, {"namespace": "ns1", "role": "admin"}]}),
            "DUPLICATE_GRANT",
            "grants[1].namespace",
        ),
        (
            json!({"name": "d", "grants": [{"namespace": "*", "role": "read"}], "expiresAt": now - 5}),
            "INVALID_EXPIRY",
            "expiresAt",
        ),
    ] {
        let (status, got, message) = api
            .call_async(Some(&admin), "POST", "/tokens", Some(body))
            .await
            .unwrap_err();
        assert_eq!((status, got.as_str()), (400, code), "{message}");
        assert!(message.contains(names), "{message}");
    }
    assert_eq!(api.table_counts().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_admin_gets_the_missing_host_answer_for_any_host_pool() {
    let api = Api::start(short()).await;
    let admin = api.admin.clone();
    api.enrol("h1").await;
    let scoped = api
        .call_async(
            Some(&admin),
            "POST",
            "/tokens",
            Some(json!({"name": "s", "grants": [{"namespace": "team", "role": "admin"}]})),
        )
        .await
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = api.table_counts().await;
    let existing = api
        .call_async(
            Some(&scoped),
            "POST",
            "/namespaces",
            Some(json!({"id": "team", "hosts": ["h1"]})),
        )
        .await
        .unwrap_err();
    let missing = api
        .call_async(
            Some(&scoped),
            "POST",
            "/namespaces",
            Some(json!({"id": "team", "hosts": ["h9"]})),
        )
        .await
        .unwrap_err();
    assert_eq!(existing.0, 400);
    assert_eq!(existing.1, "UNKNOWN_HOST");
    assert_eq!(existing.2.replace("h1", "H"), missing.2.replace("h9", "H"));
    // A global admin gets the same answer for a missing host.
    let global_missing = api
        .call_async(
            Some(&admin),
            "POST",
            "/namespaces",
            Some(json!({"id": "team", "hosts": ["h9"]})),
        )
        .await
        .unwrap_err();
    assert_eq!(global_missing, missing);
    assert_eq!(api.table_counts().await, before);
    api.call_async(
        Some(&admin),
        "POST",
        "/namespaces",
        Some(json!({"id": "team", "hosts": ["h1"]})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_literal_api_key_is_refused_with_nothing_stored() {
    let api = Api::start(short()).await;
    let admin = api.admin.clone();
    api.enrol("h1").await;
    api.call_async(
        Some(&admin),
        "POST",
        "/namespaces",
        Some(json!({"id": "ns1", "hosts": ["h1"]})),
    )
    .await
    .unwrap();
    let before = api.table_counts().await;
    let doc = json!({"models": {"providers": {"openai": {"apiKey": "sk-live-0123456789"}}}});
    let (status, code, message) = api
        .call_async(
            Some(&admin),
            "POST",
            "/namespaces/ns1/configurations",
            Some(json!({"id": "cfg", "document": doc})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (status, code.as_str()),
        (400, "CONFIGURATION_REFUSED"),
        "{message}"
    );
    assert!(
        message.contains("models.providers.openai.apiKey"),
        "{message}"
    );
    assert!(message.contains("env file"), "{message}");
    assert!(!message.contains("sk-live"), "{message}");
    assert_eq!(api.table_counts().await, before);
    let ok = json!({"models": {"providers": {"openai": {"apiKey": "${OPENAI_API_KEY}"}}}});
    api.call_async(
        Some(&admin),
        "POST",
        "/namespaces/ns1/configurations",
        Some(json!({"id": "cfg", "document": ok})),
    )
    .await
    .unwrap();
    let stored = api
        .call_async(
            Some(&admin),
            "GET",
            "/namespaces/ns1/configurations/cfg",
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        stored["document"]["models"]["providers"]["openai"]["apiKey"],
        "${OPENAI_API_KEY}"
    );
}

/// Trusted-proxy and Tailscale authentication trust requests any Agent on a shared host can
/// send: refused on a shared pool, accepted on a single-tenant one, and a single-tenant pool
/// shares no host with another Namespace (either way round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxy_needs_a_single_tenant_pool_whose_hosts_no_one_else_uses() {
    let api = Api::start(short()).await;
    let admin = api.admin.clone();
    for h in ["h1", "h2"] {
        api.enrol(h).await;
    }
    api.call_async(
        Some(&admin),
        "POST",
        "/namespaces",
        Some(json!({"id": "shared", "hosts": ["h1"]})),
    )
    .await
    .unwrap();
    let proxy = json!({"gateway": {"auth": {"mode": "trusted-proxy", "trustedProxy": {"userHeader": "x-user"}}}});
    let tailscale = json!({"gateway": {"auth": {"allowTailscale": true}}});
    let before = api.table_counts().await;
    for (doc, field) in [
        (&proxy, "gateway.auth.mode"),
        (&tailscale, "gateway.auth.allowTailscale"),
    ] {
        let (status, code, message) = api
            .call_async(
                Some(&admin),
                "POST",
                "/namespaces/shared/configurations",
                Some(json!({"id": "cfg", "document": doc})),
            )
            .await
            .unwrap_err();
        assert_eq!(
            (status, code.as_str()),
            (400, "CONFIGURATION_REFUSED"),
            "{message}"
        );
        assert!(
            message.contains(field) && message.contains("singleTenant"),
            "{message}"
        );
    }
    assert_eq!(api.table_counts().await, before);
    // A single-tenant pool may not take a host another Namespace uses, nor lend its own.
    let (status, code, message) = api
        .call_async(
            Some(&admin),
            "POST",
            "/namespaces",
            Some(json!({"id": "team", "hosts": ["h1"], "singleTenant": true})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (status, code.as_str()),
        (409, "HOST_DEDICATED"),
        "{message}"
    );
    let team = api
        .call_async(
            Some(&admin),
            "POST",
            "/namespaces",
            Some(json!({"id": "team", "hosts": ["h2"], "singleTenant": true})),
        )
        .await
        .unwrap();
    assert_eq!(team["singleTenant"], true);
    let (status, code, _) = api
        .call_async(
            Some(&admin),
            "POST",
            "/namespaces",
            Some(json!({"id": "other", "hosts": ["h2"]})),
        )
        .await
        .unwrap_err();
    assert_eq!((status, code.as_str()), (409, "HOST_DEDICATED"));
    for (id, doc) in [("cfg", &proxy), ("cfg2", &tailscale)] {
        api.call_async(
            Some(&admin),
            "POST",
            "/namespaces/team/configurations",
            Some(json!({"id": id, "document": doc})),
        )
        .await
        .unwrap();
    }
}

/// Issue 28, fail closed: a host whose probe says it cannot isolate Agents' networks takes
/// one Namespace; a second one naming it is refused with `HOST_NOT_ISOLATED` (saying what the
/// host lacks) and nothing is stored, while a host that isolates them is shared as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_network_isolation_takes_one_namespace_only() {
    let api = Api::start(short()).await;
    let admin = api.admin.clone();
    for h in ["h1", "h2", "h3"] {
        api.enrol(h).await;
    }
    let lacking = "unavailable: hostd cannot configure a network namespace (CAP_NET_ADMIN missing?); binds not confined";
    api.store
        .set_host_probe("h1", &json!({"networkIsolation": lacking}))
        .await
        .unwrap();
    // h2 isolates Agents and enforces quotas; h3 runs a hostd that predates both reports.
    api.store
        .set_host_probe(
            "h2",
            &json!({"networkIsolation": "namespaces", "quotas": "enforced: project quotas"}),
        )
        .await
        .unwrap();
    api.store
        .set_host_probe("h3", &json!({"hostdVersion": "0.1.0"}))
        .await
        .unwrap();
    let create = |id: &'static str, hosts: Value| {
        let admin = admin.clone();
        let api = &api;
        async move {
            api.call_async(
                Some(&admin),
                "POST",
                "/namespaces",
                Some(json!({"id": id, "hosts": hosts})),
            )
            .await
        }
    };
    create("first", json!(["h1"])).await.unwrap();
    let before = api.table_counts().await;
    let (status, code, message) = create("second", json!(["h2", "h1"])).await.unwrap_err();
    assert_eq!(
        (status, code.as_str()),
        (409, "HOST_NOT_ISOLATED"),
        "{message}"
    );
    assert!(
        message.contains("host h1")
            && message.contains("CAP_NET_ADMIN")
            && message.contains("first"),
        "{message}"
    );
    assert_eq!(api.table_counts().await, before, "nothing stored");
    // Hosts that isolate Agents (or were never probed) are shared as before.
    create("second", json!(["h2", "h3"])).await.unwrap();
    create("third", json!(["h2", "h3"])).await.unwrap();
}

/// Issue 26, N6, fail closed: a host whose probe says it cannot limit each Agent's disk and
/// inode use (hostd's `quotas: "unavailable: …"`) takes one Namespace; a second one naming it
/// is refused with `HOST_NOT_QUOTA_LIMITED` (naming the host, what it lacks and the other
/// Namespace) and nothing is stored. Its own Namespace keeps using it (a Namespace may be
/// created on it alone, single-tenant or not), and hosts whose quotas are enforced, or which
/// never reported them, are shared as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_per_agent_quotas_takes_one_namespace_only() {
    let api = Api::start(short()).await;
    let admin = api.admin.clone();
    for h in ["h1", "h2", "h3", "h4"] {
        api.enrol(h).await;
    }
    let lacking = "unavailable: the file system of /var/lib/clawfleet does not have project quotas turned on (ext4: `tune2fs -O quota,project` and mount with `prjquota`)";
    for (h, quotas) in [
        ("h1", lacking),
        ("h2", "enforced: project quotas (bytes and inodes)"),
        ("h4", lacking),
    ] {
        api.store
            .set_host_probe(
                h,
                &json!({"networkIsolation": "namespaces", "quotas": quotas}),
            )
            .await
            .unwrap();
    }
    // h3 runs a hostd that predates the report.
    api.store
        .set_host_probe("h3", &json!({"networkIsolation": "namespaces"}))
        .await
        .unwrap();
    let create = |id: &'static str, body: Value| {
        let admin = admin.clone();
        let api = &api;
        async move {
            let mut body = body;
            body["id"] = json!(id);
            api.call_async(Some(&admin), "POST", "/namespaces", Some(body))
                .await
        }
    };
    create("first", json!({"hosts": ["h1"]})).await.unwrap();
    let before = api.table_counts().await;
    let (status, code, message) = create("second", json!({"hosts": ["h2", "h1"]}))
        .await
        .unwrap_err();
    assert_eq!(
        (status, code.as_str()),
        (409, "HOST_NOT_QUOTA_LIMITED"),
        "{message}"
    );
    assert!(
        message.contains("host h1")
            && message.contains("disk and inode")
            && message.contains("does not have project quotas turned on")
            && message.contains("Namespace first"),
        "{message}"
    );
    assert_eq!(api.table_counts().await, before, "nothing stored");
    // Single-tenant use of a host without quotas works.
    create("solo", json!({"hosts": ["h4"], "singleTenant": true}))
        .await
        .unwrap();
    // Hosts that enforce quotas (or never reported them) are shared as before.
    create("second", json!({"hosts": ["h2", "h3"]}))
        .await
        .unwrap();
    create("third", json!({"hosts": ["h2", "h3"]}))
        .await
        .unwrap();
}
