//! Validated identifiers.
//!
//! Every identifier that reaches a host is checked when it is decoded, so hostd never builds a
//! path, an account name or a unit name from an unchecked string.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// Why a string is not a valid identifier of some kind.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentError {
    #[error("must not be empty")]
    Empty,
    #[error("is {len} characters long; at most {max} are allowed")]
    TooLong { len: usize, max: usize },
    #[error("contains {found:?} at position {position}; only {allowed} are allowed")]
    BadCharacter {
        found: char,
        position: usize,
        allowed: &'static str,
    },
    #[error("must start and end with a letter or digit")]
    BadEdge,
    #[error("must look like {expected}")]
    BadShape { expected: &'static str },
}

fn check_chars(
    value: &str,
    max: usize,
    allowed: &'static str,
    ok: impl Fn(char) -> bool,
) -> Result<(), IdentError> {
    if value.is_empty() {
        return Err(IdentError::Empty);
    }
    let len = value.chars().count();
    if len > max {
        return Err(IdentError::TooLong { len, max });
    }
    if let Some((position, found)) = value.char_indices().find(|(_, c)| !ok(*c)) {
        return Err(IdentError::BadCharacter {
            found,
            position,
            allowed,
        });
    }
    Ok(())
}

fn label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

fn alnum_edges(value: &str) -> Result<(), IdentError> {
    let first = value.chars().next();
    let last = value.chars().last();
    match (first, last) {
        (Some(f), Some(l)) if f.is_ascii_alphanumeric() && l.is_ascii_alphanumeric() => Ok(()),
        _ => Err(IdentError::BadEdge),
    }
}

/// Declares a validated string newtype with serde support that validates on decode.
macro_rules! validated_string {
    ($(#[$meta:meta])* $name:ident, $check:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Checks `value` and wraps it.
            pub fn new(value: impl Into<String>) -> Result<Self, IdentError> {
                let value = value.into();
                let check: fn(&str) -> Result<(), IdentError> = $check;
                check(&value)?;
                Ok(Self(value))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        // Read as text wherever text is expected (formatting, lookups, SQL parameters);
        // only construction checks, so a typed value never needs checking again.
        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdentError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(deserializer)?;
                Self::new(raw.as_str()).map_err(|e| {
                    serde::de::Error::custom(format_args!(
                        "invalid {}: {:?} {}",
                        stringify!($name),
                        truncate_for_message(&raw),
                        e
                    ))
                })
            }
        }
    };
}

/// Shortens untrusted text before it goes into an error message.
pub(crate) fn truncate_for_message(value: &str) -> String {
    crate::text::clean(value, 80)
}

/// Longest identifier: 63 characters, so that every identifier is also a valid Kubernetes label
/// value.
pub const IDENT_MAX: usize = 63;

validated_string!(
    /// A Namespace, Agent, service principal or revision id: 1–63 characters of
    /// `[A-Za-z0-9._-]`, first and last alphanumeric (also a valid Kubernetes label value).
    Ident,
    |v| {
        check_chars(v, IDENT_MAX, "letters, digits, '.', '_' and '-'", label_char)?;
        alnum_edges(v)
    }
);

validated_string!(
    /// An operation id (the idempotency key): 1–128 characters of `[A-Za-z0-9._-]`, first and
    /// last alphanumeric.
    OperationId,
    |v| {
        check_chars(v, 128, "letters, digits, '.', '_' and '-'", label_char)?;
        alnum_edges(v)
    }
);

validated_string!(
    /// A host name as the coordinator knows it: 1–253 characters of `[A-Za-z0-9.-]`, first and
    /// last alphanumeric.
    HostName,
    |v| {
        check_chars(v, 253, "letters, digits, '.' and '-'", |c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '-')
        })?;
        alnum_edges(v)
    }
);

validated_string!(
    /// An allowed_signers principal: 1–128 characters of `[A-Za-z0-9._@+-]`, no patterns.
    Principal,
    |v| check_chars(v, 128, "letters, digits, '.', '_', '@', '+' and '-'", |c| {
        c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '+' | '-')
    })
);

validated_string!(
    /// An SSH key fingerprint in OpenSSH's form: `SHA256:` followed by 43 unpadded base64
    /// characters.
    Fingerprint,
    |v| {
        let body = v.strip_prefix("SHA256:").ok_or(IdentError::BadShape {
            expected: "SHA256:<43 base64 characters>",
        })?;
        if body.len() != 43
            || !body
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '/')
        {
            return Err(IdentError::BadShape {
                expected: "SHA256:<43 base64 characters>",
            });
        }
        Ok(())
    }
);

