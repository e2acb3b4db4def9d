//! The coordinator's data model as the API shows it: every type an answer carries.
//! Protocol newtypes (`Ident`, `HostName`, `Sha256Hex`, …) travel as their text and are
//! described as strings.

use clawfleet_protocol::egress::{Egress, MAX_ENTRIES};
use clawfleet_protocol::{HostName, Ident, SecretFingerprint, SecretName, Sha256Hex};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Roles, in increasing power; each includes the ones before it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Operate,
    Deploy,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Deploy => "deploy",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Role::Read),
            "operate" => Some(Role::Operate),
            "deploy" => Some(Role::Deploy),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// One grant of a token: a role in one Namespace, or in all (`"*"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grant {
    /// A Namespace id, or `*` for all Namespaces.
    #[schemars(pattern(r"^(\*|[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)$"))]
    pub namespace: String,
    pub role: Role,
}

/// A host known to the coordinator, with its pinned key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Host {
    #[schemars(with = "String")]
    pub name: HostName,
    pub address: String,
    pub port: u16,
    pub host_key: String,
    pub fingerprint: String,
    pub max_agents: u32,
    pub enrolled_at: i64,
    pub last_probe: Option<Value>,
    /// The account the coordinator logs in as, on a host that forbids root login (`hostd
    /// enrol --login-user`); absent: root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_user: Option<String>,
    /// The jump host (bastion) the host is reached through; absent: directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jump: Option<Jump>,
    /// Whether the host's hostd refuses operations of a coordinator whose claim was replaced,
    /// as its last probe said (derived, never stored).
    #[serde(default)]
    pub fencing: Fencing,
}

/// A jump host: its address, port, pinned key and login user. The SSH backend's pool of jump
/// connections is keyed by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Jump {
    #[schemars(length(min = 1, max = 253))]
    pub address: String,
    #[serde(default = "ssh_port")]
    pub port: u16,
    /// The jump host's SSH public key (one OpenSSH line), pinned like a host's.
    pub host_key: String,
    /// The account on the jump host (it only forwards); absent: the coordinator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_user: Option<String>,
}

fn ssh_port() -> u16 {
    22
}

impl Host {
    /// Derives [`Host::fencing`] from the last probe's `protocolVersions`.
    pub fn with_fencing(mut self) -> Self {
        self.fencing = match self
            .last_probe
            .as_ref()
            .and_then(|p| p.get("protocolVersions"))
            .and_then(Value::as_array)
        {
            None => Fencing::Unknown,
            Some(v)
                if v.iter()
                    .any(|x| x.as_u64() == Some(u64::from(clawfleet_protocol::FENCED_VERSION))) =>
            {
                Fencing::Fenced
            }
            Some(_) => Fencing::Unfenced,
        };
        self
    }
}

/// Something a host must be able to do before Agents of several Namespaces share it, as its
/// probe reports it: a probe field that says `unavailable: <what is missing>` when the host
/// cannot. The coordinator refuses a second Namespace on such a host with [`Self::code`], and
/// `occ host probe` warns about it; one Namespace (single-tenant use) keeps working. A host
/// never probed, or whose hostd predates the field, is not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedHostNeed {
    /// The probe's field (`networkIsolation`, `quotas`).
    pub field: &'static str,
    /// What a second Namespace is refused with.
    pub code: crate::codes::Code,
    /// What the host cannot do, completing "host h1 …".
    pub cannot: &'static str,
}

/// Every [`SharedHostNeed`], the one list the refusal and the warnings read: network isolation
/// (issue 28) and per-Agent disk and inode limits (issue 26, N6: without them one tenant can
/// fill the state root for every other).
pub const SHARED_HOST_NEEDS: &[SharedHostNeed] = &[
    SharedHostNeed {
        field: "networkIsolation",
        code: crate::codes::Code::HostNotIsolated,
        cannot: "cannot isolate the networks of Agents of different Namespaces",
    },
    SharedHostNeed {
        field: "quotas",
        code: crate::codes::Code::HostNotQuotaLimited,
        cannot: "cannot limit each Agent's disk and inode use (per-Agent quotas), so one \
                 tenant's Agent could fill the disk for the others",
    },
];

