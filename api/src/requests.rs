//! Every request the API takes: JSON bodies (strict: unknown fields are refused) and query
//! strings, with the JSON Schemas `/openapi.json` shows for them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::Grant;

/// An `Ident` (`clawfleet_protocol::Ident`) as a JSON Schema pattern, for `/openapi.json`.
pub const IDENT_PATTERN: &str = "^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$";
/// A host's address: an IP address or DNS name, never an option (`-…`).
pub const ADDRESS_PATTERN: &str = "^[A-Za-z0-9.:][A-Za-z0-9.:-]*$";
/// A host name: an `Ident` that is also a `HostName` (no `_`).
pub const HOST_NAME_PATTERN: &str = "^[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$";

/// Body of `POST /namespaces`: a Namespace on a host pool (`hosts`) or on one Kubernetes
/// cluster (`cluster`), chosen at creation.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewNamespace {
    #[schemars(pattern(IDENT_PATTERN))]
    pub id: String,
    #[serde(default)]
    #[schemars(pattern(IDENT_PATTERN))]
    pub name: Option<String>,
    #[serde(default)]
    #[schemars(inner(pattern(HOST_NAME_PATTERN)))]
    pub hosts: Vec<String>,
    #[serde(default)]
    #[schemars(pattern(IDENT_PATTERN))]
    pub cluster: Option<String>,
    /// The pool's hosts run this Namespace's Agents only: no other Namespace may put them in
    /// its pool. Only then may its configurations use `gateway.auth.mode: "trusted-proxy"`
    /// or `allowTailscale` (on a shared host any Agent could forge a proxy's headers).
    #[serde(default)]
    pub single_tenant: bool,
}

/// Body of `POST /hosts`.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewHost {
    #[schemars(pattern(HOST_NAME_PATTERN))]
    pub name: String,
    #[schemars(pattern(ADDRESS_PATTERN), length(max = 253))]
    pub address: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// The host's SSH public key (the line from `/etc/ssh/ssh_host_ed25519_key.pub`), pinned.
    pub host_key: String,
    #[serde(default = "default_max_agents")]
    pub max_agents: u32,
    /// The account to log in as where root login is forbidden (`hostd enrol --login-user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub login_user: Option<String>,
    /// The jump host the host is reached through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jump: Option<crate::model::Jump>,
}

fn default_port() -> u16 {
    22
}

fn default_max_agents() -> u32 {
    100
}

/// Body of `POST /clusters`: a kubeconfig (its text) and the cluster's settings.
#[derive(Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewCluster {
    #[schemars(pattern(IDENT_PATTERN))]
    pub name: String,
    /// The kubeconfig's text, with everything inline (`*-data`, `token`): a file reference
    /// (`certificate-authority`, `client-certificate`, `client-key`, `tokenFile`) is refused,
    /// never read on the coordinator. `occ cluster add` reads them on the operator's machine.
    pub kubeconfig: String,
    #[serde(default)]
    pub context: Option<String>,
    /// Per-cluster settings (`clawfleet_kube::ClusterSettings`, camelCase).
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub settings: Value,
}

impl std::fmt::Debug for NewCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewCluster")
            .field("name", &self.name)
            .field("kubeconfig", &"<redacted>")
            .field("context", &self.context)
            .field("settings", &self.settings)
            .finish()
    }
}

/// Body of `PUT /clusters/{cluster}`: new credentials and settings for a registered cluster.
/// `settings` replaces the stored settings whole; without `kubeconfig` the stored credentials
/// stay. Validated, probed and checked like a registration.
#[derive(Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterUpdate {
    /// The kubeconfig's text, everything inline (as for `POST /clusters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Per-cluster settings (`clawfleet_kube::ClusterSettings`, camelCase).
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub settings: Value,
}

impl std::fmt::Debug for ClusterUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterUpdate")
            .field(
                "kubeconfig",
                &self.kubeconfig.as_ref().map(|_| "<redacted>"),
            )
            .field("context", &self.context)
            .field("settings", &self.settings)
            .finish()
    }
}

/// Body of `PUT /hosts/{host}`.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostUpdate {
    #[schemars(pattern(ADDRESS_PATTERN), length(max = 253))]
    pub address: String,
    #[serde(default = "default_port")]
    pub port: u16,
    pub host_key: String,
    #[serde(default = "default_max_agents")]
    pub max_agents: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub login_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jump: Option<crate::model::Jump>,
}

/// Body of `POST /namespaces/{ns}/configurations`.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewConfiguration {
    #[schemars(pattern(IDENT_PATTERN))]
    pub id: String,
    /// The native OpenClaw configuration (`openclaw.json`).
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub document: Value,
}

