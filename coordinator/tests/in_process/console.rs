//! The web console over HTTP on loopback: the router `occ serve` serves (console and API,
//! `coordinator::console::with_api`), its service over SQLite, hostd's engine in process
//! behind it (tests/hostd_engine/mod.rs), the worker run by the test. Sign-in and its
//! cookie, CSRF refusals, roles (buttons and 403s), Namespace scoping, escaping, the live
//! streams, a failed revision's evidence, a rollout paused from the console, the audit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support;
use crate::console_support;
use crate::hostd_engine;

use std::sync::Arc;
use std::time::Duration;

use console_support::{no_chromium, shots, text_of, wait_text};
use coordinator::api::AppState;
use coordinator::config::{ApiSettings, WorkerSettings};
use coordinator::console::ConsoleSettings;
use coordinator::console::auth::{COOKIE, csrf_of};
use coordinator::service::Service;
use coordinator::store::SharedStore;
use coordinator::worker::Worker;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::HOST_KEY;

/// Markup planted where the console shows text.
const PLANT: &str = "<script>alert('planted')</script>";

/// An HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct Fixture {
    addr: String,
    admin: String,
    store: SharedStore,
    worker: Arc<Worker<EngineBackend>>,
    backend: Arc<EngineBackend>,
}

/// One HTTP/1.1 request on its own connection (`Connection: close`).
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn form(pairs: &[(&str, &str)]) -> String {
    serde_urlencoded::to_string(pairs).unwrap()
}

impl Fixture {
    async fn start() -> Self {
        Self::start_with(ApiSettings::default()).await
    }

    async fn start_with(api_settings: ApiSettings) -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let backend = Arc::new(EngineBackend::new());
        let settings = WorkerSettings {
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(5),
            ..WorkerSettings::default()
        };
        let worker = Arc::new(Worker::new(store.clone(), backend.clone(), settings));
        let state = Arc::new(AppState {
            foreground: Default::default(),
            service: Service::new(store.clone()),
            backend: backend.clone(),
        });
        let console = ConsoleSettings {
            status_interval: Duration::from_millis(100),
            log_interval: Duration::from_millis(100),
            ..ConsoleSettings::default()
        };
        let router = coordinator::console::with_api(state, console, &api_settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self {
            addr,
            admin,
            store,
            worker,
            backend,
        }
    }

    async fn api(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let auth = format!("Bearer {}", self.admin);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut headers = vec![("Authorization", auth.as_str())];
        if !body.is_empty() {
            headers.push(("Content-Type", "application/json"));
        }
        let a = http(&self.addr, method, path, &headers, &body).await;
        assert!(a.status < 300, "{method} {path}: {} {}", a.status, a.body);
        serde_json::from_str(&a.body).unwrap_or(Value::Null)
    }

    async fn settle(&self) {
        for _ in 0..400 {
            if self.worker.run_once().await.is_none()
                && self.store.pending_work().await.unwrap() == 0
            {
                return;
            }
        }
    }

    /// Hosts h1 and h2; Namespace ns1 on h1 with Agents a1 (deployed) and a2, Configuration
    /// cfg holding [`PLANT`]; Namespace ns2 on h2 with Agent b1.
    async fn fleet(&self) {
        for h in ["h1", "h2"] {
            self.api(
                "POST",
                "/hosts",
                Some(json!({"name": h, "address": "127.0.0.1", "hostKey": HOST_KEY})),
            )
            .await;
        }
        for (ns, h) in [("ns1", "h1"), ("ns2", "h2")] {
            self.api("POST", "/namespaces", Some(json!({"id": ns, "hosts": [h]})))
                .await;
            self.api(
                "POST",
                &format!("/namespaces/{ns}/configurations"),
                Some(json!({"id": "cfg", "document": {"meta": {"note": PLANT}}})),
            )
            .await;
        }
        for (ns, a) in [("ns1", "a1"), ("ns1", "a2"), ("ns2", "b1")] {
            self.api(
                "POST",
                &format!("/namespaces/{ns}/agents"),
                Some(json!({"id": a, "configurationId": "cfg"})),
            )
            .await;
        }
        self.settle().await;
        self.api("POST", "/namespaces/ns1/agents/a1/deploy", None)
            .await;
        self.settle().await;
    }

