//! The gateway route (issue 30), `.../agents/{agent}/gateway/{path}`, with hostd's engine in
//! process for operations and an in-process HTTP gateway behind the backend's dialer that
//! records what reaches it: the caller's Cookie and Authorization never do, the gateway's
//! own password does (and never comes back to the caller), the gateway's answers pass
//! unchanged; the role and the Namespace are enforced; a foreign Origin is refused on
//! WebSockets and changes; a console session opens the WebSocket, and a gateway that goes
//! away closes it with 1012; connect and close are audited.
//!
//! The same route in headless Chromium over a real test host is `tests/e2e/gateway_route.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support::{self, Served};
use crate::hostd_engine;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Request, Response, StatusCode};
use clawfleet_protocol::Ident;
use clawfleet_protocol::result::OperationResult;
use coordinator::backend::{
    Backend, CallError, CallOptions, GatewayDialer, GatewayIo, GatewayOpen, GatewayOpenWithAuth,
    GatewayPassword, GatewayStream, Target,
};
use coordinator::config::ApiSettings;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::HOST_KEY;

/// The Agent's managed gateway password, as its host would tell it.
const PASSWORD: &str = "gw-pw-7f3a9c1e5b2d4f60";

/// What reached the gateway: each request's method, target and headers.
type Seen = Arc<Mutex<Vec<(String, String, HeaderMap)>>>;

/// hostd's engine for operations; for streams, an HTTP gateway in process.
struct GatewayBackend {
    engine: EngineBackend,
    seen: Seen,
    opens: Mutex<usize>,
    /// The gateway's WebSocket goes away (no close frame) after its second frame.
    vanish: Arc<AtomicBool>,
    /// The stream opens, but nothing answers on it.
    mute: AtomicBool,
}

/// The gateway: `GET /missing` is a plain-text 404, `POST /things` 201, a WebSocket upgrade
/// sends "hello", answers each frame with "got" (but a `connect` request that carries the
/// gateway's password, as OpenClaw's gateway wants it, with "connect-ok"), and (when
/// `vanish`) then drops the
/// connection as a restarting gateway would; anything else 200 with the names of the headers
/// it got (never their values).
async fn gateway(
    request: Request<hyper::body::Incoming>,
    seen: Seen,
    vanish: Arc<AtomicBool>,
) -> Result<Response<axum::body::Body>, Infallible> {
    let target = request
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    seen.lock().unwrap().push((
        request.method().to_string(),
        target.clone(),
        request.headers().clone(),
    ));
    let names: Vec<String> = request.headers().keys().map(|k| k.to_string()).collect();
    let upgrade = request
        .headers()
        .get("upgrade")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if upgrade {
        let mut request = request;
        let on = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let Ok(up) = on.await else { return };
            let mut io = hyper_util::rt::TokioIo::new(up);
            io.write_all(&text_frame("hello")).await.unwrap();
            let mut buf = [0u8; 1024];
            loop {
                let Ok(n) = io.read(&mut buf).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                let answer = if connect_has_password(&buf[..n]) {
                    "connect-ok"
                } else {
                    "got"
                };
                io.write_all(&text_frame(answer)).await.unwrap();
                if vanish.load(Ordering::SeqCst) {
                    // Gone without a close frame, as a gateway that restarts.
                    return;
                }
            }
        });
        return Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", "test-accept")
            .body(axum::body::Body::empty())
            .unwrap());
    }
    let (status, ct, body) = match (request.method().as_str(), target.as_str()) {
        ("GET", "/missing") => (404, "text/plain", "the gateway has no such page".to_owned()),
        ("POST", "/things") => (201, "application/json", json!({"made": 1}).to_string()),
        _ => (
            200,
            "application/json",
            json!({"headers": names}).to_string(),
        ),
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", ct)
        .header("x-gateway", "yes")
        .body(axum::body::Body::from(body))
        .unwrap())
}

/// Whether `frame` (one whole masked client frame of under 126 bytes, or with a 16-bit
/// length) is OpenClaw's `connect` request with the gateway's password and no token.
fn connect_has_password(frame: &[u8]) -> bool {
    if frame.len() < 6 || frame[1] & 0x80 == 0 {
        return false;
    }
    let (len, at) = match frame[1] & 0x7f {
        126 if frame.len() >= 8 => (usize::from(u16::from_be_bytes([frame[2], frame[3]])), 4),
        n if n < 126 => (usize::from(n), 2),
        _ => return false,
    };
    let Some(mask) = frame.get(at..at + 4) else {
        return false;
    };
    let Some(payload) = frame.get(at + 4..at + 4 + len) else {
        return false;
    };
    let text: Vec<u8> = payload
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ mask[i % 4])
        .collect();
    let Ok(v) = serde_json::from_slice::<Value>(&text) else {
        return false;
    };
    v["method"] == "connect"
        && v["params"]["auth"]["password"] == PASSWORD
        && v["params"]["auth"].get("token").is_none()
}