impl SharedHostNeed {
    /// What is missing, when `probe` (a host's probe answer, as stored) says the host lacks
    /// it.
    pub fn missing<'a>(&self, probe: &'a Value) -> Option<&'a str> {
        probe
            .get(self.field)?
            .as_str()?
            .strip_prefix("unavailable: ")
    }
}

/// The [`SHARED_HOST_NEEDS`] `probe` says the host lacks, each with what is missing.
pub fn shared_host_gaps(probe: &Value) -> Vec<(SharedHostNeed, &str)> {
    SHARED_HOST_NEEDS
        .iter()
        .filter_map(|n| n.missing(probe).map(|why| (*n, why)))
        .collect()
}

/// A Kubernetes cluster registered with the coordinator, as the API shows it: never its
/// credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    pub name: String,
    /// The API server's URL (HTTPS).
    pub server: String,
    /// Per-cluster settings (gateway image, command, resources, quota, ...).
    pub settings: Value,
    pub created_at: i64,
    /// The registration's probe in a cluster's words (the Kubernetes backend's `ClusterProbeReport`:
    /// `serverVersion`, `caFingerprint`, `warnings`, `gatewayPort`, ...).
    pub last_probe: Option<Value>,
}

/// A Namespace and where it is placed: a host pool, or one cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Namespace {
    #[schemars(with = "String")]
    pub id: Ident,
    #[schemars(with = "String")]
    pub name: Ident,
    /// The host pool (empty for a cluster Namespace).
    pub hosts: Vec<String>,
    /// The cluster, for a Namespace placed on Kubernetes.
    pub cluster: Option<String>,
    /// Pool hosts where `ensure-namespace` succeeded.
    pub ready_hosts: Vec<String>,
    pub ready: bool,
    pub deleting: bool,
    pub created_at: i64,
    /// The pool's hosts run this Namespace's Agents only (no other Namespace may use them),
    /// which is what lets its configurations trust a proxy's identity headers.
    pub single_tenant: bool,
}

impl Namespace {
    /// A Namespace from its stored row and its pool (host, ready) or cluster (name, ready):
    /// readiness is derived here, the same for every store.
    pub fn from_pool(
        (id, name): (Ident, Ident),
        pool: Vec<(String, bool)>,
        cluster: Option<(String, bool)>,
        deleting: bool,
        created_at: i64,
        single_tenant: bool,
    ) -> Self {
        let ready_hosts: Vec<String> = pool
            .iter()
            .filter(|(_, r)| *r)
            .map(|(h, _)| h.clone())
            .collect();
        let ready = match &cluster {
            Some((_, ready)) => *ready,
            None => !pool.is_empty() && ready_hosts.len() == pool.len(),
        };
        Self {
            id,
            name,
            hosts: pool.into_iter().map(|(h, _)| h).collect(),
            cluster: cluster.map(|(c, _)| c),
            ready_hosts,
            ready,
            deleting,
            created_at,
            single_tenant,
        }
    }
}

/// A Configuration generation: a native `openclaw.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    #[schemars(with = "String")]
    pub namespace_id: Ident,
    #[schemars(with = "String")]
    pub id: Ident,
    pub generation: u32,
    pub document: Value,
    pub created_at: i64,
}

/// What the operator wants an Agent to be doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DesiredState {
    Running,
    Stopped,
    Deleted,
}

impl DesiredState {
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Running => "running",
            DesiredState::Stopped => "stopped",
            DesiredState::Deleted => "deleted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(DesiredState::Running),
            "stopped" => Some(DesiredState::Stopped),
            "deleted" => Some(DesiredState::Deleted),
            _ => None,
        }
    }
}

