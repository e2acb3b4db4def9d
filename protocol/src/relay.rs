//! The gateway relay: many byte streams to Agents' gateways over one SSH channel per host
//! (issue 30), separate from the operation sessions so operations never wait behind traffic.
//!
//! The coordinator opens a session channel whose command is [`RELAY_COMMAND`]; hostd's forced
//! command (`hostd serve`) sees it in `SSH_ORIGINAL_COMMAND` and relays instead of serving
//! operations. No SSH port forwarding is involved, so it works with the `restrict` key and
//! `AllowTcpForwarding no`.
//!
//! A relay frame is `"CR"`, a kind byte, a stream id (u32, big endian), a payload length
//! (u32, big endian) and the payload (at most [`MAX_PAYLOAD`] bytes). hostd speaks first
//! ([`RelayKind::Hello`], stream 0, JSON [`RelayHello`]).
//!
//! Opening a stream: the coordinator sends [`RelayKind::Open`] with a fresh odd-or-even-free
//! stream id (any id not in use, never 0) and a signed [`RelayOpen`] (SSHSIG in the
//! operation namespace over [`OPEN_DOMAIN`] followed by the JSON, so an open can never be
//! read as an operation envelope nor the reverse). hostd checks the signature, signer,
//! issuer, host and time window exactly as for operations, resolves the Agent's host-held
//! port from its own state (never from the request) and connects to `127.0.0.1:<port>`
//! only; it answers [`RelayKind::Opened`] or [`RelayKind::Refused`] (JSON
//! [`crate::Failure`]).
//!
//! Flow control: each side may have at most [`INITIAL_WINDOW`] unacknowledged data bytes
//! in flight per stream and direction. The receiver grants more with
//! [`RelayKind::Credit`] (u32 increment) once it has handed data on, so a slow client holds
//! back its own stream only, and neither side ever buffers more than the window per stream.
//! A sender that exceeds its credit is a protocol error: the stream is reset.
//!
//! Closing: [`RelayKind::Eof`] half-closes one direction; [`RelayKind::Reset`] (UTF-8
//! reason) aborts the stream both ways. [`RelayKind::Ping`]/[`RelayKind::Pong`] (stream 0,
//! an opaque 8-byte payload echoed back) keep the channel alive and measure it.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use ssh_key::{PrivateKey, PublicKey, SshSig};
use thiserror::Error;

use crate::allowed_signers::CheckError;
use crate::envelope::Target;
use crate::failure::{Failure, FailureCode};
use crate::ident::{Ident, Principal};
use crate::signing::{
    Rejection, SIGNATURE_NAMESPACE, SignError, SignedEnvelope, Verifier, fingerprint,
};

/// The command the coordinator asks for on the relay channel.
pub const RELAY_COMMAND: &str = "hostd relay";
/// The relay protocol version hostd announces.
pub const RELAY_VERSION: u32 = 1;
/// The two bytes every relay frame starts with.
pub const MAGIC: [u8; 2] = *b"CR";
/// Bytes before the payload.
pub const HEADER_LEN: usize = 11;
/// Largest payload of any relay frame (data chunks, opens).
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Unacknowledged data bytes a sender may have in flight per stream and direction.
pub const INITIAL_WINDOW: u32 = 1024 * 1024;
/// Longest span between an open's issued-at and expires-at that hostd accepts.
pub const MAX_OPEN_LIFETIME_SECONDS: u64 = 300;
/// Prefix of every signed open body (domain separation from operation envelopes).
pub const OPEN_DOMAIN: &[u8] = b"clawfleet-relay-open\n";
/// Longest caller principal an open carries (it is logged, never trusted).
pub const MAX_CALLER: usize = 256;
/// Longest reset reason.
pub const MAX_REASON: usize = 512;

/// What a relay frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RelayKind {
    /// hostd → coordinator, first on the channel (stream 0): [`RelayHello`] as JSON.
    Hello = 1,
    /// coordinator → hostd: a signed [`RelayOpen`] ([`SignedEnvelope::to_payload`]).
    Open = 2,
    /// hostd → coordinator: the stream is connected to the gateway.
    Opened = 3,
    /// hostd → coordinator: the stream was not opened; a [`Failure`] as JSON.
    Refused = 4,
    /// Either way: stream bytes.
    Data = 5,
    /// Either way: the receiver accepts this many more bytes (u32, big endian).
    Credit = 6,
    /// Either way: the sender sends no more bytes on the stream.
    Eof = 7,
    /// Either way: the stream is aborted; the payload is a reason (UTF-8).
    Reset = 8,
    /// Either way, stream 0: answer with [`RelayKind::Pong`] and the same payload.
    Ping = 9,
    /// The answer to a [`RelayKind::Ping`].
    Pong = 10,
}

