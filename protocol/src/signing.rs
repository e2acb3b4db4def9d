//! Signing envelopes (coordinator side) and verifying them (host side).
//!
//! Signatures are OpenSSH SSHSIG over the exact envelope bytes that travel, namespace
//! [`SIGNATURE_NAMESPACE`], so an operator can check any logged envelope with
//! `ssh-keygen -Y verify -n clawfleet-operation`.

use std::path::Path;

use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};
use thiserror::Error;

use crate::allowed_signers::{AllowedSigners, CheckError};
use crate::envelope::{DecodeError, Envelope, Limits};
use crate::failure::{Failure, FailureCode};
use crate::ident::{Fingerprint, HostName, OperationId, Sha256Hex, sha256};

/// The SSHSIG namespace of every operation signature.
pub const SIGNATURE_NAMESPACE: &str = "clawfleet-operation";

/// Default tolerance for clocks that run ahead of the host's.
pub const DEFAULT_CLOCK_SKEW_SECONDS: u64 = 60;
/// Default longest span between issued-at and expires-at that a host accepts.
pub const DEFAULT_MAX_LIFETIME_SECONDS: u64 = 3600;

/// An envelope body and its armored signature, as they travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedEnvelope {
    /// The exact signed bytes (JSON).
    pub body: Vec<u8>,
    /// The SSHSIG signature in OpenSSH's armored form.
    pub signature: String,
}

/// Why signing failed.
#[derive(Debug, Error)]
pub enum SignError {
    #[error("the envelope cannot be serialized: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("the signing key cannot sign: {0}")]
    Key(ssh_key::Error),
}

/// Why a key file could not be used.
#[derive(Debug, Error)]
pub enum KeyFileError {
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("key file {path} is not an unencrypted OpenSSH Ed25519 private key: {message}")]
    Invalid { path: String, message: String },
}

/// Loads an unencrypted Ed25519 private key in OpenSSH format.
pub fn load_signing_key(path: &Path) -> Result<PrivateKey, KeyFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
        path: shown.clone(),
        source,
    })?;
    let key = PrivateKey::from_openssh(text.as_bytes()).map_err(|e| KeyFileError::Invalid {
        path: shown.clone(),
        message: e.to_string(),
    })?;
    if key.is_encrypted() || key.algorithm() != ssh_key::Algorithm::Ed25519 {
        return Err(KeyFileError::Invalid {
            path: shown,
            message: "an unencrypted ssh-ed25519 key is required".to_owned(),
        });
    }
    Ok(key)
}

/// The OpenSSH fingerprint (`SHA256:…`) of a public key.
pub fn fingerprint(key: &PublicKey) -> Fingerprint {
    Fingerprint::of(key)
}

impl SignedEnvelope {
    /// Serializes and signs an envelope.
    pub fn sign(envelope: &Envelope, key: &PrivateKey) -> Result<Self, SignError> {
        let body = envelope.to_bytes()?;
        Self::sign_bytes(body, key)
    }

    /// Signs bytes that are already an envelope body (used by tests and tools).
    pub fn sign_bytes(body: Vec<u8>, key: &PrivateKey) -> Result<Self, SignError> {
        let sig = key
            .sign(SIGNATURE_NAMESPACE, HashAlg::Sha512, &body)
            .map_err(SignError::Key)?;
        let signature = sig.to_pem(LineEnding::LF).map_err(SignError::Key)?;
        Ok(Self { body, signature })
    }

    /// The frame payload: body length (u32, big endian), body, armored signature.
    pub fn to_payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.body.len() + self.signature.len());
        // Bodies are bounded by `Limits::max_envelope`, far below u32::MAX.
        out.extend_from_slice(&(self.body.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.body);
        out.extend_from_slice(self.signature.as_bytes());
        out
    }

    /// Splits a frame payload, enforcing the size limits.
    pub fn from_payload(payload: &[u8], limits: &Limits) -> Result<Self, DecodeError> {
        let malformed = |message: &str| DecodeError::Malformed {
            what: "envelope frame",
            message: message.to_owned(),
        };
        let (len_bytes, rest) = payload
            .split_first_chunk::<4>()
            .ok_or_else(|| malformed("shorter than its 4-byte length prefix"))?;
        let len = u32::from_be_bytes(*len_bytes) as usize;
        if len > limits.max_envelope {
            return Err(DecodeError::TooLarge {
                what: "envelope",
                size: len,
                max: limits.max_envelope,
            });
        }
        if len > rest.len() {
            return Err(malformed("its body is shorter than its length prefix says"));
        }
        let (body, signature) = rest.split_at(len);
        if signature.len() > limits.max_signature {
            return Err(DecodeError::TooLarge {
                what: "signature",
                size: signature.len(),
                max: limits.max_signature,
            });
        }
        let signature = std::str::from_utf8(signature)
            .map_err(|_| malformed("its signature is not ASCII text"))?;
        Ok(Self {
            body: body.to_vec(),
            signature: signature.to_owned(),
        })
    }
}

/// The host an envelope must be addressed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    pub name: HostName,
    pub host_key: Fingerprint,
}

/// An envelope whose signature, signer, target and time window all checked out.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedEnvelope {
    pub envelope: Envelope,
    /// SHA-256 of the body: the replay check compares it for a reused operation id.
    pub body_sha256: Sha256Hex,
    /// Fingerprint of the key that signed.
    pub signer: Fingerprint,
}