/// An Agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    #[schemars(with = "String")]
    pub namespace_id: Ident,
    #[schemars(with = "String")]
    pub id: Ident,
    #[schemars(with = "String")]
    pub service_principal_id: Ident,
    #[schemars(with = "String")]
    pub configuration_id: Ident,
    pub desired_state: DesiredState,
    /// The host the Agent is placed on (sticky once set).
    pub host: Option<String>,
    pub port: Option<u16>,
    #[schemars(with = "Option<String>")]
    pub active_revision_id: Option<Ident>,
    /// What the host last reported serving.
    #[schemars(with = "Option<String>")]
    pub served_revision_id: Option<Ident>,
    /// What happens when a candidate does not become ready.
    pub restore: RestorePolicy,
    pub created_at: i64,
    /// The Agent's own egress settings, a narrowing of its target's policy (each list left
    /// out is the target's); absent when it has none. A deploy sends them with its prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<EgressSchema>")]
    pub egress: Option<Egress>,
}

impl Agent {
    /// Under `restore: last-served`, the revision a failed activation of `candidate` falls
    /// back to: the one last served, if another. (The worker also needs it still on record
    /// and not retired.)
    pub fn last_served_fallback(&self, candidate: &str) -> Option<&str> {
        if self.restore != RestorePolicy::LastServed {
            return None;
        }
        self.served_revision_id
            .as_deref()
            .filter(|served| *served != candidate)
    }
}

/// How the OpenAPI document describes an Agent's `egress`. The value itself is
/// [`Egress`] (protocol/src/egress.rs), whose decoding checks the shape and names the entry;
/// this only writes the same rules down as a schema.
#[derive(Debug)]
pub struct EgressSchema;

/// An IPv4 CIDR as `a.b.c.d/n`; [`Egress`]'s decoding also refuses a prefix above 32 and
/// bits set past it.
pub const CIDR_PATTERN: &str = r"^((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])/[0-9]{1,2}$";

impl schemars::JsonSchema for EgressSchema {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Egress".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "description": "What the Agent may reach, a narrowing of its target's policy (a host pool's hostd.toml [network], a cluster's TCP 443 to public addresses): each list left out (or null) is the target's, an empty list is none. An entry the target does not allow fails the deploy with EGRESS_NOT_ALLOWED.",
            "properties": {
                "ports": {
                    "type": ["array", "null"],
                    "description": "TCP ports to public addresses.",
                    "items": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "maxItems": MAX_ENTRIES,
                    "uniqueItems": true,
                },
                "allow": {
                    "type": ["array", "null"],
                    "description": "IPv4 CIDRs (no bits set past the prefix) reachable on any port, each inside one the target allows.",
                    "items": {"type": "string", "pattern": CIDR_PATTERN},
                    "maxItems": MAX_ENTRIES,
                    "uniqueItems": true,
                },
            },
            "additionalProperties": false,
        })
    }
}

/// The last attempt at a work item, or at a revision's work (the `lastAttempt` of a work
/// record and of a revision): how it ended, when, and how many attempts counted against the
/// budget by then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastAttempt {
    pub code: String,
    pub message: String,
    /// Seconds since the epoch.
    pub at: i64,
    /// Attempts that counted against the budget.
    pub attempts: u32,
}

/// Where a revision is in its life. The revision named by the Agent's `activeRevisionId` is
/// `activating`, `active` or `failed` (a committed candidate that never became ready); no
/// other revision is ever `activating` or `active`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RevisionStatus {
    /// Created, not yet committed (its deploy may have staged it on the target already).
    Pending,
    /// Staged on the host (prepare succeeded) and not committed: a newer revision was active,
    /// or the commit lost its compare-and-set. A revision committed right after its prepare
    /// goes from pending to activating.
    Prepared,
    /// Committed as the active revision; the host is switching to it or waiting for it to
    /// become ready. Nothing is served meanwhile.
    Activating,
    /// Committed and served by the host.
    Active,
    /// Replaced by a newer revision (skipped before it was committed, or committed over).
    Superseded,
    /// Failed permanently (before or after the commit).
    Failed,
    /// Was active; the Agent was stopped (`activeRevisionId` is cleared).
    Stopped,
    /// Removed from the host after a successor became active.
    Retired,
}