impl RelayKind {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Hello,
            2 => Self::Open,
            3 => Self::Opened,
            4 => Self::Refused,
            5 => Self::Data,
            6 => Self::Credit,
            7 => Self::Eof,
            8 => Self::Reset,
            9 => Self::Ping,
            10 => Self::Pong,
            _ => return None,
        })
    }
}

/// Why a relay frame could not be read or written.
#[derive(Debug, Error)]
pub enum RelayFrameError {
    #[error(
        "the relay channel does not carry relay frames (found bytes {found:02x?} where the frame magic belongs)"
    )]
    BadMagic { found: [u8; 2] },
    #[error("unknown relay frame kind {0}")]
    UnknownKind(u8),
    #[error("relay frame payload of {size} bytes exceeds the limit of {MAX_PAYLOAD}")]
    TooLarge { size: usize },
    #[error("the relay channel ended inside a frame")]
    Truncated,
    #[error("relay frame I/O failed: {0}")]
    Io(#[from] io::Error),
}

/// One relay frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayFrame {
    pub kind: RelayKind,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl RelayFrame {
    /// A frame.
    pub fn new(kind: RelayKind, stream: u32, payload: Vec<u8>) -> Self {
        Self {
            kind,
            stream,
            payload,
        }
    }

    /// A credit grant of `bytes`.
    pub fn credit(stream: u32, bytes: u32) -> Self {
        Self::new(RelayKind::Credit, stream, bytes.to_be_bytes().to_vec())
    }

    /// A reset with a reason (shortened to [`MAX_REASON`] bytes at a character boundary).
    pub fn reset(stream: u32, reason: &str) -> Self {
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        Self::new(RelayKind::Reset, stream, reason.as_bytes()[..end].to_vec())
    }

    /// The increment of a credit frame, `None` for a malformed one.
    pub fn credit_increment(&self) -> Option<u32> {
        let bytes: [u8; 4] = self.payload.as_slice().try_into().ok()?;
        Some(u32::from_be_bytes(bytes))
    }

    /// The header of a frame with `len` payload bytes.
    pub fn header(
        kind: RelayKind,
        stream: u32,
        len: usize,
    ) -> Result<[u8; HEADER_LEN], RelayFrameError> {
        if len > MAX_PAYLOAD {
            return Err(RelayFrameError::TooLarge { size: len });
        }
        let mut h = [0u8; HEADER_LEN];
        h[..2].copy_from_slice(&MAGIC);
        h[2] = kind as u8;
        h[3..7].copy_from_slice(&stream.to_be_bytes());
        h[7..11].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(h)
    }

    /// Appends the frame's bytes to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), RelayFrameError> {
        out.extend_from_slice(&Self::header(self.kind, self.stream, self.payload.len())?);
        out.extend_from_slice(&self.payload);
        Ok(())
    }

    /// Parses the header of a frame: kind, stream and payload length.
    pub fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(RelayKind, u32, usize), RelayFrameError> {
        if h[..2] != MAGIC {
            return Err(RelayFrameError::BadMagic {
                found: [h[0], h[1]],
            });
        }
        let kind = RelayKind::from_byte(h[2]).ok_or(RelayFrameError::UnknownKind(h[2]))?;
        let stream = u32::from_be_bytes([h[3], h[4], h[5], h[6]]);
        let len = u32::from_be_bytes([h[7], h[8], h[9], h[10]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(RelayFrameError::TooLarge { size: len });
        }
        Ok((kind, stream, len))
    }
}

/// Reads one frame; `Ok(None)` at a clean end of the channel (between frames).
pub fn read_relay_frame<R: Read>(reader: &mut R) -> Result<Option<RelayFrame>, RelayFrameError> {
    let mut h = [0u8; HEADER_LEN];
    let mut have = 0;
    while have < HEADER_LEN {
        match reader.read(&mut h[have..]) {
            Ok(0) if have == 0 => return Ok(None),
            Ok(0) => return Err(RelayFrameError::Truncated),
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (kind, stream, len) = RelayFrame::parse_header(&h)?;
    let mut payload = vec![0u8; len];
    reader
        .read_exact(&mut payload)
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => RelayFrameError::Truncated,
            _ => RelayFrameError::Io(e),
        })?;
    Ok(Some(RelayFrame {
        kind,
        stream,
        payload,
    }))
}