    async fn token(&self, ns: &str, role: &str) -> String {
        let v = self
            .api(
                "POST",
                "/tokens",
                Some(json!({"name": format!("{ns}-{role}"), "grants": [{"namespace": ns, "role": role}]})),
            )
            .await;
        v["token"].as_str().unwrap().to_owned()
    }

    async fn get(&self, token: &str, path: &str) -> Answer {
        let cookie = format!("{COOKIE}={token}");
        http(&self.addr, "GET", path, &[("Cookie", &cookie)], "").await
    }

    /// A form POST with the session cookie (`csrf`: the field sent, if any).
    async fn post(&self, token: &str, path: &str, fields: &[(&str, &str)]) -> Answer {
        let cookie = format!("{COOKIE}={token}");
        http(
            &self.addr,
            "POST",
            path,
            &[
                ("Cookie", &cookie),
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Origin", &format!("http://{}", self.addr)),
            ],
            &form(fields),
        )
        .await
    }

    async fn desired(&self, ns: &str, agent: &str) -> String {
        self.store
            .agent(ns, agent)
            .await
            .unwrap()
            .unwrap()
            .desired_state
            .as_str()
            .to_owned()
    }
}

/// Sign-in sets the token in an HttpOnly, SameSite=Strict cookie scoped to /console
/// (Secure behind TLS), never in the page; a wrong token sets nothing; sign-out needs the
/// CSRF token and clears the cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_keeps_the_token_in_a_strict_http_only_cookie() {
    let f = Fixture::start().await;
    let out = http(&f.addr, "GET", "/console", &[], "").await;
    assert_eq!(out.status, 303);
    assert_eq!(out.header("location"), Some("/console/sign-in"));
    let page = http(&f.addr, "GET", "/console/sign-in", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("type=\"password\""), "{}", page.body);
    assert!(!page.body.contains("localStorage"));
    let ct = [("Content-Type", "application/x-www-form-urlencoded")];
    let wrong = http(
        &f.addr,
        "POST",
        "/console/sign-in",
        &ct,
        &form(&[("token", "nope")]),
    )
    .await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert!(wrong.header("set-cookie").is_none());
    let ok = http(
        &f.addr,
        "POST",
        "/console/sign-in",
        &ct,
        &form(&[("token", &f.admin)]),
    )
    .await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    let cookie = ok.header("set-cookie").unwrap();
    assert_eq!(
        cookie,
        format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", f.admin)
    );
    let tls = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("X-Forwarded-Proto", "https"),
    ];
    let secure = http(
        &f.addr,
        "POST",
        "/console/sign-in",
        &tls,
        &form(&[("token", &f.admin)]),
    )
    .await;
    assert!(secure.header("set-cookie").unwrap().ends_with("; Secure"));
    let overview = f.get(&f.admin, "/console").await;
    assert_eq!(overview.status, 200);
    assert!(overview.body.contains("Fleet overview"));
    assert!(
        !overview.body.contains(&f.admin),
        "the token is in the page"
    );
    assert_eq!(overview.header("cache-control"), Some("no-store"));
    assert!(
        overview
            .header("content-security-policy")
            .unwrap()
            .contains("script-src 'self'")
    );
    // Sign-out without the CSRF token is refused; with it the cookie is cleared.
    let refused = f.post(&f.admin, "/console/sign-out", &[]).await;
    assert_eq!(refused.status, 403);
    let out = f
        .post(
            &f.admin,
            "/console/sign-out",
            &[("csrf", &csrf_of(&f.admin))],
        )
        .await;
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
}

