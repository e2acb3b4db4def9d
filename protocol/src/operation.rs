//! The operations a coordinator can ask of a host, as typed requests.
//!
//! Every struct rejects unknown fields, and every identifier is validated on decode, so an
//! operation that decodes is one hostd can act on without further parsing.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use crate::configuration::Configuration;
use crate::ident::{Ident, OperationId, Sha256Hex};

/// One operation, tagged by `op`. Decoding goes through [`Operation::from_value`] so that
/// errors name the exact field inside the arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", try_from = "serde_json::Value")]
pub enum Operation {
    /// Report version, protocol versions and missing tools; takes no lock.
    Probe(ProbeArgs),
    /// Create or verify a Namespace's directory and marker.
    EnsureNamespace(NamespaceArgs),
    /// Remove a Namespace, its Agents, units and accounts, after validating all of them.
    DeleteNamespace(NamespaceArgs),
    /// Stage a revision: account, directories, port, immutable snapshot, password file.
    PrepareRevision(PrepareArgs),
    /// Cut over to a prepared revision and wait for readiness (optionally restoring the last
    /// served revision when the candidate does not become ready).
    ActivateRevision(ActivateArgs),
    /// Check a revision's snapshot and ownership without side effects.
    VerifyRevision(RevisionArgs),
    /// Stop the gateway if it serves this revision; keeps snapshots, state and credentials.
    StopRevision(RevisionArgs),
    /// Stop if current, then remove this revision's snapshot.
    RetireRevision(RevisionArgs),
    /// Remove an Agent: unit, directory, port and account.
    DeleteAgent(AgentArgs),
    /// Read-only inventory of the host.
    Status(StatusArgs),
    /// The recorded outcome of an earlier operation id.
    OperationStatus(OperationStatusArgs),
    /// What the Agent's unit is doing now (read-only, no lock).
    AgentRuntime(crate::runtime::RuntimeArgs),
    /// One bounded, redacted page of the Agent's log (read-only, no lock).
    AgentLogs(crate::runtime::LogsArgs),
    /// What a deploy of a revision would change on the host (read-only, no lock).
    PlanRevision(crate::plan::PlanArgs),
    /// Replace the Agent's set of secrets with these values, sealed to the host key
    /// (`sealed.rs`); a running gateway sees the new files at once.
    PutSecrets(crate::sealed::PutSecretsArgs),
}

/// The operation names, for logs, metrics and progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperationKind {
    Probe,
    EnsureNamespace,
    DeleteNamespace,
    PrepareRevision,
    ActivateRevision,
    VerifyRevision,
    StopRevision,
    RetireRevision,
    DeleteAgent,
    Status,
    OperationStatus,
    AgentRuntime,
    AgentLogs,
    PlanRevision,
    PutSecrets,
}

impl OperationKind {
    /// The wire name, e.g. `prepare-revision`.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::Probe => "probe",
            OperationKind::EnsureNamespace => "ensure-namespace",
            OperationKind::DeleteNamespace => "delete-namespace",
            OperationKind::PrepareRevision => "prepare-revision",
            OperationKind::ActivateRevision => "activate-revision",
            OperationKind::VerifyRevision => "verify-revision",
            OperationKind::StopRevision => "stop-revision",
            OperationKind::RetireRevision => "retire-revision",
            OperationKind::DeleteAgent => "delete-agent",
            OperationKind::Status => "status",
            OperationKind::OperationStatus => "operation-status",
            OperationKind::AgentRuntime => "agent-runtime",
            OperationKind::AgentLogs => "agent-logs",
            OperationKind::PlanRevision => "plan-revision",
            OperationKind::PutSecrets => "put-secrets",
        }
    }

    /// Whether the operation changes Agents and so takes a fence (protocol version 2 on): a
    /// host refuses it when it saw a higher fence for an Agent it would change.
    /// `delete-namespace` removes every Agent of the Namespace left on the host, so it is
    /// checked against each of them (its fence is the coordinator's current one; without one
    /// it removes only Agents that never had a fence).
    pub fn is_fenced(self) -> bool {
        matches!(
            self,
            OperationKind::PrepareRevision
                | OperationKind::ActivateRevision
                | OperationKind::StopRevision
                | OperationKind::RetireRevision
                | OperationKind::DeleteAgent
                | OperationKind::DeleteNamespace
                | OperationKind::PutSecrets
        )
    }

    /// Whether the operation only reads host state.
    pub fn is_read_only(self) -> bool {
        matches!(
            self,
            OperationKind::Probe
                | OperationKind::VerifyRevision
                | OperationKind::Status
                | OperationKind::OperationStatus
                | OperationKind::AgentRuntime
                | OperationKind::AgentLogs
                | OperationKind::PlanRevision
        )
    }
}

