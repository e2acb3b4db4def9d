//! The harness against the real chromium: what the console and gateway-access tests rely on.

use std::time::Duration;

use clawfleet_cdp::{Browser, CdpError, Key, artifacts_dir, chromium_available};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PAGE: &str = r##"<!doctype html><html><head><title>harness</title></head><body>
<a href="#one" id="first">one</a> <input id="name"> <button id="b" onclick="window.clicks=(window.clicks||0)+1">b</button>
<script>localStorage.setItem('k', 'v'); window.clicks = 0; fetch('/api?x=1').then(r => r.text()).then(t => { window.api = t; });</script>
</body></html>"##;

/// Serves [`PAGE`] with a session cookie at `/`, and `pong` at `/api`, on loopback.
async fn serve() -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let (kind, body) = if request.starts_with(b"GET /api") {
                    ("text/plain", "pong".to_owned())
                } else {
                    ("text/html", PAGE.to_owned())
                };
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                     Set-Cookie: session=s3cret; HttpOnly; SameSite=Strict; Path=/\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(response.as_bytes()).await.ok();
            });
        }
    });
    Ok(format!("http://{address}/"))
}

fn skip() -> bool {
    if chromium_available() {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "chromium is missing under CI=true (apt-get install chromium)"
    );
    eprintln!("SKIP: chromium is not installed (apt-get install chromium)");
    true
}

#[tokio::test]
async fn drives_a_page_and_reads_what_it_stored_and_sent() -> Result<(), Box<dyn std::error::Error>>
{
    if skip() {
        return Ok(());
    }
    let url = serve().await?;
    let browser = Browser::launch().await?;
    let page = browser.new_page(1024, 768).await?;
    page.navigate(&url).await?;
    assert_eq!(page.evaluate("document.title").await?, "harness");
    assert_eq!(
        page.wait_for("window.api", Duration::from_secs(10)).await?,
        "pong"
    );

    // HttpOnly: the browser holds the cookie, the page's scripts cannot read it.
    let cookies = page.cookies().await?;
    let session = cookies
        .iter()
        .find(|c| c.name == "session")
        .ok_or("no session cookie")?;
    assert!(
        session.http_only && session.same_site == "Strict",
        "{session:?}"
    );
    assert_eq!(page.evaluate("document.cookie").await?, "");
    assert!(
        browser
            .all_cookies()
            .await?
            .iter()
            .any(|c| c.value == "s3cret")
    );
    assert_eq!(page.storage().await?["local"]["k"], "v");

    // The network log has the fetch, with the cookie the browser sent along.
    let log = serde_json::to_string(
        &page
            .network_events()
            .iter()
            .map(|e| &e.params)
            .collect::<Vec<_>>(),
    )?;
    assert!(
        log.contains("/api?x=1"),
        "the fetch is not in the network log"
    );

    // Input: keyboard focus moves, clicks and typing reach the page.
    page.press_key(Key::Tab).await?;
    assert_eq!(page.evaluate("document.activeElement.id").await?, "first");
    page.click("#b").await?;
    page.fill("#name", "<b>typed</b>").await?;
    assert_eq!(
        page.evaluate("[window.clicks, document.querySelector('#name').value]")
            .await?,
        serde_json::json!([1, "<b>typed</b>"])
    );
    assert!(matches!(
        page.click("#missing").await,
        Err(CdpError::NoElement { .. })
    ));

    // Errors name what failed.
    let thrown = page.evaluate("(() => { throw new Error('boom') })()").await;
    assert!(
        matches!(&thrown, Err(CdpError::Script { message, .. }) if message.contains("boom")),
        "{thrown:?}"
    );
    let late = page
        .wait_for("window.never", Duration::from_millis(200))
        .await;
    assert!(
        matches!(&late, Err(CdpError::Timeout { what, .. }) if what.contains("window.never")),
        "{late:?}"
    );

    // Screenshots are PNGs at the viewport's size.
    page.set_viewport(390, 800).await?;
    let dir = artifacts_dir(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "cdp-harness",
    )?;
    let shot = dir.join("page-390.png");
    page.screenshot(&shot).await?;
    let png = std::fs::read(&shot)?;
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(
        u32::from_be_bytes([png[16], png[17], png[18], png[19]]),
        390,
        "the PNG's width"
    );

    let group = browser.process_group();
    browser.close().await?;
    // Nothing of the browser is left: its process group is empty.
    let gone = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(group), None);
    assert_eq!(
        gone,
        Err(nix::errno::Errno::ESRCH),
        "processes of chromium's group {group} survived close()"
    );
    Ok(())
}

#[tokio::test]
async fn a_missing_browser_is_named() {
    let error = Browser::launch_at(std::path::Path::new("/nonexistent/chromium")).await;
    assert!(
        matches!(&error, Err(CdpError::NotFound { .. })),
        "{error:?}"
    );
    assert!(
        error
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
            .contains("/nonexistent/chromium")
    );
}