/// A form without the CSRF token, with a wrong one, or from another origin changes
/// nothing; with it, the change is made and audited under the caller's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_form_is_refused_and_changes_nothing() {
    let f = Fixture::start().await;
    f.fleet().await;
    let stop = "/console/namespaces/ns1/agents/a1/stop";
    let none = f.post(&f.admin, stop, &[("confirm", "yes")]).await;
    assert_eq!(none.status, 403, "{}", none.body);
    assert!(none.body.contains("CSRF"), "{}", none.body);
    let wrong_csrf = csrf_of("another token");
    let wrong = f
        .post(&f.admin, stop, &[("confirm", "yes"), ("csrf", &wrong_csrf)])
        .await;
    assert_eq!(wrong.status, 403);
    let cookie = format!("{COOKIE}={}", f.admin);
    let csrf = csrf_of(&f.admin);
    let elsewhere = http(
        &f.addr,
        "POST",
        stop,
        &[
            ("Cookie", &cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", "http://evil.example"),
        ],
        &form(&[("confirm", "yes"), ("csrf", &csrf)]),
    )
    .await;
    assert_eq!(elsewhere.status, 403);
    assert_eq!(f.desired("ns1", "a1").await, "running");
    // The first step shows the plan and changes nothing.
    let plan = f.post(&f.admin, stop, &[("csrf", &csrf)]).await;
    assert_eq!(plan.status, 200);
    assert!(plan.body.contains("becomes"), "{}", plan.body);
    assert_eq!(f.desired("ns1", "a1").await, "running");
    let done = f
        .post(&f.admin, stop, &[("confirm", "yes"), ("csrf", &csrf)])
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(f.desired("ns1", "a1").await, "stopped");
    let admin_id = f
        .store
        .token_by_hash(&coordinator::tokens::hash(&f.admin))
        .await
        .unwrap()
        .unwrap()
        .id;
    let audit = f.store.audit_events(50).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.action.contains("stop") && e.target.contains("a1") && e.actor == admin_id),
        "{audit:?}"
    );
}

/// A read token sees no action buttons and is refused (403) when it posts anyway, with a
/// valid CSRF token; the hosts and audit pages are a global admin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_sees_no_actions_and_gets_403() {
    let f = Fixture::start().await;
    f.fleet().await;
    let reader = f.token("ns1", "read").await;
    let page = f.get(&reader, "/console/namespaces/ns1/agents/a1").await;
    assert_eq!(page.status, 200, "{}", page.body);
    // The gateway and Control UI links too: the routes ask for deploy in the Namespace.
    let gateway = "href=\"/namespaces/ns1/agents/a1/gateway/\"";
    let ui = "href=\"/namespaces/ns1/agents/a1/ui/\"";
    for action in ["/deploy\"", "/stop\"", "/reconcile\"", gateway, ui] {
        assert!(!page.body.contains(action), "{action} shown to a reader");
    }
    assert!(
        page.body.contains("the target&#39;s policy") || page.body.contains("the target's policy"),
        "{}",
        page.body
    );
    f.store
        .set_agent_egress(
            "ns1",
            "a1",
            Some(&clawfleet_protocol::egress::Egress {
                ports: Some(vec![]),
                allow: None,
            }),
        )
        .await
        .unwrap();
    let admin_page = f.get(&f.admin, "/console/namespaces/ns1/agents/a1").await;
    assert!(
        admin_page.body.contains("ports none; allow target"),
        "{}",
        admin_page.body
    );
    for action in ["/deploy\"", "/stop\"", "/reconcile\"", gateway, ui] {
        assert!(
            admin_page.body.contains(action),
            "{action} not shown to an admin"
        );
    }
    let csrf = csrf_of(&reader);
    for path in ["stop", "reconcile", "deploy"] {
        let r = f
            .post(
                &reader,
                &format!("/console/namespaces/ns1/agents/a1/{path}"),
                &[("confirm", "yes"), ("csrf", &csrf)],
            )
            .await;
        assert_eq!(r.status, 403, "{path}: {}", r.body);
    }
    assert_eq!(f.desired("ns1", "a1").await, "running");
    for path in ["/console/hosts", "/console/audit"] {
        assert_eq!(f.get(&reader, path).await.status, 403, "{path}");
    }
    let overview = f.get(&reader, "/console").await;
    assert!(!overview.body.contains("href=\"/console/hosts\""));
}

