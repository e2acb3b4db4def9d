//! Secrets on their way to a host: names, fingerprints, and the sealed form in which a value
//! travels inside a signed envelope.
//!
//! A value is sealed to the target host's ssh-ed25519 host key, the key the coordinator pinned
//! at enrolment and checks on every SSH connection, so the host needs no key of its own and
//! enrolment does not change. The construction is the one `age` uses for ssh-ed25519
//! recipients, without its file format: the Ed25519 public key is mapped to its X25519
//! (Montgomery) form; the sender draws an ephemeral X25519 key, derives a key with
//! HKDF-SHA-256 from the shared secret (salt: the ephemeral and the recipient public key), and
//! encrypts with ChaCha20-Poly1305 (a fresh key per value, so a zero nonce). The associated
//! data binds the ciphertext to the Namespace, Agent, secret name, version and fingerprint: a
//! sealed value copied into another Agent's or another name's slot does not open. The host
//! derives the X25519 scalar from its Ed25519 private key (SHA-512 of the seed, clamped), as
//! `age` does.
//!
//! What travels, what the coordinator may log and what hostd's operation journal keeps is the
//! ciphertext and the `sha256:` fingerprint of the value, never the value.

use std::fmt;

use base64ct::{Base64, Encoding};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use curve25519_dalek::edwards::CompressedEdwardsY;
use curve25519_dalek::montgomery::MontgomeryPoint;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};

use thiserror::Error;
use zeroize::Zeroizing;

use crate::ident::Ident;
pub use crate::secret::{SecretFingerprint, SecretName, VALUE_MAX, check_value};

/// Most secrets one Agent may have bound.
pub const MAX_SECRETS_PER_AGENT: usize = 32;

/// The HKDF info string, and the version of the construction.
const INFO: &[u8] = b"clawfleet-secret-v1";

/// Which secret version, by name and fingerprint (never the value).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretVersion {
    pub name: SecretName,
    /// The secret's version number in the coordinator (1 on).
    pub version: u64,
    pub fingerprint: SecretFingerprint,
}

/// One secret value sealed to a host key, as it travels in `put-secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SealedSecret {
    pub name: SecretName,
    pub version: u64,
    pub fingerprint: SecretFingerprint,
    /// The sender's ephemeral X25519 public key, base64.
    pub ephemeral: String,
    /// ChaCha20-Poly1305 ciphertext and tag, base64.
    pub ciphertext: String,
}

impl SealedSecret {
    /// Its name, version and fingerprint.
    pub fn version(&self) -> SecretVersion {
        SecretVersion {
            name: self.name.clone(),
            version: self.version,
            fingerprint: self.fingerprint.clone(),
        }
    }
}

/// Checks an Agent's whole set of secrets by name and version, as `put-secrets` and a
/// cluster's Secret take it: at most [`MAX_SECRETS_PER_AGENT`], each name once, versions from
/// 1. The error is the field's path (`secrets[i].…`) and a sentence, never a value.
pub fn check_set<'a>(
    set: impl ExactSizeIterator<Item = (&'a SecretName, u64)>,
) -> Result<(), (String, String)> {
    if set.len() > MAX_SECRETS_PER_AGENT {
        return Err((
            "secrets".to_owned(),
            format!(
                "at most {MAX_SECRETS_PER_AGENT} secrets per Agent, got {}",
                set.len()
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, (name, version)) in set.enumerate() {
        if !seen.insert(name.as_str()) {
            return Err((
                format!("secrets[{i}].name"),
                format!("secret {name} is named twice"),
            ));
        }
        if version == 0 {
            return Err((
                format!("secrets[{i}].version"),
                "a secret version starts at 1".to_owned(),
            ));
        }
    }
    Ok(())
}

/// Arguments of `put-secrets`: the Agent's whole set of secrets (an empty list removes them
/// all). Fenced like every other per-Agent change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutSecretsArgs {
    pub namespace: crate::operation::NamespaceRef,
    pub agent: crate::operation::AgentRef,
    pub secrets: Vec<SealedSecret>,
}

impl PutSecretsArgs {
    /// Checks what serde cannot: at most [`MAX_SECRETS_PER_AGENT`], each name once, versions
    /// from 1. The error is the field's path and a sentence.
    pub fn check(&self) -> Result<(), (String, String)> {
        check_set(self.secrets.iter().map(|s| (&s.name, s.version)))
    }

    /// The set's names, versions and fingerprints, by name.
    pub fn versions(&self) -> Vec<SecretVersion> {
        let mut v: Vec<_> = self.secrets.iter().map(SealedSecret::version).collect();
        v.sort();
        v
    }
}

/// The result of `put-secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PutSecretsResult {
    /// The Agent's secrets on the host now, by name.
    pub secrets: Vec<SecretVersion>,
    /// Whether the host's set changed (false: it already held exactly these versions).
    pub changed: bool,
    /// Whether the files were also written where the running gateway reads them (false when
    /// the gateway is not running: its next start writes them).
    pub delivered_to_running_gateway: bool,
}

/// Why a value could not be sealed.
#[derive(Debug, Error)]
pub enum SealError {
    #[error(
        "the host key is not an ssh-ed25519 key; secrets are sealed only to ssh-ed25519 host keys"
    )]
    NotEd25519,
    #[error("the host key is not a valid Ed25519 point")]
    InvalidKey,
    #[error("secret {name}: {message}")]
    Value { name: SecretName, message: String },
    #[error(transparent)]
    Random(#[from] crate::random::RandomError),
    #[error("the cipher refused the value")]
    Cipher,
}

