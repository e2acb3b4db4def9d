//! The envelope: who asks which host to do what, and for how long the request holds.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::failure::{Failure, FailureCode};
use crate::ident::{Fingerprint, HostName, OperationId, Principal, truncate_for_message};
use crate::operation::{Operation, OperationDecodeError};

/// The protocol version this crate writes.
pub const PROTOCOL_VERSION: u32 = 2;
/// The first version whose envelopes carry a fence ([`Envelope::fence`]). A writer speaks
/// version 1 (no fence) to a peer that accepts only that.
pub const FENCED_VERSION: u32 = 2;
/// The protocol versions this crate reads.
pub const SUPPORTED_VERSIONS: &[u32] = &[1, PROTOCOL_VERSION];
/// The default time hostd may work on one operation.
pub const DEFAULT_DEADLINE_SECONDS: u32 = 190;
/// The longest deadline an envelope may ask for.
pub const MAX_DEADLINE_SECONDS: u32 = 3600;

/// Size limits for what crosses the wire. Every limit is explicit so a peer cannot make the
/// other side allocate without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame payload.
    pub max_frame: usize,
    /// Largest envelope body (the signed JSON bytes).
    pub max_envelope: usize,
    /// Largest armored signature.
    pub max_signature: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame: 1024 * 1024,
            max_envelope: 512 * 1024,
            max_signature: 8 * 1024,
        }
    }
}

/// The host an envelope is for: its name and the fingerprint of its SSH host key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    pub host: HostName,
    pub host_key: Fingerprint,
}

/// One signed request. The signature covers exactly the serialized bytes of this struct.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    try_from = "EnvelopeWire"
)]
pub struct Envelope {
    pub version: u32,
    /// The idempotency key: a replay with the same body returns the recorded outcome.
    pub operation_id: OperationId,
    pub target: Target,
    /// The allowed_signers principal of the signer.
    pub issuer: Principal,
    /// Unix seconds.
    pub issued_at: u64,
    /// Unix seconds; the host refuses the envelope from this moment on.
    pub expires_at: u64,
    /// How long hostd may work on the operation, in seconds.
    pub deadline_seconds: u32,
    /// The issuer's fence for the Agent (version 2 on, operations that change Agents only,
    /// [`crate::operation::OperationKind::is_fenced`]): the host keeps the highest it saw per
    /// Agent and refuses a lower one with `FENCE_STALE`, so a coordinator whose claim another
    /// one replaced can never act on the Agent again. A `delete-namespace` fence is checked
    /// against every Agent it would remove.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    pub operation: Operation,
}

/// Why bytes are not an acceptable envelope or message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("{what} is {size} bytes; at most {max} are allowed")]
    TooLarge {
        what: &'static str,
        size: usize,
        max: usize,
    },
    #[error("protocol version {found} is not supported; this side speaks {supported:?}")]
    UnsupportedVersion {
        found: String,
        supported: &'static [u32],
    },
    #[error("invalid {what} at `{path}`: {message}")]
    Invalid {
        what: &'static str,
        path: String,
        message: String,
    },
    #[error("{what} is malformed: {message}")]
    Malformed { what: &'static str, message: String },
    /// The operation's name, or a field of its arguments, is one this side does not know:
    /// the sender is newer (`OPERATION_UNSUPPORTED`).
    #[error("unsupported {what} at `{path}`: {message}")]
    Unsupported {
        what: &'static str,
        path: String,
        message: String,
    },
}

impl DecodeError {
    /// The protocol failure this decode error is reported as.
    pub fn to_failure(&self) -> Failure {
        let code = match self {
            DecodeError::TooLarge { .. } => FailureCode::InputTooLarge,
            DecodeError::UnsupportedVersion { .. } => FailureCode::UnsupportedVersion,
            DecodeError::Invalid { .. } | DecodeError::Malformed { .. } => {
                FailureCode::InvalidInput
            }
            DecodeError::Unsupported { .. } => FailureCode::OperationUnsupported,
        };
        Failure::new(code, self.to_string())
    }
}

/// Decodes JSON strictly: any error names the path of the offending field.
pub fn decode_json<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        DecodeError::Invalid {
            what,
            path: if path.is_empty() {
                ".".to_owned()
            } else {
                path
            },
            message: strip_position(&inner.to_string()),
        }
    })?;
    de.end().map_err(|e| DecodeError::Invalid {
        what,
        path: ".".to_owned(),
        message: strip_position(&e.to_string()),
    })?;
    Ok(value)
}

/// serde_json appends " at line 1 column 57"; the path already says where.
fn strip_position(message: &str) -> String {
    let trimmed = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    truncate_for_message_long(trimmed)
}

fn truncate_for_message_long(message: &str) -> String {
    if message.chars().count() <= 300 {
        message.to_owned()
    } else {
        let mut s: String = message.chars().take(300).collect();
        s.push('…');
        s
    }
}