/// A token of another Namespace sees nothing of this one: not in the overview, and 403 on
/// its pages and streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_another_namespace_sees_none_of_this_one() {
    let f = Fixture::start().await;
    f.fleet().await;
    let other = f.token("ns2", "admin").await;
    let overview = f.get(&other, "/console").await;
    assert_eq!(overview.status, 200);
    assert!(overview.body.contains("ns2"));
    assert!(!overview.body.contains("ns1"), "{}", overview.body);
    for path in [
        "/console/namespaces/ns1",
        "/console/namespaces/ns1/agents/a1",
        "/console/namespaces/ns1/agents/a1/events",
        "/console/namespaces/ns1/agents/a1/logs",
    ] {
        let r = f.get(&other, path).await;
        assert_eq!(r.status, 403, "{path}");
        assert!(!r.body.contains("agents/a1"), "{path}: {}", r.body);
    }
}

/// Markup in a configuration, a log line and a name (an audit filter echoed back, a
/// failure message) is shown as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_markup_is_shown_as_text() {
    let f = Fixture::start().await;
    f.fleet().await;
    let escaped = "&lt;script&gt;alert('planted')&lt;/script&gt;";
    let page = f.get(&f.admin, "/console/namespaces/ns1/agents/a1").await;
    assert!(!page.body.contains(PLANT), "configuration unescaped");
    assert!(page.body.contains("&lt;script&gt;"), "{}", page.body);
    let audit = f
        .get(
            &f.admin,
            &format!("/console/audit?actor={}", urlencode(PLANT)),
        )
        .await;
    assert_eq!(audit.status, 200);
    assert!(!audit.body.contains(PLANT));
    assert!(audit.body.contains("&lt;script&gt;"));
    // A log line, through the log stream.
    f.backend.gateway_log("h1", "ns1", "a1", PLANT);
    let cookie = format!("{COOKIE}={}", f.admin);
    let events = read_stream(
        &f.addr,
        "/console/namespaces/ns1/agents/a1/logs",
        &cookie,
        "alert",
    )
    .await;
    assert!(!events.contains(PLANT), "{events}");
    assert!(events.contains(escaped), "{events}");
    // A name: identifiers refuse markup outright.
    let auth = format!("Bearer {}", f.admin);
    let r = http(
        &f.addr,
        "POST",
        "/namespaces/ns1/agents",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        &json!({"id": PLANT, "configurationId": "cfg"}).to_string(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).unwrap()[2..].to_owned()
}

/// Reads a server-sent event stream until its text holds `until` (at most 10 s).
async fn read_stream(addr: &str, path: &str, cookie: &str, until: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nAccept: text/event-stream\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 8192];
    while !text.contains(until) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {until:?} in {text}"))
            .unwrap();
        if n == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    text
}

/// The Agent stream shows a deploy converging live: a deploy planned and applied from the
/// console, then the status block replaced once the worker ran it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_is_planned_applied_and_seen_converging_live() {
    let f = Fixture::start().await;
    f.fleet().await;
    let csrf = csrf_of(&f.admin);
    let base = "/console/namespaces/ns1/agents/a2";
    let plan = f
        .post(&f.admin, &format!("{base}/deploy"), &[("csrf", &csrf)])
        .await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    assert!(plan.body.contains("What the target would change"));
    let token = plan
        .body
        .split("name=\"planToken\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_owned();
    let applied = f
        .post(
            &f.admin,
            &format!("{base}/deploy"),
            &[("csrf", &csrf), ("planToken", &token)],
        )
        .await;
    assert_eq!(applied.status, 303, "{}", applied.body);
    // A plan token applies once.
    let again = f
        .post(
            &f.admin,
            &format!("{base}/deploy"),
            &[("csrf", &csrf), ("planToken", &token)],
        )
        .await;
    assert_eq!(again.status, 409, "{}", again.body);
    let cookie = format!("{COOKIE}={}", f.admin);
    let before = read_stream(
        &f.addr,
        &format!("{base}/events"),
        &cookie,
        "event: replace",
    )
    .await;
    assert!(before.contains("converging"), "{before}");
    f.settle().await;
    let after = read_stream(
        &f.addr,
        &format!("{base}/events"),
        &cookie,
        "active, served",
    )
    .await;
    // Done, but no sweep observed it yet: not green.
    assert!(after.contains("work done"), "{after}");
    assert!(!after.contains(">converged<"), "{after}");
}

