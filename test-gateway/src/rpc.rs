//! The gateway's WebSocket RPC, shaped like OpenClaw's protocol 4 (`connect.challenge` event,
//! `connect` request answered by `hello-ok`, then `{type:"req"}` / `{type:"res"}` frames), with
//! the methods the test gateway implements:
//!
//! - `secrets.reload` (scope `operator.admin`): `{ok: true, warningCount: 0}`, or the error
//!   `UNAVAILABLE` "secrets.reload failed" with the reason in `details.reason` (OpenClaw only
//!   logs the reason); the last good snapshot stays active.
//! - `x-clawfleet-test.secrets.status` (scope `operator.read`): the fingerprints held, as
//!   `GET /secrets` reports them.
//!
//! Device identity is not implemented: like OpenClaw, a connection without `device` keeps the
//! scopes it asks for only as `gateway-client`/`backend` or `cli`/`cli` (loopback, shared
//! password); any other device-less client gets no scopes.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};

use crate::secrets::Runtime;
use crate::ws::{self, Message};

/// OpenClaw's gateway protocol version (`PROTOCOL_VERSION` in `packages/gateway-protocol`).
pub const PROTOCOL_VERSION: u64 = 4;
pub const METHOD_RELOAD: &str = "secrets.reload";
pub const METHOD_STATUS: &str = "x-clawfleet-test.secrets.status";
/// Every method this gateway answers (reported in `hello-ok.features.methods`).
pub const METHODS: [&str; 2] = [METHOD_RELOAD, METHOD_STATUS];
/// The configuration path whose SecretRef, when present, is the gateway password.
pub const PASSWORD_PATH: &str = "gateway.auth.password";
/// Frames before `connect` succeeds (OpenClaw's `MAX_PREAUTH_PAYLOAD_BYTES`).
const MAX_PREAUTH_BYTES: usize = 64 * 1024;
/// Frames after it (reported as `policy.maxPayload`).
const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// How long a client has to send `connect`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Device-less clients whose requested scopes survive (OpenClaw's local backend and CLI paths).
const SCOPE_KEEPING_CLIENTS: [(&str, &str); 2] = [("gateway-client", "backend"), ("cli", "cli")];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connection's write side, shared by its session and [`Connections::close_all`]; each
/// `write` call is one whole frame under the lock.
#[derive(Debug, Clone)]
pub struct Writer(Arc<Mutex<TcpStream>>);

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        lock(&self.0).flush()
    }
}

/// The open WebSocket sessions, so a change of the gateway password can end them all, as
/// OpenClaw does (close code 4001 "gateway auth changed").
#[derive(Debug, Default)]
pub struct Connections {
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, Writer>>,
}

impl Connections {
    fn register(&self, stream: TcpStream) -> (u64, Writer) {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let writer = Writer(Arc::new(Mutex::new(stream)));
        lock(&self.open).insert(id, writer.clone());
        (id, writer)
    }

    fn remove(&self, id: u64) {
        lock(&self.open).remove(&id);
    }

    /// Sends a close frame to every session and shuts its socket, which ends its thread.
    pub fn close_all(&self, code: u16, reason: &str) -> usize {
        let open: Vec<Writer> = lock(&self.open).values().cloned().collect();
        for mut w in open.iter().cloned() {
            // A session that is already gone needs no close frame.
            let _ = ws::write_close(&mut w, code, reason);
            let _ = lock(&w.0).shutdown(Shutdown::Both);
        }
        open.len()
    }
}

/// What a session needs from the gateway.
#[derive(Debug)]
pub struct Context<'a> {
    pub secrets: &'a Runtime,
    pub connections: &'a Connections,
    /// `OPENCLAW_GATEWAY_PASSWORD`, used when `gateway.auth.password` is not a SecretRef.
    pub env_password: Option<&'a str>,
    /// `gateway.auth.mode` is `"none"`.
    pub auth_none: bool,
    pub label: Option<&'a str>,
    /// The configuration file and what was applied of it (`config.get`).
    pub live: &'a crate::live::LiveConfig,
    /// The `secretLogLines` switch, written after every successful reload.
    pub secret_log_lines: &'a [String],
}

