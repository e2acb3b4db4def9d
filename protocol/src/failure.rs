//! The failure model: a class that tells the caller whether to retry, a stable code that
//! programs match on, and a short message for people that never carries secrets or raw output.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Whether trying the same operation again may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    /// A later attempt may succeed (lock busy, gateway not ready yet, session dropped).
    Retryable,
    /// Nothing changes by retrying; a person or a new revision has to act.
    Permanent,
}

macro_rules! failure_codes {
    ($( $(#[doc = $doc:literal])* $variant:ident = $text:literal => $class:ident ),+ $(,)?) => {
        /// Stable failure codes. The text form never changes once released.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum FailureCode {
            $( $(#[doc = $doc])* #[serde(rename = $text)] $variant, )+
        }

        impl FailureCode {
            /// Every code, for documentation and tests.
            pub const ALL: &'static [FailureCode] = &[$(FailureCode::$variant),+];

            /// The stable text form, e.g. `LOCK_TIMEOUT`.
            pub fn as_str(self) -> &'static str {
                match self { $(FailureCode::$variant => $text,)+ }
            }

            /// What the code means: its documentation above, one line.
            pub fn describe(self) -> &'static str {
                match self { $(FailureCode::$variant => concat!($($doc),*).trim_ascii(),)+ }
            }

            /// The class this code has unless a caller has a reason to say otherwise.
            pub fn default_class(self) -> FailureClass {
                match self { $(FailureCode::$variant => FailureClass::$class,)+ }
            }
        }
    };
}

failure_codes! {
    // Envelope and transport rejections: no side effect happened.
    /// The signature does not verify over the bytes received (tampered or malformed).
    SignatureInvalid = "SIGNATURE_INVALID" => Permanent,
    /// The signing key, or the issuer named in the envelope, is not in allowed_signers.
    UnknownSigner = "UNKNOWN_SIGNER" => Permanent,
    /// The allowed_signers entry of the key is outside its valid-after/valid-before window.
    SignerNotValid = "SIGNER_NOT_VALID" => Permanent,
    /// The host's allowed_signers file cannot be read or is outside the supported subset.
    SignersFileInvalid = "SIGNERS_FILE_INVALID" => Permanent,
    /// The envelope's expires-at has passed.
    EnvelopeExpired = "ENVELOPE_EXPIRED" => Permanent,
    /// The envelope's issued-at is in the future beyond the allowed clock skew.
    EnvelopeNotYetValid = "ENVELOPE_NOT_YET_VALID" => Retryable,
    /// The envelope names another host or another host key.
    WrongHost = "WRONG_HOST" => Permanent,
    /// The envelope's protocol version is not one this hostd speaks.
    UnsupportedVersion = "UNSUPPORTED_VERSION" => Permanent,
    /// The operation id was used before with a different body.
    ReplayMismatch = "REPLAY_MISMATCH" => Permanent,
    /// The operation's fence is lower than one the target already saw for this Agent: a later
    /// claim of the Agent's work moved it on, so this (stale) coordinator's operation is
    /// refused with nothing changed.
    FenceStale = "FENCE_STALE" => Permanent,
    /// The envelope expires at or before the latest expiry of a journal entry hostd already
    /// pruned (or, after a power cut, that it may have lost): it may have run before, and the
    /// host can no longer tell, so this envelope never runs. Retryable: the same operation in
    /// a new envelope (a later expiry) runs, as a coordinator's retry sends it.
    ReplayUnverifiable = "REPLAY_UNVERIFIABLE" => Retryable,
    /// A frame, envelope, or field is larger than its limit.
    InputTooLarge = "INPUT_TOO_LARGE" => Permanent,
    /// The envelope or operation does not decode: unknown field, wrong type, bad identifier.
    InvalidInput = "INVALID_INPUT" => Permanent,
    /// The target does not know the operation, or a field of its arguments: it predates them
    /// (the coordinator is newer; upgrade the target), or it does not offer the operation.
    /// Nothing was done.
    OperationUnsupported = "OPERATION_UNSUPPORTED" => Permanent,
    // Host-side outcomes.
    /// A lock could not be taken within its limit.
    LockTimeout = "LOCK_TIMEOUT" => Retryable,
    /// Something on the host is not ours or does not match its marker; nothing was changed.
    OwnershipMismatch = "OWNERSHIP_MISMATCH" => Permanent,
    /// An existing snapshot differs from the revision that was asked for.
    SnapshotMismatch = "SNAPSHOT_MISMATCH" => Permanent,
    /// A newer revision is already current for this Agent.
    Superseded = "SUPERSEDED" => Permanent,
    /// The snapshot to activate, stop or verify does not exist on the host.
    RevisionNotPrepared = "REVISION_NOT_PREPARED" => Permanent,
    /// No free gateway port is left in the host's configured range.
    PortRangeExhausted = "PORT_RANGE_EXHAUSTED" => Permanent,
    /// The host already runs its configured maximum number of Agents.
    HostFull = "HOST_FULL" => Permanent,
    /// The gateway did not answer /readyz with 200 within the readiness limit.
    ReadinessTimeout = "READINESS_TIMEOUT" => Retryable,
    /// The socket listening on the Agent's port belongs to another uid than the Agent's account
    /// (a squatter answered /readyz); nothing was recorded as served. Retryable: the port is
    /// the Agent's, and an activation retried after the squatter is gone succeeds.
    ListenerNotOwned = "LISTENER_NOT_OWNED" => Retryable,
    /// The gateway's unit failed or exited (for example on a configuration error).
    UnitFailed = "UNIT_FAILED" => Retryable,
    /// systemd could not be reached over D-Bus or refused a job.
    SystemdUnavailable = "SYSTEMD_UNAVAILABLE" => Retryable,
    /// An account tool (useradd, groupadd, userdel, groupdel) failed.
    AccountToolFailed = "ACCOUNT_TOOL_FAILED" => Retryable,
    /// The revision's configuration is outside what this host accepts.
    ConfigurationRejected = "CONFIGURATION_REJECTED" => Permanent,
    /// hostd's own configuration file is invalid.
    HostConfigInvalid = "HOST_CONFIG_INVALID" => Permanent,
    /// A tool hostd needs is missing on the host.
    MissingTool = "MISSING_TOOL" => Permanent,
    /// The Agent's egress settings ask for a port or range its host's pool (`hostd.toml`
    /// `[network]`) or its cluster does not allow: an Agent may only narrow them. Nothing was
    /// changed; the message names the entry.
    EgressNotAllowed = "EGRESS_NOT_ALLOWED" => Permanent,
    /// The configured gateway command (hostd.toml `gateway_command`, first word) does not
    /// exist on the host or is not executable by the Agent accounts; nothing was created.
    GatewayCommandMissing = "GATEWAY_COMMAND_MISSING" => Permanent,
    /// The operation ran past its deadline; the step in progress was finished and recorded.
    DeadlineExceeded = "DEADLINE_EXCEEDED" => Retryable,
    /// The session closed during the operation; the step in progress was finished and recorded.
    SessionClosed = "SESSION_CLOSED" => Retryable,
    /// A file system operation failed on the host.
    IoFailed = "IO_FAILED" => Retryable,
    /// The host's file system is full (ENOSPC) or a quota is spent (EDQUOT); nothing half
    /// written was kept. Retryable once space is freed.
    NoSpace = "NO_SPACE" => Retryable,
    /// The host already runs its configured maximum of `hostd serve` sessions
    /// (hostd.toml `[limits] max_sessions`); this session answered only this and ended.
    SessionLimit = "SESSION_LIMIT" => Retryable,
    /// The Namespace has not been ensured on this host yet.
    NamespaceMissing = "NAMESPACE_MISSING" => Retryable,
    /// Another session is executing the same operation id right now.
    OperationInProgress = "OPERATION_IN_PROGRESS" => Retryable,
    /// A Namespace still holds Agents and cannot be deleted.
    NamespaceNotEmpty = "NAMESPACE_NOT_EMPTY" => Permanent,
    /// The Agent is not on this host (no directory, or not this Agent's).
    AgentMissing = "AGENT_MISSING" => Permanent,
    /// The Agent's log could not be read on a host (journalctl failed or timed out). A
    /// cluster's failed log read carries the cluster's own code (`KUBERNETES_API_*`).
    JournalUnavailable = "JOURNAL_UNAVAILABLE" => Retryable,
    /// A log cursor names no entry this host or cluster has (rotated away, or from elsewhere).
    LogCursorInvalid = "LOG_CURSOR_INVALID" => Permanent,
    /// `previous` was asked for, but the journal holds no earlier run of the Agent's unit.
    PreviousRunMissing = "PREVIOUS_RUN_MISSING" => Permanent,
    /// The Agent's initial workspace files could not be applied (a planted link or special
    /// file where one goes, no space, contents no longer held); nothing was started. The
    /// message names the file, never its content.
    WorkspaceSetupFailed = "WORKSPACE_SETUP_FAILED" => Retryable,
    /// A host hook, its event directory or the hooks directory is not a regular file
    /// (directory) owned by root and unwritable by group and others; nothing ran. The message
    /// names the hook.
    HookRefused = "HOOK_REFUSED" => Permanent,
    /// A host hook exited non-zero (its redacted stderr is in hostd's journal).
    HookFailed = "HOOK_FAILED" => Retryable,
    /// A host hook ran past `[limits] hook_timeout_ms` and was killed with its process group.
    HookTimeout = "HOOK_TIMEOUT" => Retryable,
    /// A `before-workload-start` hook printed a launch value that is refused (a malformed or
    /// reserved name, a value that looks like a credential, too many values).
    HookOutputRefused = "HOOK_OUTPUT_REFUSED" => Permanent,
    /// A sealed secret of `put-secrets` does not open with this host's key for this Agent
    /// (sealed to another host key, Agent or name, or altered), or its value does not have
    /// the stated fingerprint; nothing was changed. The message names the secret.
    SecretUndecryptable = "SECRET_UNDECRYPTABLE" => Permanent,
    /// The gateway could not resolve its secrets on a reload and kept its last good snapshot.
    SecretReloadFailed = "SECRET_RELOAD_FAILED" => Permanent,
    /// After a reload the gateway holds another fingerprint than the one delivered.
    SecretFingerprintMismatch = "SECRET_FINGERPRINT_MISMATCH" => Retryable,
    /// The host's gateway relay already carries its configured maximum of streams
    /// (hostd.toml `[limits] max_relay_streams`); the stream was not opened.
    RelayStreamLimit = "RELAY_STREAM_LIMIT" => Retryable,
    /// The Agent's gateway did not accept a connection on its host-held port (the Agent is
    /// stopped, or its front is missing).
    GatewayUnreachable = "GATEWAY_UNREACHABLE" => Retryable,
    /// An unexpected internal error; the host log has details under the operation id.
    Internal = "INTERNAL" => Retryable,
    // Kubernetes backend outcomes.
    /// The revision's Pod cannot be scheduled (PodScheduled=False, reason Unschedulable).
    RevisionUnschedulable = "REVISION_UNSCHEDULABLE" => Retryable,
    /// The gateway image of the revision's Pod cannot be pulled (ErrImagePull, ImagePullBackOff).
    RevisionImagePullFailed = "REVISION_IMAGE_PULL_FAILED" => Retryable,
    /// The Namespace's Pod quota refuses the revision's Pod (ReplicaSet FailedCreate, exceeded quota).
    NamespacePodQuotaExceeded = "NAMESPACE_POD_QUOTA_EXCEEDED" => Retryable,
    /// The revision is not ready yet (rollout, readiness or endpoints still pending) at the deadline.
    RevisionIncomplete = "REVISION_INCOMPLETE" => Retryable,
    /// The Kubernetes API timed out, refused the connection, throttled (429) or failed (5xx).
    KubernetesApiUnavailable = "KUBERNETES_API_UNAVAILABLE" => Retryable,
    /// The Kubernetes API refused a request (a 4xx other than 429).
    KubernetesApiRejected = "KUBERNETES_API_REJECTED" => Permanent,
    /// A Kubernetes object at an owned name is foreign or its ownership markers were changed;
    /// nothing was written.
    KubernetesOwnershipConflict = "KUBERNETES_OWNERSHIP_CONFLICT" => Permanent,
    /// The cluster's credentials or settings, or the revision, cannot be deployed as configured.
    KubernetesConfigurationInvalid = "KUBERNETES_CONFIGURATION_INVALID" => Permanent,
    /// A warning of a cluster's probe, not a refusal: the API server runs a Kubernetes older
    /// than the oldest clawfleet is tested on.
    KubernetesVersionBelowMinimum = "KUBERNETES_VERSION_BELOW_MINIMUM" => Permanent,
}

impl fmt::Display for FailureCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest message a failure carries.
pub const MESSAGE_MAX: usize = 512;

/// A failed operation as it travels back to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub class: FailureClass,
    pub code: FailureCode,
    /// One short human sentence. Never secrets, never raw command output.
    pub message: String,
}