/// An unmasked text frame (as a server sends).
fn text_frame(text: &str) -> Vec<u8> {
    let mut f = vec![0x81, text.len() as u8];
    f.extend_from_slice(text.as_bytes());
    f
}

/// A masked text frame (as a client sends).
fn client_frame(text: &str) -> Vec<u8> {
    clawfleet_protocol::websocket::client_frame(0x1, text.as_bytes(), [1, 2, 3, 4]).to_vec()
}

impl GatewayBackend {
    fn connect(&self) -> Box<dyn GatewayIo> {
        *self.opens.lock().unwrap() += 1;
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        if self.mute.load(Ordering::SeqCst) {
            drop(theirs);
            return Box::new(ours);
        }
        let (seen, vanish) = (self.seen.clone(), self.vanish.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |r| gateway(r, seen.clone(), vanish.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(theirs), service)
                .with_upgrades()
                .await;
        });
        Box::new(ours)
    }
}

impl GatewayDialer for GatewayBackend {
    fn open<'a>(
        &'a self,
        _target: &'a Target,
        _namespace: &'a Ident,
        _agent: &'a Ident,
        _caller: &'a str,
    ) -> GatewayOpen<'a> {
        let io = self.connect();
        Box::pin(async move { Ok(io) })
    }

    fn open_with_auth<'a>(
        &'a self,
        _target: &'a Target,
        _namespace: &'a Ident,
        _agent: &'a Ident,
        _caller: &'a str,
    ) -> GatewayOpenWithAuth<'a> {
        let io = self.connect();
        Box::pin(async move {
            Ok(GatewayStream {
                io,
                password: Some(GatewayPassword::new(PASSWORD.to_owned())),
            })
        })
    }
}

impl Backend for GatewayBackend {
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

/// The API and a worker on the gateway backend ([`Served`]).
struct Fleet(Served<GatewayBackend>);

impl std::ops::Deref for Fleet {
    type Target = Served<GatewayBackend>;
    fn deref(&self) -> &Served<GatewayBackend> {
        &self.0
    }
}

/// An answer: status, head (lower-cased header names) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    fn code(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .map(|v| v["error"]["code"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    }
}

