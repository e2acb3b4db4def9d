//! The smallest RFC 6455 server side the gateway protocol needs: the upgrade handshake and
//! text/ping/close frames (client frames must be masked; fragments are joined).

use std::io::{self, Read, Write};

use base64ct::Encoding;
use sha1::{Digest, Sha1};

const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(client_key: &str) -> String {
    let mut h = Sha1::new();
    h.update(client_key.trim().as_bytes());
    h.update(ACCEPT_GUID.as_bytes());
    base64ct::Base64::encode_string(&h.finalize())
}

/// What a client sent, after control frames were answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    Text(String),
    /// The client closed (or sent something this server does not take); the reply close frame
    /// has been sent.
    Closed,
}

pub const OP_CONT: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Writes one unmasked (server) frame with FIN set, in a single `write_all` (so a writer that
/// locks per write never interleaves two frames).
pub fn write_frame(w: &mut impl Write, opcode: u8, payload: &[u8]) -> io::Result<()> {
    let mut head = Vec::with_capacity(10 + payload.len());
    head.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => head.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            head.push(126);
            head.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            head.push(127);
            head.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    head.extend_from_slice(payload);
    w.write_all(&head)?;
    w.flush()
}

/// Sends a close frame with `code` and a short reason.
pub fn write_close(w: &mut impl Write, code: u16, reason: &str) -> io::Result<()> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend(reason.bytes().take(120));
    write_frame(w, OP_CLOSE, &payload)
}

/// The largest frame [`echo`] takes.
pub const ECHO_MAX_FRAME: u64 = 1024 * 1024;

/// Echoes every data frame (text, binary, continuation) back with the same opcode and FIN bit,
/// answers pings, and returns after a close (answered) or a broken frame (1002 / 1009): the
/// test endpoint that checks a byte path end to end (bytes in = bytes out).
pub fn echo(r: &mut impl Read, w: &mut impl Write) -> io::Result<()> {
    loop {
        let mut head = [0u8; 2];
        r.read_exact(&mut head)?;
        let fin = head[0] & 0x80;
        let opcode = head[0] & 0x0F;
        let len = match head[1] & 0x7F {
            126 => {
                let mut b = [0u8; 2];
                r.read_exact(&mut b)?;
                u64::from(u16::from_be_bytes(b))
            }
            127 => {
                let mut b = [0u8; 8];
                r.read_exact(&mut b)?;
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        };
        if head[1] & 0x80 == 0 {
            return write_close(w, 1002, "client frames must be masked");
        }
        if len > ECHO_MAX_FRAME {
            return write_close(w, 1009, "frame too big");
        }
        let mut mask = [0u8; 4];
        r.read_exact(&mut mask)?;
        let mut payload = vec![0u8; len as usize];
        r.read_exact(&mut payload)?;
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        match opcode {
            OP_PING => write_frame(w, OP_PONG, &payload)?,
            OP_PONG => {}
            OP_CLOSE => {
                let code = payload
                    .get(..2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]))
                    .unwrap_or(1000);
                return write_close(w, code, "");
            }
            OP_TEXT | OP_BINARY | OP_CONT => {
                // write_frame sets FIN; a fragment keeps the client's.
                let mut frame = Vec::with_capacity(payload.len() + 10);
                write_frame(&mut frame, opcode, &payload)?;
                frame[0] = fin | opcode;
                w.write_all(&frame)?;
                w.flush()?;
            }
            _ => return write_close(w, 1002, "unexpected frame"),
        }
    }
}