impl RevisionStatus {
    /// Every status, for the OpenAPI document and tests.
    pub const ALL: &[RevisionStatus] = &[
        RevisionStatus::Pending,
        RevisionStatus::Prepared,
        RevisionStatus::Activating,
        RevisionStatus::Active,
        RevisionStatus::Superseded,
        RevisionStatus::Failed,
        RevisionStatus::Stopped,
        RevisionStatus::Retired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RevisionStatus::Pending => "pending",
            RevisionStatus::Prepared => "prepared",
            RevisionStatus::Activating => "activating",
            RevisionStatus::Active => "active",
            RevisionStatus::Superseded => "superseded",
            RevisionStatus::Failed => "failed",
            RevisionStatus::Stopped => "stopped",
            RevisionStatus::Retired => "retired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.as_str() == s)
    }
}

/// An immutable Agent revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    #[schemars(with = "String")]
    pub namespace_id: Ident,
    #[schemars(with = "String")]
    pub agent_id: Ident,
    #[schemars(with = "String")]
    pub id: Ident,
    pub number: u64,
    #[schemars(with = "String")]
    pub configuration_id: Ident,
    pub configuration_generation: u32,
    #[schemars(with = "String")]
    pub configuration_hash: Sha256Hex,
    pub status: RevisionStatus,
    pub last_attempt: Option<LastAttempt>,
    pub created_at: i64,
    /// Why the revision's activation failed, as the target showed it (bounded, redacted):
    /// component, check, checkedAt, code, message, the last exit and the newest log lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_failure: Option<RuntimeFailure>,
    #[serde(skip)]
    pub rendered: Value,
    /// The secret versions the revision was deployed with, by name (never a value).
    #[serde(default)]
    pub secrets: Vec<SecretBinding>,
    /// Whether a prepare of this revision was ever sent to a target: one that never reached
    /// a target has nothing there to retire.
    #[serde(skip)]
    pub staged: bool,
}

/// Why a revision's activation failed, as the target showed it right after (bounded,
/// redacted): which check failed, the failure's code and message, the unit's or Pod's state,
/// its last exit, events and newest log lines. Every field has a default, so evidence
/// recorded by an older coordinator still reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RuntimeFailure {
    /// `gateway`.
    pub component: String,
    /// `readiness`, `unit`, `listener` or `rollout`.
    pub check: String,
    /// Seconds since the epoch.
    pub checked_at: i64,
    pub code: String,
    pub message: String,
    pub active_state: Option<String>,
    pub sub_state: Option<String>,
    pub restarts: Option<u32>,
    /// How the gateway's process last ended (`clawfleet_protocol::runtime::LastExit`).
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub last_exit: Option<clawfleet_protocol::runtime::LastExit>,
    /// Events about the workload (`clawfleet_protocol::runtime::RuntimeEvent`).
    #[schemars(with = "Vec<serde_json::Map<String, Value>>")]
    pub events: Vec<clawfleet_protocol::runtime::RuntimeEvent>,
    pub last_lines: Vec<EvidenceLine>,
}

/// One log line kept as evidence of a failed activation (redacted, bounded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvidenceLine {
    pub at: String,
    /// `gateway` or `supervisor`.
    #[schemars(with = "String")]
    pub source: clawfleet_protocol::runtime::LogSource,
    pub message: String,
}

