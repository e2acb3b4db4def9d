//! A small blocking HTTP/1.1 client for the `occ` CLI (loopback or a trusted network): one
//! request per connection, JSON in and out, bounded response size.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::codes::Code;
use serde_json::Value;
use thiserror::Error;

/// Why a request failed.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error("cannot reach the coordinator at {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("the coordinator's answer is malformed: {0}")]
    Malformed(String),
    #[error("{code} (HTTP {status}): {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// 429: the token's read budget is spent for now.
    #[error("RATE_LIMITED (HTTP 429): {message}")]
    RateLimited { retry_after: u64, message: String },
    #[error("--server {0:?} must look like http://HOST:PORT")]
    BadServer(String),
}

/// A client for one coordinator.
#[derive(Debug, Clone)]
pub struct Client {
    addr: String,
    token: Option<String>,
}

const MAX_RESPONSE: u64 = 16 * 1024 * 1024;

impl Client {
    /// `server` is `http://host:port`.
    pub fn new(server: &str, token: Option<String>) -> Result<Self, ClientError> {
        let addr = server
            .strip_prefix("http://")
            .map(|s| s.trim_end_matches('/'))
            .filter(|s| !s.is_empty() && !s.contains('/'))
            .ok_or_else(|| ClientError::BadServer(server.to_owned()))?;
        Ok(Self {
            addr: addr.to_owned(),
            token,
        })
    }

    /// Sends a typed request body (one of the API's request types); returns the JSON body of
    /// a 2xx answer.
    pub fn send<T: serde::Serialize>(
        &self,
        method: &str,
        path: &str,
        body: &T,
    ) -> Result<Value, ClientError> {
        let value = serde_json::to_value(body)
            .map_err(|e| ClientError::Malformed(format!("cannot encode the request: {e}")))?;
        self.request(method, path, Some(&value))
    }

    /// Sends a request; returns the JSON body of a 2xx answer (Null for 204).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        self.exchange(method, path, body).map(|(value, _)| value)
    }

    /// Every item of a list route, page after page (each page `page_size` items, the API's
    /// default when `None`), as one JSON array.
    pub fn list_all(&self, path: &str, page_size: Option<u32>) -> Result<Value, ClientError> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut query = Vec::new();
            if let Some(n) = page_size {
                query.push(format!("limit={n}"));
            }
            if let Some(c) = &cursor {
                query.push(format!("cursor={}", percent_encode(c)));
            }
            let sep = if path.contains('?') { '&' } else { '?' };
            let url = if query.is_empty() {
                path.to_owned()
            } else {
                format!("{path}{sep}{}", query.join("&"))
            };
            let (page, next) = self.exchange("GET", &url, None)?;
            match page {
                Value::Array(mut page) => items.append(&mut page),
                other => {
                    return Err(ClientError::Malformed(format!(
                        "{path} answered {} instead of a list",
                        match other {
                            Value::Object(_) => "an object",
                            _ => "something else",
                        }
                    )));
                }
            }
            match next {
                // A cursor that does not move on would loop forever.
                Some(n) if cursor.as_deref() != Some(n.as_str()) => cursor = Some(n),
                Some(_) => {
                    return Err(ClientError::Malformed(format!(
                        "{path} answered the same next cursor twice"
                    )));
                }
                None => return Ok(Value::Array(items)),
            }
        }
    }

    /// One page of a list route: its items and the cursor of the next page, if more follow.
    pub fn get_page(&self, path: &str) -> Result<(Value, Option<String>), ClientError> {
        self.exchange("GET", path, None)
    }

    /// One request: the JSON body of a 2xx answer and its next-page cursor, if any.
    fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(Value, Option<String>), ClientError> {
        let connect = |source| ClientError::Connect {
            addr: self.addr.clone(),
            source,
        };
        let mut stream = TcpStream::connect(&self.addr).map_err(connect)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(connect)?;
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\nContent-Length: {}\r\n",
            self.addr,
            payload.len()
        );
        if body.is_some() {
            req.push_str("Content-Type: application/json\r\n");
        }
        if let Some(t) = &self.token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(&payload);
        stream.write_all(req.as_bytes()).map_err(connect)?;
        let mut raw = Vec::new();
        stream
            .take(MAX_RESPONSE)
            .read_to_end(&mut raw)
            .map_err(connect)?;
        let text = String::from_utf8_lossy(&raw);
        let (head, rest) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| ClientError::Malformed("no header end".into()))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClientError::Malformed("no status code".into()))?;
        let chunked = head.lines().any(|l| {
            l.to_ascii_lowercase().starts_with("transfer-encoding:")
                && l.to_ascii_lowercase().contains("chunked")
        });
        let body_text = if chunked {
            dechunk(rest)?
        } else {
            rest.to_owned()
        };
        let value: Value = if body_text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body_text).unwrap_or(Value::String(body_text.clone()))
        };
        if (200..300).contains(&status) {
            return Ok((
                value,
                header(head, crate::service::page::NEXT_CURSOR_HEADER),
            ));
        }
        let code = value["error"]["code"]
            .as_str()
            .unwrap_or(Code::HttpError.as_str())
            .to_owned();
        let message = value["error"]["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| body_text.chars().take(200).collect());
        if status == 429 {
            let retry_after = header(head, "retry-after")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1);
            return Err(ClientError::RateLimited {
                retry_after,
                message,
            });
        }
        Err(ClientError::Api {
            status,
            code,
            message,
        })
    }
}

/// A header's value in a response head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|l| {
        let (n, value) = l.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// Percent-encoding of a query value: everything but unreserved characters (log cursors hold
/// `;` and `=`).
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn dechunk(mut rest: &str) -> Result<String, ClientError> {
    let mut out = String::new();
    loop {
        let (size_line, after) = rest
            .split_once("\r\n")
            .ok_or_else(|| ClientError::Malformed("bad chunk".into()))?;
        let size = usize::from_str_radix(size_line.trim(), 16)
            .map_err(|_| ClientError::Malformed("bad chunk size".into()))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = after
            .get(..size)
            .ok_or_else(|| ClientError::Malformed("short chunk".into()))?;
        out.push_str(chunk);
        rest = after.get(size + 2..).unwrap_or("");
    }
}
