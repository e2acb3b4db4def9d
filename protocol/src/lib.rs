//! The clawfleet operation protocol: the contract between the coordinator and hostd.
//!
//! - [`operation`]: typed requests; [`result`]: typed results, outcomes, progress.
//! - [`envelope`]: who asks which host, until when; strict decoding with explicit limits.
//! - [`signing`]: OpenSSH SSHSIG (Ed25519) over the exact bytes that travel.
//! - [`allowed_signers`]: the subset of OpenSSH's allowed_signers format hostd trusts.
//! - [`framing`]: many messages over one SSH session's stdin and stdout.
//! - [`relay`]: gateway streams over one SSH channel per host, with signed opens.
//! - [`failure`]: class, stable code and safe message for every failure.
//! - [`runtime`]: the read-only runtime and log operations' types; [`redact`]: their redaction.
//! - [`sealed`]: secret values sealed to a host's key on their way there, `put-secrets`.
//! - [`secret`]: secrets' names, values, fingerprints and how configurations refer to them.
//! - [`workspace`]: initial workspace files, their names and limits.
//! - [`egress`]: an Agent's own egress settings, a narrowing of its target's.
//! - [`websocket`]: a WebSocket client's masked frame, for the clients of a gateway.
//! - [`atomic_file`]: files replaced whole or created once (temporary, fsync, rename), for
//!   hostd and the coordinator alike.

pub mod allowed_signers;
pub mod atomic_file;
pub mod configuration;
pub mod egress;
pub mod envelope;
pub mod failure;
pub mod framing;
pub mod ident;
pub mod live_config;
pub mod operation;
pub mod plan;
pub mod random;
pub mod redact;
pub mod relay;
pub mod result;
pub mod runtime;
pub mod sealed;
pub mod secret;
pub mod signing;
pub mod text;
pub mod time;
pub mod websocket;
pub mod workspace;

pub use allowed_signers::AllowedSigners;
pub use configuration::Configuration;
pub use envelope::{
    Envelope, FENCED_VERSION, Limits, PROTOCOL_VERSION, SUPPORTED_VERSIONS, Target,
};
pub use failure::{Failure, FailureClass, FailureCode};
pub use framing::{Frame, FrameDecoder, FrameKind, Message};
pub use ident::{
    Fingerprint, HostName, Ident, OperationId, Principal, SecretFingerprint, SecretName, Sha256Hex,
};
pub use operation::Operation;
pub use result::{OperationResult, Outcome, ResultMessage};
pub use signing::{HostIdentity, SIGNATURE_NAMESPACE, SignedEnvelope, Verifier};

/// Re-exported so callers use the same pinned version for keys.
pub use ssh_key;