/// An audit event.
impl Revision {
    /// The id of revision `number` of an Agent whose rendered configuration hashes to
    /// `configuration_hash`: one rule for every store and every plan. The hash's first 8 hex
    /// digits make an id name its content, so a number issued again (a database restored
    /// from an older backup) never reissues an id for different content: targets see a new
    /// id, and refuse its number while they serve a newer one (see `revision_floor`).
    pub fn id_for(
        number: u64,
        configuration_hash: &str,
    ) -> Result<Ident, clawfleet_protocol::ident::IdentError> {
        let tag: String = configuration_hash.chars().take(8).collect();
        Ident::new(format!("rev-{number}-{tag}"))
    }

    /// The number in an id made by [`Revision::id_for`] (`rev-N-…`), as targets report ids.
    pub fn number_of(id: &str) -> Option<u64> {
        let rest = id.strip_prefix("rev-")?;
        let digits = rest.split('-').next()?;
        digits.parse().ok()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub id: i64,
    pub at: i64,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub detail: Value,
}

/// An enum stored and sent as fixed kebab-case text: `as_str`, `parse` and `ALL` from one list.
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $text, )* }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s { $( $text => Some($name::$variant), )* _ => None }
            }
        }
    };
}

text_enum! {
    /// What the drift sweep found for one Agent.
    DriftState {
        /// The target runs what the coordinator expects.
        Synced = "synced",
        /// The target differs (the reason says how); nothing was repaired.
        Drift = "drift",
        /// The target could not be asked.
        Unreachable = "unreachable",
        /// Work for the Agent is open: it is being changed, so the sweep does not judge it.
        Converging = "converging",
    }
}

text_enum! {
    /// How an Agent drifted.
    DriftReason {
        /// The unit (or Deployment) does not run although the Agent should (stopped or failed
        /// outside clawfleet).
        UnitNotRunning = "unit-not-running",
        /// The unit runs although the Agent is stopped.
        UnitRunningWhileStopped = "unit-running-while-stopped",
        /// `current` names another revision than the active one (or none).
        CurrentChanged = "current-changed",
        /// The unit runs, but the host does not record the current revision as served.
        NotServed = "not-served",
        /// The host serves another revision than the active one.
        ServedNotActive = "served-not-active",
        /// The active revision's snapshot is missing or does not verify.
        SnapshotChanged = "snapshot-changed",
        /// The Agent's unit on the target is not what the target would write (a hand-edited
        /// unit file, a drop-in overriding it).
        UnitFileChanged = "unit-file-changed",
        /// The target holds an Agent (or an Agent directory) the coordinator does not know.
        UnknownAgent = "unknown-agent",
        /// The coordinator expects the Agent on the target, which lacks it.
        MissingOnTarget = "missing-on-target",
        /// The target reports a problem the sweep cannot attribute to one Agent.
        TargetProblem = "target-problem",
        /// What runs is not what clawfleet applied: a cluster Deployment's Pod template was
        /// edited (a container's image, command or args, a container added or removed).
        WorkloadChanged = "workload-changed",
        /// The secrets the target holds for the Agent (names, versions, fingerprints) are not
        /// those its active revision binds.
        SecretsChanged = "secrets-changed",
    }
}

/// One drift finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftRow {
    /// The host or cluster name.
    pub target: String,
    /// Empty for a stray the target could not attribute to a Namespace.
    pub namespace_id: String,
    /// The Agent id, or the path of a stray directory.
    pub agent_id: String,
    pub state: DriftState,
    pub reason: Option<DriftReason>,
    pub message: String,
    /// Seconds since the epoch.
    pub checked_at: i64,
}

text_enum! {
    /// What a failed activation does (`restore` of an Agent).
    RestorePolicy {
        /// The seed's behaviour: the failed candidate stays selected, nothing is rolled back.
        None = "none",
        /// The target puts the last served revision back within the same operation, and the
        /// coordinator sets `activeRevisionId` back to it.
        LastServed = "last-served",
    }
}