/// A failed revision's evidence (its code and message) is on the Agent's page, red, never
/// green.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_revision_shows_its_evidence() {
    let f = Fixture::start().await;
    f.fleet().await;
    f.backend.fail_activations_of(
        "a2",
        clawfleet_protocol::failure::FailureCode::ReadinessTimeout,
    );
    f.api("POST", "/namespaces/ns1/agents/a2/deploy", None)
        .await;
    f.settle().await;
    let page = f.get(&f.admin, "/console/namespaces/ns1/agents/a2").await;
    assert!(page.body.contains("Failure evidence"), "{}", page.body);
    assert!(page.body.contains("READINESS_TIMEOUT"), "{}", page.body);
    assert!(page.body.contains("badge bad"));
    assert!(!page.body.contains("active, served"));
}

/// Without a drift finding an Agent is unknown; an unreachable finding shows unreachable,
/// never green.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unobserved_and_unreachable_agents_are_never_green() {
    let f = Fixture::start().await;
    f.fleet().await;
    let list = f.get(&f.admin, "/console/namespaces/ns1").await;
    assert!(
        list.body.contains("data-state=\"unknown\""),
        "{}",
        list.body
    );
    assert!(!list.body.contains("badge ok\" data-state=\"running"));
    let now = coordinator::clock::now_seconds();
    let row = |agent: &str, state| coordinator::model::DriftRow {
        target: "h1".into(),
        namespace_id: "ns1".into(),
        agent_id: agent.into(),
        state,
        reason: None,
        message: "no answer".into(),
        checked_at: now,
    };
    use coordinator::model::DriftState;
    f.store
        .replace_drift("h1", &[row("a1", DriftState::Synced)])
        .await
        .unwrap();
    let list = f.get(&f.admin, "/console/namespaces/ns1").await;
    assert!(
        list.body.contains("badge ok\" data-state=\"running"),
        "{}",
        list.body
    );
    f.store
        .replace_drift(
            "h1",
            &[
                row("a1", DriftState::Unreachable),
                row("a2", DriftState::Unreachable),
            ],
        )
        .await
        .unwrap();
    let list = f.get(&f.admin, "/console/namespaces/ns1").await;
    assert!(!list.body.contains("data-state=\"running"), "{}", list.body);
    assert_eq!(list.body.matches("data-state=\"unreachable\"").count(), 2);
    let filtered = f
        .get(&f.admin, "/console/namespaces/ns1?state=unreachable")
        .await;
    assert!(filtered.body.contains(">a1<") && filtered.body.contains(">a2<"));
    let hosts = f.get(&f.admin, "/console/hosts").await;
    assert!(
        hosts.body.contains("data-state=\"unreachable\""),
        "{}",
        hosts.body
    );
}

