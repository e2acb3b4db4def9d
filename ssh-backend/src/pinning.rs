//! Host key pinning: the coordinator trusts exactly the key its database pinned for a host,
//! compared by key data in `check_server_key`. russh's known_hosts helpers are never used
//! (they miss patterns, tab-separated lines and `@revoked`).

use std::sync::{Arc, Mutex};

use clawfleet_protocol::Fingerprint;
use russh::client;
use russh::keys::{PublicKey, PublicKeyOrCertificate};
use thiserror::Error;

/// A host key pinned in the coordinator's database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedKey {
    key: PublicKey,
    fingerprint: Fingerprint,
}

/// Why a pinned key line is not usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the pinned host key is not one OpenSSH public key line: {message}")]
pub struct PinError {
    message: String,
}

impl PinnedKey {
    /// Parses one OpenSSH public key line (`ssh-ed25519 AAAA… [comment]`). The comment is
    /// ignored; only the key data is compared.
    pub fn parse(line: &str) -> Result<Self, PinError> {
        let line = line.trim();
        if line.is_empty() || line.contains('\n') {
            return Err(PinError {
                message: "expected exactly one non-empty line".to_owned(),
            });
        }
        let key = PublicKey::from_openssh(line).map_err(|e| PinError {
            message: e.to_string(),
        })?;
        let fingerprint = Fingerprint::of(&key);
        Ok(Self { key, fingerprint })
    }

    /// The pinned key.
    pub fn key(&self) -> &PublicKey {
        &self.key
    }

    /// Its OpenSSH SHA-256 fingerprint (what envelopes name as the target's host key).
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Whether a presented key is exactly this one (same algorithm and key data).
    pub fn matches(&self, presented: &PublicKey) -> bool {
        presented.key_data() == self.key.key_data()
    }
}

/// What the server presented in the handshake, kept for the error message.
pub(crate) type PresentedSlot = Arc<Mutex<Option<String>>>;

/// Errors of the russh client handler.
#[derive(Debug, Error)]
pub(crate) enum HandlerError {
    #[error("SSH protocol error: {0}")]
    Ssh(#[from] russh::Error),
    #[error("the host presented key {presented}, which is not the pinned key")]
    KeyMismatch { presented: String },
}

/// The russh client handler: accepts the server only if it presents the pinned key.
#[derive(Debug)]
pub(crate) struct PinningHandler {
    pub(crate) pinned: Option<PinnedKey>,
    pub(crate) presented: PresentedSlot,
}

impl client::Handler for PinningHandler {
    type Error = HandlerError;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let (presented, accepted) = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => (
                Fingerprint::of(key).to_string(),
                self.pinned.as_ref().is_some_and(|p| p.matches(key)),
            ),
            // Certificates are never advertised by this client; refuse one if it comes anyway.
            PublicKeyOrCertificate::Certificate(cert) => (
                format!(
                    "a certificate for {}",
                    cert.public_key().fingerprint(russh::keys::HashAlg::Sha256)
                ),
                false,
            ),
        };
        if let Ok(mut slot) = self.presented.lock() {
            *slot = Some(presented.clone());
        }
        if accepted {
            Ok(true)
        } else {
            Err(HandlerError::KeyMismatch { presented })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH2XWBTUF5xwdK3EqFuvX2HpjScSyGnppPngNQjqE4jL a@b";

    #[test]
    fn parses_and_ignores_comments() {
        let a = PinnedKey::parse(A);
        let Ok(a) = a else {
            panic!("{a:?}");
        };
        let Some(no_comment) = A.rsplit_once(' ').map(|(k, _)| k) else {
            panic!("no comment");
        };
        let Ok(b) = PinnedKey::parse(no_comment) else {
            panic!("no parse");
        };
        assert!(a.matches(b.key()));
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert!(a.fingerprint().as_str().starts_with("SHA256:"));
    }

    #[test]
    fn refuses_garbage_and_several_lines() {
        assert!(PinnedKey::parse("").is_err());
        assert!(PinnedKey::parse("ssh-ed25519 nonsense").is_err());
        assert!(PinnedKey::parse(&format!("{A}\n{A}")).is_err());
    }
}
