//! The gateway's WebSocket RPC over any byte stream (here, [`crate::GatewayStream`]: the
//! API server's port-forward into the Pod), for the calls the backend makes to a running
//! gateway: `secrets.reload` and reading back what it holds (`secrets.resolve`).
//!
//! The same protocol as hostd's loopback client (`hostd/src/gateway_rpc.rs`, which is
//! synchronous over a `TcpStream` and stays out of this crate's dependencies): text frames of
//! JSON; the server opens with a `connect.challenge` event; the client sends `connect` as
//! `gateway-client`/`backend` with the managed password and scope `operator.admin`, then
//! requests `{"type":"req","id","method","params"}` answered by `{"type":"res","id","ok",
//! "payload"|"error"}`. Masked client frames, fragmented and control frames from the server, a
//! bound on every message. No password or payload is ever logged or put in an error.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use zeroize::Zeroizing;

/// Largest message read from the gateway.
pub const MESSAGE_MAX: usize = 1024 * 1024;
/// Largest HTTP upgrade response read.
const HEADER_MAX: usize = 16 * 1024;
/// The RPC protocol version spoken.
const PROTOCOL: u64 = 4;

/// Why an RPC call did not give an answer. No variant carries the password or a payload.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("the gateway stream failed: {0}")]
    Io(String),
    #[error("no answer from the gateway within {} ms", .0.as_millis())]
    TimedOut(Duration),
    #[error("the gateway refused the WebSocket upgrade: {0}")]
    Upgrade(String),
    #[error("the gateway broke the RPC protocol: {0}")]
    Protocol(String),
    #[error("the gateway closed the connection (close code {0})")]
    Closed(u16),
    #[error("the gateway answered {method} with {code}: {message}")]
    Refused {
        method: String,
        code: String,
        message: String,
        /// The error's `details`, if any (reasons only, never a secret).
        details: Option<Value>,
    },
}

/// One authenticated RPC session.
pub struct GatewayRpc<S> {
    io: BufReader<S>,
    next_id: u64,
    timeout: Duration,
}

