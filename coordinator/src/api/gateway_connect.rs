//! The gateway's own password in the Control UI's `connect` request (issue 30). The OpenClaw
//! gateway takes its password in the first message of its WebSocket, a JSON request
//! `{"type":"req","method":"connect","params":{"auth":{"password":…}}}`, not in a header: a
//! browser signed in to the console, which must never learn the password, would be asked
//! for it. So on the gateway route the coordinator reads the caller's first WebSocket frame
//! and, when it is that request, sets `params.auth.password` to the Agent's managed password
//! (and drops a `params.auth.token` the caller may have typed) before the gateway sees it;
//! every other frame, and a first one that is anything else, passes untouched.
//!
//! The caller's offer of WebSocket extensions is removed from the upgrade when the password
//! is to be given (`gateway_proxy.rs`), so that frame is never compressed. A first frame
//! that is fragmented, unmasked, over [`MAX_FIRST_FRAME`] bytes or not JSON is passed as it
//! is: the gateway then refuses the connection as it would without the coordinator.

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use zeroize::Zeroizing;

use super::ws_frame::{Header, header};
use crate::backend::GatewayPassword;

/// The largest first frame the coordinator reads to look at (a `connect` request is a few
/// KiB: client info, device identity and signature).
pub(crate) const MAX_FIRST_FRAME: usize = 64 * 1024;

/// A whole frame: its header and its payload.
struct Frame<'a> {
    header: Header,
    payload: &'a [u8],
}

/// The first frame in `buf` and its length on the wire, once it is all there.
fn parse(buf: &[u8]) -> Option<(Frame<'_>, usize)> {
    let header = header(buf)?;
    let end = header
        .header_len
        .checked_add(usize::try_from(header.payload_len).ok()?)?;
    let payload = buf.get(header.header_len..end)?;
    Some((Frame { header, payload }, end))
}

fn apply_mask(bytes: &mut [u8], mask: [u8; 4]) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
}

/// A client's text frame (FIN, masked with `mask`) carrying `payload`.
fn text_frame(payload: &[u8], mask: [u8; 4]) -> Zeroizing<Vec<u8>> {
    clawfleet_protocol::websocket::client_frame(0x1, payload, mask)
}

/// The frame at the start of `buf`, with the password given, when it is a whole, masked
/// text frame holding the gateway's `connect` request; `None` for anything else.
fn with_password(buf: &[u8], password: &str, mask: [u8; 4]) -> Option<(Zeroizing<Vec<u8>>, usize)> {
    let (frame, used) = parse(buf)?;
    let client_mask = frame.header.mask?;
    if !frame.header.fin || frame.header.opcode != 0x1 {
        return None;
    }
    let mut text = Zeroizing::new(frame.payload.to_vec());
    apply_mask(&mut text, client_mask);
    let mut request: Value = serde_json::from_slice(&text).ok()?;
    if request.get("type")?.as_str()? != "req" || request.get("method")?.as_str()? != "connect" {
        return None;
    }
    let params = request.get_mut("params")?.as_object_mut()?;
    let auth = params
        .entry("auth")
        .or_insert_with(|| Value::Object(Default::default()));
    if !auth.is_object() {
        *auth = Value::Object(Default::default());
    }
    let auth = auth.as_object_mut()?;
    auth.remove("token");
    auth.insert("password".into(), Value::String(password.to_owned()));
    let out = Zeroizing::new(serde_json::to_vec(&request).ok()?);
    Some((text_frame(&out, mask), used))
}