impl Fleet {
    /// Host h1, Namespaces ns1 and ns2, Agent ns1/a1 deployed.
    async fn start(allowed_origins: Vec<String>) -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let backend = Arc::new(GatewayBackend {
            engine: EngineBackend::new(),
            seen: Arc::new(Mutex::new(Vec::new())),
            opens: Mutex::new(0),
            vanish: Arc::new(AtomicBool::new(false)),
            mute: AtomicBool::new(false),
        });
        let api = ApiSettings {
            gateway_recheck: Duration::from_secs(1),
            gateway_allowed_origins: allowed_origins,
            ..ApiSettings::default()
        };
        let f = Self(Served::start(store, admin, backend, api).await);
        f.add_host(HOST_KEY).await;
        // Two Namespaces share h1: it stands for a host with per-Agent quotas.
        hostd_engine::with_enforced_quotas(&f.store, "h1").await;
        f.deploy_agent(&["ns1", "ns2"]).await;
        f
    }

    /// A token with `role` in `ns`.
    async fn token(&self, ns: &str, role: &str) -> String {
        let v = self
            .call(
                "POST",
                "/tokens",
                json!({"name": format!("t-{ns}-{role}"), "grants": [{"namespace": ns, "role": role}]}),
            )
            .await;
        v["token"].as_str().unwrap().to_owned()
    }

    /// A hand-written request (`headers`: whole lines), read to its end.
    async fn raw(&self, method: &str, path: &str, headers: &[String], body: &str) -> Answer {
        let mut s = tokio::net::TcpStream::connect(&self.addr).await.unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
            .await
            .expect("the answer did not end")
            .unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        Answer {
            status: head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            head: head.to_owned(),
            body: body.to_owned(),
        }
    }

    async fn audit(&self, action: &str) -> Vec<Value> {
        let v = self
            .call("GET", &format!("/audit?action={action}"), Value::Null)
            .await;
        v.as_array().unwrap().clone()
    }

    fn seen(&self) -> Vec<(String, String, HeaderMap)> {
        self.backend.seen.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gateway_gets_its_password_never_the_callers_credentials_and_answers_unchanged() {
    let f = Fleet::start(Vec::new()).await;
    let deploy = f.token("ns1", "deploy").await;
    let a = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/gateway/ui/app.js?v=1&x=%20",
            &[
                format!("Authorization: Bearer {deploy}"),
                "Cookie: occ_console=other-session; theme=dark".into(),
                "X-Custom: kept".into(),
            ],
            "",
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("x-gateway").as_deref(), Some("yes"), "{a:?}");
    let seen = f.seen();
    let (method, target, headers) = seen.last().unwrap();
    assert_eq!(
        (method.as_str(), target.as_str()),
        ("GET", "/ui/app.js?v=1&x=%20")
    );
    assert!(headers.get("cookie").is_none(), "{headers:?}");
    assert_eq!(
        headers.get("authorization").unwrap(),
        &format!("Bearer {PASSWORD}"),
        "the gateway's own password at the last hop"
    );
    assert_eq!(headers.get("x-custom").unwrap(), "kept");
    assert_eq!(headers.get("host").unwrap(), f.addr.as_str());
    assert!(!a.body.contains(PASSWORD) && !a.head.contains(PASSWORD));
    assert!(!a.body.contains(&deploy));

    // The gateway's root; its 404 stays its own (plain text, not the API's error shape);
    // its 201 is not turned into the table's 200.
    let root = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/gateway/",
            &[format!("Authorization: Bearer {deploy}")],
            "",
        )
        .await;
    assert_eq!(root.status, 200, "{root:?}");
    assert_eq!(f.seen().last().unwrap().1, "/");
    // Without its trailing slash, the gateway's root is a redirect to it (the Control UI's
    // relative links resolve against the gateway's path), the query kept, nothing opened.
    let opened = f.seen().len();
    let bare = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/gateway?session=main",
            &[format!("Authorization: Bearer {deploy}")],
            "",
        )
        .await;
    assert_eq!(bare.status, 308, "{bare:?}");
    assert_eq!(
        bare.header("location").as_deref(),
        Some("/namespaces/ns1/agents/a1/gateway/?session=main"),
        "{bare:?}"
    );
    assert_eq!(f.seen().len(), opened, "a redirect reaches no gateway");
    // A WebSocket there is the gateway's root (the Control UI opens it at the page's path
    // without its last slash), with the console's session cookie as anywhere on the route.
    let mut s = tokio::net::TcpStream::connect(&f.addr).await.unwrap();
    let req = format!(
        "GET /namespaces/ns1/agents/a1/gateway HTTP/1.1\r\nHost: {addr}\r\n\
         Origin: http://{addr}\r\nCookie: occ_console={deploy}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        addr = f.addr
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte))
            .await
            .expect("no answer to the upgrade")
            .unwrap();
        assert_eq!(
            n,
            1,
            "closed before its head: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert_eq!(f.seen().last().unwrap().1, "/");
    drop(s);
    let missing = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/gateway/missing",
            &[format!("Authorization: Bearer {deploy}")],
            "",
        )
        .await;
    assert_eq!(
        (missing.status, missing.body.as_str()),
        (404, "the gateway has no such page"),
        "{missing:?}"
    );
    let made = f
        .raw(
            "POST",
            "/namespaces/ns1/agents/a1/gateway/things",
            &[
                format!("Authorization: Bearer {deploy}"),
                format!("Origin: http://{}", f.addr),
                "Content-Type: application/json".into(),
            ],
            "{\"name\":\"x\"}",
        )
        .await;
    assert_eq!(made.status, 201, "{made:?}");
    // A gateway that answers nothing: 502 with the route's own code.
    f.backend.mute.store(true, Ordering::SeqCst);
    let mute = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/gateway/",
            &[format!("Authorization: Bearer {deploy}")],
            "",
        )
        .await;
    assert_eq!(
        (mute.status, mute.code()),
        (502, "GATEWAY_ROUTE_FAILED".into()),
        "{mute:?}"
    );
    f.backend.mute.store(false, Ordering::SeqCst);
    // A change through the route is audited, without the password.
    let rows = f.audit("agent.gateway-request").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["target"], "ns1/a1");
    assert_eq!(rows[0]["detail"]["method"], "POST");
    assert_eq!(rows[0]["detail"]["path"], "/things");
    assert_eq!(rows[0]["detail"]["status"], 201);
    assert!(!rows[0].to_string().contains(PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_deploy_in_the_agents_namespace_reaches_the_gateway() {
    let f = Fleet::start(Vec::new()).await;
    let path = "/namespaces/ns1/agents/a1/gateway/";
    for (who, token) in [
        ("read of ns1", f.token("ns1", "read").await),
        ("operate of ns1", f.token("ns1", "operate").await),
        ("admin of ns2", f.token("ns2", "admin").await),
    ] {
        for cookie in [false, true] {
            let auth = if cookie {
                format!("Cookie: occ_console={token}")
            } else {
                format!("Authorization: Bearer {token}")
            };
            let a = f.raw("GET", path, &[auth], "").await;
            assert_eq!(
                (a.status, a.code()),
                (403, "FORBIDDEN".into()),
                "{who}: {a:?}"
            );
        }
    }
    let none = f.raw("GET", path, &[], "").await;
    assert_eq!((none.status, none.code()), (401, "UNAUTHENTICATED".into()));
    let revoked = f
        .raw(
            "GET",
            path,
            &["Cookie: occ_console=cf_nope_nope".into()],
            "",
        )
        .await;
    assert_eq!(revoked.status, 401, "{revoked:?}");
    assert_eq!(
        *f.backend.opens.lock().unwrap(),
        0,
        "the gateway was dialled"
    );
    // The console's session cookie authenticates the gateway route, and only it: the rest
    // of the API still takes bearer tokens only.
    let deploy = f.token("ns1", "deploy").await;
    let ok = f
        .raw("GET", path, &[format!("Cookie: occ_console={deploy}")], "")
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let api = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1",
            &[format!("Cookie: occ_console={deploy}")],
            "",
        )
        .await;
    assert_eq!(api.status, 401, "{api:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_foreign_origin_is_refused_on_websockets_and_changes() {
    let f = Fleet::start(vec!["https://console.example".into()]).await;
    let deploy = f.token("ns1", "deploy").await;
    let auth = format!("Authorization: Bearer {deploy}");
    let ws = [
        "Connection: Upgrade".to_owned(),
        "Upgrade: websocket".into(),
        "Sec-WebSocket-Version: 13".into(),
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==".into(),
    ];
    let evil = "Origin: https://evil.example".to_owned();
    let upgrade: Vec<String> = [auth.clone(), evil.clone()]
        .into_iter()
        .chain(ws.iter().cloned())
        .collect();
    let a = f
        .raw("GET", "/namespaces/ns1/agents/a1/gateway/ws", &upgrade, "")
        .await;
    assert_eq!(
        (a.status, a.code()),
        (403, "ORIGIN_REFUSED".into()),
        "{a:?}"
    );
    assert!(a.body.contains("https://evil.example"), "{}", a.body);
    for method in ["POST", "PUT", "PATCH", "DELETE"] {
        let a = f
            .raw(
                method,
                "/namespaces/ns1/agents/a1/gateway/things",
                &[auth.clone(), evil.clone()],
                "",
            )
            .await;
        assert_eq!(
            (a.status, a.code()),
            (403, "ORIGIN_REFUSED".into()),
            "{method}: {a:?}"
        );
    }
    assert_eq!(
        *f.backend.opens.lock().unwrap(),
        0,
        "the gateway was dialled"
    );
    // Reads from anywhere are answered (a browser sends no SameSite=Strict cookie with a
    // cross-site request); the allow-listed origin may change things.
    let read = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/gateway/x",
            &[auth.clone(), evil],
            "",
        )
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    let listed = f
        .raw(
            "POST",
            "/namespaces/ns1/agents/a1/gateway/things",
            &[auth.clone(), "Origin: https://console.example".into()],
            "",
        )
        .await;
    assert_eq!(listed.status, 201, "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_console_session_opens_the_websocket_and_a_vanishing_gateway_closes_it_with_1012() {
    let f = Fleet::start(Vec::new()).await;
    let deploy = f.token("ns1", "deploy").await;
    f.backend.vanish.store(true, Ordering::SeqCst);
    let mut s = tokio::net::TcpStream::connect(&f.addr).await.unwrap();
    let req = format!(
        "GET /namespaces/ns1/agents/a1/gateway/ws HTTP/1.1\r\nHost: {addr}\r\n\
         Origin: http://{addr}\r\nCookie: occ_console={deploy}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        addr = f.addr
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // The head, then the frames; everything the gateway and the coordinator send, to the end.
    s.write_all(&client_frame("ping")).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .expect("the WebSocket was not closed")
        .unwrap();
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&out[..at]).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("sec-websocket-accept: test-accept"), "{head}");
    let frames = &out[at..];
    let mut want = text_frame("hello");
    want.extend(text_frame("got"));
    assert_eq!(&frames[..want.len()], &want[..], "{frames:?}");
    let close = &frames[want.len()..];
    assert_eq!(close[0], 0x88, "a close frame: {close:?}");
    assert_eq!(u16::from_be_bytes([close[2], close[3]]), 1012, "{close:?}");
    // The gateway saw the upgrade without the session cookie, with its password.
    let (_, target, headers) = f.seen().last().unwrap().clone();
    assert_eq!(target, "/ws");
    assert!(headers.get("cookie").is_none(), "{headers:?}");
    assert_eq!(
        headers.get("authorization").unwrap(),
        &format!("Bearer {PASSWORD}")
    );
    assert_eq!(headers.get("upgrade").unwrap(), "websocket");
    // One connect and one close record.
    let connects = f.audit("agent.gateway-connect").await;
    assert_eq!(connects.len(), 1, "{connects:?}");
    assert_eq!(connects[0]["detail"]["via"], "websocket");
    let mut closes = Vec::new();
    for _ in 0..100 {
        closes = f.audit("agent.gateway-stream").await;
        if !closes.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(closes.len(), 1, "{closes:?}");
    let d = &closes[0]["detail"];
    assert_eq!(d["via"], "websocket");
    assert_eq!(d["closeReason"], "gateway closed");
    assert_eq!(d["bytesToGateway"], client_frame("ping").len());
    assert_eq!(d["bytesFromGateway"], want.len());
    assert!(!closes[0].to_string().contains(PASSWORD));
}

/// A new active revision closes the browser's WebSocket with 1012 at the next re-check
/// (every second here), between two of the gateway's frames, so the Control UI reconnects to
/// the new revision's gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_active_revision_closes_the_websocket_with_1012() {
    let f = Fleet::start(Vec::new()).await;
    let deploy = f.token("ns1", "deploy").await;
    let mut s = tokio::net::TcpStream::connect(&f.addr).await.unwrap();
    let req = format!(
        "GET /namespaces/ns1/agents/a1/gateway/ws HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {deploy}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        addr = f.addr
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(&client_frame("ping")).await.unwrap();
    // The head and both frames of the gateway, before the revision moves.
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let want_frames = [text_frame("hello"), text_frame("got")].concat();
    while !out.ends_with(&want_frames) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the gateway's frames did not come")
            .unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 101"));
    f.call(
        "PUT",
        "/namespaces/ns1/configurations/cfg",
        json!({"document": {"logging": {"level": "debug"}}}),
    )
    .await;
    f.call("POST", "/namespaces/ns1/agents/a1/deploy", Value::Null)
        .await;
    f.settle().await;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("the WebSocket was not closed after the new revision")
        .unwrap();
    assert_eq!(rest.first(), Some(&0x88), "a close frame: {rest:?}");
    assert_eq!(u16::from_be_bytes([rest[2], rest[3]]), 1012, "{rest:?}");
    let mut closes = Vec::new();
    for _ in 0..100 {
        closes = f.audit("agent.gateway-stream").await;
        if !closes.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        closes[0]["detail"]["closeReason"],
        "active revision changed"
    );
}

/// OpenClaw's gateway takes its password in the WebSocket's first message, the `connect`
/// request, not in a header: the coordinator gives it there, replacing a token the caller
/// typed, and the caller never sees it. The caller's offer of compression is not passed on,
/// so that frame can be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_connect_request_gets_the_gateways_password_and_the_caller_never_sees_it() {
    let f = Fleet::start(Vec::new()).await;
    let deploy = f.token("ns1", "deploy").await;
    let mut s = tokio::net::TcpStream::connect(&f.addr).await.unwrap();
    let req = format!(
        "GET /namespaces/ns1/agents/a1/gateway HTTP/1.1\r\nHost: {addr}\r\n\
         Origin: http://{addr}\r\nCookie: occ_console={deploy}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        addr = f.addr
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let connect = json!({"type": "req", "id": "1", "method": "connect",
                         "params": {"auth": {"token": "typed-by-the-caller"}}});
    s.write_all(&client_frame(&connect.to_string()))
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut want = [text_frame("hello"), text_frame("connect-ok")].concat();
    for second in [false, true] {
        if second {
            // A later frame that looks the same passes untouched.
            s.write_all(&client_frame(&connect.to_string()))
                .await
                .unwrap();
            want.extend(text_frame("got"));
        }
        while !got.windows(want.len()).any(|w| w == want.as_slice()) {
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("the gateway's answer within 10 s")
                .unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    }
    assert!(
        !got.windows(PASSWORD.len())
            .any(|w| w == PASSWORD.as_bytes())
    );
    let (_, target, headers) = f.seen().last().unwrap().clone();
    assert_eq!(target, "/");
    assert!(
        headers.get("sec-websocket-extensions").is_none(),
        "{headers:?}"
    );
}

/// The Control UI's route, `.../agents/{agent}/ui/{path}`: each revision tells its gateway
/// that path as `gateway.controlUi.basePath`, and the route passes the whole path on (the
/// gateway writes it into the page's absolute links), with the gateway route's rules: the
/// gateway's password, no caller credential, deploy in the Namespace. A document may not set
/// the path itself; a revision that turns the Control UI off is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_ui_route_passes_its_whole_path_to_a_gateway_told_it_as_its_base_path() {
    let f = Fleet::start(Vec::new()).await;
    let deploy = f.token("ns1", "deploy").await;
    // The revision's gateway was told the path: the route checks it before it opens.
    let a = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/ui/assets/index.js?v=1",
            &[
                format!("Authorization: Bearer {deploy}"),
                "Cookie: occ_console=other-session".into(),
            ],
            "",
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    let seen = f.seen();
    let (method, target, headers) = seen.last().unwrap();
    assert_eq!(
        (method.as_str(), target.as_str()),
        ("GET", "/namespaces/ns1/agents/a1/ui/assets/index.js?v=1"),
        "the gateway gets the whole path, its basePath included"
    );
    assert!(headers.get("cookie").is_none(), "{headers:?}");
    assert_eq!(
        headers.get("authorization").unwrap(),
        &format!("Bearer {PASSWORD}")
    );
    // The root without its slash: a redirect for a page, nothing opened.
    let opened = f.seen().len();
    let bare = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/ui",
            &[format!("Authorization: Bearer {deploy}")],
            "",
        )
        .await;
    assert_eq!(bare.status, 308, "{bare:?}");
    assert_eq!(
        bare.header("location").as_deref(),
        Some("/namespaces/ns1/agents/a1/ui/")
    );
    assert_eq!(f.seen().len(), opened);
    // A reader may not; another Namespace's deployer may not.
    for token in [f.token("ns1", "read").await, f.token("ns2", "deploy").await] {
        let r = f
            .raw(
                "GET",
                "/namespaces/ns1/agents/a1/ui/",
                &[format!("Authorization: Bearer {token}")],
                "",
            )
            .await;
        assert_eq!(r.status, 403, "{r:?}");
    }
    assert_eq!(f.seen().len(), opened);

    // The path is the coordinator's to set.
    let refused = f
        .raw(
            "PUT",
            "/namespaces/ns1/configurations/cfg",
            &[
                format!("Authorization: Bearer {}", f.admin),
                "Content-Type: application/json".into(),
            ],
            &json!({"document": {"gateway": {"controlUi": {"basePath": "/elsewhere"}}}})
                .to_string(),
        )
        .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.code(), "CONFIGURATION_REFUSED", "{refused:?}");
    assert!(
        refused.body.contains("gateway.controlUi.basePath"),
        "{refused:?}"
    );
    // A revision with the Control UI turned off: refused by name, the gateway route still
    // reaches the gateway.
    f.call(
        "PUT",
        "/namespaces/ns1/configurations/cfg",
        json!({"document": {"gateway": {"controlUi": {"enabled": false}}}}),
    )
    .await;
    f.call("POST", "/namespaces/ns1/agents/a1/deploy", Value::Null)
        .await;
    f.settle().await;
    let off = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/ui/",
            &[format!("Authorization: Bearer {deploy}")],
            "",
        )
        .await;
    assert_eq!(off.status, 409, "{off:?}");
    assert_eq!(off.code(), "CONTROL_UI_NOT_DEPLOYED", "{off:?}");
    assert!(off.body.contains("gateway.controlUi.enabled"), "{off:?}");
    let api = f
        .raw(
            "GET",
            "/namespaces/ns1/agents/a1/gateway/",
            &[format!("Authorization: Bearer {deploy}")],
            "",
        )
        .await;
    assert_eq!(api.status, 200, "{api:?}");
}