impl Failure {
    /// Whether the target does not know the operation or one of its argument fields: the
    /// typed [`FailureCode::OperationUnsupported`], or what a hostd built before that code
    /// answered, `INVALID_INPUT` naming an unknown operation or an unknown field. Peers of
    /// two versions meet during every upgrade (the coordinator first, hosts from their mirror
    /// later); this is the one place their text is read.
    pub fn is_unsupported(&self) -> bool {
        match self.code {
            FailureCode::OperationUnsupported => true,
            FailureCode::InvalidInput => {
                self.message.contains("unknown operation ")
                    || self.message.contains("unknown field `")
            }
            _ => false,
        }
    }

    /// A failure with the code's default class. The message is cleaned of control characters
    /// and shortened to [`MESSAGE_MAX`] characters.
    pub fn new(code: FailureCode, message: impl AsRef<str>) -> Self {
        Self::with_class(code.default_class(), code, message)
    }

    /// A failure with an explicit class.
    pub fn with_class(class: FailureClass, code: FailureCode, message: impl AsRef<str>) -> Self {
        Self {
            class,
            code,
            message: clean_message(message.as_ref()),
        }
    }

    /// Whether a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        self.class == FailureClass::Retryable
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let class = match self.class {
            FailureClass::Retryable => "retryable",
            FailureClass::Permanent => "permanent",
        };
        write!(f, "{} ({class}): {}", self.code, self.message)
    }
}