impl Context<'_> {
    fn expected_password(&self) -> Option<String> {
        if self.auth_none {
            return None;
        }
        self.secrets
            .value_at(PASSWORD_PATH)
            .or_else(|| self.env_password.map(str::to_owned))
    }
}

fn error_shape(code: &str, message: &str, details: Option<Value>) -> Value {
    let mut e = json!({"code": code, "message": message});
    if let (Some(d), Value::Object(map)) = (details, &mut e) {
        map.insert("details".into(), d);
    }
    e
}

fn send(w: &Writer, frame: &Value) -> std::io::Result<()> {
    let mut w = w.clone();
    ws::write_frame(&mut w, ws::OP_TEXT, frame.to_string().as_bytes())
}

fn respond_ok(stream: &Writer, id: &Value, payload: Value) -> std::io::Result<()> {
    send(
        stream,
        &json!({"type": "res", "id": id, "ok": true, "payload": payload}),
    )
}

fn respond_err(stream: &Writer, id: &Value, error: Value) -> std::io::Result<()> {
    send(
        stream,
        &json!({"type": "res", "id": id, "ok": false, "error": error}),
    )
}

fn nonce() -> String {
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if read.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = t.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The scopes a connection holds.
#[derive(Debug, Default)]
struct Grant {
    scopes: Vec<String>,
}

impl Grant {
    /// `operator.admin` satisfies everything; `operator.write` satisfies `operator.read`.
    fn allows(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| {
            s == scope
                || s == "operator.admin"
                || (scope == "operator.read" && s == "operator.write")
        })
    }
}

/// Checks a `connect` request; `Err` carries the error object to send before closing.
fn accept_connect(params: &Value, ctx: &Context<'_>) -> Result<Grant, Value> {
    let invalid = |m: &str| error_shape("INVALID_REQUEST", m, None);
    let Value::Object(p) = params else {
        return Err(invalid("invalid connect params: params must be an object"));
    };
    let min = p.get("minProtocol").and_then(Value::as_u64);
    let max = p.get("maxProtocol").and_then(Value::as_u64);
    match (min, max) {
        (Some(min), Some(max)) if min <= PROTOCOL_VERSION && PROTOCOL_VERSION <= max => {}
        (Some(_), Some(_)) => {
            return Err(error_shape(
                "INVALID_REQUEST",
                "protocol mismatch",
                Some(json!({"expectedProtocol": PROTOCOL_VERSION})),
            ));
        }
        _ => {
            return Err(invalid(
                "invalid connect params: minProtocol and maxProtocol must be integers",
            ));
        }
    }
    let client = p.get("client").and_then(Value::as_object);
    let field = |k: &str| {
        client
            .and_then(|c| c.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let (Some(client_id), Some(mode), Some(_), Some(_)) = (
        field("id"),
        field("mode"),
        field("version"),
        field("platform"),
    ) else {
        return Err(invalid(
            "invalid connect params: client.id, client.version, client.platform and client.mode \
             must be non-empty strings",
        ));
    };
    if p.contains_key("device") {
        return Err(invalid(
            "the clawfleet test gateway does not implement device identity: connect without \
             device as client gateway-client/backend",
        ));
    }
    let role = p.get("role").and_then(Value::as_str).unwrap_or("operator");
    if role != "operator" {
        return Err(invalid(
            "the clawfleet test gateway accepts only role operator",
        ));
    }
    let requested: Vec<String> = match p.get("scopes") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("invalid connect params: scopes must be strings"))?,
        Some(_) => return Err(invalid("invalid connect params: scopes must be an array")),
    };
    if let Some(expected) = ctx.expected_password() {
        let auth = p.get("auth");
        let given = auth
            .and_then(|a| a.get("password"))
            .or_else(|| auth.and_then(|a| a.get("token")))
            .and_then(Value::as_str);
        match given {
            None => {
                return Err(error_shape(
                    "INVALID_REQUEST",
                    "unauthorized: gateway password missing",
                    Some(json!({"code": "AUTH_PASSWORD_MISSING"})),
                ));
            }
            Some(g) if g != expected => {
                return Err(error_shape(
                    "INVALID_REQUEST",
                    "unauthorized: gateway password mismatch",
                    Some(json!({"code": "AUTH_PASSWORD_MISMATCH"})),
                ));
            }
            Some(_) => {}
        }
    }
    let keeps = SCOPE_KEEPING_CLIENTS.contains(&(client_id, mode));
    Ok(Grant {
        scopes: if keeps { requested } else { Vec::new() },
    })
}

