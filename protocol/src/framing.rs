//! Framing for one byte stream (an SSH session's stdin and stdout) that carries many
//! envelopes, results and progress events.
//!
//! A frame is `"CF"`, a kind byte, a payload length (u32, big endian) and the payload. The
//! magic makes stray bytes on the stream (a login banner, a shell's output) fail at once with
//! a clear error instead of being read as a length.

use std::io::{self, Read, Write};

use thiserror::Error;

use crate::envelope::{DecodeError, Limits, decode_json};
use crate::result::{Hello, Progress, ResultMessage};
use crate::signing::SignedEnvelope;

/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"CF";
/// Bytes before the payload.
pub const HEADER_LEN: usize = 7;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// hostd → coordinator, first on every session.
    Hello = 1,
    /// coordinator → hostd: a signed envelope.
    Envelope = 2,
    /// hostd → coordinator: the outcome of one envelope.
    Result = 3,
    /// hostd → coordinator: a step of a running operation.
    Progress = 4,
}

impl FrameKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(FrameKind::Hello),
            2 => Some(FrameKind::Envelope),
            3 => Some(FrameKind::Result),
            4 => Some(FrameKind::Progress),
            _ => None,
        }
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, Error)]
pub enum FrameError {
    #[error(
        "the stream does not carry clawfleet frames (found bytes {found:02x?} where the frame magic belongs)"
    )]
    BadMagic { found: [u8; 2] },
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame payload of {size} bytes exceeds the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("the stream ended inside a frame ({have} of {need} bytes)")]
    Truncated { have: usize, need: usize },
    #[error("frame I/O failed: {0}")]
    Io(#[from] io::Error),
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The frame's bytes on the wire.
    pub fn encode(&self, max_frame: usize) -> Result<Vec<u8>, FrameError> {
        if self.payload.len() > max_frame || self.payload.len() > u32::MAX as usize {
            return Err(FrameError::TooLarge {
                size: self.payload.len(),
                max: max_frame,
            });
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&MAGIC);
        out.push(self.kind as u8);
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.payload);
        Ok(out)
    }
}

/// Parses a header, checking magic, kind and size before any payload is buffered.
fn parse_header(
    header: &[u8; HEADER_LEN],
    max_frame: usize,
) -> Result<(FrameKind, usize), FrameError> {
    let found = [header[0], header[1]];
    if found != MAGIC {
        return Err(FrameError::BadMagic { found });
    }
    let kind = FrameKind::from_byte(header[2]).ok_or(FrameError::UnknownKind(header[2]))?;
    let len = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
    if len > max_frame {
        return Err(FrameError::TooLarge {
            size: len,
            max: max_frame,
        });
    }
    Ok((kind, len))
}

/// An incremental decoder for byte chunks (async readers feed it as bytes arrive).
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max_frame: usize,
}

impl FrameDecoder {
    /// A decoder that refuses payloads over `max_frame`.
    pub fn new(max_frame: usize) -> Self {
        Self {
            buf: Vec::new(),
            max_frame,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if one is buffered. After an error the stream is unusable.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let Some(header) = self.buf.first_chunk::<HEADER_LEN>() else {
            // Check the magic early so garbage fails before a full header arrives.
            if self.buf.len() >= 2 && self.buf[..2] != MAGIC {
                return Err(FrameError::BadMagic {
                    found: [self.buf[0], self.buf[1]],
                });
            }
            return Ok(None);
        };
        let (kind, len) = parse_header(header, self.max_frame)?;
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(Frame { kind, payload }))
    }

    /// Bytes buffered that are not yet a whole frame; non-zero at end of stream means the
    /// peer stopped mid-frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Reads one frame. `Ok(None)` on a clean end of stream between frames.
pub fn read_frame<R: Read>(reader: &mut R, max_frame: usize) -> Result<Option<Frame>, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    let got = read_full(reader, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got >= 2 && header[..2] != MAGIC {
        return Err(FrameError::BadMagic {
            found: [header[0], header[1]],
        });
    }
    if got < HEADER_LEN {
        return Err(FrameError::Truncated {
            have: got,
            need: HEADER_LEN,
        });
    }
    let (kind, len) = parse_header(&header, max_frame)?;
    let mut payload = vec![0u8; len];
    let got = read_full(reader, &mut payload)?;
    if got < len {
        return Err(FrameError::Truncated {
            have: HEADER_LEN + got,
            need: HEADER_LEN + len,
        });
    }
    Ok(Some(Frame { kind, payload }))
}

fn read_full<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Writes one frame and flushes, so the peer sees it at once.
pub fn write_frame<W: Write>(
    writer: &mut W,
    frame: &Frame,
    max_frame: usize,
) -> Result<(), FrameError> {
    writer.write_all(&frame.encode(max_frame)?)?;
    writer.flush()?;
    Ok(())
}

/// A decoded message of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Hello(Hello),
    Envelope(SignedEnvelope),
    Result(ResultMessage),
    Progress(Progress),
}