text_enum! {
    /// Where a rollout is. `running`, `paused` and `waiting` are open: their Agents belong to
    /// the rollout (ordinary deploys of them are refused).
    RolloutState {
        /// Deploying its current wave, or about to start the next one.
        Running = "running",
        /// Paused by an operator: nothing new starts; deploys in flight finish.
        Paused = "paused",
        /// A wave finished and the rollout waits for `promote` (manual promotion).
        Waiting = "waiting",
        /// The failure budget was spent: nothing more is deployed.
        Halted = "halted",
        /// Aborted by an operator: nothing more is deployed; Agents done stay as they are.
        Aborted = "aborted",
        /// Every selected Agent was deployed (or failed within the budget).
        Done = "done",
    }
}

impl RolloutState {
    /// The open states: the rollout may still deploy something.
    pub const OPEN: &'static [RolloutState] = &[
        RolloutState::Running,
        RolloutState::Paused,
        RolloutState::Waiting,
    ];

    /// Whether the rollout may still deploy something.
    pub fn is_open(self) -> bool {
        Self::OPEN.contains(&self)
    }
}

text_enum! {
    /// Where one Agent of a rollout is.
    RolloutAgentState {
        /// Not deployed yet.
        Pending = "pending",
        /// Its revision's deploy is queued or running.
        Deploying = "deploying",
        /// The new revision serves.
        Succeeded = "succeeded",
        /// The new revision did not become active (the code says why).
        Failed = "failed",
        /// The new revision did not become ready and the last served revision serves again.
        Restored = "restored",
        /// Not deployed: the rollout halted or was aborted first, or the Agent was deleted.
        Skipped = "skipped",
    }
}

impl RolloutAgentState {
    /// Whether the Agent's part in the rollout is over.
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            RolloutAgentState::Pending | RolloutAgentState::Deploying
        )
    }

    /// Whether it counts against the failure budget.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            RolloutAgentState::Failed | RolloutAgentState::Restored
        )
    }
}

/// One Agent of a rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAgent {
    #[schemars(with = "String")]
    pub agent_id: Ident,
    /// 0 is the canary wave when the rollout has a canary.
    pub wave: u32,
    pub state: RolloutAgentState,
    pub revision_id: Option<String>,
    pub work_id: Option<i64>,
    /// How its deploy ended (the work's last code), or why it was skipped.
    pub code: Option<String>,
    pub message: Option<String>,
    /// Seconds since the epoch.
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
}

/// What a rollout deploys to each of its Agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutSubject {
    /// One Configuration generation, the same for every Agent.
    Configuration { id: Ident, generation: u32 },
    /// A secret's newest version (`occ secret rotate`): each Agent keeps the Configuration
    /// generation of its newest revision and binds the newest version of every secret, so
    /// on a host the change is secrets-only and the gateway reloads without a restart.
    /// `version` is the newest when the rollout was created.
    Secret { name: SecretName, version: u32 },
}

/// The secret a rollout rolls out (`secret` of [`Rollout`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSecret {
    #[schemars(with = "String")]
    pub name: SecretName,
    /// The newest version when the rollout was created: each Agent binds this or a newer one.
    pub version: u32,
}

/// A rollout: one Configuration generation, or a secret's newest version, to many Agents of a
/// Namespace, canary first, then waves, under one failure budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    pub id: i64,
    #[schemars(with = "String")]
    pub namespace_id: Ident,
    /// The Configuration every Agent gets; `null` for a secret's rollout.
    #[schemars(with = "Option<String>")]
    pub configuration_id: Option<Ident>,
    /// The generation every Agent gets (the latest when the rollout was created); `null` for a
    /// secret's rollout.
    pub configuration_generation: Option<u32>,
    /// The secret whose newest version every Agent gets; absent for a Configuration's rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<RolloutSecret>,
    pub canary: u32,
    pub max_parallel: u32,
    /// Failures tolerated: one more halts the rollout.
    pub max_failures: u32,
    pub pause_between_seconds: u32,
    pub manual_promote: bool,
    pub state: RolloutState,
    /// The wave being deployed (or just finished, while paused between waves or waiting).
    pub wave: u32,
    pub waves: u32,
    /// When the next wave may start (pause between waves), seconds since the epoch.
    pub next_wave_at: Option<i64>,
    pub message: Option<String>,
    pub created_by: String,
    /// Seconds since the epoch.
    pub created_at: i64,
    pub updated_at: i64,
    pub agents: Vec<RolloutAgent>,
}