/// Why a sealed value could not be opened. No variant carries any part of the value.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("secret {name}: `{field}` is not base64 of the expected length")]
    Encoding {
        name: SecretName,
        field: &'static str,
    },
    #[error(
        "secret {name}: does not decrypt with this host's key for this Agent (sealed to another host key, Agent or name, or altered)"
    )]
    Undecryptable { name: SecretName },
    #[error("secret {name}: the decrypted value does not have the stated fingerprint")]
    FingerprintMismatch { name: SecretName },
    #[error("secret {name}: {message}")]
    Value { name: SecretName, message: String },
}

/// Why the host's private key is not usable for secrets.
#[derive(Debug, Error)]
pub enum HostKeyError {
    #[error("the host's private key does not parse as an OpenSSH private key: {0}")]
    Parse(String),
    #[error("the host's private key is encrypted; hostd needs the unencrypted host key")]
    Encrypted,
    #[error("the host's private key is not an ssh-ed25519 key")]
    NotEd25519,
}

fn montgomery_of(public: &ssh_key::PublicKey) -> Result<MontgomeryPoint, SealError> {
    let ed = public.key_data().ed25519().ok_or(SealError::NotEd25519)?;
    let point = CompressedEdwardsY(ed.0)
        .decompress()
        .ok_or(SealError::InvalidKey)?;
    if point.is_small_order() {
        return Err(SealError::InvalidKey);
    }
    Ok(point.to_montgomery())
}

fn aad(namespace: &Ident, agent: &Ident, v: &SecretVersion) -> Vec<u8> {
    // Length-prefixed fields, so no two bindings share bytes.
    let mut out = Vec::new();
    for field in [
        namespace.as_str(),
        agent.as_str(),
        v.name.as_str(),
        &v.version.to_string(),
        v.fingerprint.as_str(),
    ] {
        out.extend_from_slice(&(field.len() as u32).to_be_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    out
}

fn cipher(
    shared: &MontgomeryPoint,
    ephemeral: &MontgomeryPoint,
    recipient: &MontgomeryPoint,
) -> ChaCha20Poly1305 {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(ephemeral.as_bytes());
    salt[32..].copy_from_slice(recipient.as_bytes());
    let hk = hkdf::Hkdf::<Sha256>::new(Some(&salt), shared.as_bytes());
    let mut key = Zeroizing::new([0u8; 32]);
    // 32 bytes is far below HKDF-SHA-256's 8160-byte limit: this cannot fail.
    if hk.expand(INFO, key.as_mut()).is_err() {
        unreachable!("HKDF-SHA-256 expands to 32 bytes");
    }
    ChaCha20Poly1305::new(&(*key).into())
}

/// Seals `value` (secret `name`, `version`) for one Agent to the host's ssh-ed25519 key.
pub fn seal(
    host_key: &ssh_key::PublicKey,
    namespace: &Ident,
    agent: &Ident,
    name: &SecretName,
    version: u64,
    value: &[u8],
) -> Result<SealedSecret, SealError> {
    check_value(value).map_err(|e| SealError::Value {
        name: name.clone(),
        message: e.to_string(),
    })?;
    let recipient = montgomery_of(host_key)?;
    let mut scalar = Zeroizing::new([0u8; 32]);
    crate::random::fill(scalar.as_mut())?;
    let ephemeral = MontgomeryPoint::mul_base_clamped(*scalar);
    let shared = recipient.mul_clamped(*scalar);
    let v = SecretVersion {
        name: name.clone(),
        version,
        fingerprint: SecretFingerprint::of(value),
    };
    let ciphertext = cipher(&shared, &ephemeral, &recipient)
        .encrypt(
            &Nonce::default(),
            Payload {
                msg: value,
                aad: &aad(namespace, agent, &v),
            },
        )
        .map_err(|_| SealError::Cipher)?;
    Ok(SealedSecret {
        name: v.name,
        version,
        fingerprint: v.fingerprint,
        ephemeral: Base64::encode_string(ephemeral.as_bytes()),
        ciphertext: Base64::encode_string(&ciphertext),
    })
}

/// The host's X25519 key, derived from its ssh-ed25519 private key.
pub struct HostSecretKey {
    scalar: Zeroizing<[u8; 32]>,
    public: MontgomeryPoint,
}

impl fmt::Debug for HostSecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSecretKey").finish_non_exhaustive()
    }
}