/// A rollout is paused from the console (plan, then apply), and its page shows it; the
/// audit page lists the pause under the caller's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_is_paused_from_the_console_and_audited() {
    let f = Fixture::start().await;
    f.fleet().await;
    f.api(
        "PUT",
        "/namespaces/ns1/configurations/cfg",
        Some(json!({"document": {"meta": {"note": "v2"}}})),
    )
    .await;
    let r = f
        .api(
            "POST",
            "/namespaces/ns1/rollouts",
            Some(json!({"configurationId": "cfg", "agents": ["a1", "a2"], "canary": 1, "manualPromote": true})),
        )
        .await;
    let id = r["id"].as_i64().unwrap();
    let page = f
        .get(&f.admin, &format!("/console/namespaces/ns1/rollouts/{id}"))
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("pause…"), "{}", page.body);
    let csrf = csrf_of(&f.admin);
    let control = format!("/console/namespaces/ns1/rollouts/{id}/control");
    let plan = f
        .post(&f.admin, &control, &[("csrf", &csrf), ("action", "pause")])
        .await;
    assert_eq!(plan.status, 200);
    assert!(plan.body.contains("Nothing new starts"));
    let done = f
        .post(
            &f.admin,
            &control,
            &[("csrf", &csrf), ("action", "pause"), ("confirm", "yes")],
        )
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let page = f
        .get(&f.admin, &format!("/console/namespaces/ns1/rollouts/{id}"))
        .await;
    assert!(page.body.contains("data-state=\"paused\""), "{}", page.body);
    assert!(page.body.contains("resume…"));
    let audit = f.get(&f.admin, "/console/audit?action=rollout.pause").await;
    assert!(audit.body.contains("rollout.pause"), "{}", audit.body);
}

// ---- The browser suite: the console in Debian's chromium (clawfleet-cdp). ----