impl Rollout {
    /// What the rollout deploys; `None` only for a row that names neither (a corrupt store).
    pub fn subject(&self) -> Option<RolloutSubject> {
        match (
            &self.secret,
            &self.configuration_id,
            self.configuration_generation,
        ) {
            (Some(s), _, _) => Some(RolloutSubject::Secret {
                name: s.name.clone(),
                version: s.version,
            }),
            (None, Some(id), Some(generation)) => Some(RolloutSubject::Configuration {
                id: id.clone(),
                generation,
            }),
            _ => None,
        }
    }

    /// Agents that failed or were restored, against the budget.
    pub fn failures(&self) -> u32 {
        self.agents.iter().filter(|a| a.state.is_failure()).count() as u32
    }
}

text_enum! {
    /// Where an Agent's initial workspace files stand.
    WorkspaceState {
        /// Stored, not applied on the Agent's target yet (the next prepare carries them).
        Pending = "pending",
        /// The target applied them and wrote its completion marker.
        Applied = "applied",
        /// The last attempt failed (the failure's code and message say why); the next
        /// deployment pass tries again.
        Failed = "failed",
    }
}

/// One initial workspace file as the API shows it: never its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFileInfo {
    #[schemars(with = "String")]
    pub name: clawfleet_protocol::workspace::WorkspaceName,
    pub size: u64,
    #[schemars(with = "String")]
    pub sha256: Sha256Hex,
    /// Whether the coordinator still holds the content (until an activation succeeded after
    /// the target applied it).
    pub content_held: bool,
}

/// An Agent's initial workspace files and their setup state
/// (`GET /namespaces/{ns}/agents/{agent}/workspace`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSetupInfo {
    pub state: WorkspaceState,
    /// Unix seconds.
    pub applied_at: Option<i64>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    /// Unix seconds.
    pub updated_at: i64,
    pub files: Vec<WorkspaceFileInfo>,
}

text_enum! {
    /// Whether a host refuses operations of a coordinator whose claim was replaced.
    Fencing {
        /// hostd speaks protocol version 2 and keeps each Agent's highest fence.
        Fenced = "fenced",
        /// hostd predates fencing (protocol version 1 only): its operations go unfenced;
        /// upgrade it before running several coordinators.
        Unfenced = "unfenced",
        /// Not probed yet.
        Unknown = "unknown",
    }
}

// `text_enum!` derives a fixed list, so the default is written out.
#[allow(clippy::derivable_impls)]
impl Default for Fencing {
    fn default() -> Self {
        Fencing::Unknown
    }
}

text_enum! {
    /// What a work item does.
    WorkKind {
        EnsureNamespace = "ensure-namespace",
        Deploy = "deploy",
        Stop = "stop",
        DeleteAgent = "delete-agent",
        DeleteNamespace = "delete-namespace",
    }
}

impl WorkKind {
    /// Kinds that hold their whole lane (the Agent, or for Namespace-level kinds the whole
    /// Namespace) until they finish: nothing queued after them in that lane runs first.
    pub const BARRIERS: &'static [WorkKind] = &[
        WorkKind::EnsureNamespace,
        WorkKind::DeleteNamespace,
        WorkKind::DeleteAgent,
    ];
}

text_enum! {
    /// Where a work item is in the queue.
    WorkState {
        /// Waiting for its `not_before` time and a free lane.
        Queued = "queued",
        /// Claimed by a worker under a lease.
        Running = "running",
        /// Finished; its last code says how.
        Done = "done",
        /// Finished without success; retrying cannot help (or the budget is spent).
        Failed = "failed",
    }
}

