//! Encryption at rest of the secrets the database holds (cluster credentials, workspace file
//! contents, secret values), so a copy of the database alone (a dump, a backup, a stolen file) discloses
//! none of them.
//!
//! The key-encryption key is 32 random bytes, hex, in a file of its own outside the database
//! (`encryption_key_file` in occ.toml, created 0600 by `occ init`); every coordinator sharing
//! a database needs the same file. Each value is sealed with AES-256-GCM (`ring`) under a
//! fresh random 96-bit nonce, with the row it belongs to as associated data (a sealed value
//! copied into another row does not open). Sealed bytes are versioned: `0x01 || nonce ||
//! ciphertext || tag`; in a text column they are `sealed1:` and their hex.

use std::path::{Path, PathBuf};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use super::StoreError;

/// The version byte of the sealed format.
const VERSION: u8 = 1;
/// The prefix of a sealed value in a text column.
pub const TEXT_PREFIX: &str = "sealed1:";
/// Bytes of the key.
const KEY_LEN: usize = 32;

/// Seals and opens values under the key-encryption key.
pub struct Sealer {
    key: LessSafeKey,
    /// Where the key came from, for error messages.
    source: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn key_error(path: &Path, message: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("encryption_key_file {}: {message}", path.display()))
}

impl Sealer {
    fn from_bytes(bytes: &[u8; KEY_LEN], source: String) -> Self {
        // AES-256-GCM takes any 32 bytes: this cannot fail.
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).unwrap_or_else(|_| unreachable!());
        Self {
            key: LessSafeKey::new(unbound),
            source,
            rng: SystemRandom::new(),
        }
    }

    /// A key of this process only (in-memory stores and tests): what it seals is unreadable
    /// after the process ends.
    pub fn ephemeral() -> Self {
        let mut bytes = [0u8; KEY_LEN];
        // The system's random source failing is beyond recovery here.
        if SystemRandom::new().fill(&mut bytes).is_err() {
            panic!("the system random number generator failed");
        }
        Self::from_bytes(&bytes, "an ephemeral key".to_owned())
    }

    /// Reads the key file: 64 hex digits, mode 0600 or stricter.
    pub fn load(path: &Path) -> Result<Self, StoreError> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).map_err(|e| {
            key_error(
                path,
                format!("{e} (`occ init` creates it; every coordinator sharing a database needs the same file)"),
            )
        })?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(key_error(
                path,
                format!(
                    "is mode {:o}: the key must be readable by its owner only (chmod 600)",
                    meta.permissions().mode() & 0o777
                ),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| key_error(path, e))?;
        let bytes = decode_hex(text.trim())
            .filter(|b| b.len() == KEY_LEN)
            .ok_or_else(|| key_error(path, "does not hold a key (64 hex digits)"))?;
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&bytes);
        Ok(Self::from_bytes(&key, format!("{}", path.display())))
    }

    /// Creates the key file (0600, complete or absent) unless it exists; true if created.
    pub fn create_file(path: &Path) -> Result<bool, StoreError> {
        let mut bytes = [0u8; KEY_LEN];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| key_error(path, "the system random number generator failed"))?;
        let text = format!("{}\n", clawfleet_protocol::ident::hex(&bytes));
        clawfleet_protocol::atomic_file::create_once(path, text.as_bytes(), 0o600)
            .map_err(|e| key_error(path, e))
    }

    /// Seals `plain` for the row `context` names.
    pub fn seal(&self, context: &str, plain: &[u8]) -> Result<Vec<u8>, StoreError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| {
            StoreError::Database("the system random number generator failed".into())
        })?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + plain.len() + 16);
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut body,
            )
            .map_err(|_| StoreError::Database(format!("cannot seal {context}")))?;
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Opens what [`Sealer::seal`] sealed for `context`.
    pub fn open(&self, context: &str, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
        let (Some(&VERSION), Some(rest)) = (sealed.first(), sealed.get(1..)) else {
            return Err(StoreError::Corrupt(format!(
                "{context}: not a sealed value of a version this coordinator knows"
            )));
        };
        if rest.len() < NONCE_LEN + 16 {
            return Err(StoreError::Corrupt(format!(
                "{context}: sealed value too short"
            )));
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let mut nonce_bytes = [0u8; NONCE_LEN];
        nonce_bytes.copy_from_slice(nonce);
        let mut body = body.to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(context.as_bytes()),
                &mut body,
            )
            .map_err(|_| {
                StoreError::Key(format!(
                    "cannot decrypt {context}: the key in encryption_key_file ({}) is not the \
                     one it was encrypted with (every coordinator sharing a database needs the \
                     same key file)",
                    self.source
                ))
            })?;
        Ok(plain.to_vec())
    }

    /// [`Sealer::seal`] for a text column: `sealed1:` and hex.
    pub fn seal_text(&self, context: &str, plain: &str) -> Result<String, StoreError> {
        Ok(format!(
            "{TEXT_PREFIX}{}",
            clawfleet_protocol::ident::hex(&self.seal(context, plain.as_bytes())?)
        ))
    }

    /// Opens a text column's value; one stored before encryption at rest (no `sealed1:`)
    /// is returned as it is.
    pub fn open_text(&self, context: &str, stored: String) -> Result<String, StoreError> {
        let Some(hex) = stored.strip_prefix(TEXT_PREFIX) else {
            return Ok(stored);
        };
        let sealed = decode_hex(hex)
            .ok_or_else(|| StoreError::Corrupt(format!("{context}: sealed value is not hex")))?;
        String::from_utf8(self.open(context, &sealed)?)
            .map_err(|_| StoreError::Corrupt(format!("{context}: not text")))
    }
}