validated_string!(
    /// A SHA-256 digest as 64 lowercase hex characters.
    Sha256Hex,
    |v| {
        if v.len() != 64 || !v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(IdentError::BadShape {
                expected: "64 lowercase hex characters",
            });
        }
        Ok(())
    }
);

validated_string!(
    /// A secret's name (`crate::secret`): 1–48 characters of `[a-z0-9-]`, starting with a
    /// letter and ending with a letter or digit, so `clawfleet-<name>` is a valid OpenClaw
    /// secret provider name and `<name>` a valid file name.
    SecretName,
    |v| {
        check_chars(v, crate::secret::NAME_MAX, "lowercase letters, digits and '-'", |c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
        })?;
        let first = v.chars().next();
        let last = v.chars().last();
        match (first, last) {
            (Some(f), Some(l)) if f.is_ascii_lowercase() && (l.is_ascii_lowercase() || l.is_ascii_digit()) => Ok(()),
            _ => Err(IdentError::BadShape {
                expected: "a lowercase letter first and a lowercase letter or digit last",
            }),
        }
    }
);

validated_string!(
    /// A secret value's fingerprint: `sha256:` and the 64 lowercase hex digits of SHA-256 over
    /// the value's exact bytes.
    SecretFingerprint,
    |v| {
        let hex = v.strip_prefix("sha256:").ok_or(IdentError::BadShape {
            expected: "sha256:<64 lowercase hex digits>",
        })?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(IdentError::BadShape {
                expected: "sha256:<64 lowercase hex digits>",
            });
        }
        Ok(())
    }
);

impl SecretFingerprint {
    /// The fingerprint of a value: `sha256:` and the hex of SHA-256 over its exact bytes.
    pub fn of(value: &[u8]) -> Self {
        Self(format!("sha256:{}", hex(&sha256(value))))
    }
}

impl Fingerprint {
    /// The OpenSSH SHA-256 fingerprint of a public key.
    pub fn of(key: &ssh_key::PublicKey) -> Self {
        Self(key.fingerprint(ssh_key::HashAlg::Sha256).to_string())
    }
}

impl Sha256Hex {
    /// The hex form of a digest.
    pub fn from_digest(digest: &[u8; 32]) -> Self {
        Self(hex(digest))
    }
}

/// Lowercase hex of some bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

/// SHA-256 of some bytes.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(&digest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ident_accepts_label_values() {
        for ok in ["a", "A1", "ns-1", "a.b_c-d", &"x".repeat(63)] {
            assert!(Ident::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn ident_rejects_each_class() {
        assert_eq!(Ident::new(""), Err(IdentError::Empty));
        assert!(matches!(
            Ident::new("x".repeat(64)),
            Err(IdentError::TooLong { len: 64, max: 63 })
        ));
        assert!(matches!(
            Ident::new("a/b"),
            Err(IdentError::BadCharacter { found: '/', .. })
        ));
        assert!(matches!(
            Ident::new("a b"),
            Err(IdentError::BadCharacter { found: ' ', .. })
        ));
        assert!(matches!(
            Ident::new("é"),
            Err(IdentError::BadCharacter { .. })
        ));
        assert_eq!(Ident::new("-a"), Err(IdentError::BadEdge));
        assert_eq!(Ident::new("a."), Err(IdentError::BadEdge));
        assert_eq!(Ident::new(".."), Err(IdentError::BadEdge));
    }

    #[test]
    fn fingerprint_shape() {
        let ok = format!("SHA256:{}", "A".repeat(43));
        assert!(Fingerprint::new(ok).is_ok());
        assert!(Fingerprint::new("MD5:aa").is_err());
        assert!(Fingerprint::new(format!("SHA256:{}", "A".repeat(42))).is_err());
        assert!(Fingerprint::new(format!("SHA256:{}=", "A".repeat(42))).is_err());
    }

    #[test]
    fn sha256_hex_shape() {
        assert!(Sha256Hex::new("a".repeat(64)).is_ok());
        assert!(Sha256Hex::new("A".repeat(64)).is_err());
        assert!(Sha256Hex::new("a".repeat(63)).is_err());
        assert_eq!(
            Sha256Hex::from_digest(&sha256(b"")).as_str(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn decode_names_the_problem() {
        let err = serde_json::from_str::<Ident>("\"a/b\"").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("invalid Ident"), "{text}");
        assert!(text.contains("'/'"), "{text}");
    }
}