/// A work item as deployment status and `occ ... --wait` show it: what it does, where it is,
/// and its last attempt (code, message, time in seconds), so failed stop and delete work is as
/// visible as a failed revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkRecord {
    pub id: i64,
    pub kind: WorkKind,
    pub revision_id: Option<String>,
    pub state: WorkState,
    /// Attempts that counted against the budget.
    pub attempts: u32,
    pub last_attempt: Option<LastAttempt>,
    /// Seconds since the epoch.
    pub created_at: i64,
}

#[cfg(test)]
mod tests {
    use super::{Egress, EgressSchema, MAX_ENTRIES, Revision};
    use schemars::JsonSchema as _;

    /// The schema names exactly the fields the protocol's type carries, with its limit.
    #[test]
    fn the_egress_schema_describes_the_protocols_type() {
        let full = Egress {
            ports: Some(vec![443]),
            allow: Some(vec!["10.0.0.0/8".into()]),
        };
        let carried = serde_json::to_value(&full).unwrap_or_default();
        let schema = EgressSchema::json_schema(&mut schemars::SchemaGenerator::default());
        let schema = schema.as_value();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert_eq!(keys(&schema["properties"]), keys(&carried));
        for field in keys(&carried) {
            assert_eq!(
                schema["properties"][&field]["maxItems"], MAX_ENTRIES,
                "{field}"
            );
        }
        assert_eq!(schema["additionalProperties"], false);
        // As requests and the Agent show it: inline, and optional.
        for (what, doc) in [
            (
                "NewAgent",
                crate::routes::schema_of::<crate::requests::NewAgent>(),
            ),
            (
                "AgentPatch",
                crate::routes::schema_of::<crate::requests::AgentPatch>(),
            ),
            ("Agent", crate::routes::response_schema_of::<super::Agent>()),
        ] {
            let egress = &doc["properties"]["egress"];
            assert!(
                egress.to_string().contains("uniqueItems"),
                "{what}: {egress}"
            );
            let required = doc["required"].as_array().cloned().unwrap_or_default();
            assert!(!required.contains(&"egress".into()), "{what}: {doc}");
        }
    }

    #[test]
    fn a_revision_id_names_its_number_and_content() {
        let a = "3fa9c2d1".to_owned() + &"0".repeat(56);
        let b = "77aa0011".to_owned() + &"0".repeat(56);
        let id = |n: u64, hash: &str| Revision::id_for(n, hash).map(String::from);
        assert_eq!(id(5, &a), Ok("rev-5-3fa9c2d1".to_owned()));
        assert_ne!(id(5, &a), id(5, &b));
        assert_eq!(id(12, &a).map(|i| Revision::number_of(&i)), Ok(Some(12)));
        // Ids from before the content tag, and ids that are not ours.
        assert_eq!(Revision::number_of("rev-7"), Some(7));
        assert_eq!(Revision::number_of("release-7"), None);
        assert_eq!(Revision::number_of("rev-x-1"), None);
    }
}

/// One version of a secret, as the API shows it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretVersion {
    #[schemars(with = "String")]
    pub name: SecretName,
    /// 1 for the first write, one more for every write after it; never reused, even after
    /// the secret was deleted and written again.
    pub version: u32,
    /// `sha256:` and the hex of SHA-256 over the value's exact bytes.
    #[schemars(with = "String")]
    pub fingerprint: SecretFingerprint,
    /// The token principal that wrote it.
    pub written_by: String,
    /// Seconds since the epoch.
    pub written_at: i64,
}

/// A secret version a revision was deployed with (the revision's `secrets`).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct SecretBinding {
    #[schemars(with = "String")]
    pub name: SecretName,
    pub version: u32,
    #[schemars(with = "String")]
    pub fingerprint: SecretFingerprint,
}