/// Writes one frame (not flushed).
pub fn write_relay_frame<W: Write>(
    writer: &mut W,
    frame: &RelayFrame,
) -> Result<(), RelayFrameError> {
    writer.write_all(&RelayFrame::header(
        frame.kind,
        frame.stream,
        frame.payload.len(),
    )?)?;
    writer.write_all(&frame.payload)?;
    Ok(())
}

/// hostd's greeting on the relay channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RelayHello {
    pub version: u32,
    /// Streams hostd carries at once on this host (all relay channels together).
    pub max_streams: u32,
    /// The initial credit per stream and direction.
    pub window: u32,
    /// A stream without a byte either way for this long is reset by hostd.
    pub idle_timeout_seconds: u64,
}

/// The signed request to open one stream to one Agent's gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RelayOpen {
    pub version: u32,
    pub target: Target,
    /// The allowed_signers principal of the signer (the coordinator's issuer).
    pub issuer: Principal,
    /// Unix seconds.
    pub issued_at: u64,
    /// Unix seconds; the host refuses the open from this moment on.
    pub expires_at: u64,
    pub namespace: Ident,
    pub agent: Ident,
    /// The API principal the coordinator serves this stream for (logged by hostd).
    pub caller: String,
    /// Whether hostd answers the Agent's managed gateway password in [`RelayOpened`], for the
    /// coordinator to add at the last hop of a browser's request (the gateway route) so the
    /// caller never learns it. Absent (false) from `occ agent connect`'s opens.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gateway_auth: bool,
}

/// The payload of [`RelayKind::Opened`] when the open asked for [`RelayOpen::gateway_auth`]
/// (otherwise the payload is empty). hostd reads the password from its own state (the
/// Agent's password file), never from the request.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RelayOpened {
    /// The Agent's managed gateway password; `None` when its configuration uses none.
    pub gateway_password: Option<String>,
}

impl std::fmt::Debug for RelayOpened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayOpened")
            .field(
                "gateway_password",
                &self.gateway_password.as_ref().map(|_| "[REDACTED]"),
            )
            .finish()
    }
}

/// Why an open could not be signed.
#[derive(Debug, Error)]
pub enum OpenSignError {
    #[error("the caller principal is {0} bytes; at most {MAX_CALLER} are allowed")]
    CallerTooLong(usize),
    #[error(transparent)]
    Sign(#[from] SignError),
}

impl RelayOpen {
    /// The bytes that are signed and travel: [`OPEN_DOMAIN`] and the JSON.
    pub fn to_body(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = OPEN_DOMAIN.to_vec();
        out.extend_from_slice(&serde_json::to_vec(self)?);
        Ok(out)
    }