/// Reads the caller's first frame from `caller` and answers what the gateway gets in its
/// place: the frame with the password given when it is the `connect` request (see the
/// module), else the bytes as read. Empty when the caller closed before sending anything.
pub(crate) async fn first_frame(
    caller: &mut (impl AsyncRead + Unpin),
    password: &GatewayPassword,
) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let mut buf = Zeroizing::new(Vec::with_capacity(4096));
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((_, used)) = parse(&buf) {
            let mut mask = [0u8; 4];
            if clawfleet_protocol::random::fill(&mut mask).is_err() {
                // No randomness for a mask: the frame goes as the caller sent it.
                return Ok(buf);
            }
            return Ok(match with_password(&buf, password.expose(), mask) {
                Some((mut out, _)) => {
                    out.extend_from_slice(&buf[used..]);
                    out
                }
                None => buf,
            });
        }
        if buf.len() > MAX_FIRST_FRAME {
            return Ok(buf);
        }
        let n = caller.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn unmasked_payload(frame: &[u8]) -> Value {
        let (f, used) = parse(frame).unwrap();
        assert_eq!(used, frame.len());
        assert!(f.header.fin && f.header.opcode == 1);
        let mut p = f.payload.to_vec();
        apply_mask(&mut p, f.header.mask.unwrap());
        serde_json::from_slice(&p).unwrap()
    }

    fn connect(auth: Value) -> Value {
        json!({"type": "req", "id": "1", "method": "connect",
               "params": {"client": {"id": "openclaw-control-ui"}, "auth": auth}})
    }

    #[test]
    fn the_connect_request_gets_the_password_and_loses_a_typed_token() {
        let sent = text_frame(
            connect(json!({"token": "typed", "deviceToken": "dt"}))
                .to_string()
                .as_bytes(),
            [1, 2, 3, 4],
        );
        let (out, used) = with_password(&sent, "managed", [9, 8, 7, 6]).unwrap();
        assert_eq!(used, sent.len());
        let got = unmasked_payload(&out);
        assert_eq!(
            got["params"]["auth"],
            json!({"password": "managed", "deviceToken": "dt"})
        );
        assert_eq!(got["params"]["client"]["id"], "openclaw-control-ui");
        // Masked on the wire: the password is not in the frame's bytes as text.
        assert!(!out.windows(7).any(|w| w == b"managed"));
        // Without auth, and with a payload over 125 bytes (16-bit length).
        let mut big = connect(Value::Null);
        big["params"]["pad"] = json!("x".repeat(300));
        let sent = text_frame(big.to_string().as_bytes(), [5, 5, 5, 5]);
        let (out, _) = with_password(&sent, "managed", [1, 1, 1, 1]).unwrap();
        assert_eq!(
            unmasked_payload(&out)["params"]["auth"],
            json!({"password": "managed"})
        );
    }

    #[test]
    fn anything_else_passes_untouched() {
        let other = json!({"type": "req", "id": "2", "method": "chat.send", "params": {}});
        let mask = [1, 2, 3, 4];
        for frame in [
            text_frame(other.to_string().as_bytes(), mask),
            text_frame(b"not json", mask),
            text_frame(b"[1,2]", mask),
        ] {
            assert!(with_password(&frame, "pw", mask).is_none());
        }
        // Unmasked, fragmented, binary: not a browser's whole text message.
        let body = connect(Value::Null).to_string();
        let mut unmasked = vec![0x81, 126];
        unmasked.extend_from_slice(&(body.len() as u16).to_be_bytes());
        unmasked.extend_from_slice(body.as_bytes());
        assert!(with_password(&unmasked, "pw", mask).is_none());
        let mut fragment = text_frame(body.as_bytes(), mask).to_vec();
        fragment[0] = 0x01;
        assert!(with_password(&fragment, "pw", mask).is_none());
        let mut binary = text_frame(body.as_bytes(), mask).to_vec();
        binary[0] = 0x82;
        assert!(with_password(&binary, "pw", mask).is_none());
        // Not all there yet.
        let whole = text_frame(body.as_bytes(), mask);
        assert!(parse(&whole[..whole.len() - 1]).is_none());
        assert!(parse(&whole[..3]).is_none());
    }

    #[tokio::test]
    async fn the_first_frame_is_read_across_reads_and_what_follows_is_kept() {
        let first = text_frame(connect(Value::Null).to_string().as_bytes(), [3, 1, 4, 1]);
        let second = text_frame(b"{\"type\":\"req\",\"method\":\"x\"}", [2, 7, 1, 8]);
        let mut wire = first.to_vec();
        wire.extend_from_slice(&second);
        // Delivered a few bytes at a time.
        let (mut a, mut b) = tokio::io::duplex(7);
        // The writer stops when the reader is gone (the relay copies the rest, not this).
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for chunk in wire.chunks(5) {
                if b.write_all(chunk).await.is_err() {
                    return;
                }
            }
        });
        let password = GatewayPassword::new("managed".into());
        let out = first_frame(&mut a, &password).await.unwrap();
        drop(a);
        let (f, used) = parse(&out).unwrap();
        assert!(f.header.fin);
        assert_eq!(
            unmasked_payload(&out[..used])["params"]["auth"]["password"],
            "managed"
        );
        // What came in the same reads after the first frame follows it unchanged; the rest
        // is the relay's to copy.
        assert!(second.starts_with(&out[used..]));
        // A caller that closes at once: nothing.
        let (mut c, d) = tokio::io::duplex(8);
        drop(d);
        assert!(first_frame(&mut c, &password).await.unwrap().is_empty());
    }
}
