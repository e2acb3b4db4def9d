//! Typed results, outcomes and progress events that hostd sends back.
//!
//! Results are read tolerantly, operations strictly: hosts are upgraded before the coordinator
//! (`docs/operator-guide.md`, "Upgrade"), so a newer hostd may add an optional field to an
//! answer, and an older coordinator must still read it. Nothing in a result grants anything;
//! an operation's arguments, which do, keep `deny_unknown_fields`
//! (`protocol/tests/decoding.rs`, `results_from_a_newer_hostd_with_extra_fields_decode`).

use serde::{Deserialize, Serialize};

use crate::failure::Failure;
use crate::ident::{Fingerprint, Ident, OperationId};
use crate::operation::{OperationKind, RevisionNumber};

/// What happened to one operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    Succeeded { result: OperationResult },
    Failed { failure: Failure },
}

impl Outcome {
    /// The failure, if the operation failed.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Outcome::Failed { failure } => Some(failure),
            Outcome::Succeeded { .. } => None,
        }
    }
}

/// The answer to one envelope. `operation_id` is absent when the envelope could not be trusted
/// enough to read it (for example a bad signature).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultMessage {
    pub operation_id: Option<OperationId>,
    pub outcome: Outcome,
}

/// Typed success per operation, tagged by `op` like the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum OperationResult {
    Probe(ProbeResult),
    EnsureNamespace(EnsureNamespaceResult),
    DeleteNamespace(DeleteNamespaceResult),
    PrepareRevision(PrepareResult),
    ActivateRevision(ActivateResult),
    VerifyRevision(VerifyResult),
    StopRevision(StopResult),
    RetireRevision(RetireResult),
    DeleteAgent(DeleteAgentResult),
    Status(Inventory),
    OperationStatus(OperationStatusResult),
    AgentRuntime(Box<crate::runtime::RuntimeReport>),
    AgentLogs(crate::runtime::LogPage),
    PlanRevision(Box<crate::plan::PlanResult>),
    PutSecrets(crate::sealed::PutSecretsResult),
}

impl OperationResult {
    /// Which operation this result answers.
    pub fn kind(&self) -> OperationKind {
        match self {
            OperationResult::Probe(_) => OperationKind::Probe,
            OperationResult::EnsureNamespace(_) => OperationKind::EnsureNamespace,
            OperationResult::DeleteNamespace(_) => OperationKind::DeleteNamespace,
            OperationResult::PrepareRevision(_) => OperationKind::PrepareRevision,
            OperationResult::ActivateRevision(_) => OperationKind::ActivateRevision,
            OperationResult::VerifyRevision(_) => OperationKind::VerifyRevision,
            OperationResult::StopRevision(_) => OperationKind::StopRevision,
            OperationResult::RetireRevision(_) => OperationKind::RetireRevision,
            OperationResult::DeleteAgent(_) => OperationKind::DeleteAgent,
            OperationResult::Status(_) => OperationKind::Status,
            OperationResult::OperationStatus(_) => OperationKind::OperationStatus,
            OperationResult::AgentRuntime(_) => OperationKind::AgentRuntime,
            OperationResult::AgentLogs(_) => OperationKind::AgentLogs,
            OperationResult::PlanRevision(_) => OperationKind::PlanRevision,
            OperationResult::PutSecrets(_) => OperationKind::PutSecrets,
        }
    }
}

/// An inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRange {
    pub start: u16,
    pub end: u16,
}

/// What `probe` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeResult {
    pub hostd_version: String,
    pub protocol_versions: Vec<u32>,
    /// The host's own idea of its name (`/etc/hostname`), for operators.
    pub system_host_name: String,
    pub host_key: Fingerprint,
    pub systemd_version: Option<String>,
    /// Tools hostd needs and did not find; empty when the host is ready. The configured
    /// gateway command appears here by its absolute path (e.g. `/usr/bin/node`) when it is
    /// missing or not executable by the Agent accounts.
    pub missing_tools: Vec<String>,
    pub port_range: PortRange,
    pub max_agents: u32,
    pub agents: u32,
    /// Per-Agent disk and inode limits: `enforced`, or `unavailable: <why>` (hostd; absent
    /// from hostd before it reported them, and from backends without them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<String>,
    /// Whether Agents of different Namespaces are isolated from each other's network:
    /// `namespaces` (each Agent in a network namespace of its own, its port held by the
    /// host), or `unavailable: <what is missing>`, where a host takes a single Namespace
    /// only (hostd; absent from hostd before it reported it, and from backends where the
    /// platform isolates Agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_isolation: Option<String>,
}