impl std::error::Error for Failure {}

fn clean_message(raw: &str) -> String {
    crate::text::clean(raw, MESSAGE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostd built before OPERATION_UNSUPPORTED still counts as not knowing what it was
    /// sent (its refusals of an unknown operation and an unknown field, as it wrote them).
    #[test]
    fn unsupported_covers_the_typed_code_and_older_hostds_refusals() {
        assert!(Failure::new(FailureCode::OperationUnsupported, "x").is_unsupported());
        for older in [
            "operation.op: unknown operation \"agent-runtime\"; expected one of probe, status",
            "operation.restore: unknown field `restore`, expected one of `namespace`, `agent`, `revision`",
        ] {
            assert!(
                Failure::new(FailureCode::InvalidInput, older).is_unsupported(),
                "{older}"
            );
        }
        assert!(!Failure::new(FailureCode::InvalidInput, "port 0 is not allowed").is_unsupported());
        assert!(!Failure::new(FailureCode::LockTimeout, "unknown field `x`").is_unsupported());
    }

    #[test]
    fn codes_round_trip_as_text() {
        for code in FailureCode::ALL {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: FailureCode = serde_json::from_str(&json).unwrap();
            assert_eq!(back, *code);
        }
    }

    #[test]
    fn codes_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for code in FailureCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate {code}");
            assert!(
                code.as_str()
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
            );
        }
    }

    #[test]
    fn messages_are_cleaned_and_bounded() {
        let f = Failure::new(FailureCode::Internal, "a\nb\u{7}c");
        assert_eq!(f.message, "a b c");
        let long = "x".repeat(2000);
        let f = Failure::new(FailureCode::Internal, &long);
        assert_eq!(f.message.chars().count(), MESSAGE_MAX);
        assert!(f.message.ends_with('…'));
    }

    #[test]
    fn failure_reads_a_newer_hosts_fields_and_rejects_unknown_codes() {
        let ok = r#"{"class":"retryable","code":"LOCK_TIMEOUT","message":"busy"}"#;
        assert!(serde_json::from_str::<Failure>(ok).is_ok());
        // A field a newer hostd adds (results are read tolerantly; see `result`).
        let extra = r#"{"class":"retryable","code":"LOCK_TIMEOUT","message":"busy","x":1}"#;
        assert_eq!(
            serde_json::from_str::<Failure>(extra).ok(),
            serde_json::from_str::<Failure>(ok).ok()
        );
        let code = r#"{"class":"retryable","code":"NOPE","message":"busy"}"#;
        assert!(serde_json::from_str::<Failure>(code).is_err());
    }
}