impl fmt::Display for OperationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation that does not decode, with the path of the offending field inside it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{path}`: {message}")]
pub struct OperationDecodeError {
    /// Dotted path inside the operation object (`op`, `revision.id`, ...).
    pub path: String,
    pub message: String,
    /// The operation's name, or a field of its arguments, is one this side does not know
    /// (the sender is newer), rather than a known one with a wrong value.
    pub unknown: bool,
}

impl TryFrom<serde_json::Value> for Operation {
    type Error = OperationDecodeError;
    fn try_from(value: serde_json::Value) -> Result<Self, Self::Error> {
        Operation::from_value(value)
    }
}

fn args<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, OperationDecodeError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let message = err.into_inner().to_string();
        OperationDecodeError {
            path: if path == "." { String::new() } else { path },
            // serde's `de::Error::unknown_field` is the one error that starts so: every
            // argument struct denies unknown fields, so this is a field the sender knows
            // and this side does not.
            unknown: message.starts_with("unknown field `"),
            message,
        }
    })
}

const OPERATION_NAMES: &str = "probe, ensure-namespace, delete-namespace, prepare-revision, \
     activate-revision, verify-revision, stop-revision, retire-revision, delete-agent, status, \
     operation-status, agent-runtime, agent-logs, plan-revision, put-secrets";

impl Operation {
    /// Decodes an operation object strictly: its `op` name, then its arguments.
    pub fn from_value(value: serde_json::Value) -> Result<Self, OperationDecodeError> {
        let err = |path: &str, message: String| OperationDecodeError {
            path: path.to_owned(),
            message,
            unknown: false,
        };
        let serde_json::Value::Object(mut map) = value else {
            return Err(err("", "must be an object with an `op` field".to_owned()));
        };
        let op = match map.remove("op") {
            Some(serde_json::Value::String(op)) => op,
            Some(_) => return Err(err("op", "must be a string".to_owned())),
            None => return Err(err("op", "missing field `op`".to_owned())),
        };
        let rest = serde_json::Value::Object(map);
        Ok(match op.as_str() {
            "probe" => Operation::Probe(args(rest)?),
            "ensure-namespace" => Operation::EnsureNamespace(args(rest)?),
            "delete-namespace" => Operation::DeleteNamespace(args(rest)?),
            "prepare-revision" => Operation::PrepareRevision(args(rest)?),
            "activate-revision" => Operation::ActivateRevision(args(rest)?),
            "verify-revision" => Operation::VerifyRevision(args(rest)?),
            "stop-revision" => Operation::StopRevision(args(rest)?),
            "retire-revision" => Operation::RetireRevision(args(rest)?),
            "delete-agent" => Operation::DeleteAgent(args(rest)?),
            "status" => Operation::Status(args(rest)?),
            "operation-status" => Operation::OperationStatus(args(rest)?),
            "agent-runtime" => Operation::AgentRuntime(args(rest)?),
            "agent-logs" => Operation::AgentLogs(args(rest)?),
            "plan-revision" => Operation::PlanRevision(args(rest)?),
            "put-secrets" => {
                let a: crate::sealed::PutSecretsArgs = args(rest)?;
                a.check().map_err(|(path, message)| err(&path, message))?;
                Operation::PutSecrets(a)
            }
            other => {
                return Err(OperationDecodeError {
                    unknown: true,
                    ..err(
                        "op",
                        format!(
                            "unknown operation {:?}; expected one of {OPERATION_NAMES}",
                            crate::ident::truncate_for_message(other)
                        ),
                    )
                });
            }
        })
    }