    /// Signs the open with the coordinator's operation key.
    pub fn sign(&self, key: &PrivateKey) -> Result<SignedEnvelope, OpenSignError> {
        if self.caller.len() > MAX_CALLER {
            return Err(OpenSignError::CallerTooLong(self.caller.len()));
        }
        let body = self.to_body().map_err(SignError::Serialize)?;
        Ok(SignedEnvelope::sign_bytes(body, key)?)
    }
}

fn refused(code: FailureCode, message: impl AsRef<str>) -> Rejection {
    Rejection {
        operation_id: None,
        failure: Failure::new(code, message),
    }
}

/// Checks a signed open the way [`Verifier::verify`] checks an operation: signature,
/// signer key, then the body, its issuer, target and time window (at most
/// [`MAX_OPEN_LIFETIME_SECONDS`] long).
pub fn verify_open(
    verifier: &Verifier,
    signed: &SignedEnvelope,
    now: u64,
) -> Result<RelayOpen, Rejection> {
    if signed.body.len() > MAX_PAYLOAD {
        return Err(refused(
            FailureCode::InputTooLarge,
            format!(
                "the relay open is {} bytes; at most {MAX_PAYLOAD} are allowed",
                signed.body.len()
            ),
        ));
    }
    let sig = SshSig::from_pem(signed.signature.as_bytes()).map_err(|e| {
        refused(
            FailureCode::SignatureInvalid,
            format!("the relay open's signature is not an SSHSIG signature: {e}"),
        )
    })?;
    if sig.namespace() != SIGNATURE_NAMESPACE {
        return Err(refused(
            FailureCode::SignatureInvalid,
            format!("the relay open's signature is not for namespace {SIGNATURE_NAMESPACE:?}"),
        ));
    }
    let key = PublicKey::from(sig.public_key().clone());
    key.verify(SIGNATURE_NAMESPACE, &signed.body, &sig)
        .map_err(|_| {
            refused(
                FailureCode::SignatureInvalid,
                "the signature does not verify over the relay open's bytes",
            )
        })?;
    if !verifier
        .signers
        .entries()
        .iter()
        .any(|e| e.key.key_data() == key.key_data())
    {
        return Err(refused(
            FailureCode::UnknownSigner,
            format!(
                "signing key {} is not in allowed_signers",
                fingerprint(&key)
            ),
        ));
    }
    let json = signed.body.strip_prefix(OPEN_DOMAIN).ok_or_else(|| {
        refused(
            FailureCode::InvalidInput,
            "the signed bytes are not a relay open (they lack its prefix)",
        )
    })?;
    let open: RelayOpen = serde_json::from_slice(json).map_err(|e| {
        refused(
            FailureCode::InvalidInput,
            format!("the relay open does not decode: {e}"),
        )
    })?;
    if open.version != RELAY_VERSION {
        return Err(refused(
            FailureCode::UnsupportedVersion,
            format!(
                "relay open version {} is not supported; this side speaks {RELAY_VERSION}",
                open.version
            ),
        ));
    }
    if open.caller.len() > MAX_CALLER {
        return Err(refused(
            FailureCode::InputTooLarge,
            format!(
                "the relay open's caller is {} bytes; at most {MAX_CALLER} are allowed",
                open.caller.len()
            ),
        ));
    }
    verifier
        .signers
        .check(&key, open.issuer.as_str(), SIGNATURE_NAMESPACE, now)
        .map_err(|e| {
            let code = match e {
                CheckError::OutsideValidity => FailureCode::SignerNotValid,
                _ => FailureCode::UnknownSigner,
            };
            refused(code, format!("issuer {}: {e}", open.issuer))
        })?;
    if open.target.host != verifier.host.name || open.target.host_key != verifier.host.host_key {
        return Err(refused(
            FailureCode::WrongHost,
            format!(
                "the relay open is for host {} with key {}, this is {} with key {}",
                open.target.host, open.target.host_key, verifier.host.name, verifier.host.host_key
            ),
        ));
    }
    if open.expires_at < open.issued_at
        || open.expires_at - open.issued_at > MAX_OPEN_LIFETIME_SECONDS
    {
        return Err(refused(
            FailureCode::InvalidInput,
            format!(
                "the relay open is valid from {} to {}; at most {MAX_OPEN_LIFETIME_SECONDS} s are accepted",
                open.issued_at, open.expires_at
            ),
        ));
    }
    if now.saturating_add(verifier.clock_skew_seconds) < open.issued_at {
        return Err(refused(
            FailureCode::EnvelopeNotYetValid,
            format!(
                "the relay open was issued {} s in the future (clock skew allowed: {} s)",
                open.issued_at - now,
                verifier.clock_skew_seconds
            ),
        ));
    }
    if now >= open.expires_at {
        return Err(refused(
            FailureCode::EnvelopeExpired,
            format!("the relay open expired {} s ago", now - open.expires_at),
        ));
    }
    Ok(open)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::allowed_signers::AllowedSigners;
    use crate::ident::{Fingerprint, HostName};
    use crate::signing::HostIdentity;
    use ssh_key::Algorithm;

    fn key() -> PrivateKey {
        PrivateKey::random(
            &mut ssh_key::rand_core::UnwrapErr(ssh_key::getrandom::SysRng),
            Algorithm::Ed25519,
        )
        .unwrap()
    }

    fn host() -> HostIdentity {
        HostIdentity {
            name: HostName::new("host-a").unwrap(),
            host_key: Fingerprint::of(key().public_key()),
        }
    }

    fn verifier(signer: &PrivateKey, host: HostIdentity) -> Verifier {
        let line = format!(
            "occ-issuer namespaces=\"{SIGNATURE_NAMESPACE}\" {}",
            signer.public_key().to_openssh().unwrap()
        );
        Verifier::new(AllowedSigners::parse(&line).unwrap(), host)
    }

    fn open(host: &HostIdentity, now: u64) -> RelayOpen {
        RelayOpen {
            version: RELAY_VERSION,
            target: Target {
                host: host.name.clone(),
                host_key: host.host_key.clone(),
            },
            issuer: Principal::new("occ-issuer").unwrap(),
            issued_at: now,
            expires_at: now + 60,
            namespace: Ident::new("team-a").unwrap(),
            agent: Ident::new("bot").unwrap(),
            caller: "token:alice".to_owned(),
            gateway_auth: false,
        }
    }

    #[test]
    fn a_signed_open_verifies_and_every_change_is_refused() {
        let signer = key();
        let host = host();
        let v = verifier(&signer, host.clone());
        let now = 1_800_000_000;
        let good = open(&host, now);
        let signed = good.sign(&signer).unwrap();
        assert_eq!(verify_open(&v, &signed, now).unwrap(), good);
        // Through the wire form too.
        let back =
            SignedEnvelope::from_payload(&signed.to_payload(), &crate::Limits::default()).unwrap();
        assert_eq!(verify_open(&v, &back, now + 59).unwrap(), good);

        let code = |s: &SignedEnvelope, at: u64| verify_open(&v, s, at).unwrap_err().failure.code;
        assert_eq!(code(&signed, now + 60), FailureCode::EnvelopeExpired);
        assert_eq!(code(&signed, now - 3600), FailureCode::EnvelopeNotYetValid);
        // Another Agent in the same signature: the bytes no longer verify.
        let mut tampered = signed.clone();
        let text = String::from_utf8(tampered.body.clone()).unwrap();
        tampered.body = text.replace("\"bot\"", "\"bou\"").into_bytes();
        assert_eq!(code(&tampered, now), FailureCode::SignatureInvalid);
        // A key that is not enrolled.
        assert_eq!(
            code(&good.sign(&key()).unwrap(), now),
            FailureCode::UnknownSigner
        );
        // Another host.
        let mut elsewhere = good.clone();
        elsewhere.target.host = HostName::new("host-b").unwrap();
        assert_eq!(
            code(&elsewhere.sign(&signer).unwrap(), now),
            FailureCode::WrongHost
        );
        // Too long a lifetime.
        let mut long = good.clone();
        long.expires_at = now + MAX_OPEN_LIFETIME_SECONDS + 1;
        assert_eq!(
            code(&long.sign(&signer).unwrap(), now),
            FailureCode::InvalidInput
        );
        // An issuer the key may not sign as.
        let mut other = good.clone();
        other.issuer = Principal::new("someone-else").unwrap();
        assert_eq!(
            code(&other.sign(&signer).unwrap(), now),
            FailureCode::UnknownSigner
        );
    }

    #[test]
    fn an_operation_envelope_is_never_a_relay_open() {
        let signer = key();
        let host = host();
        let v = verifier(&signer, host.clone());
        let now = 1_800_000_000;
        // The JSON of an open without the domain prefix, signed: refused.
        let json = serde_json::to_vec(&open(&host, now)).unwrap();
        let signed = SignedEnvelope::sign_bytes(json, &signer).unwrap();
        assert_eq!(
            verify_open(&v, &signed, now).unwrap_err().failure.code,
            FailureCode::InvalidInput
        );
        // And an open's bytes are not an operation envelope.
        let body = open(&host, now).to_body().unwrap();
        assert!(crate::Envelope::decode(&body, &crate::Limits::default()).is_err());
    }

    #[test]
    fn frames_round_trip_and_reject_garbage() {
        let frames = vec![
            RelayFrame::new(RelayKind::Data, 7, b"hello".to_vec()),
            RelayFrame::credit(7, 65536),
            RelayFrame::reset(9, "idle"),
            RelayFrame::new(RelayKind::Eof, 7, vec![]),
        ];
        let mut bytes = Vec::new();
        for f in &frames {
            f.encode_into(&mut bytes).unwrap();
        }
        let mut r = bytes.as_slice();
        for f in &frames {
            assert_eq!(read_relay_frame(&mut r).unwrap().as_ref(), Some(f));
        }
        assert!(read_relay_frame(&mut r).unwrap().is_none());
        assert_eq!(frames[1].credit_increment(), Some(65536));

        let mut truncated = &bytes[..bytes.len() - 1];
        for _ in 0..3 {
            read_relay_frame(&mut truncated).unwrap();
        }
        assert!(matches!(
            read_relay_frame(&mut truncated),
            Err(RelayFrameError::Truncated)
        ));
        let mut banner: &[u8] = b"Welcome to Debian\n";
        assert!(matches!(
            read_relay_frame(&mut banner),
            Err(RelayFrameError::BadMagic { .. })
        ));
        let mut huge = RelayFrame::header(RelayKind::Data, 1, 0).unwrap().to_vec();
        huge[7..11].copy_from_slice(&((MAX_PAYLOAD + 1) as u32).to_be_bytes());
        assert!(matches!(
            read_relay_frame(&mut huge.as_slice()),
            Err(RelayFrameError::TooLarge { .. })
        ));
        assert!(
            RelayFrame::new(RelayKind::Data, 1, vec![0; MAX_PAYLOAD + 1])
                .encode_into(&mut Vec::new())
                .is_err()
        );
    }
}