/// Why a message could not be built or read.
#[derive(Debug, Error)]
pub enum MessageError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("the message cannot be serialized: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl Message {
    /// The frame carrying this message.
    pub fn to_frame(&self) -> Result<Frame, MessageError> {
        let (kind, payload) = match self {
            Message::Hello(m) => (FrameKind::Hello, serde_json::to_vec(m)?),
            Message::Envelope(m) => (FrameKind::Envelope, m.to_payload()),
            Message::Result(m) => (FrameKind::Result, serde_json::to_vec(m)?),
            Message::Progress(m) => (FrameKind::Progress, serde_json::to_vec(m)?),
        };
        Ok(Frame { kind, payload })
    }

    /// Decodes a frame's payload strictly.
    pub fn from_frame(frame: &Frame, limits: &Limits) -> Result<Self, MessageError> {
        Ok(match frame.kind {
            FrameKind::Hello => Message::Hello(decode_json("hello", &frame.payload)?),
            FrameKind::Envelope => {
                Message::Envelope(SignedEnvelope::from_payload(&frame.payload, limits)?)
            }
            FrameKind::Result => Message::Result(decode_json("result", &frame.payload)?),
            FrameKind::Progress => Message::Progress(decode_json("progress", &frame.payload)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: FrameKind, payload: &[u8]) -> Frame {
        Frame {
            kind,
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn round_trips_many_frames_on_one_stream() {
        let frames = vec![
            frame(FrameKind::Hello, b"{}"),
            frame(FrameKind::Envelope, &[0u8; 300]),
            frame(FrameKind::Result, b""),
            frame(FrameKind::Progress, b"x"),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            write_frame(&mut wire, f, 1024).unwrap();
        }
        let mut reader = wire.as_slice();
        let mut back = Vec::new();
        while let Some(f) = read_frame(&mut reader, 1024).unwrap() {
            back.push(f);
        }
        assert_eq!(back, frames);

        // The same bytes fed one at a time to the incremental decoder.
        let mut dec = FrameDecoder::new(1024);
        let mut back = Vec::new();
        for b in &wire {
            dec.push(std::slice::from_ref(b));
            while let Some(f) = dec.next_frame().unwrap() {
                back.push(f);
            }
        }
        assert_eq!(back, frames);
        assert_eq!(dec.pending(), 0);
    }

    #[test]
    fn refuses_garbage_oversize_unknown_kind_and_truncation() {
        let mut r: &[u8] = b"Welcome to host\n";
        assert!(matches!(
            read_frame(&mut r, 1024),
            Err(FrameError::BadMagic { .. })
        ));

        let big = frame(FrameKind::Result, &[0u8; 2000]).encode(4096).unwrap();
        assert!(matches!(
            read_frame(&mut big.as_slice(), 1024),
            Err(FrameError::TooLarge {
                size: 2000,
                max: 1024
            })
        ));
        assert!(matches!(
            frame(FrameKind::Result, &[0u8; 2000]).encode(1024),
            Err(FrameError::TooLarge { .. })
        ));

        let mut bad_kind = frame(FrameKind::Result, b"{}").encode(1024).unwrap();
        bad_kind[2] = 9;
        assert!(matches!(
            read_frame(&mut bad_kind.as_slice(), 1024),
            Err(FrameError::UnknownKind(9))
        ));

        let whole = frame(FrameKind::Result, b"{\"a\":1}").encode(1024).unwrap();
        for cut in 1..whole.len() {
            let mut part = &whole[..cut];
            assert!(
                matches!(
                    read_frame(&mut part, 1024),
                    Err(FrameError::Truncated { .. })
                ),
                "cut at {cut}"
            );
        }
    }
}