/// What `ensure-namespace` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnsureNamespaceResult {
    pub namespace_id: Ident,
    /// False when the Namespace was already there and verified.
    pub created: bool,
}

/// What `delete-namespace` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteNamespaceResult {
    pub namespace_id: Ident,
    /// False when nothing of the Namespace was left on the host.
    pub removed: bool,
    pub agents_removed: u32,
}

/// The systemd view of an Agent's unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitObservation {
    pub name: String,
    pub active_state: String,
    pub sub_state: String,
    pub n_restarts: u32,
    pub enabled: bool,
}

/// What a host actually runs for one Agent. Every Agent-scoped result carries it, so the
/// coordinator always knows the served revision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentObservation {
    /// The revision `current` points at.
    pub current: Option<Ident>,
    /// The revision the host serves: confirmed ready (`/readyz` answered 200, recorded in
    /// `served.json`) for exactly the revision `current` names, with the unit active. `None`
    /// while a candidate is cut over but not (yet) ready: the revision before it no longer
    /// runs, so it is not reported either.
    pub served: Option<Ident>,
    pub port: Option<u16>,
    pub unit: Option<UnitObservation>,
}

/// What `prepare-revision` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrepareResult {
    /// False when a newer revision is current: nothing was written.
    pub ready: bool,
    /// False when the snapshot already existed and verified.
    pub created: bool,
    pub observation: AgentObservation,
    /// Where the Agent's initial workspace files stand, when the prepare carried a setup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceOutcome>,
}

/// What a prepare did with the Agent's initial workspace files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkspaceOutcome {
    /// This prepare wrote them and the completion marker.
    Applied,
    /// The completion marker was already there: nothing was written (edits are kept).
    AlreadyApplied,
    /// A cluster staged them (the Agent's workspace Secret) for the Pod's init container, which
    /// applies them before the gateway starts; a ready activation means they were applied.
    Staged,
}

/// What `activate-revision` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivateResult {
    /// False when the unit already ran this revision: it was served and ready (the fast
    /// path), or a retried activation waited for it again without restarting it.
    pub restarted: bool,
    /// True when the unit file was written and systemd reloaded.
    pub unit_changed: bool,
    pub observation: AgentObservation,
    /// Present when the candidate did not become ready and the last served revision was put
    /// back (asked for with `restore`): it serves again, and the candidate failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
    /// Present when the revision differed from the served one only in its secrets, so the
    /// running gateway was asked to reload them instead of being restarted (`restarted` is
    /// false): whether what it holds was checked against the delivered fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_reload: Option<SecretsReload>,
    /// Present when the revision differed from the served one only in configuration the
    /// gateway applies live (`live_config.rs`): it read the new file without a restart
    /// (`restarted` is false) and reported that configuration as applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_reload: Option<ConfigReload>,
}

/// A configuration applied live by the running gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigReload {
    /// The configuration paths that changed.
    pub changed: Vec<String>,
}

/// How a secrets-only activation was confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SecretsReload {
    /// What the gateway holds was read back (the test gateway's fingerprint report, or
    /// OpenClaw's `secrets.resolve` at every rendered reference, hashed), and it is the
    /// delivered secrets.
    Verified,
    /// The gateway reloaded without a warning, but not every reference could be read back
    /// (OpenClaw knows no credential surface by its path, or the reference is inactive):
    /// what it holds there was not checked.
    Unverified,
}

