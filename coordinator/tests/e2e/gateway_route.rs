//! Issue 30 end to end: an Agent's gateway page in Debian's chromium through the coordinator's
//! gateway route, against a real `occ serve` driving a real test host (systemd-nspawn, hostd
//! with its `restrict` key, the test gateway with password auth). Sign in to the console;
//! open `.../agents/a1/gateway/x-clawfleet-test/ui` (the test gateway's stand-in of the
//! Control UI), whose script's WebSocket echoes through the route and hostd's relay; the
//! gateway reports that it got its own password and no cookie; the password is nowhere in
//! the browser (cookies, local and session storage, the page, every network event: request
//! and response headers, WebSocket frames). A screenshot goes to
//! `CLAWFLEET_ARTIFACT_DIR/e2e_gateway_route`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::console_support;
use crate::fleet_support as fleet;

use std::time::{Duration, Instant};

use console_support::{
    artifacts, assert_not_in_browser, browser_runtime, no_chromium, sign_in, wait_text,
};
use fleet::{Fleet, FleetOptions, NS, Want, document};
use serde_json::{Value, json};

/// The managed gateway password hostd generated for the host's one Agent, read on the host.
fn managed_password(host: &clawfleet_vm_tests::TestHost) -> String {
    let line = host
        .run_ok("find / -xdev -name gateway-password.env -exec cat {} +")
        .unwrap();
    let password = line
        .trim()
        .strip_prefix("OPENCLAW_GATEWAY_PASSWORD=")
        .unwrap_or_else(|| panic!("no managed password on the host: {line:?}"))
        .to_owned();
    assert!(password.len() >= 32, "{password}");
    password
}