/// Body of `PUT /namespaces/{ns}/configurations/{cfg}`.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigurationUpdate {
    /// The native OpenClaw configuration (`openclaw.json`).
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub document: Value,
}

/// Harness authentication: only operator-managed runtime credentials are supported.
///
/// Decoding reads `method` first: `runtime` takes no other field (an unknown one is an invalid
/// body, as elsewhere), while any other method decodes whatever its other fields (a
/// `codex_pat` with its `source`, say) so that the check refuses it as
/// HARNESS_AUTH_UNSUPPORTED instead of as an unknown field.
#[derive(Debug, Clone)]
pub struct HarnessAuth {
    pub method: String,
}

/// The only supported harness authentication method.
pub const HARNESS_AUTH_RUNTIME: &str = "runtime";

impl Serialize for HarnessAuth {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("method", &self.method)?;
        m.end()
    }
}

impl schemars::JsonSchema for HarnessAuth {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HarnessAuth".into()
    }

    /// Only `{"method": "runtime"}` is deployable; other methods are decoded to be refused
    /// with HARNESS_AUTH_UNSUPPORTED.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "required": ["method"],
            "properties": {"method": {"type": "string", "enum": [HARNESS_AUTH_RUNTIME]}},
            "additionalProperties": false,
        })
    }
}

impl<'de> Deserialize<'de> for HarnessAuth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut fields = serde_json::Map::<String, Value>::deserialize(d)?;
        let method = match fields.remove("method") {
            Some(Value::String(m)) => m,
            Some(_) => return Err(D::Error::custom("method must be a string")),
            None => return Err(D::Error::missing_field("method")),
        };
        if method == HARNESS_AUTH_RUNTIME
            && let Some(key) = fields.keys().next()
        {
            return Err(D::Error::unknown_field(key, &["method"]));
        }
        Ok(HarnessAuth { method })
    }
}

/// Body of `POST /namespaces/{ns}/agents`.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewAgent {
    #[schemars(pattern(IDENT_PATTERN))]
    pub id: String,
    #[serde(default)]
    #[schemars(pattern(IDENT_PATTERN))]
    pub service_principal_id: Option<String>,
    #[schemars(pattern(IDENT_PATTERN))]
    pub configuration_id: String,
    #[serde(default)]
    pub harness_auth: Option<HarnessAuth>,
    /// What a failed activation does: `none` (default) or `last-served`.
    #[serde(default)]
    pub restore: Option<crate::model::RestorePolicy>,
    /// Files written once into the Agent's workspace before its gateway first starts (at
    /// most 32, 64 KiB each, 128 KiB in all); never returned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspace_files: Vec<NewWorkspaceFile>,
    /// The Agent's own egress settings, a narrowing of its target's (default: the target's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<crate::model::EgressSchema>")]
    pub egress: Option<clawfleet_protocol::egress::Egress>,
}

/// `POST …/agents/{agent}/deploy`'s query.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployQuery {
    /// The token of a plan of this deploy (`POST …/plan`): refused with PLAN_STALE unless the
    /// plan is still current.
    #[schemars(length(min = 1, max = 64))]
    pub plan_token: Option<String>,
}

/// Body of `PATCH /namespaces/{ns}/agents/{agent}`.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentPatch {
    #[schemars(pattern(IDENT_PATTERN))]
    #[serde(default)]
    pub configuration_id: Option<String>,
    /// What a failed activation does from the next deploy on: `none` or `last-served`.
    #[serde(default)]
    pub restore: Option<crate::model::RestorePolicy>,
    /// The Agent's own egress settings from the next deploy on, replacing its current ones;
    /// `{}` drops them (the target's policy applies), and leaving the field out keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<crate::model::EgressSchema>")]
    pub egress: Option<clawfleet_protocol::egress::Egress>,
}

/// One file of `workspaceFiles` in `POST /namespaces/{ns}/agents`: a name and exactly one of
/// `content` (UTF-8 text) or `contentBase64` (any bytes).
#[derive(Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewWorkspaceFile {
    /// A relative path inside the workspace: 1 to 4 components of letters, digits, '.', '_'
    /// and '-', none '.' or '..', at most 200 bytes.
    #[schemars(length(min = 1, max = 200))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

impl std::fmt::Debug for NewWorkspaceFile {
    /// Never the content.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewWorkspaceFile")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Body of `POST /namespaces/{ns}/secrets`: a new version of a secret. The value never comes
/// back in any answer, log or audit event.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSecret {
    /// 1–48 characters of lowercase letters, digits and '-', starting with a letter and
    /// ending with a letter or digit.
    #[schemars(regex(pattern = r"^[a-z]([a-z0-9-]{0,46}[a-z0-9])?$"))]
    pub name: String,
    /// The value: 1 byte to 64 KiB of UTF-8, no NUL, not ending with a newline.
    #[schemars(length(min = 1))]
    pub value: String,
}

