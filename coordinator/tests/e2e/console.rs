//! Issue 32 end to end: the web console in Debian's chromium against a real `occ serve` (a
//! child process on SQLite) driving a real test host (systemd-nspawn, hostd, the test
//! gateway). Sign in; deploy an Agent from the console and watch it converge live; follow
//! its log (a line holding `<script>` shown as text); see a failed revision's evidence; run
//! a rollout and pause it; read the audit. Screenshots at 1440, 768 and 390 px go to the
//! test's artifact directory (`CLAWFLEET_ARTIFACT_DIR/e2e_console`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::console_support;
use crate::fleet_support as fleet;

use console_support::{no_chromium, shots, sign_in, wait_text};
use fleet::{Fleet, FleetOptions, NS, document};
use serde_json::json;

const PLANT: &str = "<script>alert('planted')</script>";

/// Runs a blocking fleet call from inside the browser's runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[test]
fn the_console_drives_a_real_host_in_chromium() {
    clawfleet_vm_tests::skip_unless_hosts!();
    if no_chromium() {
        return;
    }
    let fleet = Fleet::start_with(FleetOptions {
        hosts: 1,
        ..FleetOptions::default()
    });
    let token = fleet.admin_token();
    fleet.create_agent(
        "a1",
        &document("a1-r1", json!({"logLines": ["first line", PLANT]})),
    );
    fleet.create_agent("a2", &document("a2-r1", json!({"neverReady": true})));
    let base = format!("http://127.0.0.1:{}", fleet.port);
    let dir = console_support::artifacts("e2e_console");
    let rt = console_support::browser_runtime();
    rt.block_on(async {
        let browser = clawfleet_cdp::Browser::launch().await.unwrap();
        let page = browser.new_page(1440, 900).await.unwrap();
        sign_in(&page, &base, &token).await;
        shots(&page, &dir, "overview").await;

        // Deploy a1 from the console (its plan from the host, then apply) and watch it
        // converge without a reload.
        page.navigate(&format!("{base}/console/namespaces/{NS}/agents/a1"))
            .await
            .unwrap();
        page.click("form[action$='/deploy'] button").await.unwrap();
        wait_text(&page, "main", "What the target would change", 60).await;
        shots(&page, &dir, "deploy-plan").await;
        page.click("form[action$='/deploy'] button.primary")
            .await
            .unwrap();
        wait_text(&page, "#status", "Deployment", 10).await;
        page.evaluate("window.__same = 1").await.unwrap();
        wait_text(&page, "#status", "active, served", 120).await;
        assert_eq!(page.evaluate("window.__same").await.unwrap(), 1);
        wait_text(&page, "#runtime", "active/running", 30).await;
        shots(&page, &dir, "agent-converged").await;

        // Follow its log: the planted line arrives as text.
        page.click("button[data-follow]").await.unwrap();
        wait_text(&page, "#log", "alert('planted')", 60).await;
        assert_eq!(
            page.evaluate("document.querySelectorAll('#log script').length")
                .await
                .unwrap(),
            0
        );
        shots(&page, &dir, "agent-log").await;
        page.click("button[data-follow]").await.unwrap();

        // a2 never becomes ready: its revision's evidence, red.
        blocking(|| fleet.deploy_api("a2"));
        page.navigate(&format!("{base}/console/namespaces/{NS}/agents/a2"))
            .await
            .unwrap();
        wait_text(&page, "#status", "Failure evidence", 180).await;
        assert!(
            !console_support::text_of(&page, "#status")
                .await
                .contains("active, served")
        );
        shots(&page, &dir, "agent-failed").await;

        // A rollout of a new generation to a1, paused from its page. The new revision takes
        // 12 s to become ready (hostd waits 30 s), so the rollout is still running when the
        // pause arrives (a quick one finished first, and the pause was refused as it should
        // be: 409 ROLLOUT_STATE_CONFLICT, "only a running rollout pauses").
        blocking(|| {
            fleet.update_configuration("a1", &document("a1-r2", json!({"readyAfterMs": 12000})))
        });
        let r = blocking(|| {
            fleet
                .api
                .request(
                    "POST",
                    &format!("/namespaces/{NS}/rollouts"),
                    Some(&json!({"configurationId": "a1", "agents": ["a1"], "canary": 0, "manualPromote": true})),
                )
                .unwrap()
        });
        let id = r["id"].as_i64().unwrap();
        page.navigate(&format!("{base}/console/namespaces/{NS}/rollouts/{id}"))
            .await
            .unwrap();
        shots(&page, &dir, "rollout").await;
        if page
            .evaluate("!!document.querySelector(\"form[action$='/control'] input[value=pause]\")")
            .await
            .unwrap()
            == true
        {
            page.click("form[action$='/control'] button").await.unwrap();
            wait_text(&page, "main", "Nothing new starts", 10).await;
            page.click("button.primary").await.unwrap();
            if let Err(e) = page
                .wait_for(
                    "(document.querySelector('#rollout') || {textContent: ''}).textContent.includes('paused')",
                    std::time::Duration::from_secs(15),
                )
                .await
            {
                let url = page.evaluate("location.href").await.unwrap_or_default();
                let text = page.evaluate("document.body.innerText").await.unwrap_or_default();
                panic!("the rollout page never showed paused: {e}; at {url} it says: {text}");
            }
            shots(&page, &dir, "rollout-paused").await;
        } else {
            // The one-Agent rollout finished before the page was read: it must say so.
            wait_text(&page, "#rollout", "done", 10).await;
        }

        // The audit: the console's deploy of a1 under the admin token.
        page.navigate(&format!("{base}/console/audit"))
            .await
            .unwrap();
        wait_text(&page, "tbody", "agent.logs.follow", 10).await;
        shots(&page, &dir, "audit").await;
        browser.close().await.unwrap();
    });
    eprintln!("console screenshots: {}", dir.display());
}