/// Why an envelope was refused. `operation_id` is set only once the signature has verified,
/// so an untrusted id is never echoed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub operation_id: Option<OperationId>,
    pub failure: Failure,
}

impl Rejection {
    fn new(code: FailureCode, message: impl AsRef<str>) -> Self {
        Self {
            operation_id: None,
            failure: Failure::new(code, message),
        }
    }

    fn with_id(mut self, id: &OperationId) -> Self {
        self.operation_id = Some(id.clone());
        self
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.failure.fmt(f)
    }
}

impl std::error::Error for Rejection {}

/// Checks envelopes for one host.
#[derive(Debug, Clone)]
pub struct Verifier {
    pub signers: AllowedSigners,
    pub host: HostIdentity,
    pub limits: Limits,
    pub clock_skew_seconds: u64,
    pub max_lifetime_seconds: u64,
}

impl Verifier {
    /// A verifier with default limits.
    pub fn new(signers: AllowedSigners, host: HostIdentity) -> Self {
        Self {
            signers,
            host,
            limits: Limits::default(),
            clock_skew_seconds: DEFAULT_CLOCK_SKEW_SECONDS,
            max_lifetime_seconds: DEFAULT_MAX_LIFETIME_SECONDS,
        }
    }

    /// Verifies in an order that never parses the body before the signature holds:
    /// signature, signer key, then the envelope, its issuer, target and time window.
    pub fn verify(&self, signed: &SignedEnvelope, now: u64) -> Result<VerifiedEnvelope, Rejection> {
        if signed.body.len() > self.limits.max_envelope {
            return Err(Rejection::new(
                FailureCode::InputTooLarge,
                format!(
                    "envelope is {} bytes; at most {} are allowed",
                    signed.body.len(),
                    self.limits.max_envelope
                ),
            ));
        }
        let sig = SshSig::from_pem(signed.signature.as_bytes()).map_err(|e| {
            Rejection::new(
                FailureCode::SignatureInvalid,
                format!("the signature is not an SSHSIG signature: {e}"),
            )
        })?;
        if sig.namespace() != SIGNATURE_NAMESPACE {
            return Err(Rejection::new(
                FailureCode::SignatureInvalid,
                format!(
                    "the signature is for namespace {:?}, not {SIGNATURE_NAMESPACE:?}",
                    crate::ident::truncate_for_message(sig.namespace())
                ),
            ));
        }
        let key = PublicKey::from(sig.public_key().clone());
        key.verify(SIGNATURE_NAMESPACE, &signed.body, &sig)
            .map_err(|_| {
                Rejection::new(
                    FailureCode::SignatureInvalid,
                    "the signature does not verify over the envelope bytes",
                )
            })?;
        let signer = fingerprint(&key);
        if !self
            .signers
            .entries()
            .iter()
            .any(|e| e.key.key_data() == key.key_data())
        {
            return Err(Rejection::new(
                FailureCode::UnknownSigner,
                format!("signing key {signer} is not in allowed_signers"),
            ));
        }
        let envelope = Envelope::decode(&signed.body, &self.limits).map_err(|e| Rejection {
            operation_id: None,
            failure: e.to_failure(),
        })?;
        let id = &envelope.operation_id;
        self.signers
            .check(&key, envelope.issuer.as_str(), SIGNATURE_NAMESPACE, now)
            .map_err(|e| {
                let code = match e {
                    CheckError::OutsideValidity => FailureCode::SignerNotValid,
                    _ => FailureCode::UnknownSigner,
                };
                Rejection::new(code, format!("issuer {}: {e}", envelope.issuer)).with_id(id)
            })?;
        if envelope.target.host != self.host.name || envelope.target.host_key != self.host.host_key
        {
            return Err(Rejection::new(
                FailureCode::WrongHost,
                format!(
                    "the envelope is for host {} with key {}, this is {} with key {}",
                    envelope.target.host,
                    envelope.target.host_key,
                    self.host.name,
                    self.host.host_key
                ),
            )
            .with_id(id));
        }
        if envelope.expires_at - envelope.issued_at > self.max_lifetime_seconds {
            return Err(Rejection::new(
                FailureCode::InvalidInput,
                format!(
                    "the envelope is valid for {} s; at most {} s are accepted",
                    envelope.expires_at - envelope.issued_at,
                    self.max_lifetime_seconds
                ),
            )
            .with_id(id));
        }
        if now.saturating_add(self.clock_skew_seconds) < envelope.issued_at {
            return Err(Rejection::new(
                FailureCode::EnvelopeNotYetValid,
                format!(
                    "the envelope was issued {} s in the future (clock skew allowed: {} s)",
                    envelope.issued_at - now,
                    self.clock_skew_seconds
                ),
            )
            .with_id(id));
        }
        if now >= envelope.expires_at {
            return Err(Rejection::new(
                FailureCode::EnvelopeExpired,
                format!("the envelope expired {} s ago", now - envelope.expires_at),
            )
            .with_id(id));
        }
        Ok(VerifiedEnvelope {
            body_sha256: Sha256Hex::from_digest(&sha256(&signed.body)),
            envelope,
            signer,
        })
    }
}