impl std::fmt::Debug for NewSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewSecret")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// `GET /audit`'s query.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditQuery {
    /// Most events, newest first (1 to 1000, default 100).
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<u32>,
    /// Only events of this action (`agent.logs.read`, `agent.deploy`, …).
    #[schemars(length(min = 1, max = 64))]
    pub action: Option<String>,
}

/// `GET /drift`'s query.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DriftQuery {
    /// Only rows of this state: synced, drift, unreachable or converging.
    #[schemars(length(min = 1, max = 16))]
    pub state: Option<String>,
}

/// A list route's query.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PageQuery {
    /// Continue after the page whose answer carried this cursor (its `X-Next-Cursor`
    /// header); without it, the first page.
    #[schemars(length(min = 1, max = 512))]
    pub cursor: Option<String>,
    /// Most items in the page (1 to 1000, default 500).
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<u32>,
}

/// A log request, as the query string of `GET …/runtime/logs` carries it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogsQuery {
    /// The newest N lines (1 to 1000). Without any of tailLines, sinceSeconds and cursor, the
    /// newest 100.
    #[schemars(range(min = 1, max = 1000))]
    pub tail_lines: Option<u32>,
    /// Only lines of the last N seconds (alone: the oldest of them first, paged by cursor).
    #[schemars(range(min = 1))]
    pub since_seconds: Option<u64>,
    /// Continue after the page that returned this cursor (not with tailLines or sinceSeconds).
    #[schemars(length(min = 1, max = 512))]
    pub cursor: Option<String>,
    /// The run before the current one (the unit's previous invocation, the Pod's previous
    /// container).
    pub previous: Option<bool>,
    /// Most lines in the page (1 to 1000, default 1000).
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<u32>,
    /// A poll of a follow (`occ agent logs --follow`): the follow is audited when it starts
    /// (`agent.logs.follow`), not at every poll; a poll after a minute without one starts a
    /// new follow.
    pub follow: Option<bool>,
}

/// Body of `POST /namespaces/{ns}/secrets/{name}/rollouts` (`occ secret rotate`): how the
/// secret's newest version goes out, with the settings of [`NewRollout`].
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSecretRollout {
    /// Agents deployed first, as wave 0 (default 1; 0: no canary wave).
    #[serde(default)]
    pub canary: Option<u32>,
    /// Most deploys at once, and the size of every wave after the canary (default 1).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    pub max_parallel: Option<u32>,
    /// Failures (failed or restored Agents) the whole rollout tolerates; one more halts it
    /// (default 0).
    #[serde(default)]
    pub max_failures: Option<u32>,
    /// Seconds to wait after each wave before the next (default 0).
    #[serde(default)]
    #[schemars(range(max = 86400))]
    pub pause_between_seconds: Option<u32>,
    /// Wait for `promote` after each wave (the canary included) instead of continuing.
    #[serde(default)]
    pub manual_promote: bool,
}

/// Body of `POST /namespaces/{ns}/rollouts`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewRollout {
    /// The Configuration whose latest generation every selected Agent gets.
    #[schemars(pattern(IDENT_PATTERN))]
    pub configuration_id: String,
    /// The Agents, in deploy order (default: every Agent of the Namespace on this
    /// Configuration, by id). Agents on another Configuration move to this one.
    #[serde(default)]
    #[schemars(inner(pattern(IDENT_PATTERN)), length(min = 1, max = 10000))]
    pub agents: Option<Vec<String>>,
    /// Agents deployed first, as wave 0 (default 1; 0: no canary wave).
    #[serde(default)]
    pub canary: Option<u32>,
    /// Most deploys at once, and the size of every wave after the canary (default 1).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    pub max_parallel: Option<u32>,
    /// Failures (failed or restored Agents) the whole rollout tolerates; one more halts it
    /// (default 0).
    #[serde(default)]
    pub max_failures: Option<u32>,
    /// Seconds to wait after each wave before the next (default 0).
    #[serde(default)]
    #[schemars(range(max = 86400))]
    pub pause_between_seconds: Option<u32>,
    /// Wait for `promote` after each wave (the canary included) instead of continuing.
    #[serde(default)]
    pub manual_promote: bool,
    /// The token of a plan of this rollout (`POST …/rollouts/plan`): the rollout is refused
    /// with PLAN_STALE unless the plan is still current.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub plan_token: Option<String>,
}

/// The body of `POST /tokens`.
#[derive(Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewToken {
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    #[schemars(length(min = 1))]
    pub grants: Vec<Grant>,
    /// Seconds since the epoch from which the token is refused (401); absent: never.
    #[serde(default)]
    pub expires_at: Option<i64>,
}
