//! One tab: navigation, scripts, input, and what the page stored and sent.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64ct::{Base64, Encoding};
use serde_json::{Value, json};

use crate::connection::{Connection, Event};
use crate::{COMMAND_TIMEOUT, CdpError, string_field};

/// A cookie as the browser holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cookie {
    pub name: String,
    pub value: String,
    pub domain: String,
    pub path: String,
    pub http_only: bool,
    pub secure: bool,
    /// `Strict`, `Lax`, `None`, or empty when the server set none.
    pub same_site: String,
}

/// Keys a test presses (keyboard navigation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Tab,
    ShiftTab,
    Enter,
    Escape,
}

/// One tab of a [`crate::Browser`].
#[derive(Debug, Clone)]
pub struct Page {
    connection: Arc<Connection>,
    session: String,
    target_id: String,
}

impl Page {
    pub(crate) fn new(connection: Arc<Connection>, session: String, target_id: String) -> Page {
        Page {
            connection,
            session,
            target_id,
        }
    }

    /// The DevTools target id of this tab.
    pub fn target_id(&self) -> &str {
        &self.target_id
    }

    /// A DevTools command to this tab.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, CdpError> {
        self.connection
            .call(Some(&self.session), method, params, COMMAND_TIMEOUT)
            .await
    }

    /// Renders the tab at `width` × `height` CSS pixels (below 500 px wide as a phone).
    pub async fn set_viewport(&self, width: u32, height: u32) -> Result<(), CdpError> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 500 }),
        )
        .await
        .map(drop)
    }

    /// Loads `url` and waits for its load event; a network failure is an error naming it.
    pub async fn navigate(&self, url: &str) -> Result<(), CdpError> {
        let mark = self.connection.mark(&self.session);
        let answer = self.call("Page.navigate", json!({ "url": url })).await?;
        if let Some(error) = answer.get("errorText").and_then(Value::as_str) {
            return Err(CdpError::Protocol {
                method: format!("Page.navigate to {url}"),
                message: error.to_owned(),
            });
        }
        self.connection
            .wait_event(
                &self.session,
                mark,
                &format!("the load event of {url}"),
                |e| e.method == "Page.loadEventFired",
                COMMAND_TIMEOUT,
            )
            .await
            .map(drop)
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value as JSON.
    pub async fn evaluate(&self, expression: &str) -> Result<Value, CdpError> {
        let answer = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
            )
            .await?;
        if let Some(details) = answer.get("exceptionDetails") {
            let message = details
                .pointer("/exception/description")
                .or_else(|| details.get("text"))
                .and_then(Value::as_str)
                .unwrap_or("an exception")
                .to_owned();
            return Err(CdpError::Script {
                expression: expression.to_owned(),
                message,
            });
        }
        Ok(answer
            .pointer("/result/value")
            .cloned()
            .unwrap_or(Value::Null))
    }

    /// Evaluates `expression` every 50 ms until its value is truthy, and returns that value.
    pub async fn wait_for(&self, expression: &str, timeout: Duration) -> Result<Value, CdpError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let value = self.evaluate(expression).await?;
            if truthy(&value) {
                return Ok(value);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(CdpError::Timeout {
                    what: format!("`{expression}` to hold (last value {value})"),
                    millis: timeout.as_millis(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the first element matching `selector` (as a user would: through `click()`).
    pub async fn click(&self, selector: &str) -> Result<(), CdpError> {
        let found = self
            .evaluate(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return false; e.click(); return true; }})()",
                js_string(selector)
            ))
            .await?;
        if found == Value::Bool(true) {
            Ok(())
        } else {
            Err(CdpError::NoElement {
                selector: selector.to_owned(),
            })
        }
    }

    /// Types `text` into the first element matching `selector`, firing `input` and `change`.
    pub async fn fill(&self, selector: &str, text: &str) -> Result<(), CdpError> {
        let found = self
            .evaluate(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return false; e.focus(); e.value = {}; \
                 e.dispatchEvent(new Event('input', {{bubbles: true}})); \
                 e.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()",
                js_string(selector),
                js_string(text)
            ))
            .await?;
        if found == Value::Bool(true) {
            Ok(())
        } else {
            Err(CdpError::NoElement {
                selector: selector.to_owned(),
            })
        }
    }

    /// Presses and releases `key` through the browser's input pipeline (focus moves as for
    /// a user; scripts cannot tell it from a real key).
    pub async fn press_key(&self, key: Key) -> Result<(), CdpError> {
        let (name, code, modifiers) = match key {
            Key::Tab => ("Tab", 9, 0),
            Key::ShiftTab => ("Tab", 9, 8),
            Key::Enter => ("Enter", 13, 0),
            Key::Escape => ("Escape", 27, 0),
        };
        let text = if key == Key::Enter { "\r" } else { "" };
        for kind in ["rawKeyDown", "char", "keyUp"] {
            if kind == "char" && text.is_empty() {
                continue;
            }
            self.call(
                "Input.dispatchKeyEvent",
                json!({ "type": kind, "key": name, "code": name, "windowsVirtualKeyCode": code,
                        "nativeVirtualKeyCode": code, "modifiers": modifiers, "text": text }),
            )
            .await?;
        }
        Ok(())
    }

    /// Writes a PNG of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<(), CdpError> {
        let answer = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await?;
        let data = string_field(&answer, "data", "Page.captureScreenshot")?;
        let png = Base64::decode_vec(&data).map_err(|e| CdpError::BadMessage {
            detail: format!("the screenshot is not base64: {e}"),
        })?;
        std::fs::write(path, png).map_err(|source| CdpError::Io {
            what: format!("writing the screenshot {}", path.display()),
            source,
        })
    }

    /// The cookies the browser would send to the page's current URL.
    pub async fn cookies(&self) -> Result<Vec<Cookie>, CdpError> {
        let answer = self.call("Network.getCookies", json!({})).await?;
        Ok(cookies_of(&answer))
    }

    /// `localStorage` and `sessionStorage` of the page's origin, as `{local: {...}, session: {...}}`.
    pub async fn storage(&self) -> Result<Value, CdpError> {
        self.evaluate(
            "(() => { const dump = s => Object.fromEntries(Object.keys(s).map(k => [k, s.getItem(k)])); \
             return { local: dump(localStorage), session: dump(sessionStorage) }; })()",
        )
        .await
    }

    /// Every event this tab has sent so far.
    pub fn events(&self) -> Vec<Event> {
        self.connection.events(&self.session)
    }

    /// The tab's network events (requests with their headers, responses, WebSocket frames).
    pub fn network_events(&self) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.method.starts_with("Network."))
            .collect()
    }

    /// Console messages, uncaught exceptions and browser log entries (e.g. a refused script
    /// under the page's Content-Security-Policy), as text.
    pub fn console_messages(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e.method.as_str() {
                "Runtime.consoleAPICalled" => Some(format!(
                    "console: {}",
                    e.params.get("args").unwrap_or(&Value::Null)
                )),
                "Runtime.exceptionThrown" => Some(format!(
                    "exception: {}",
                    e.params.get("exceptionDetails").unwrap_or(&Value::Null)
                )),
                "Log.entryAdded" => Some(format!(
                    "log: {}",
                    e.params.pointer("/entry/text").unwrap_or(&Value::Null)
                )),
                _ => None,
            })
            .collect()
    }

    /// A mark for [`Page::wait_event`]: events from here on count.
    pub fn mark(&self) -> usize {
        self.connection.mark(&self.session)
    }

    /// Waits for an event named `method` recorded at or after `mark`.
    pub async fn wait_event(
        &self,
        mark: usize,
        method: &str,
        timeout: Duration,
    ) -> Result<Event, CdpError> {
        self.connection
            .wait_event(
                &self.session,
                mark,
                &format!("the event {method}"),
                |e| e.method == method,
                timeout,
            )
            .await
    }
}

/// Whether a script's value counts as true (as JavaScript's `if` would judge it).
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// `text` as a JavaScript string literal.
fn js_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

pub(crate) fn cookies_of(answer: &Value) -> Vec<Cookie> {
    let text = |c: &Value, f: &str| {
        c.get(f)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let flag = |c: &Value, f: &str| c.get(f).and_then(Value::as_bool).unwrap_or(false);
    answer
        .get("cookies")
        .and_then(Value::as_array)
        .map(|cookies| {
            cookies
                .iter()
                .map(|c| Cookie {
                    name: text(c, "name"),
                    value: text(c, "value"),
                    domain: text(c, "domain"),
                    path: text(c, "path"),
                    http_only: flag(c, "httpOnly"),
                    secure: flag(c, "secure"),
                    same_site: text(c, "sameSite"),
                })
                .collect()
        })
        .unwrap_or_default()
}