fn hello_ok(grant: &Grant, ctx: &Context<'_>) -> Value {
    json!({
        "type": "hello-ok",
        "protocol": PROTOCOL_VERSION,
        "server": {
            "version": concat!("clawfleet-test-gateway/", env!("CARGO_PKG_VERSION")),
            "connId": nonce(),
        },
        "features": {"methods": METHODS, "events": ["connect.challenge"]},
        "snapshot": {"label": ctx.label},
        "auth": {"role": "operator", "scopes": grant.scopes},
        "policy": {
            "maxPayload": MAX_PAYLOAD_BYTES,
            "maxBufferedBytes": MAX_PAYLOAD_BYTES,
            "tickIntervalMs": 0,
        },
    })
}

fn missing_scope(scope: &str) -> Value {
    error_shape(
        "FORBIDDEN",
        &format!("missing scope: {scope}"),
        Some(json!({"code": "MISSING_SCOPE", "missingScope": scope, "requiredScopes": [scope]})),
    )
}

/// What to do after answering a request.
#[derive(Debug, PartialEq, Eq)]
enum After {
    Nothing,
    /// The gateway password changed: every session ends (OpenClaw: 4001 "gateway auth changed").
    CloseAll,
}

/// Answers one request after `connect`.
fn dispatch(method: &str, grant: &Grant, ctx: &Context<'_>) -> (Result<Value, Value>, After) {
    if method == METHOD_RELOAD && grant.allows("operator.admin") {
        let before = ctx.secrets.value_at(PASSWORD_PATH);
        let result = answer(method, grant, ctx);
        let changed = result.is_ok() && ctx.secrets.value_at(PASSWORD_PATH) != before;
        return (
            result,
            if changed {
                After::CloseAll
            } else {
                After::Nothing
            },
        );
    }
    (answer(method, grant, ctx), After::Nothing)
}

fn answer(method: &str, grant: &Grant, ctx: &Context<'_>) -> Result<Value, Value> {
    match method {
        METHOD_RELOAD => {
            if !grant.allows("operator.admin") {
                return Err(missing_scope("operator.admin"));
            }
            match ctx.secrets.reload() {
                Ok(snapshot) => {
                    eprintln!(
                        "clawfleet-test-gateway: secrets reloaded, generation {}",
                        snapshot.generation
                    );
                    crate::write_secret_log_lines(ctx.secrets, ctx.secret_log_lines);
                    Ok(json!({"ok": true, "warningCount": 0}))
                }
                Err(e) => {
                    eprintln!("clawfleet-test-gateway: secrets.reload failed: {e}");
                    Err(error_shape(
                        "UNAVAILABLE",
                        "secrets.reload failed",
                        Some(json!({"reason": e.to_string()})),
                    ))
                }
            }
        }
        METHOD_STATUS => {
            if !grant.allows("operator.read") {
                return Err(missing_scope("operator.read"));
            }
            Ok(ctx.secrets.status_json())
        }
        "config.get" => {
            if !grant.allows("operator.read") {
                return Err(missing_scope("operator.read"));
            }
            Ok(ctx.live.get())
        }
        other => Err(error_shape(
            "INVALID_REQUEST",
            &format!("unknown method: {other}"),
            None,
        )),
    }
}

