//! What the console's browser suites share (`tests/in_process/console.rs` in process, `tests/e2e/console.rs`
//! on a real test host, and the gateway route's browser tests): the chromium skip rule,
//! screenshots at three widths and where they go, waiting for a page's text, and checking
//! that a secret never reached the browser.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

pub fn no_chromium() -> bool {
    if clawfleet_cdp::chromium_available() {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "chromium is missing under CI=true (apt-get install chromium)"
    );
    eprintln!("SKIP: chromium is not installed (apt-get install chromium)");
    true
}

/// Screenshots of the current page at 1440, 768 and 390 px wide, as `<name>-<width>.png`;
/// at 390 px nothing but the tables' own scroll boxes is wider than the viewport.
pub async fn shots(page: &clawfleet_cdp::Page, dir: &std::path::Path, name: &str) {
    for (w, h) in [(1440, 900), (768, 1024), (390, 844)] {
        page.set_viewport(w, h).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        page.screenshot(&dir.join(format!("{name}-{w}.png")))
            .await
            .unwrap();
        if w == 390 {
            let wide = page
                .evaluate("document.documentElement.scrollWidth")
                .await
                .unwrap();
            assert!(
                wide.as_u64().unwrap() <= 390,
                "{name}: {wide} px wide at 390"
            );
        }
    }
    page.set_viewport(1440, 900).await.unwrap();
}

pub async fn text_of(page: &clawfleet_cdp::Page, selector: &str) -> String {
    page.evaluate(&format!(
        "(document.querySelector({selector:?}) || {{textContent: ''}}).textContent"
    ))
    .await
    .unwrap()
    .as_str()
    .unwrap_or_default()
    .to_owned()
}

pub async fn wait_text(page: &clawfleet_cdp::Page, selector: &str, text: &str, secs: u64) {
    page.wait_for(
        &format!(
            "(document.querySelector({selector:?}) || {{textContent: ''}}).textContent.includes({text:?})"
        ),
        Duration::from_secs(secs),
    )
    .await
    .unwrap_or_else(|e| panic!("{selector} never showed {text:?}: {e}"));
}

/// Signs in at `base` (`http://host:port`) with `token` through the sign-in form, and checks
/// the cookie the browser got: HttpOnly, SameSite=Strict, unreadable by the page, and the
/// token in no storage.
pub async fn sign_in(page: &clawfleet_cdp::Page, base: &str, token: &str) {
    page.navigate(&format!("{base}/console")).await.unwrap();
    assert!(text_of(page, "h1").await.contains("clawfleet console"));
    page.fill("#token", token).await.unwrap();
    page.click("button[type=submit]").await.unwrap();
    page.wait_for(
        "location.pathname === '/console' && document.title.startsWith('Fleet overview')",
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let cookies = page.cookies().await.unwrap();
    let session = cookies
        .iter()
        .find(|c| c.name == coordinator::console::auth::COOKIE)
        .unwrap();
    assert!(
        session.http_only && session.same_site == "Strict",
        "{session:?}"
    );
    assert_eq!(page.evaluate("document.cookie").await.unwrap(), "");
    let storage = page.storage().await.unwrap().to_string();
    assert!(!storage.contains(token), "{storage}");
}

/// The directory a browser test keeps its screenshots in: `name` under
/// `CLAWFLEET_ARTIFACT_DIR`, else under the test target's temporary directory.
pub fn artifacts(name: &str) -> std::path::PathBuf {
    clawfleet_cdp::artifacts_dir(
        &std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts"),
        name,
    )
    .unwrap()
}

/// A runtime for a synchronous test that drives a browser.
pub fn browser_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Asserts that `secret` is in none of the browser's cookies, `page`'s local and session
/// storage, and none of `page`'s network events (request and response headers, WebSocket
/// frames).
pub async fn assert_not_in_browser(
    browser: &clawfleet_cdp::Browser,
    page: &clawfleet_cdp::Page,
    secret: &str,
) {
    for c in browser.all_cookies().await.unwrap() {
        assert!(!c.value.contains(secret), "cookie {} holds it", c.name);
    }
    let storage = page.storage().await.unwrap().to_string();
    assert!(!storage.contains(secret), "storage holds it");
    for e in page.network_events() {
        assert!(
            !e.params.to_string().contains(secret),
            "the network event {} holds it",
            e.method
        );
    }
}