    /// The Agent an Agent-scoped operation acts on (for logs and fencing).
    pub fn agent(&self) -> Option<&Ident> {
        Some(match self {
            Operation::PrepareRevision(a) => &a.agent.id,
            Operation::ActivateRevision(a) => &a.agent.id,
            Operation::VerifyRevision(a)
            | Operation::StopRevision(a)
            | Operation::RetireRevision(a) => &a.agent.id,
            Operation::DeleteAgent(a) => &a.agent.id,
            Operation::AgentRuntime(a) => &a.agent.id,
            Operation::AgentLogs(a) => &a.agent.id,
            Operation::PlanRevision(a) => &a.agent.id,
            Operation::PutSecrets(a) => &a.agent.id,
            Operation::Probe(_)
            | Operation::EnsureNamespace(_)
            | Operation::DeleteNamespace(_)
            | Operation::Status(_)
            | Operation::OperationStatus(_) => return None,
        })
    }

    /// The revision a revision operation names (for logs).
    pub fn revision(&self) -> Option<&Ident> {
        Some(match self {
            Operation::PrepareRevision(a) => &a.revision.id,
            Operation::ActivateRevision(a) => &a.revision.id,
            Operation::VerifyRevision(a)
            | Operation::StopRevision(a)
            | Operation::RetireRevision(a) => &a.revision.id,
            Operation::PlanRevision(a) => &a.revision.id,
            _ => return None,
        })
    }

    /// Which operation this is.
    pub fn kind(&self) -> OperationKind {
        match self {
            Operation::Probe(_) => OperationKind::Probe,
            Operation::EnsureNamespace(_) => OperationKind::EnsureNamespace,
            Operation::DeleteNamespace(_) => OperationKind::DeleteNamespace,
            Operation::PrepareRevision(_) => OperationKind::PrepareRevision,
            Operation::ActivateRevision(_) => OperationKind::ActivateRevision,
            Operation::VerifyRevision(_) => OperationKind::VerifyRevision,
            Operation::StopRevision(_) => OperationKind::StopRevision,
            Operation::RetireRevision(_) => OperationKind::RetireRevision,
            Operation::DeleteAgent(_) => OperationKind::DeleteAgent,
            Operation::Status(_) => OperationKind::Status,
            Operation::OperationStatus(_) => OperationKind::OperationStatus,
            Operation::AgentRuntime(_) => OperationKind::AgentRuntime,
            Operation::AgentLogs(_) => OperationKind::AgentLogs,
            Operation::PlanRevision(_) => OperationKind::PlanRevision,
            Operation::PutSecrets(_) => OperationKind::PutSecrets,
        }
    }
}

/// `probe` takes no arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProbeArgs {}

/// A Namespace as the host records it in its marker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceRef {
    pub id: Ident,
    pub name: Ident,
}

/// An Agent and the service principal it runs as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRef {
    pub id: Ident,
    pub service_principal_id: Ident,
}

/// Arguments of `ensure-namespace` and `delete-namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceArgs {
    pub namespace: NamespaceRef,
}

/// Arguments of `delete-agent`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentArgs {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
}

/// The only harness this product deploys now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HarnessId {
    Openclaw,
}

/// The only execution mode supported now: one gateway process per Agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HarnessMode {
    Embedded,
}

/// Which harness a revision runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Harness {
    pub id: HarnessId,
    pub version: HarnessVersion,
    pub mode: HarnessMode,
}

/// A harness version string: 1–64 characters of `[A-Za-z0-9.+_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HarnessVersion(String);