impl Restored {
    /// The failure when the restore failed too: the candidate's code and class, both reasons.
    pub fn failed_too(candidate: &Failure, revision: &Ident, restore: &Failure) -> Failure {
        Failure::with_class(
            candidate.class,
            candidate.code,
            format!(
                "{}; restoring {revision} failed too: {} ({}); nothing serves",
                candidate.message, restore.message, restore.code
            ),
        )
    }
}

/// A restore after a failed candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restored {
    /// The revision that serves again.
    pub revision: Ident,
    /// Why the candidate was given up.
    pub candidate_failure: Failure,
}

/// What `verify-revision` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResult {
    pub observation: AgentObservation,
}

/// What `stop-revision` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StopResult {
    /// True when the unit served this revision and was stopped now.
    pub stopped: bool,
    pub observation: AgentObservation,
}

/// What `retire-revision` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetireResult {
    pub stopped: bool,
    /// True when the snapshot existed and was removed now.
    pub removed: bool,
    pub observation: AgentObservation,
}

/// What `delete-agent` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteAgentResult {
    /// False when nothing of the Agent was left on the host.
    pub removed: bool,
}

/// One revision snapshot on a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionInventory {
    pub id: Ident,
    pub number: RevisionNumber,
}

/// One Agent on a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInventory {
    pub id: Ident,
    pub service_principal_id: Ident,
    pub account: String,
    pub revisions: Vec<RevisionInventory>,
    pub observation: AgentObservation,
    /// How the Agent's unit on the target differs from what the target itself would write
    /// (a hand-edited unit file, a drop-in overriding it); absent when it does not, or when
    /// the Agent has no unit yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_drift: Option<String>,
    /// The secrets the target holds for the Agent (name, version, fingerprint; never a
    /// value), as its last `put-secrets` left them (on a cluster, as the Agent's Secret
    /// records them); absent where the target does not report them (a hostd from before
    /// secrets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Vec<crate::sealed::SecretVersion>>,
}

/// One Namespace on a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceInventory {
    pub id: Ident,
    pub name: Ident,
    pub agents: Vec<AgentInventory>,
}

/// Something `status` found that it could not read as ours; reported, never repaired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryProblem {
    pub path: String,
    pub message: String,
}

/// What `status` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub namespaces: Vec<NamespaceInventory>,
    pub problems: Vec<InventoryProblem>,
}

/// The steps of host work, for progress events and for "aborted after step X".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    Verify,
    HostLock,
    AgentLock,
    Account,
    Directories,
    Port,
    Snapshot,
    PasswordFile,
    WorkspaceSetup,
    Hooks,
    UnitFile,
    DaemonReload,
    Enable,
    PointerFlip,
    Restart,
    Readiness,
    ServedRecord,
    Stop,
    Disable,
    Remove,
    AccountRemoval,
    /// Opening the sealed secrets and storing them encrypted under the Agent's directory.
    Secrets,
    /// Writing the secrets' files where the running gateway reads them.
    SecretFiles,
    /// Asking the running gateway to reload its secrets and checking what it holds.
    SecretReload,
    /// Replacing the running gateway's configuration file and waiting until it reports the
    /// new configuration applied (a live configuration change).
    ConfigReload,
}

/// The recorded state of an operation id, as `operation-status` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum OperationState {
    /// Another session is working on it now.
    Running {
        kind: OperationKind,
        step: Option<Step>,
    },
    /// Finished; the recorded result.
    Succeeded {
        kind: OperationKind,
        result: Box<OperationResult>,
    },
    /// Finished with a failure; `afterStep` names the last step completed when it was aborted.
    /// Hosts before the rename wrote `after_step`, still read.
    Failed {
        kind: OperationKind,
        failure: Failure,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            rename = "afterStep",
            alias = "after_step"
        )]
        after_step: Option<Step>,
    },
    /// This host has no record of the id (never received, or older than the journal).
    Unknown,
}

/// What `operation-status` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatusResult {
    pub operation_id: OperationId,
    pub state: OperationState,
}

/// A progress event while an operation runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub operation_id: OperationId,
    pub step: Step,
    pub elapsed_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The first message hostd sends on a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    pub hostd_version: String,
    pub protocol_versions: Vec<u32>,
    pub host_key: Fingerprint,
}
