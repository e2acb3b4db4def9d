//! Debian's chromium, headless, driven over the DevTools protocol: the browser of the console
//! and gateway-access tests.
//!
//! The browser runs in its own process group with a throw-away profile, talks over
//! `--remote-debugging-pipe` (no port is opened), and is torn down by its own process-group
//! id. Everything a test asserts on (cookies, storage, network events, console messages,
//! screenshots) is read through [`Page`].

mod connection;
mod error;
mod page;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tokio::process::Child;

pub use connection::Event;
pub use error::CdpError;
pub use page::{Cookie, Key, Page};

use connection::Connection;

/// How long one DevTools command may take before it is reported as timed out.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Where chromium is looked for: `CLAWFLEET_CHROMIUM`, else Debian's binary (the
/// `/usr/bin/chromium` wrapper script adds nothing a test needs).
pub fn chromium_path() -> PathBuf {
    match std::env::var_os("CLAWFLEET_CHROMIUM") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from("/usr/lib/chromium/chromium"),
    }
}

/// Whether chromium is installed where [`chromium_path`] looks.
pub fn chromium_available() -> bool {
    chromium_path().is_file()
}

/// The directory a test keeps its screenshots in: `CLAWFLEET_ARTIFACT_DIR/<test>` when set
/// (CI prints it), else `<default>/<test>`; created if missing.
pub fn artifacts_dir(default: &Path, test: &str) -> Result<PathBuf, CdpError> {
    let base = std::env::var_os("CLAWFLEET_ARTIFACT_DIR")
        .map_or_else(|| default.to_path_buf(), PathBuf::from);
    let dir = base.join(test);
    std::fs::create_dir_all(&dir).map_err(|source| CdpError::Io {
        what: format!("creating the artifact directory {}", dir.display()),
        source,
    })?;
    Ok(dir)
}

/// One headless chromium process and its profile.
#[derive(Debug)]
pub struct Browser {
    child: Child,
    pgid: i32,
    connection: Arc<Connection>,
    profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromium headless with a fresh profile, no network of its own (no component
    /// updates, sync or background requests), and the DevTools protocol on a pipe.
    pub async fn launch() -> Result<Browser, CdpError> {
        Browser::launch_at(&chromium_path()).await
    }

    /// [`Browser::launch`] with the chromium executable at `path`.
    pub async fn launch_at(path: &Path) -> Result<Browser, CdpError> {
        let path = path.to_path_buf();
        if !path.is_file() {
            return Err(CdpError::NotFound { path });
        }
        let profile = tempfile::Builder::new()
            .prefix("clawfleet-cdp-")
            .tempdir()
            .map_err(|source| CdpError::Io {
                what: "creating the browser profile directory".into(),
                source,
            })?;
        let log_path = profile.path().join("chromium.log");
        let log = std::fs::File::create(&log_path).map_err(|source| CdpError::Io {
            what: format!("creating {}", log_path.display()),
            source,
        })?;
        let mut command = tokio::process::Command::new("/bin/sh");
        // The pipe protocol wants fd 3 (commands in) and fd 4 (answers out); the shell moves
        // our stdin/stdout there, so no unsafe pre-exec code is needed.
        command
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg(&path)
            .args([
                "--headless",
                "--remote-debugging-pipe",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--metrics-recording-only",
                "--mute-audio",
                "--hide-scrollbars",
                "--password-store=basic",
                "--use-mock-keychain",
            ])
            .arg(format!(
                "--user-data-dir={}",
                profile.path().join("data").display()
            ));
        if nix::unistd::geteuid().is_root() {
            // Chromium refuses to run as root with its sandbox; the tests run as root in CI.
            command.arg("--no-sandbox");
        }
        command
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| CdpError::Spawn {
            path: path.clone(),
            source,
        })?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| CdpError::Closed {
                reason: "chromium exited at once".into(),
                log_tail: String::new(),
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(CdpError::Closed {
                reason: "no pipe to chromium".into(),
                log_tail: String::new(),
            });
        };
        let connection = Connection::start(stdin, stdout, log_path);
        let browser = Browser {
            child,
            pgid,
            connection,
            profile,
        };
        browser.call("Browser.getVersion", json!({})).await?;
        Ok(browser)
    }

    /// The browser's process group (its own id), for tests that assert nothing is left.
    pub fn process_group(&self) -> i32 {
        self.pgid
    }

    /// A DevTools command to the browser itself.
    pub async fn call(
        &self,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, CdpError> {
        self.connection
            .call(None, method, params, COMMAND_TIMEOUT)
            .await
    }

    /// A new tab of `width` × `height` CSS pixels, with page, runtime and network events on.
    pub async fn new_page(&self, width: u32, height: u32) -> Result<Page, CdpError> {
        let target = self
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await?;
        let target_id = string_field(&target, "targetId", "Target.createTarget")?;
        let attached = self
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target_id, "flatten": true }),
            )
            .await?;
        let session = string_field(&attached, "sessionId", "Target.attachToTarget")?;
        let page = Page::new(self.connection.clone(), session, target_id);
        for domain in [
            "Page.enable",
            "Runtime.enable",
            "Network.enable",
            "Log.enable",
        ] {
            page.call(domain, json!({})).await?;
        }
        page.set_viewport(width, height).await?;
        Ok(page)
    }

    /// Every cookie the browser holds, for every site.
    pub async fn all_cookies(&self) -> Result<Vec<Cookie>, CdpError> {
        let answer = self.call("Storage.getCookies", json!({})).await?;
        Ok(page::cookies_of(&answer))
    }

    /// Closes the browser, waits for it, and kills its process group if it lingers; the
    /// profile directory goes with it.
    pub async fn close(mut self) -> Result<(), CdpError> {
        // An error here means the browser is already gone; the wait below settles it.
        self.call("Browser.close", json!({})).await.ok();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            self.kill_group();
            self.child.wait().await.map_err(|source| CdpError::Io {
                what: "waiting for chromium to exit".into(),
                source,
            })?;
        }
        // Helpers (zygote, renderers) share the group; none may outlive the test. Killed
        // helpers stay in the group until their new parent reaps them: wait for that.
        self.kill_group();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while killpg(Pid::from_raw(self.pgid), None).is_ok() {
            if tokio::time::Instant::now() >= deadline {
                return Err(CdpError::Closed {
                    reason: format!(
                        "processes of chromium's group {} outlived SIGKILL for 10 s",
                        self.pgid
                    ),
                    log_tail: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn kill_group(&self) {
        // ESRCH: the group is already empty, which is what we want.
        killpg(Pid::from_raw(self.pgid), Signal::SIGKILL).ok();
    }

    /// The profile directory (removed when the browser is dropped or closed).
    pub fn profile_dir(&self) -> &Path {
        self.profile.path()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill_group();
    }
}

pub(crate) fn string_field(
    value: &serde_json::Value,
    field: &str,
    method: &str,
) -> Result<String, CdpError> {
    value
        .get(field)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| CdpError::BadMessage {
            detail: format!("the answer to {method} has no {field}"),
        })
}