/// Signs in, deploys an Agent and watches it converge live, reads a failed revision's
/// evidence, follows a log, pauses a rollout, reads the audit, sees a host cut off turn
/// its Agents unreachable within one drift interval; screenshots at 1440, 768 and 390 px.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chromium() {
    if no_chromium() {
        return;
    }
    let f = Fixture::start().await;
    f.fleet().await;
    let dir = console_support::artifacts("console_in_chromium");
    let base = format!("http://{}", f.addr);
    let browser = clawfleet_cdp::Browser::launch().await.unwrap();
    let page = browser.new_page(1440, 900).await.unwrap();

    // Sign in: the token goes into an HttpOnly, SameSite=Strict cookie, nowhere else.
    page.navigate(&format!("{base}/console")).await.unwrap();
    shots(&page, &dir, "sign-in").await;
    console_support::sign_in(&page, &base, &f.admin).await;
    // Keyboard: the first Tab lands on the skip link, with a visible focus ring.
    page.press_key(clawfleet_cdp::Key::Tab).await.unwrap();
    assert_eq!(
        page.evaluate("document.activeElement.className")
            .await
            .unwrap(),
        "skip"
    );
    let ring = page
        .evaluate("getComputedStyle(document.activeElement).outlineStyle")
        .await
        .unwrap();
    assert_ne!(ring, "none");
    shots(&page, &dir, "overview").await;

    // Deploy a2 from the console: the plan, then apply; the page shows it converging and
    // then converged without a reload.
    page.navigate(&format!("{base}/console/namespaces/ns1/agents/a2"))
        .await
        .unwrap();
    page.click("form[action$='/deploy'] button").await.unwrap();
    wait_text(&page, "main", "What the target would change", 10).await;
    shots(&page, &dir, "deploy-plan").await;
    page.click("form[action$='/deploy'] button.primary")
        .await
        .unwrap();
    wait_text(&page, "#status", "converging", 10).await;
    page.evaluate("window.__same = 1").await.unwrap();
    let stop_worker = {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(f.worker.clone().run(1, rx));
        tx
    };
    wait_text(&page, "#status", "active, served", 20).await;
    assert_eq!(
        page.evaluate("window.__same").await.unwrap(),
        1,
        "the page was reloaded"
    );
    wait_text(&page, "#runtime", "Unit", 20).await;
    shots(&page, &dir, "agent-converged").await;

    // Follow the log: lines appear as they are written, markup as text.
    f.backend.gateway_log("h1", "ns1", "a2", "first line");
    page.click("button[data-follow]").await.unwrap();
    wait_text(&page, "#log", "first line", 10).await;
    f.backend.gateway_log("h1", "ns1", "a2", PLANT);
    wait_text(&page, "#log", "alert('planted')", 10).await;
    assert_eq!(
        page.evaluate("document.querySelectorAll('#log script').length")
            .await
            .unwrap(),
        0
    );
    shots(&page, &dir, "agent-log").await;
    page.click("button[data-follow]").await.unwrap();

    // A failed revision's evidence.
    f.backend.fail_activations_of(
        "a1",
        clawfleet_protocol::failure::FailureCode::ReadinessTimeout,
    );
    f.api(
        "PUT",
        "/namespaces/ns1/configurations/cfg",
        Some(json!({"document": {"meta": {"note": "v2"}}})),
    )
    .await;
    f.api("POST", "/namespaces/ns1/agents/a1/deploy", None)
        .await;
    page.navigate(&format!("{base}/console/namespaces/ns1/agents/a1"))
        .await
        .unwrap();
    wait_text(&page, "#status", "READINESS_TIMEOUT", 30).await;
    shots(&page, &dir, "agent-failed").await;

    // A rollout, paused from its page (plan, then apply).
    stop_worker.send(true).unwrap();
    let r = f
        .api(
            "POST",
            "/namespaces/ns1/rollouts",
            Some(json!({"configurationId": "cfg", "agents": ["a2"], "canary": 0, "manualPromote": true})),
        )
        .await;
    let id = r["id"].as_i64().unwrap();
    page.navigate(&format!("{base}/console/namespaces/ns1/rollouts/{id}"))
        .await
        .unwrap();
    page.click("form[action$='/control'] button").await.unwrap();
    wait_text(&page, "main", "Nothing new starts", 10).await;
    page.click("button.primary").await.unwrap();
    wait_text(&page, "#rollout", "paused", 10).await;
    shots(&page, &dir, "rollout-paused").await;

    // The audit, filtered.
    page.navigate(&format!("{base}/console/audit?action=rollout.pause"))
        .await
        .unwrap();
    wait_text(&page, "tbody", "rollout.pause", 5).await;
    shots(&page, &dir, "audit").await;

    // A host cut off: its Agents show unreachable within one drift interval, live.
    let interval = Duration::from_secs(3);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(coordinator::control::run_drift(
        f.store.clone(),
        f.backend.clone(),
        coordinator::config::DriftSettings { interval },
        coordinator::control::leader::Leadership::always(),
        stop_rx,
    ));
    page.navigate(&format!("{base}/console/namespaces/ns1/agents/a2"))
        .await
        .unwrap();
    wait_text(&page, "#status", "running", 15).await;
    let cut = std::time::Instant::now();
    f.backend.cut_off("h1", true);
    wait_text(&page, "#status", "unreachable", 10).await;
    let took = cut.elapsed();
    // One drift interval (the runner jitters it by a tenth) and the stream's 100 ms step.
    assert!(
        took <= interval + interval / 10 + Duration::from_millis(500),
        "unreachable after {took:?}"
    );
    assert!(!text_of(&page, "#status").await.contains("converged"));
    shots(&page, &dir, "agent-unreachable").await;
    stop_tx.send(true).unwrap();
    eprintln!("console screenshots: {}", dir.display());
    browser.close().await.unwrap();
}

/// Issue 26's N9 on the console too: a token's rate limit counts its console pages and its
/// API requests together, and the console answers 429 `RATE_LIMITED` beyond it.
#[tokio::test]
async fn a_tokens_rate_limit_counts_its_console_requests() {
    let f = Fixture::start_with(ApiSettings {
        token_requests_per_minute: 6,
        ..ApiSettings::default()
    })
    .await;
    let reader = f.token("*", "read").await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(f.get(&reader, "/console").await.status);
    }
    assert!(statuses.iter().take(6).all(|s| *s == 200), "{statuses:?}");
    let refused = f.get(&reader, "/console").await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert!(refused.body.contains("RATE_LIMITED"), "{}", refused.body);
    // The same token's API requests share the limit.
    let auth = format!("Bearer {reader}");
    let api = http(
        &f.addr,
        "GET",
        "/namespaces",
        &[("Authorization", auth.as_str())],
        "",
    )
    .await;
    assert_eq!(api.status, 429, "{}", api.body);
    // Another token is not charged for it.
    let other = f.token("*", "operate").await;
    assert_eq!(f.get(&other, "/console").await.status, 200);
}
