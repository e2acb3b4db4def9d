//! A small blocking HTTP/1.1 client for the `occ` CLI (loopback or a trusted network): one
//! request per connection, JSON in and out, bounded response size. It is the [`Transport`] of
//! `clawfleet-api`'s typed client, so `occ` calls [`Api`]'s methods (one per route, built
//! from the route table) and reads their typed answers; [`Client::request`] is left for tests
//! that send what the typed client cannot.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::codes::Code;
pub use clawfleet_api::client::{Api, Page, all_pages, percent_encode};
use clawfleet_api::client::{Call, CallError, Reply, Transport};
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
    /// The request could not be encoded, or the answer is not the route's response type.
    #[error(transparent)]
    Call(#[from] CallError),
}

impl Transport for Client {
    type Error = ClientError;

    fn call(&self, call: Call) -> Result<Reply, ClientError> {
        let (body, next_cursor) =
            self.exchange(call.method.as_http(), &call.path, call.body.as_ref())?;
        Ok(Reply { body, next_cursor })
    }
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

    /// A raw request, for tests that send what the typed client ([`Api`]) cannot (a
    /// malformed body, an unknown route); returns the JSON body of a 2xx answer (Null for
    /// 204).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        self.get_page_of(method, path, body).map(|(value, _)| value)
    }

    /// A raw GET of one page of a list route: its items and the next page's cursor, if more
    /// follow (for tests of paging itself).
    pub fn get_page(&self, path: &str) -> Result<(Value, Option<String>), ClientError> {
        self.get_page_of("GET", path, None)
    }

    fn get_page_of(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(Value, Option<String>), ClientError> {
        let (text, next) = self.exchange(method, path, body)?;
        let value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((value, next))
    }

    /// One request: the body of a 2xx answer and its next-page cursor, if any.
    fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(String, Option<String>), ClientError> {
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
        if (200..300).contains(&status) {
            return Ok((
                body_text,
                header(head, clawfleet_api::routes::NEXT_CURSOR_HEADER),
            ));
        }
        Err(refusal(status, head, &body_text))
    }

    /// Opens an HTTP upgrade to `path` ([`clawfleet_api::routes::UPGRADE_PROTOCOL`]): the
    /// connection, once the coordinator answered 101, carries the stream; a refusal is the
    /// API's error like any other request's.
    pub fn upgrade(&self, path: &str) -> Result<TcpStream, ClientError> {
        let connect = |source| ClientError::Connect {
            addr: self.addr.clone(),
            source,
        };
        let mut stream = TcpStream::connect(&self.addr).map_err(connect)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(connect)?;
        let _ = stream.set_nodelay(true);
        let mut req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: {}\r\n",
            self.addr,
            clawfleet_api::routes::UPGRADE_PROTOCOL
        );
        if let Some(t) = &self.token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        req.push_str("\r\n");
        stream.write_all(req.as_bytes()).map_err(connect)?;
        // The head, byte by byte: what follows it belongs to the stream.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() > 64 * 1024 {
                return Err(ClientError::Malformed(
                    "the answer's head is over 64 KiB".into(),
                ));
            }
            match stream.read(&mut byte).map_err(connect)? {
                0 => return Err(ClientError::Malformed("no header end".into())),
                _ => head.push(byte[0]),
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClientError::Malformed("no status code".into()))?;
        if status == 101 {
            stream.set_read_timeout(None).map_err(connect)?;
            return Ok(stream);
        }
        let length: u64 = header(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = Vec::new();
        stream
            .take(length.min(MAX_RESPONSE))
            .read_to_end(&mut body)
            .map_err(connect)?;
        Err(refusal(status, &head, &String::from_utf8_lossy(&body)))
    }
}

/// The error of a non-2xx answer: its code and message from the API's error body.
fn refusal(status: u16, head: &str, body_text: &str) -> ClientError {
    let value: Value = serde_json::from_str(body_text).unwrap_or(Value::Null);
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
        return ClientError::RateLimited {
            retry_after,
            message,
        };
    }
    ClientError::Api {
        status,
        code,
        message,
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