/// The envelope with its operation still undecoded, so that operation errors can carry their
/// full path (serde loses paths inside tagged enums).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EnvelopeWire {
    version: u32,
    operation_id: OperationId,
    target: Target,
    issuer: Principal,
    issued_at: u64,
    expires_at: u64,
    deadline_seconds: u32,
    #[serde(default)]
    fence: Option<u64>,
    operation: serde_json::Value,
}

impl TryFrom<EnvelopeWire> for Envelope {
    type Error = OperationDecodeError;
    fn try_from(wire: EnvelopeWire) -> Result<Self, Self::Error> {
        Ok(Envelope {
            version: wire.version,
            operation_id: wire.operation_id,
            target: wire.target,
            issuer: wire.issuer,
            issued_at: wire.issued_at,
            expires_at: wire.expires_at,
            deadline_seconds: wire.deadline_seconds,
            fence: wire.fence,
            operation: Operation::from_value(wire.operation)?,
        })
    }
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> DecodeError {
    DecodeError::Invalid {
        what: "envelope",
        path: path.into(),
        message: message.into(),
    }
}

impl Envelope {
    /// Decodes an envelope body strictly. The version is checked first, so a newer peer gets
    /// `UNSUPPORTED_VERSION` rather than a complaint about fields it added.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Envelope, DecodeError> {
        if bytes.len() > limits.max_envelope {
            return Err(DecodeError::TooLarge {
                what: "envelope",
                size: bytes.len(),
                max: limits.max_envelope,
            });
        }
        // One parse into a tree: this also catches trailing garbage and deep nesting.
        let tree: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Malformed {
                what: "envelope",
                message: strip_position(&e.to_string()),
            })?;
        let serde_json::Value::Object(map) = &tree else {
            return Err(invalid(".", "the envelope must be a JSON object"));
        };
        match map.get("version") {
            None => return Err(invalid("version", "missing field `version`")),
            Some(serde_json::Value::Number(n))
                if n.as_u64().is_some_and(|v| {
                    u32::try_from(v).is_ok_and(|v| SUPPORTED_VERSIONS.contains(&v))
                }) => {}
            Some(other) => {
                return Err(DecodeError::UnsupportedVersion {
                    found: truncate_for_message(&other.to_string()),
                    supported: SUPPORTED_VERSIONS,
                });
            }
        }
        let wire: EnvelopeWire = serde_path_to_error::deserialize(tree).map_err(|err| {
            let path = err.path().to_string();
            invalid(path, strip_position(&err.into_inner().to_string()))
        })?;
        let envelope = Envelope::try_from(wire).map_err(|e| {
            let path = if e.path.is_empty() {
                "operation".to_owned()
            } else {
                format!("operation.{}", e.path)
            };
            let message = strip_position(&e.message);
            if e.unknown {
                DecodeError::Unsupported {
                    what: "envelope",
                    path,
                    message,
                }
            } else {
                invalid(path, message)
            }
        })?;
        envelope.check_shape()?;
        Ok(envelope)
    }

    /// Checks that do not depend on the clock or the host.
    fn check_shape(&self) -> Result<(), DecodeError> {
        if self.deadline_seconds == 0 || self.deadline_seconds > MAX_DEADLINE_SECONDS {
            return Err(DecodeError::Invalid {
                what: "envelope",
                path: "deadlineSeconds".to_owned(),
                message: format!(
                    "must be between 1 and {MAX_DEADLINE_SECONDS}, got {}",
                    self.deadline_seconds
                ),
            });
        }
        if self.expires_at <= self.issued_at {
            return Err(DecodeError::Invalid {
                what: "envelope",
                path: "expiresAt".to_owned(),
                message: "must be later than issuedAt".to_owned(),
            });
        }
        if let Some(fence) = self.fence {
            let message = if self.version < FENCED_VERSION {
                Some(format!(
                    "needs protocol version {FENCED_VERSION} or later (the envelope says {})",
                    self.version
                ))
            } else if !self.operation.kind().is_fenced() {
                Some(format!(
                    "applies to operations that change Agents only, not to {}",
                    self.operation.kind()
                ))
            } else if fence == 0 {
                Some("must be at least 1".to_owned())
            } else {
                None
            };
            if let Some(message) = message {
                return Err(DecodeError::Invalid {
                    what: "envelope",
                    path: "fence".to_owned(),
                    message,
                });
            }
        }
        if let Operation::PrepareRevision(args) = &self.operation
            && !args.revision.hash_matches()
        {
            return Err(DecodeError::Invalid {
                what: "envelope",
                path: "operation.revision.configurationHash".to_owned(),
                message: format!(
                    "does not match the configuration carried (its hash is {})",
                    args.revision.configuration.hash()
                ),
            });
        }
        Ok(())
    }

    /// The exact bytes that get signed and travel.
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}
