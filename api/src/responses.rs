//! Every answer the API gives that is not one of the model's types as it is: each route's
//! response type is named in the route table (`routes.rs`), and `/openapi.json` shows its
//! JSON Schema. Parts that are the protocol's own answers (a runtime report, a plan's
//! changes, a probe) travel as the protocol serializes them and are described as objects.

use clawfleet_protocol::plan::PlanResult;
use clawfleet_protocol::result::{AgentObservation, OperationResult};
use clawfleet_protocol::runtime::{
    LogCursor, LogEntry, LogPage, RuntimeEvent, RuntimeReport, Workload,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::{DesiredState, Grant, Namespace, Revision, SecretVersion, WorkRecord};

/// A JSON object whose fields the protocol defines (`clawfleet_protocol`), for schemas.
type Object = Map<String, Value>;

/// `GET /healthz`: the coordinator serves and its database answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// `ok`: the database answered a cheap query in time.
    pub database: String,
}

impl Health {
    /// The only answer `/healthz` gives with 200.
    pub fn ok() -> Self {
        Health {
            status: "ok".to_owned(),
            database: "ok".to_owned(),
        }
    }
}

/// A Namespace with its newest Namespace-level work item (`ensure-namespace` or
/// `delete-namespace`), so a Namespace that is not ready says why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceStatus {
    #[serde(flatten)]
    pub namespace: Namespace,
    /// The newest ensure or delete work (state, attempts, last code and message); `null`
    /// before any.
    pub work: Option<WorkRecord>,
}

/// `DELETE /namespaces/{ns}`: the Namespace is being deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceDeleting {
    pub namespace_id: String,
    pub deleting: bool,
}

/// A Configuration generation as written (`POST` and `PUT` of a Configuration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationWritten {
    pub namespace_id: String,
    pub id: String,
    /// 1 for the first, one more for each `PUT`.
    pub generation: u32,
    /// The document as given.
    pub document: Value,
}

/// `DELETE …/agents/{agent}`: the Agent is being deleted by the work item `workId`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentDeleting {
    pub namespace_id: String,
    pub agent_id: String,
    pub deleting: bool,
    pub work_id: i64,
}

/// `POST …/agents/{agent}/deploy`: the new revision and the work item that deploys it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    #[serde(flatten)]
    pub revision: Revision,
    pub work_id: i64,
}

/// `POST …/agents/{agent}/stop`: the Agent is to stop, by the work item `workId`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Stopping {
    pub namespace_id: String,
    pub agent_id: String,
    /// `stopped`.
    pub desired_state: DesiredState,
    pub work_id: i64,
}

/// `POST …/agents/{agent}/reconcile`: the active revision is applied again by `workId`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reconciling {
    pub namespace_id: String,
    pub agent_id: String,
    pub revision_id: String,
    pub work_id: i64,
}

/// An Agent's deployment status: desired state, active and served revision, per-revision
/// progress, open work and the newest work items with their last attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentStatus {
    pub namespace_id: String,
    pub agent_id: String,
    pub desired_state: DesiredState,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub active_revision_id: Option<String>,
    pub served_revision_id: Option<String>,
    /// Nothing open, and the newest request of its kind did not fail.
    pub converged: bool,
    pub revisions: Vec<Revision>,
    pub open_work: Vec<WorkRecord>,
    /// The newest work items, newest first.
    pub recent_work: Vec<WorkRecord>,
    /// The newest work's last code, for tables and scripts.
    pub last_code: Option<String>,
}

/// What the Agent's unit or Pod is doing now (`GET …/runtime`): the target's runtime
/// report (`clawfleet_protocol::runtime::RuntimeReport`) and where it was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRuntime {
    pub namespace_id: String,
    pub agent_id: String,
    /// The host or cluster asked.
    pub target: String,
    /// What the target observes of the Agent: current and served revision, port, unit.
    #[schemars(with = "Object")]
    pub observation: AgentObservation,
    /// The unit or Pod; `null` when none is loaded.
    #[schemars(with = "Option<Object>")]
    pub workload: Option<Workload>,
    /// The uid of the Agent's account (hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_uid: Option<u32>,
    /// Events about the workload (Kubernetes events; hosts have none).
    #[serde(default)]
    #[schemars(with = "Vec<Object>")]
    pub events: Vec<RuntimeEvent>,
    #[serde(default)]
    #[schemars(with = "Vec<Object>")]
    pub recent_lines: Vec<LogEntry>,
}

