//! A minimal client of the gateway's WebSocket RPC on its loopback port, for the calls hostd
//! makes to a running Agent (`secrets.reload`, and reading back what the gateway holds).
//!
//! The transport is OpenClaw's (its gateway protocol documents on transport, handshake and
//! auth, shipped in the openclaw npm package, and `test-gateway/README.md`): text frames of JSON; the server opens with a `connect.challenge` event;
//! the client sends `connect` as `gateway-client`/`backend` with the managed password and
//! scope `operator.admin` (a device-less loopback backend client keeps its scopes), then
//! requests `{"type":"req","id","method","params"}` answered by `{"type":"res","id","ok",
//! "payload"|"error"}`. Only what that needs of RFC 6455 is here: one plain-TCP connection
//! to 127.0.0.1, masked client frames, fragmented and control frames from the server, and a
//! bound on every message's size. No password or payload is ever logged or put in an error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use base64ct::{Base64, Encoding};
use serde_json::{Value, json};
use thiserror::Error;

/// Largest message read from the gateway: `config.get` answers with the configuration six
/// times over (raw, parsed, resolved, ...), and a configuration may have 1 MiB.
pub const MESSAGE_MAX: usize = 8 * 1024 * 1024;
/// Largest HTTP upgrade response read.
const HEADER_MAX: usize = 16 * 1024;
/// The RPC protocol version spoken.
const PROTOCOL: u64 = 4;

/// Why an RPC call did not give an answer. No variant carries the password or a payload.
#[derive(Debug, Error)]
pub enum RpcError {
    #[error("gateway on 127.0.0.1:{port}: {detail}")]
    Io { port: u16, detail: String },
    #[error("gateway on 127.0.0.1:{port} refused the WebSocket upgrade: {status}")]
    Upgrade { port: u16, status: String },
    #[error("gateway on 127.0.0.1:{port} broke the RPC protocol: {detail}")]
    Protocol { port: u16, detail: String },
    #[error("gateway on 127.0.0.1:{port} closed the connection (close code {code})")]
    Closed { port: u16, code: u16 },
    #[error("gateway on 127.0.0.1:{port} answered {method} with {code}: {message}")]
    Refused {
        port: u16,
        method: String,
        code: String,
        message: String,
        /// The error's `details`, if any (never a secret: the gateway sends reasons only).
        details: Option<Value>,
    },
}

/// One authenticated RPC session with a gateway on the loopback interface.
pub struct GatewayRpc {
    port: u16,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    next_id: u64,
}