/// Parses a request frame into `(id, method, params)`.
fn parse_request(text: &str) -> Result<(Value, String, Value), Value> {
    let invalid = |m: &str| error_shape("INVALID_REQUEST", m, None);
    let frame: Value =
        serde_json::from_str(text).map_err(|_| invalid("invalid frame: not JSON"))?;
    if frame.get("type").and_then(Value::as_str) != Some("req") {
        return Err(invalid("invalid frame: type must be \"req\""));
    }
    let id = frame
        .get("id")
        .filter(|id| id.as_str().is_some_and(|s| !s.is_empty()))
        .cloned()
        .ok_or_else(|| invalid("invalid frame: id must be a non-empty string"))?;
    let method = frame
        .get("method")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| invalid("invalid frame: method must be a non-empty string"))?;
    let params = frame.get("params").cloned().unwrap_or(Value::Null);
    Ok((id, method.to_owned(), params))
}

/// Runs one WebSocket session after the 101 response: the challenge, `connect`, then requests
/// until the client closes. I/O errors end the session quietly (the client went away).
pub fn serve(reader: &mut impl BufRead, stream: &TcpStream, ctx: &Context<'_>) {
    let Ok(write_side) = stream.try_clone() else {
        return;
    };
    let (id, writer) = ctx.connections.register(write_side);
    let _ = run(reader, stream, &writer, ctx);
    ctx.connections.remove(id);
}