impl AgentRuntime {
    /// The target's report of the Agent, read from `target`.
    pub fn new(namespace_id: &str, agent_id: &str, target: &str, report: RuntimeReport) -> Self {
        let RuntimeReport {
            observation,
            workload,
            account_uid,
            events,
            recent_lines,
        } = report;
        AgentRuntime {
            namespace_id: namespace_id.to_owned(),
            agent_id: agent_id.to_owned(),
            target: target.to_owned(),
            observation,
            workload,
            account_uid,
            events,
            recent_lines,
        }
    }
}

/// One redacted page of an Agent's log (`GET …/runtime/logs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentLogPage {
    pub namespace_id: String,
    pub agent_id: String,
    /// The entries, oldest first, redacted.
    #[schemars(with = "Vec<Object>")]
    pub entries: Vec<LogEntry>,
    /// Where the next page starts (pass it as `cursor`); `null` when the log is empty.
    #[schemars(with = "Option<String>")]
    pub cursor: Option<LogCursor>,
    /// The page stopped at a limit with entries left.
    pub more: bool,
    /// How many values were redacted in this page.
    pub redactions: u32,
    /// The run the page is of, when `previous` was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
}

impl AgentLogPage {
    /// The target's page of the Agent's log.
    pub fn new(namespace_id: &str, agent_id: &str, page: LogPage) -> Self {
        let LogPage {
            entries,
            cursor,
            more,
            redactions,
            invocation_id,
        } = page;
        AgentLogPage {
            namespace_id: namespace_id.to_owned(),
            agent_id: agent_id.to_owned(),
            entries,
            cursor,
            more,
            redactions,
            invocation_id,
        }
    }
}

/// The revision a plan would deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedRevision {
    pub id: String,
    pub number: u64,
    pub configuration_id: String,
    pub configuration_generation: u32,
    pub configuration_hash: String,
}

/// One Agent's plan: what deploying its next revision would change on its target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentPlan {
    pub agent_id: String,
    /// The host or cluster asked (for an unplaced Agent, the host placement would choose).
    pub target: String,
    /// Whether the Agent is placed on `target` already.
    pub placed: bool,
    pub revision: PlannedRevision,
    pub active_revision_id: Option<String>,
    /// What the target would change (`clawfleet_protocol::plan::PlanResult`).
    #[schemars(with = "Object")]
    pub changes: PlanResult,
    /// The Agent's wave, in a rollout's plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<u32>,
}

/// `POST …/agents/{agent}/plan`: the deploy's plan and the token `--apply-plan` needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeployPlan {
    pub namespace_id: String,
    pub token: String,
    pub agents: Vec<AgentPlan>,
}

/// `POST …/rollouts/plan`: the rollout as it would be created, each Agent's plan, and the
/// token `--apply-plan` needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPlan {
    pub namespace_id: String,
    pub configuration_id: String,
    pub configuration_generation: u32,
    pub waves: u32,
    pub token: String,
    pub agents: Vec<AgentPlan>,
}

/// `POST /hosts/{host}/probe`: hostd's answer to `probe` as the protocol tags it
/// (`"op": "probe"`), stored as the host's last probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostProbe(pub OperationResult);

impl JsonSchema for HostProbe {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HostProbe".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "hostd's answer to probe (clawfleet_protocol::result::ProbeResult), tagged with its operation",
            "type": "object",
            "required": ["op"],
            "properties": {"op": {"type": "string", "const": "probe"}},
        })
    }
}

/// `POST /tokens`: the new token. Its secret (`token`) is shown once, here, and never again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedToken {
    pub id: String,
    /// The bearer token; only its hash is stored.
    pub token: String,
    pub grants: Vec<Grant>,
    /// Seconds since the epoch from which the token is refused; `null`: never.
    pub expires_at: Option<i64>,
}

/// One Agent revision that binds a secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretUse {
    pub agent_id: String,
    pub revision_id: String,
    pub version: u32,
    /// The revision the Agent serves (its active one).
    pub active: bool,
    /// The Agent's newest revision (the one being deployed, when it is not the active one).
    pub newest: bool,
}

/// A secret as the API shows it: its versions and who uses which; never a value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretInfo {
    pub name: String,
    /// The newest version.
    pub version: u32,
    pub fingerprint: String,
    pub written_by: String,
    pub written_at: i64,
    /// Every version, oldest first.
    pub versions: Vec<SecretVersion>,
    /// The Agents' current revisions (active and newest) that bind it.
    pub used_by: Vec<SecretUse>,
}

/// What `POST /namespaces/{ns}/secrets/{name}/deploy` started per Agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretDeploy {
    pub agent_id: String,
    /// The new revision and the work that deploys it, when one was created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
    /// Why no revision was created (the Agent is in a rollout, stopped, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