/// The associated data of a cluster's credentials.
pub fn cluster_context(name: &str) -> String {
    format!("cluster {name} credentials")
}

/// The associated data of a workspace file's content.
pub fn workspace_context(ns: &str, agent: &str, name: &str) -> String {
    format!("workspace file {ns}/{agent}/{name}")
}

/// The associated data of a secret version's value.
pub fn secret_context(ns: &str, name: &str, version: u32) -> String {
    format!("secret {ns}/{name} version {version}")
}

/// The default key file of a state directory.
pub fn default_key_file(state_dir: &Path) -> PathBuf {
    state_dir.join("keys").join("encryption.key")
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_and_row() {
        let a = Sealer::ephemeral();
        let b = Sealer::ephemeral();
        let sealed = a.seal("row 1", b"secret").unwrap();
        assert_eq!(sealed[0], VERSION);
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(a.open("row 1", &sealed).unwrap(), b"secret");
        assert!(a.open("row 2", &sealed).is_err());
        let e = b.open("row 1", &sealed).unwrap_err().to_string();
        assert!(e.contains("encryption_key_file"), "{e}");
        // Two seals of one value differ (random nonces).
        assert_ne!(sealed, a.seal("row 1", b"secret").unwrap());
        let t = a.seal_text("c", "{\"token\":\"x\"}").unwrap();
        assert!(t.starts_with(TEXT_PREFIX));
        assert_eq!(a.open_text("c", t).unwrap(), "{\"token\":\"x\"}");
        assert_eq!(a.open_text("c", "{}".into()).unwrap(), "{}");
    }

    #[test]
    fn the_key_file_is_created_private_and_refused_when_not() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("occ-seal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k");
        let _ = std::fs::remove_file(&path);
        assert!(Sealer::create_file(&path).unwrap());
        assert!(!Sealer::create_file(&path).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let one = Sealer::load(&path).unwrap();
        let sealed = one.seal("x", b"v").unwrap();
        assert_eq!(
            Sealer::load(&path).unwrap().open("x", &sealed).unwrap(),
            b"v"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Sealer::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("encryption_key_file") && e.contains("644"),
            "{e}"
        );
        std::fs::write(&path, "nothex").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Sealer::load(&path).unwrap_err().to_string();
        assert!(e.contains("64 hex digits"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