impl std::fmt::Debug for GatewayRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayRpc")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl GatewayRpc {
    /// Connects to `127.0.0.1:port` and authenticates with the gateway's password. Every
    /// read and write waits at most `timeout`.
    pub fn connect(port: u16, password: &str, timeout: Duration) -> Result<Self, RpcError> {
        let io = |e: std::io::Error| RpcError::Io {
            port,
            detail: e.to_string(),
        };
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        let mut rpc = Self {
            port,
            reader: BufReader::new(stream),
            writer,
            next_id: 1,
        };
        rpc.upgrade()?;
        // The server speaks first: its challenge (other events before it are skipped).
        loop {
            let m = rpc.read_json()?;
            if m["type"] == "event" && m["event"] == "connect.challenge" {
                break;
            }
        }
        let params = json!({
            "minProtocol": PROTOCOL,
            "maxProtocol": PROTOCOL,
            "client": {
                "id": "gateway-client",
                "version": env!("CARGO_PKG_VERSION"),
                "platform": "linux",
                "mode": "backend",
            },
            "role": "operator",
            "scopes": ["operator.admin"],
            "auth": {"password": password},
        });
        rpc.request("connect", params)?;
        Ok(rpc)
    }

    /// Sends one request and returns its payload (`null` when it has none).
    pub fn request(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id.to_string();
        self.next_id += 1;
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        let text = zeroize::Zeroizing::new(frame.to_string());
        drop(frame);
        self.write_frame(0x1, text.as_bytes())?;
        drop(text);
        loop {
            let mut m = self.read_json()?;
            if m["type"] != "res" || m["id"] != id.as_str() {
                continue;
            }
            if m["ok"] == true {
                return Ok(m["payload"].take());
            }
            let error = &m["error"];
            return Err(RpcError::Refused {
                port: self.port,
                method: method.to_owned(),
                code: error["code"].as_str().unwrap_or("UNKNOWN").to_owned(),
                message: error["message"].as_str().unwrap_or("").to_owned(),
                details: error.get("details").cloned(),
            });
        }
    }

    fn io(&self, e: std::io::Error) -> RpcError {
        RpcError::Io {
            port: self.port,
            detail: e.to_string(),
        }
    }

    fn protocol(&self, detail: impl Into<String>) -> RpcError {
        RpcError::Protocol {
            port: self.port,
            detail: detail.into(),
        }
    }

    /// The HTTP/1.1 upgrade to a WebSocket.
    fn upgrade(&mut self) -> Result<(), RpcError> {
        let mut nonce = [0u8; 16];
        clawfleet_protocol::random::fill(&mut nonce).map_err(|e| self.protocol(e.to_string()))?;
        let request = format!(
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {}\r\nSec-WebSocket-Version: 13\r\n\r\n",
            self.port,
            Base64::encode_string(&nonce)
        );
        self.writer
            .write_all(request.as_bytes())
            .map_err(|e| self.io(e))?;
        let mut status = String::new();
        let mut read = 0usize;
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).map_err(|e| self.io(e))?;
            read += n;
            if n == 0 || read > HEADER_MAX {
                return Err(self.protocol("the upgrade response ended or grew too long"));
            }
            if status.is_empty() {
                status = line.trim_end().to_owned();
            } else if line == "\r\n" || line == "\n" {
                break;
            }
        }
        if status.split_whitespace().nth(1) != Some("101") {
            return Err(RpcError::Upgrade {
                port: self.port,
                status,
            });
        }
        Ok(())
    }

    /// One masked frame from the client.
    fn write_frame(&mut self, opcode: u8, payload: &[u8]) -> Result<(), RpcError> {
        let mut mask = [0u8; 4];
        clawfleet_protocol::random::fill(&mut mask).map_err(|e| self.protocol(e.to_string()))?;
        let out = clawfleet_protocol::websocket::client_frame(opcode, payload, mask);
        self.writer.write_all(&out).map_err(|e| self.io(e))
    }

    /// The next whole text message, parsed; pings are answered, pongs skipped.
    fn read_json(&mut self) -> Result<Value, RpcError> {
        let mut message: Vec<u8> = Vec::new();
        let mut in_message = false;
        loop {
            let mut head = [0u8; 2];
            self.reader.read_exact(&mut head).map_err(|e| self.io(e))?;
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0f;
            if head[1] & 0x80 != 0 {
                return Err(self.protocol("a server frame is masked"));
            }
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.reader.read_exact(&mut b).map_err(|e| self.io(e))?;
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.reader.read_exact(&mut b).map_err(|e| self.io(e))?;
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            let len = usize::try_from(len)
                .ok()
                .filter(|n| message.len() + n <= MESSAGE_MAX)
                .ok_or_else(|| {
                    self.protocol(format!("a message is longer than {MESSAGE_MAX} bytes"))
                })?;
            let mut payload = vec![0u8; len];
            self.reader
                .read_exact(&mut payload)
                .map_err(|e| self.io(e))?;
            match opcode {
                0x8 => {
                    let code = payload
                        .get(..2)
                        .map(|b| u16::from_be_bytes([b[0], b[1]]))
                        .unwrap_or(1005);
                    return Err(RpcError::Closed {
                        port: self.port,
                        code,
                    });
                }
                0x9 => self.write_frame(0xA, &payload)?,
                0xA => {}
                0x1 if !in_message => {
                    message = payload;
                    in_message = true;
                }
                0x0 if in_message => message.extend_from_slice(&payload),
                other => {
                    return Err(self.protocol(format!("unexpected frame opcode {other:#x}")));
                }
            }
            if in_message && fin && opcode != 0x9 && opcode != 0xA {
                return serde_json::from_slice(&message)
                    .map_err(|e| self.protocol(format!("a message is not JSON: {e}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::net::TcpListener;

    /// A server frame (unmasked).
    fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => out.push(n as u8),
            n => {
                out.push(126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        out.extend_from_slice(payload);
        out
    }

    /// Reads one masked client frame's text.
    fn client_text(r: &mut impl Read) -> (u8, Value) {
        let mut head = [0u8; 2];
        r.read_exact(&mut head).unwrap();
        assert_eq!(head[1] & 0x80, 0x80, "client frames are masked");
        let len = match head[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                r.read_exact(&mut b).unwrap();
                usize::from(u16::from_be_bytes(b))
            }
            n => usize::from(n),
        };
        let mut mask = [0u8; 4];
        r.read_exact(&mut mask).unwrap();
        let mut p = vec![0u8; len];
        r.read_exact(&mut p).unwrap();
        for (i, b) in p.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        (
            head[0] & 0x0f,
            serde_json::from_slice(&p).unwrap_or(Value::Null),
        )
    }

    /// A gateway that accepts `password`, pings once, fragments one answer, and answers
    /// `secrets.reload` with `reload` (ok payload or error object).
    fn serve(password: &'static str, reload: Result<Value, Value>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.starts_with("GET / HTTP/1.1"), "{line}");
            loop {
                line.clear();
                r.read_line(&mut line).unwrap();
                if line == "\r\n" {
                    break;
                }
            }
            w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n").unwrap();
            w.write_all(&frame(0x1, true, br#"{"type":"event","event":"tick"}"#))
                .unwrap();
            w.write_all(&frame(
                0x1,
                true,
                br#"{"type":"event","event":"connect.challenge","payload":{"nonce":"n","ts":1}}"#,
            ))
            .unwrap();
            let (_, connect) = client_text(&mut r);
            assert_eq!(connect["method"], "connect");
            assert_eq!(connect["params"]["client"]["id"], "gateway-client");
            assert_eq!(connect["params"]["client"]["mode"], "backend");
            assert_eq!(connect["params"]["scopes"], json!(["operator.admin"]));
            if connect["params"]["auth"]["password"] != password {
                let res = json!({"type":"res","id":connect["id"],"ok":false,"error":{"code":"UNAUTHORIZED","message":"bad password"}});
                w.write_all(&frame(0x1, true, res.to_string().as_bytes()))
                    .unwrap();
                return;
            }
            // A long hello, in two fragments, after a ping.
            w.write_all(&frame(0x9, true, b"p")).unwrap();
            let hello = json!({"type":"res","id":connect["id"],"ok":true,"payload":{"type":"hello-ok","pad":"x".repeat(300)}}).to_string();
            let (a, b) = hello.as_bytes().split_at(100);
            w.write_all(&frame(0x1, false, a)).unwrap();
            w.write_all(&frame(0x0, true, b)).unwrap();
            let (op, _) = client_text(&mut r);
            assert_eq!(op, 0xA, "the ping is answered with a pong");
            let (_, req) = client_text(&mut r);
            assert_eq!(req["method"], "secrets.reload");
            let res = match &reload {
                Ok(p) => json!({"type":"res","id":req["id"],"ok":true,"payload":p}),
                Err(e) => json!({"type":"res","id":req["id"],"ok":false,"error":e}),
            };
            w.write_all(&frame(0x1, true, res.to_string().as_bytes()))
                .unwrap();
        });
        port
    }

    #[test]
    fn connects_with_the_password_and_calls_a_method() {
        let port = serve("pw-1", Ok(json!({"ok": true, "warningCount": 0})));
        let mut rpc = GatewayRpc::connect(port, "pw-1", Duration::from_secs(5)).unwrap();
        let answer = rpc.request("secrets.reload", json!({})).unwrap();
        assert_eq!(answer, json!({"ok": true, "warningCount": 0}));
    }

    #[test]
    fn a_refusal_carries_its_code_and_never_the_password() {
        let port = serve(
            "pw-1",
            Err(
                json!({"code":"UNAVAILABLE","message":"secrets.reload failed","details":{"reason":"not readable"}}),
            ),
        );
        let mut rpc = GatewayRpc::connect(port, "pw-1", Duration::from_secs(5)).unwrap();
        let e = rpc.request("secrets.reload", json!({})).unwrap_err();
        assert!(
            matches!(&e, RpcError::Refused { code, details: Some(_), .. } if code == "UNAVAILABLE"),
            "{e:?}"
        );
        let port = serve("pw-1", Ok(json!({})));
        let e = GatewayRpc::connect(port, "wrong-pw", Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(&e, RpcError::Refused { code, .. } if code == "UNAUTHORIZED"),
            "{e:?}"
        );
        assert!(!format!("{e} {e:?}").contains("wrong-pw"), "{e:?}");
    }

    #[test]
    fn a_port_without_a_gateway_is_an_io_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let e = GatewayRpc::connect(port, "pw", Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, RpcError::Io { .. }), "{e:?}");
    }
}