#[test]
fn the_gateway_page_and_its_websocket_work_in_chromium_and_never_see_the_password() {
    clawfleet_vm_tests::skip_unless_hosts!();
    if no_chromium() {
        return;
    }
    let fleet = Fleet::start_with(FleetOptions {
        hosts: 1,
        ..FleetOptions::default()
    });
    let token = fleet.admin_token();
    let mut doc = document("a1-r1", json!({}));
    doc["gateway"] = json!({"auth": {"mode": "password"}});
    fleet.create_agent("a1", &doc);
    let rev = fleet.deploy("a1");
    fleet.wait_converged(
        &[(
            "a1",
            Want::Running {
                rev,
                label: "a1-r1".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(120),
    );
    // The managed password hostd generated, read on the host itself.
    let host = fleet.host(&fleet.host_names()[0]);
    let password = managed_password(host);

    let base = format!("http://127.0.0.1:{}", fleet.port);
    let gateway = format!("{base}/namespaces/{NS}/agents/a1/gateway");
    let dir = artifacts("e2e_gateway_route");
    let rt = browser_runtime();
    rt.block_on(async {
        let browser = clawfleet_cdp::Browser::launch().await.unwrap();
        let page = browser.new_page(1280, 800).await.unwrap();
        sign_in(&page, &base, &token).await;

        // The console's link to the gateway, and the gateway's root without its slash,
        // which the browser is redirected from to the root with it.
        page.navigate(&format!("{base}/console/namespaces/{NS}/agents/a1"))
            .await
            .unwrap();
        let href = page
            .evaluate("document.querySelector('a[href$=\"/gateway/\"]')?.href ?? null")
            .await
            .unwrap();
        assert_eq!(
            href,
            json!(format!("{gateway}/")),
            "the console's gateway link"
        );
        page.navigate(&gateway).await.unwrap();
        let at = page.evaluate("location.pathname").await.unwrap();
        assert_eq!(at, json!(format!("/namespaces/{NS}/agents/a1/gateway/")));

        // The page loads through the route, and its WebSocket echoes through it.
        page.navigate(&format!("{gateway}/x-clawfleet-test/ui"))
            .await
            .unwrap();
        wait_text(&page, "#out", "echo: hello through the route", 30).await;
        page.screenshot(&dir.join("gateway-ui.png")).await.unwrap();
        let frames: Vec<Value> = page
            .network_events()
            .into_iter()
            .filter(|e| e.method == "Network.webSocketFrameReceived")
            .map(|e| e.params)
            .collect();
        assert!(
            frames
                .iter()
                .any(|f| f.pointer("/response/payloadData")
                    == Some(&json!("hello through the route"))),
            "no echoed frame in the network log: {frames:?}"
        );

        // What reached the gateway: its own password, no cookie.
        page.navigate(&format!("{gateway}/x-clawfleet-test/auth"))
            .await
            .unwrap();
        let body = page
            .evaluate("document.body.innerText")
            .await
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let report: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("the gateway's report is not JSON ({e}): {body}"));
        assert_eq!(report["authorization"], "gateway-password", "{report}");
        assert_eq!(report["cookie"], false, "{report}");

        // The password is nowhere in the browser.
        assert_not_in_browser(&browser, &page, &password).await;
        let html = page
            .evaluate("document.documentElement.outerHTML")
            .await
            .unwrap()
            .to_string();
        assert!(!html.contains(&password), "the page holds it");
        assert!(
            page.network_events()
                .iter()
                .any(|e| e.method == "Network.requestWillBeSentExtraInfo"),
            "the network log has no request headers to check"
        );
        browser.close().await.unwrap();
    });
    // Connect and close of the page's WebSocket are audited.
    let audit = |action: &str| -> Vec<Value> {
        fleet
            .api
            .request("GET", &format!("/audit?action={action}"), None)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    assert!(
        audit("agent.gateway-connect")
            .iter()
            .any(|r| r["detail"]["via"] == "websocket" && r["target"] == format!("{NS}/a1")),
        "no connect record"
    );
    let mut closed = Vec::new();
    for _ in 0..100 {
        closed = audit("agent.gateway-stream");
        if !closed.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        closed.iter().any(|r| r["detail"]["via"] == "websocket"),
        "no close record: {closed:?}"
    );
    assert!(!format!("{closed:?}").contains(&password));
}

/// The real OpenClaw gateway's Control UI through the coordinator (issue 30's first
/// acceptance item): a real host runs OpenClaw (the cached bundle) deployed with `occ`; the
/// console's "Open the Control UI" link loads its page in chromium, every script and
/// stylesheet through the route (the gateway was told the route's path as its
/// `gateway.controlUi.basePath`), and the page's own WebSocket connects (the coordinator
/// gives the gateway's password in its `connect` request) and gets answers to its RPCs.
/// The host's sshd forbids forwarding, hostd's key is `restrict`ed; the password is nowhere
/// in the browser. A screenshot goes to
/// `CLAWFLEET_ARTIFACT_DIR/e2e_gateway_route/control-ui.png`.
#[test]
fn the_real_control_ui_loads_and_talks_to_its_gateway_through_the_route() {
    clawfleet_vm_tests::skip_unless_hosts!();
    if no_chromium() {
        return;
    }
    if let Some(reason) = clawfleet_vm_tests::openclaw::skip_reason() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true: the real Control UI test must run, but {reason}");
        }
        eprintln!("SKIP: {reason}");
        return;
    }
    let harness = clawfleet_vm_tests::HarnessConfig::from_env().unwrap();
    clawfleet_vm_tests::openclaw::ensure_cached(&harness).unwrap();
    let fleet = Fleet::start_with(FleetOptions {
        hosts: 1,
        openclaw: true,
        ..FleetOptions::default()
    });
    let token = fleet.admin_token();
    fleet.create_agent("a1", &json!({"gateway": {"auth": {"mode": "password"}}}));
    let rev = fleet.deploy("a1");
    let t = Instant::now();
    loop {
        let s = fleet.status("a1").unwrap();
        if s["activeRevisionId"] == json!(rev) && s["servedRevisionId"] == json!(rev) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "OpenClaw did not come up: {s}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("OpenClaw serving in {:.1} s", t.elapsed().as_secs_f64());
    let host = fleet.host(&fleet.host_names()[0]);
    let password = managed_password(host);
    // The host forbids every forwarding (`Fleet` sets `AllowTcpForwarding no` on its hosts):
    // what follows goes through hostd's relay, never through an ssh forward.
    let forward = host
        .ssh_command()
        .args(["-W", "127.0.0.1:22"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&forward.stderr);
    assert!(
        !forward.status.success() && said.contains("forwarding failed"),
        "the host allowed a forward: {said}"
    );

    let base = format!("http://127.0.0.1:{}", fleet.port);
    let ui = format!("{base}/namespaces/{NS}/agents/a1/ui/");
    let dir = artifacts("e2e_gateway_route");
    let rt = browser_runtime();
    rt.block_on(async {
        let browser = clawfleet_cdp::Browser::launch().await.unwrap();
        let page = browser.new_page(1280, 800).await.unwrap();
        sign_in(&page, &base, &token).await;
        page.navigate(&format!("{base}/console/namespaces/{NS}/agents/a1"))
            .await
            .unwrap();
        let href = page
            .evaluate("document.querySelector('a[href$=\"/ui/\"]')?.href ?? null")
            .await
            .unwrap();
        assert_eq!(href, json!(ui), "the console's Control UI link");
        page.navigate(&ui).await.unwrap();

        // The page's WebSocket: the gateway's hello, then answers to the page's requests.
        let received = |page: &clawfleet_cdp::Page| -> Vec<Value> {
            page.network_events()
                .into_iter()
                .filter(|e| e.method == "Network.webSocketFrameReceived")
                .filter_map(|e| {
                    let text = e
                        .params
                        .pointer("/response/payloadData")?
                        .as_str()?
                        .to_owned();
                    serde_json::from_str::<Value>(&text).ok()
                })
                .collect()
        };
        let t = Instant::now();
        loop {
            let frames = received(&page);
            let hello = frames.iter().any(|f| {
                f["type"] == "res" && f["ok"] == true && f["payload"]["type"] == "hello-ok"
            });
            let answered = frames
                .iter()
                .filter(|f| f["type"] == "res" && f["ok"] == true)
                .count();
            if hello && answered >= 2 {
                eprintln!(
                    "Control UI connected and answered ({answered} RPCs) in {:.1} s",
                    t.elapsed().as_secs_f64()
                );
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                page.screenshot(&dir.join("control-ui-failed.png"))
                    .await
                    .unwrap();
                let sent: Vec<String> = page
                    .network_events()
                    .into_iter()
                    .filter(|e| {
                        e.method.starts_with("Network.webSocket")
                            || e.method == "Network.responseReceived"
                    })
                    .map(|e| {
                        format!("{} {}", e.method, e.params)
                            .chars()
                            .take(400)
                            .collect()
                    })
                    .collect();
                panic!(
                    "the Control UI did not connect through the route:\n{}",
                    sent.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The page renders what the RPCs answered; then the picture.
        tokio::time::sleep(Duration::from_secs(4)).await;
        page.screenshot(&dir.join("control-ui.png")).await.unwrap();
        let text = page.evaluate("document.body.innerText").await.unwrap();
        eprintln!(
            "the Control UI shows: {}",
            text.to_string().chars().take(300).collect::<String>()
        );
        // Every script and stylesheet came through the route.
        let responses: Vec<(String, i64)> = page
            .network_events()
            .into_iter()
            .filter(|e| e.method == "Network.responseReceived")
            .map(|e| {
                (
                    e.params["response"]["url"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                    e.params["response"]["status"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        let console = format!("{base}/console/");
        let assets: Vec<&(String, i64)> = responses
            .iter()
            .filter(|(u, _)| u.contains("/assets/") && !u.starts_with(&console))
            .collect();
        assert!(!assets.is_empty(), "no assets loaded: {responses:?}");
        for (url, status) in &assets {
            assert!(
                url.starts_with(&format!("{ui}assets/")) && *status == 200,
                "{url} answered {status}"
            );
        }

        // The password is nowhere in the browser.
        assert_not_in_browser(&browser, &page, &password).await;
        browser.close().await.unwrap();
    });
}