impl<S> std::fmt::Debug for GatewayRpc<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayRpc").finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> GatewayRpc<S> {
    /// Upgrades `stream` to a WebSocket and authenticates with the gateway's password. Each
    /// step waits at most `timeout`.
    pub async fn connect(stream: S, password: &str, timeout: Duration) -> Result<Self, RpcError> {
        let mut rpc = Self {
            io: BufReader::new(stream),
            next_id: 1,
            timeout,
        };
        rpc.upgrade().await?;
        loop {
            let m = rpc.read_json().await?;
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
        rpc.request("connect", params).await?;
        Ok(rpc)
    }

    /// Sends one request and returns its payload (`null` when it has none).
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id.to_string();
        self.next_id += 1;
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        let text = Zeroizing::new(frame.to_string());
        drop(frame);
        self.write_frame(0x1, text.as_bytes()).await?;
        drop(text);
        loop {
            let mut m = self.read_json().await?;
            if m["type"] != "res" || m["id"] != id.as_str() {
                continue;
            }
            if m["ok"] == true {
                return Ok(m["payload"].take());
            }
            let error = &m["error"];
            return Err(RpcError::Refused {
                method: method.to_owned(),
                code: error["code"].as_str().unwrap_or("UNKNOWN").to_owned(),
                message: error["message"].as_str().unwrap_or("").to_owned(),
                details: error.get("details").cloned(),
            });
        }
    }

    async fn timed<T>(
        &mut self,
        f: impl AsyncFnOnce(&mut BufReader<S>) -> std::io::Result<T>,
    ) -> Result<T, RpcError> {
        let limit = self.timeout;
        match tokio::time::timeout(limit, f(&mut self.io)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(RpcError::Io(e.to_string())),
            Err(_) => Err(RpcError::TimedOut(limit)),
        }
    }

    async fn upgrade(&mut self) -> Result<(), RpcError> {
        let mut nonce = [0u8; 16];
        clawfleet_protocol::random::fill(&mut nonce)
            .map_err(|e| RpcError::Protocol(e.to_string()))?;
        use base64::Engine as _;
        let request = format!(
            "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {}\r\nSec-WebSocket-Version: 13\r\n\r\n",
            base64::engine::general_purpose::STANDARD.encode(nonce)
        );
        self.timed(async |io| {
            io.get_mut().write_all(request.as_bytes()).await?;
            io.get_mut().flush().await
        })
        .await?;
        let head = self
            .timed(async |io| {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") && head.len() <= HEADER_MAX {
                    head.push(io.read_u8().await?);
                }
                Ok(head)
            })
            .await?;
        if !head.ends_with(b"\r\n\r\n") {
            return Err(RpcError::Protocol(
                "the upgrade response grew too long".into(),
            ));
        }
        let text = String::from_utf8_lossy(&head);
        let status = text.lines().next().unwrap_or("").to_owned();
        if status.split_whitespace().nth(1) != Some("101") {
            return Err(RpcError::Upgrade(status));
        }
        Ok(())
    }

    /// One masked frame from the client.
    async fn write_frame(&mut self, opcode: u8, payload: &[u8]) -> Result<(), RpcError> {
        let mut mask = [0u8; 4];
        clawfleet_protocol::random::fill(&mut mask)
            .map_err(|e| RpcError::Protocol(e.to_string()))?;
        let out = clawfleet_protocol::websocket::client_frame(opcode, payload, mask);
        self.timed(async |io| {
            io.get_mut().write_all(&out).await?;
            io.get_mut().flush().await
        })
        .await
    }

    /// One frame from the server: (fin, opcode, payload), at most what `room` allows.
    async fn read_frame(&mut self, room: usize) -> Result<(bool, u8, Vec<u8>), RpcError> {
        let (fin, opcode, masked, len) = self
            .timed(async |io| {
                let mut head = [0u8; 2];
                io.read_exact(&mut head).await?;
                let len = match head[1] & 0x7f {
                    126 => u64::from(io.read_u16().await?),
                    127 => io.read_u64().await?,
                    n => u64::from(n),
                };
                Ok((
                    head[0] & 0x80 != 0,
                    head[0] & 0x0f,
                    head[1] & 0x80 != 0,
                    len,
                ))
            })
            .await?;
        if masked {
            return Err(RpcError::Protocol("a server frame is masked".into()));
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|n| *n <= room)
            .ok_or_else(|| {
                RpcError::Protocol(format!("a message is longer than {MESSAGE_MAX} bytes"))
            })?;
        let payload = self
            .timed(async |io| {
                let mut payload = vec![0u8; len];
                io.read_exact(&mut payload).await?;
                Ok(payload)
            })
            .await?;
        Ok((fin, opcode, payload))
    }

    /// The next whole text message, parsed; pings are answered, pongs skipped.
    async fn read_json(&mut self) -> Result<Value, RpcError> {
        let mut message: Vec<u8> = Vec::new();
        let mut in_message = false;
        loop {
            let (fin, opcode, payload) = self.read_frame(MESSAGE_MAX - message.len()).await?;
            match opcode {
                0x8 => {
                    let code = payload
                        .get(..2)
                        .map(|b| u16::from_be_bytes([b[0], b[1]]))
                        .unwrap_or(1005);
                    return Err(RpcError::Closed(code));
                }
                0x9 => {
                    self.write_frame(0xA, &payload).await?;
                    continue;
                }
                0xA => continue,
                0x1 if !in_message => {
                    message = payload;
                    in_message = true;
                }
                0x0 if in_message => message.extend_from_slice(&payload),
                other => {
                    return Err(RpcError::Protocol(format!(
                        "unexpected frame opcode {other:#x}"
                    )));
                }
            }
            if fin {
                return serde_json::from_slice(&message)
                    .map_err(|e| RpcError::Protocol(format!("a message is not JSON: {e}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A scripted gateway on the other end of a duplex pipe: the upgrade, the challenge, then
    /// answers `connect` and one method.
    async fn serve(mut s: tokio::io::DuplexStream, password: &'static str, answer: Value) {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(s.read_u8().await.unwrap());
        }
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n").await.unwrap();
        let send = |v: Value| {
            let p = v.to_string().into_bytes();
            let mut f = vec![0x81u8];
            if p.len() < 126 {
                f.push(p.len() as u8);
            } else {
                f.push(126);
                f.extend_from_slice(&(p.len() as u16).to_be_bytes());
            }
            f.extend(p);
            f
        };
        s.write_all(&send(
            json!({"type":"event","event":"connect.challenge","payload":{"nonce":"n"}}),
        ))
        .await
        .unwrap();
        for _ in 0..2 {
            let mut h = [0u8; 2];
            s.read_exact(&mut h).await.unwrap();
            assert_eq!(h[1] & 0x80, 0x80, "client frames are masked");
            let len = match h[1] & 0x7f {
                126 => usize::from(s.read_u16().await.unwrap()),
                n => usize::from(n),
            };
            let mut mask = [0u8; 4];
            s.read_exact(&mut mask).await.unwrap();
            let mut p = vec![0u8; len];
            s.read_exact(&mut p).await.unwrap();
            p.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b ^= mask[i % 4]);
            let req: Value = serde_json::from_slice(&p).unwrap();
            let res = if req["method"] == "connect" {
                assert_eq!(req["params"]["auth"]["password"], password);
                json!({"type":"res","id":req["id"],"ok":true,"payload":{"type":"hello-ok"}})
            } else {
                let mut a = answer.clone();
                a["id"] = req["id"].clone();
                a
            };
            // A ping first: the client must answer it and keep waiting.
            s.write_all(&[0x89, 1, b'p']).await.unwrap();
            s.write_all(&send(res)).await.unwrap();
            // The pong: header, mask, one byte.
            let mut pong = [0u8; 7];
            s.read_exact(&mut pong).await.unwrap();
            assert_eq!(pong[..2], [0x8A, 0x81]);
        }
    }

    #[tokio::test]
    async fn connects_and_calls_a_method_over_any_stream() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve(
            b,
            "pw",
            json!({"type":"res","ok":true,"payload":{"ok":true,"warningCount":0}}),
        ));
        let mut rpc = GatewayRpc::connect(a, "pw", Duration::from_secs(5))
            .await
            .unwrap();
        let out = rpc.request("secrets.reload", json!({})).await.unwrap();
        assert_eq!(out["ok"], true);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_refusal_is_typed_and_a_silent_gateway_times_out() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve(
            b,
            "pw",
            json!({"type":"res","ok":false,"error":{"code":"UNAVAILABLE","message":"secrets.reload failed","details":{"reason":"bad"}}}),
        ));
        let mut rpc = GatewayRpc::connect(a, "pw", Duration::from_secs(5))
            .await
            .unwrap();
        let err = rpc.request("secrets.reload", json!({})).await.unwrap_err();
        assert!(
            matches!(&err, RpcError::Refused { code, .. } if code == "UNAVAILABLE"),
            "{err}"
        );
        server.await.unwrap();
        let (a, _b) = tokio::io::duplex(1 << 16);
        let err = GatewayRpc::connect(a, "pw", Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, RpcError::TimedOut(_)), "{err}");
    }
}