impl HarnessVersion {
    /// Checks and wraps a version string.
    pub fn new(value: impl Into<String>) -> Result<Self, String> {
        let value = value.into();
        if value.is_empty() || value.len() > 64 {
            return Err(format!(
                "harness version must be 1 to 64 characters, got {}",
                value.len()
            ));
        }
        if !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '_' | '-'))
        {
            return Err(
                "harness version may hold only letters, digits, '.', '+', '_' and '-'".to_owned(),
            );
        }
        Ok(Self(value))
    }

    /// The version text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for HarnessVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        HarnessVersion::new(raw).map_err(serde::de::Error::custom)
    }
}

/// A revision number: 1 to 2^53−1, so it survives every JSON implementation unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RevisionNumber(u64);

/// Largest revision number (JavaScript's safe integer limit).
pub const REVISION_NUMBER_MAX: u64 = (1 << 53) - 1;

impl RevisionNumber {
    /// Checks and wraps a revision number.
    pub fn new(value: u64) -> Result<Self, String> {
        if value == 0 || value > REVISION_NUMBER_MAX {
            return Err(format!(
                "revision number must be between 1 and {REVISION_NUMBER_MAX}, got {value}"
            ));
        }
        Ok(Self(value))
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RevisionNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for RevisionNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = u64::deserialize(deserializer)?;
        RevisionNumber::new(raw).map_err(serde::de::Error::custom)
    }
}

/// Names a revision without its configuration: enough to verify the snapshot on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevisionRef {
    pub id: Ident,
    pub number: RevisionNumber,
    pub configuration_hash: Sha256Hex,
}

/// A full revision as `prepare-revision` stages it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevisionSpec {
    pub id: Ident,
    pub number: RevisionNumber,
    pub harness: Harness,
    /// The rendered `openclaw.json`.
    pub configuration: Configuration,
    /// SHA-256 of the configuration's canonical bytes; hostd recomputes and compares it.
    pub configuration_hash: Sha256Hex,
}

impl RevisionSpec {
    /// The reference that later operations on this revision carry.
    pub fn reference(&self) -> RevisionRef {
        RevisionRef {
            id: self.id.clone(),
            number: self.number,
            configuration_hash: self.configuration_hash.clone(),
        }
    }

    /// Whether the stated hash equals the hash of the configuration carried.
    pub fn hash_matches(&self) -> bool {
        self.configuration.hash() == self.configuration_hash
    }
}

/// Arguments of `prepare-revision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrepareArgs {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
    pub revision: RevisionSpec,
    /// The Agent's initial workspace files, when it was created with some: applied once,
    /// before the gateway first starts (protocol/src/workspace.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::workspace::WorkspaceSetup>,
    /// The Agent's own egress settings, a narrowing of its target's (protocol/src/egress.rs);
    /// none: the target's. They take effect when the revision is activated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::Egress>,
}

/// Arguments of `activate-revision`, `verify-revision`, `stop-revision`, `retire-revision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevisionArgs {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
    pub revision: RevisionRef,
}

/// Arguments of `activate-revision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActivateArgs {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
    pub revision: RevisionRef,
    /// The last served revision, to put back when the candidate does not become ready
    /// (readiness timeout, unit failed, crash loop). With it, the activation finishes on the
    /// host even when the session closes or the deadline passes after the cutover began. Its
    /// snapshot must still be on the host (it is retired only after a successful cutover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RevisionRef>,
}

impl From<RevisionArgs> for ActivateArgs {
    /// An activation without restore (the seed's behaviour).
    fn from(a: RevisionArgs) -> Self {
        Self {
            namespace: a.namespace,
            agent: a.agent,
            revision: a.revision,
            restore: None,
        }
    }
}

impl ActivateArgs {
    /// The revision part, as the other revision operations take it.
    pub fn revision_args(&self) -> RevisionArgs {
        RevisionArgs {
            namespace: self.namespace.clone(),
            agent: self.agent.clone(),
            revision: self.revision.clone(),
        }
    }
}

/// Arguments of `status`: optionally one Namespace only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_id: Option<Ident>,
}

/// Arguments of `operation-status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationStatusArgs {
    pub operation_id: OperationId,
}