fn run(
    reader: &mut impl BufRead,
    stream: &TcpStream,
    writer: &Writer,
    ctx: &Context<'_>,
) -> std::io::Result<()> {
    let mut w = writer.clone();
    let stream_for_timeouts = stream;
    let stream = writer;
    send(
        stream,
        &json!({"type": "event", "event": "connect.challenge",
                "payload": {"nonce": nonce(), "ts": now_ms()}}),
    )?;
    stream_for_timeouts.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let Message::Text(first) = ws::read_message(reader, &mut w, MAX_PREAUTH_BYTES)? else {
        return Ok(());
    };
    let grant = match parse_request(&first) {
        Ok((id, method, params)) if method == "connect" => match accept_connect(&params, ctx) {
            Ok(grant) => {
                respond_ok(stream, &id, hello_ok(&grant, ctx))?;
                grant
            }
            Err(error) => {
                respond_err(stream, &id, error)?;
                return ws::write_close(&mut w, 1008, "connect failed");
            }
        },
        Ok((id, _, _)) => {
            respond_err(
                stream,
                &id,
                error_shape(
                    "INVALID_REQUEST",
                    "invalid handshake: first request must be connect",
                    None,
                ),
            )?;
            return ws::write_close(&mut w, 1008, "invalid handshake");
        }
        Err(_) => return ws::write_close(&mut w, 1008, "invalid handshake"),
    };
    // Long-lived from here: no read timeout, the client decides when to leave.
    stream_for_timeouts.set_read_timeout(None)?;
    loop {
        let Message::Text(text) = ws::read_message(reader, &mut w, MAX_PAYLOAD_BYTES)? else {
            return Ok(());
        };
        match parse_request(&text) {
            Ok((id, method, _params)) => {
                let (result, after) = dispatch(&method, &grant, ctx);
                match result {
                    Ok(payload) => respond_ok(stream, &id, payload)?,
                    Err(error) => respond_err(stream, &id, error)?,
                }
                if after == After::CloseAll {
                    let n = ctx.connections.close_all(4001, "gateway auth changed");
                    eprintln!(
                        "clawfleet-test-gateway: gateway auth changed, closed {n} connection(s)"
                    );
                }
            }
            Err(error) => respond_err(stream, &Value::Null, error)?,
        }
        w.flush()?;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn runtime() -> Runtime {
        Runtime::start(crate::secrets::Spec::default(), 0, |_| None).unwrap()
    }

    fn connect(params: Value, ctx: &Context<'_>) -> Result<Grant, Value> {
        accept_connect(&params, ctx)
    }

    fn params(id: &str, mode: &str, auth: Value) -> Value {
        json!({"minProtocol": 4, "maxProtocol": 4,
               "client": {"id": id, "version": "1", "platform": "linux", "mode": mode},
               "role": "operator", "scopes": ["operator.admin"], "auth": auth})
    }

    #[test]
    fn connect_checks_protocol_client_and_password() {
        let rt = runtime();
        let conns = Connections::default();
        let live = crate::live::LiveConfig::new("/nonexistent".into(), b"{}".to_vec());
        let ctx = Context {
            secrets: &rt,
            connections: &conns,
            env_password: Some("pw"),
            auth_none: false,
            label: None,
            live: &live,
            secret_log_lines: &[],
        };
        let ok = connect(
            params("gateway-client", "backend", json!({"password": "pw"})),
            &ctx,
        )
        .unwrap();
        assert!(ok.allows("operator.admin") && ok.allows("operator.read"));
        let e = connect(
            params("gateway-client", "backend", json!({"password": "no"})),
            &ctx,
        )
        .unwrap_err();
        assert_eq!(e["details"]["code"], "AUTH_PASSWORD_MISMATCH");
        let e = connect(params("gateway-client", "backend", json!({})), &ctx).unwrap_err();
        assert_eq!(e["details"]["code"], "AUTH_PASSWORD_MISSING");
        // The token field carries the shared secret too.
        assert!(connect(params("cli", "cli", json!({"token": "pw"})), &ctx).is_ok());
        // Other device-less clients lose their scopes.
        let other = connect(
            params("webchat", "webchat", json!({"password": "pw"})),
            &ctx,
        )
        .unwrap();
        assert!(!other.allows("operator.read"));
        let mut old = params("cli", "cli", json!({"password": "pw"}));
        old["maxProtocol"] = json!(3);
        old["minProtocol"] = json!(3);
        assert_eq!(
            connect(old, &ctx).unwrap_err()["message"],
            "protocol mismatch"
        );
        let mut device = params("cli", "cli", json!({"password": "pw"}));
        device["device"] = json!({"id": "d"});
        assert!(connect(device, &ctx).is_err());
        let none = Context {
            secrets: &rt,
            connections: &conns,
            env_password: Some("pw"),
            auth_none: true,
            label: None,
            live: &live,
            secret_log_lines: &[],
        };
        assert!(connect(params("cli", "cli", json!({})), &none).is_ok());
    }

    #[test]
    fn methods_need_their_scope() {
        let rt = runtime();
        let conns = Connections::default();
        let live = crate::live::LiveConfig::new("/nonexistent".into(), b"{}".to_vec());
        let ctx = Context {
            secrets: &rt,
            connections: &conns,
            env_password: None,
            auth_none: false,
            label: None,
            live: &live,
            secret_log_lines: &[],
        };
        let read = Grant {
            scopes: vec!["operator.read".into()],
        };
        let e = answer(METHOD_RELOAD, &read, &ctx).unwrap_err();
        assert_eq!(e["code"], "FORBIDDEN");
        assert_eq!(e["details"]["missingScope"], "operator.admin");
        assert!(answer(METHOD_STATUS, &read, &ctx).is_ok());
        let admin = Grant {
            scopes: vec!["operator.admin".into()],
        };
        assert_eq!(
            answer(METHOD_RELOAD, &admin, &ctx).unwrap(),
            json!({"ok": true, "warningCount": 0})
        );
        assert!(
            answer("nope", &admin, &ctx).unwrap_err()["message"]
                .as_str()
                .unwrap()
                .contains("unknown method: nope")
        );
    }
}