impl HostSecretKey {
    /// From the text of an OpenSSH private key file (`/etc/ssh/ssh_host_ed25519_key`).
    pub fn from_openssh(text: &str) -> Result<Self, HostKeyError> {
        let key = ssh_key::PrivateKey::from_openssh(text)
            .map_err(|e| HostKeyError::Parse(e.to_string()))?;
        if key.is_encrypted() {
            return Err(HostKeyError::Encrypted);
        }
        let pair = key.key_data().ed25519().ok_or(HostKeyError::NotEd25519)?;
        Ok(Self::from_seed(&pair.private.to_bytes()))
    }

    /// From an Ed25519 seed (the 32 private bytes of an ssh-ed25519 key).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let mut digest = Sha512::digest(seed);
        let mut scalar = Zeroizing::new([0u8; 32]);
        scalar.copy_from_slice(&digest[..32]);
        zeroize::Zeroize::zeroize(digest.as_mut_slice());
        let public = MontgomeryPoint::mul_base_clamped(*scalar);
        Self { scalar, public }
    }

    /// Opens one sealed value for an Agent and checks its fingerprint and limits.
    pub fn open(
        &self,
        namespace: &Ident,
        agent: &Ident,
        sealed: &SealedSecret,
    ) -> Result<Zeroizing<Vec<u8>>, OpenError> {
        let name = || sealed.name.clone();
        let eph = Base64::decode_vec(&sealed.ephemeral)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
            .ok_or_else(|| OpenError::Encoding {
                name: name(),
                field: "ephemeral",
            })?;
        let ciphertext = Base64::decode_vec(&sealed.ciphertext)
            .ok()
            .filter(|c| c.len() <= VALUE_MAX + 16)
            .ok_or_else(|| OpenError::Encoding {
                name: name(),
                field: "ciphertext",
            })?;
        let ephemeral = MontgomeryPoint(eph);
        let shared = ephemeral.mul_clamped(*self.scalar);
        if shared.as_bytes().iter().all(|b| *b == 0) {
            return Err(OpenError::Undecryptable { name: name() });
        }
        let value = cipher(&shared, &ephemeral, &self.public)
            .decrypt(
                &Nonce::default(),
                Payload {
                    msg: &ciphertext,
                    aad: &aad(namespace, agent, &sealed.version()),
                },
            )
            .map_err(|_| OpenError::Undecryptable { name: name() })?;
        let value = Zeroizing::new(value);
        if SecretFingerprint::of(&value) != sealed.fingerprint {
            return Err(OpenError::FingerprintMismatch { name: name() });
        }
        check_value(&value).map_err(|e| OpenError::Value {
            name: name(),
            message: e.to_string(),
        })?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keypair() -> (ssh_key::PrivateKey, ssh_key::PublicKey) {
        let private = ssh_key::PrivateKey::random(
            &mut ssh_key::rand_core::UnwrapErr(ssh_key::getrandom::SysRng),
            ssh_key::Algorithm::Ed25519,
        )
        .unwrap();
        let public = private.public_key().clone();
        (private, public)
    }

    fn host(private: &ssh_key::PrivateKey) -> HostSecretKey {
        HostSecretKey::from_openssh(&private.to_openssh(ssh_key::LineEnding::LF).unwrap()).unwrap()
    }

    fn id(s: &str) -> Ident {
        Ident::new(s).unwrap()
    }

    #[test]
    fn a_value_sealed_to_a_host_opens_there_for_that_agent_only() {
        let (private, public) = keypair();
        let name = SecretName::new("slack-bot").unwrap();
        let sealed = seal(&public, &id("ns"), &id("a1"), &name, 3, b"xoxb-123").unwrap();
        assert_eq!(sealed.fingerprint, SecretFingerprint::of(b"xoxb-123"));
        let text = serde_json::to_string(&sealed).unwrap();
        assert!(!text.contains("xoxb"), "{text}");
        let key = host(&private);
        assert_eq!(
            key.open(&id("ns"), &id("a1"), &sealed).unwrap().as_slice(),
            b"xoxb-123"
        );
        // Another Agent, Namespace, name or version: does not open.
        assert!(matches!(
            key.open(&id("ns"), &id("a2"), &sealed),
            Err(OpenError::Undecryptable { .. })
        ));
        assert!(matches!(
            key.open(&id("ns2"), &id("a1"), &sealed),
            Err(OpenError::Undecryptable { .. })
        ));
        let mut renamed = sealed.clone();
        renamed.name = SecretName::new("other").unwrap();
        assert!(key.open(&id("ns"), &id("a1"), &renamed).is_err());
        let mut bumped = sealed.clone();
        bumped.version = 4;
        assert!(key.open(&id("ns"), &id("a1"), &bumped).is_err());
        // A changed fingerprint is bound too.
        let mut lied = sealed.clone();
        lied.fingerprint = SecretFingerprint::of(b"other");
        assert!(key.open(&id("ns"), &id("a1"), &lied).is_err());
        // Another host's key does not open it.
        let (other, _) = keypair();
        assert!(matches!(
            host(&other).open(&id("ns"), &id("a1"), &sealed),
            Err(OpenError::Undecryptable { .. })
        ));
    }

    #[test]
    fn an_altered_ciphertext_or_bad_encoding_is_refused() {
        let (private, public) = keypair();
        let name = SecretName::new("k").unwrap();
        let sealed = seal(&public, &id("ns"), &id("a"), &name, 1, b"value").unwrap();
        let key = host(&private);
        let mut bytes = Base64::decode_vec(&sealed.ciphertext).unwrap();
        bytes[0] ^= 1;
        let mut altered = sealed.clone();
        altered.ciphertext = Base64::encode_string(&bytes);
        assert!(matches!(
            key.open(&id("ns"), &id("a"), &altered),
            Err(OpenError::Undecryptable { .. })
        ));
        let mut bad = sealed.clone();
        bad.ephemeral = "!!".to_owned();
        assert!(matches!(
            key.open(&id("ns"), &id("a"), &bad),
            Err(OpenError::Encoding {
                field: "ephemeral",
                ..
            })
        ));
        // The all-zero (low-order) ephemeral point gives no key.
        let mut zero = sealed;
        zero.ephemeral = Base64::encode_string(&[0u8; 32]);
        assert!(key.open(&id("ns"), &id("a"), &zero).is_err());
    }

    #[test]
    fn each_seal_differs_and_values_are_checked() {
        let (_, public) = keypair();
        let name = SecretName::new("k").unwrap();
        let a = seal(&public, &id("ns"), &id("a"), &name, 1, b"v").unwrap();
        let b = seal(&public, &id("ns"), &id("a"), &name, 1, b"v").unwrap();
        assert_ne!(a.ciphertext, b.ciphertext);
        assert_ne!(a.ephemeral, b.ephemeral);
        for bad in [&b""[..], b"a\0b", &[0xff, 0xfe]] {
            assert!(matches!(
                seal(&public, &id("ns"), &id("a"), &name, 1, bad),
                Err(SealError::Value { .. })
            ));
        }
        assert!(
            seal(
                &public,
                &id("ns"),
                &id("a"),
                &name,
                1,
                &vec![b'x'; VALUE_MAX]
            )
            .is_ok()
        );
        assert!(
            seal(
                &public,
                &id("ns"),
                &id("a"),
                &name,
                1,
                &vec![b'x'; VALUE_MAX + 1]
            )
            .is_err()
        );
    }

    #[test]
    fn the_host_scalar_matches_the_ed25519_public_key() {
        // The X25519 public key derived from the private seed is the Montgomery form of the
        // Ed25519 public key (what the sender seals to).
        let (private, public) = keypair();
        assert_eq!(host(&private).public, montgomery_of(&public).unwrap());
    }
}