/// Reads frames until a whole text message arrives, answering pings; `max_len` bounds a message.
pub fn read_message(r: &mut impl Read, w: &mut impl Write, max_len: usize) -> io::Result<Message> {
    let mut message: Vec<u8> = Vec::new();
    let mut in_text = false;
    loop {
        let mut head = [0u8; 2];
        r.read_exact(&mut head)?;
        let fin = head[0] & 0x80 != 0;
        let opcode = head[0] & 0x0F;
        let masked = head[1] & 0x80 != 0;
        let len = match head[1] & 0x7F {
            126 => {
                let mut b = [0u8; 2];
                r.read_exact(&mut b)?;
                u64::from(u16::from_be_bytes(b))
            }
            127 => {
                let mut b = [0u8; 8];
                r.read_exact(&mut b)?;
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        };
        if !masked {
            write_close(w, 1002, "client frames must be masked")?;
            return Ok(Message::Closed);
        }
        if len > max_len as u64 || message.len() as u64 + len > max_len as u64 {
            write_close(w, 1009, "message too big")?;
            return Ok(Message::Closed);
        }
        let mut mask = [0u8; 4];
        r.read_exact(&mut mask)?;
        let mut payload = vec![0u8; len as usize];
        r.read_exact(&mut payload)?;
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        match opcode {
            OP_PING => write_frame(w, OP_PONG, &payload)?,
            OP_PONG => {}
            OP_CLOSE => {
                let code = payload
                    .get(..2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]))
                    .unwrap_or(1000);
                write_close(w, code, "")?;
                return Ok(Message::Closed);
            }
            OP_TEXT | OP_CONT if opcode == OP_TEXT || in_text => {
                message.extend_from_slice(&payload);
                in_text = !fin;
                if fin {
                    return match String::from_utf8(message) {
                        Ok(text) => Ok(Message::Text(text)),
                        Err(_) => {
                            write_close(w, 1007, "text frames must be UTF-8")?;
                            Ok(Message::Closed)
                        }
                    };
                }
            }
            OP_BINARY => {
                write_close(w, 1003, "the gateway protocol uses text frames")?;
                return Ok(Message::Closed);
            }
            _ => {
                write_close(w, 1002, "unexpected frame")?;
                return Ok(Message::Closed);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn masked(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        assert!(payload.len() < 126);
        out.push(0x80 | payload.len() as u8);
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn accept_key_matches_the_rfc_example() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn fragments_are_joined_and_pings_answered() {
        let mut input = masked(OP_TEXT, false, b"{\"a\":");
        input.extend(masked(OP_PING, true, b"hi"));
        input.extend(masked(OP_CONT, true, b"1}"));
        let mut out = Vec::new();
        let m = read_message(&mut input.as_slice(), &mut out, 1024).unwrap();
        assert_eq!(m, Message::Text("{\"a\":1}".into()));
        assert_eq!(out, vec![0x80 | OP_PONG, 2, b'h', b'i']);
    }

    #[test]
    fn unmasked_oversized_and_close_frames_end_the_session() {
        let mut out = Vec::new();
        let unmasked = [0x81u8, 1, b'x'];
        assert_eq!(
            read_message(&mut unmasked.as_slice(), &mut out, 1024).unwrap(),
            Message::Closed
        );
        assert_eq!(&out[2..4], &1002u16.to_be_bytes());
        out.clear();
        let big = masked(OP_TEXT, true, &[b'x'; 100]);
        assert_eq!(
            read_message(&mut big.as_slice(), &mut out, 10).unwrap(),
            Message::Closed
        );
        assert_eq!(&out[2..4], &1009u16.to_be_bytes());
        out.clear();
        let close = masked(OP_CLOSE, true, &1000u16.to_be_bytes());
        assert_eq!(
            read_message(&mut close.as_slice(), &mut out, 10).unwrap(),
            Message::Closed
        );
    }

    #[test]
    fn echo_returns_data_frames_as_sent_and_answers_close() {
        let mut input = masked(OP_BINARY, true, &[0, 1, 2, 255]);
        input.extend(masked(OP_TEXT, false, b"ab"));
        input.extend(masked(OP_CONT, true, b"c"));
        input.extend(masked(OP_CLOSE, true, &1000u16.to_be_bytes()));
        let mut out = Vec::new();
        echo(&mut input.as_slice(), &mut out).unwrap();
        let mut want = vec![0x80 | OP_BINARY, 4, 0, 1, 2, 255];
        want.extend([OP_TEXT, 2, b'a', b'b']);
        want.extend([0x80 | OP_CONT, 1, b'c']);
        want.extend([0x80 | OP_CLOSE, 2, 0x03, 0xE8]);
        assert_eq!(out, want);
    }

    #[test]
    fn long_frames_use_the_extended_length() {
        let mut out = Vec::new();
        write_frame(&mut out, OP_TEXT, &[b'a'; 300]).unwrap();
        assert_eq!(&out[..4], &[0x81, 126, 1, 44]);
        assert_eq!(out.len(), 304);
    }
}
