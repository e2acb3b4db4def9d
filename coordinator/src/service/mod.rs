//! The coordinator's operations on desired state, shared by the HTTP API and tests: each
//! validates its input, changes the store in one transaction where it matters, records an
//! audit event, and queues the work that realises it. Nothing here talks to hosts.

use clawfleet_protocol::Ident;
use clawfleet_protocol::egress::Egress;
use serde_json::{Value, json};
use thiserror::Error;

mod clusters;
mod gateway;
pub mod page;
pub use gateway::GatewayPlace;
mod plans;
mod probe;
mod reads;
mod rollouts;
mod runtime;
mod secrets;
mod tokens;
mod workspace;

pub use crate::evidence::{
    EVIDENCE_LINES, is_runtime_failure, runtime_failure, secret_redaction_terms,
};
pub use clusters::ClusterUpdate;
pub use probe::ProbeError;
pub use reads::{AuditQuery, DriftQuery, Metrics};
pub use rollouts::{MAX_ROLLOUT_AGENTS, NewRollout, NewSecretRollout, RolloutAction};
pub use runtime::{LogsQuery, RuntimeError};
pub use secrets::{NewSecret, SecretDeploy, SecretInfo, SecretUse};
pub use tokens::TokenChangeError;
pub use workspace::NewWorkspaceFile;

use clawfleet_api::responses::{ConfigurationWritten, DeploymentStatus, NamespaceStatus};

use crate::codes::Code;
use crate::model::{Agent, DesiredState, Host, Namespace, Revision, RevisionStatus};
use crate::render;
use crate::store::{
    Enqueue, NamespaceInsert, RevisionInsert, SharedStore, StoreError, WorkKind, WorkRecord,
    WorkState,
};

/// The refusal of a change to an Agent that an open rollout owns.
fn in_rollout(ns: &str, agent: &str, rollout: i64) -> ServiceError {
    ServiceError::conflict(
        Code::RolloutInProgress,
        format!(
            "Agent {ns}/{agent} is in rollout {rollout}, which deploys it; wait for it, or \
             `occ rollout abort {ns} {rollout}`"
        ),
    )
}

/// How many of an Agent's newest work items deployment status shows.
pub const RECENT_WORK: u32 = 10;

/// A refused or failed request, with the HTTP status and stable code the API answers with.
#[derive(Debug, Error)]
pub enum ServiceError {
    #[error("{message}")]
    Invalid { code: Code, message: String },
    #[error("{what} {id} does not exist")]
    NotFound { what: &'static str, id: String },
    #[error("{message}")]
    Conflict { code: Code, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ServiceError {
    fn invalid(code: Code, message: impl Into<String>) -> Self {
        ServiceError::Invalid {
            code,
            message: message.into(),
        }
    }

    fn conflict(code: Code, message: impl Into<String>) -> Self {
        ServiceError::Conflict {
            code,
            message: message.into(),
        }
    }

    fn not_found(what: &'static str, id: &str) -> Self {
        ServiceError::NotFound {
            what,
            id: id.to_owned(),
        }
    }
}

/// A target the store names inconsistently is a conflict the message explains.
impl From<crate::targets::TargetError> for ServiceError {
    fn from(e: crate::targets::TargetError) -> Self {
        match e {
            crate::targets::TargetError::Store(s) => ServiceError::Store(s),
            crate::targets::TargetError::Inconsistent { code, message } => {
                ServiceError::conflict(code, message)
            }
        }
    }
}

type Result<T> = std::result::Result<T, ServiceError>;

pub use clawfleet_api::requests::{
    AgentPatch, ConfigurationUpdate, DeployQuery, HARNESS_AUTH_RUNTIME, HarnessAuth, HostUpdate,
    NewAgent, NewCluster, NewConfiguration, NewHost, NewNamespace,
};

/// The document as it deploys in this Namespace, or the refusal (`CONFIGURATION_REFUSED`,
/// naming the field). On a host pool other Namespaces share, the authentication a sibling
/// could forge is refused too.
fn rendered_for(ns: &Namespace, document: &Value) -> Result<Value> {
    let shared_pool = ns.cluster.is_none() && !ns.single_tenant;
    render::render(document)
        .and_then(|r| render::check_tenancy(&r, shared_pool).map(|()| r))
        .map_err(|r| ServiceError::invalid(Code::ConfigurationRefused, r.to_string()))
}

/// An Agent's own egress settings as kept: checked again (the API's decoding already did),
/// and `{}`, which sets no list, kept as none (its target's policy).
fn own_egress(egress: Option<Egress>) -> Result<Option<Egress>> {
    let Some(e) = egress else { return Ok(None) };
    e.check()
        .map_err(|err| ServiceError::invalid(Code::InvalidBody, err.to_string()))?;
    Ok((e != Egress::default()).then_some(e))
}

/// An id from a request, checked once and typed from here down: the store keeps it typed and
/// the worker sends it to targets as it is.
fn check_id(field: &str, value: &str) -> Result<Ident> {
    Ident::new(value).map_err(|e| {
        ServiceError::invalid(Code::InvalidIdentifier, format!("{field} {value:?} {e}"))
    })
}

/// An id in a request's path, used to look something up: text that is not an id names
/// nothing, so it is not found (as an unknown id is).
fn lookup_id(kind: &'static str, value: &str) -> Result<Ident> {
    Ident::new(value).map_err(|_| ServiceError::not_found(kind, value))
}

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    store: SharedStore,
    /// Log follows in progress: (token, Namespace/Agent) to the time of their last poll,
    /// so a follow is audited once, not once per poll (`service/runtime.rs`).
    follows: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(String, String), i64>>>,
}

fn now() -> i64 {
    crate::clock::now_seconds()
}

impl Service {
    pub fn new(store: SharedStore) -> Self {
        Self {
            store,
            follows: Default::default(),
        }
    }

    async fn audit(&self, actor: &str, action: &str, target: &str, detail: Value) -> Result<()> {
        Ok(self
            .store
            .audit(actor, action, target, &detail, now())
            .await?)
    }

    pub async fn enrol_host(&self, actor: &str, h: NewHost) -> Result<Host> {
        let host = Self::validate_host(h)?;
        if !self.store.insert_host(&host).await? {
            return Err(ServiceError::conflict(
                Code::HostExists,
                format!(
                    "host {} is already enrolled; PUT /hosts/{} (occ host enrol --replace) re-pins it",
                    host.name, host.name
                ),
            ));
        }
        self.audit(
            actor,
            "host.enrol",
            &host.name,
            json!({"fingerprint": host.fingerprint}),
        )
        .await?;
        Ok(host)
    }

    /// Re-pins an enrolled host (a legitimate re-key, a new address or capacity).
    pub async fn update_host(&self, actor: &str, h: NewHost) -> Result<Host> {
        let old = self
            .store
            .host(&h.name)
            .await?
            .ok_or_else(|| ServiceError::not_found("host", &h.name))?;
        let mut host = Self::validate_host(h)?;
        host.enrolled_at = old.enrolled_at;
        self.store.update_host(&host).await?;
        self.audit(
            actor,
            "host.update",
            &host.name,
            json!({"oldFingerprint": old.fingerprint, "fingerprint": host.fingerprint,
                   "address": host.address, "port": host.port, "maxAgents": host.max_agents,
                   "loginUser": host.login_user, "jump": host.jump.as_ref().map(|j| &j.address)}),
        )
        .await?;
        Ok(host)
    }

    /// Forgets a host that no Namespace pool and no Agent uses (decommissioning).
    pub async fn delete_host(&self, actor: &str, name: &str) -> Result<()> {
        match self.store.delete_host(name).await? {
            None => Err(ServiceError::not_found("host", name)),
            Some(false) => Err(ServiceError::conflict(
                Code::HostInUse,
                format!("host {name} is still in a Namespace pool or runs Agents"),
            )),
            Some(true) => self.audit(actor, "host.delete", name, json!({})).await,
        }
    }

    fn validate_host(h: NewHost) -> Result<Host> {
        check_id("name", &h.name)?;
        let name = clawfleet_protocol::HostName::new(h.name.as_str())
            .map_err(|e| ServiceError::invalid(Code::InvalidIdentifier, format!("name {e}")))?;
        check_address("address", &h.address)?;
        if h.port == 0 {
            return Err(ServiceError::invalid(
                Code::InvalidPort,
                "port must be 1 to 65535",
            ));
        }
        if h.max_agents == 0 {
            return Err(ServiceError::invalid(
                Code::InvalidCapacity,
                "maxAgents must be at least 1",
            ));
        }
        let key = clawfleet_protocol::ssh_key::PublicKey::from_openssh(h.host_key.trim()).map_err(
            |e| {
                ServiceError::invalid(
                    Code::InvalidHostKey,
                    format!("hostKey is not an OpenSSH public key: {e}"),
                )
            },
        )?;
        let host = Host {
            name,
            address: h.address,
            port: h.port,
            host_key: key
                .to_openssh()
                .map_err(|e| ServiceError::invalid(Code::InvalidHostKey, e.to_string()))?,
            fingerprint: clawfleet_protocol::Fingerprint::of(&key).to_string(),
            max_agents: h.max_agents,
            enrolled_at: now(),
            last_probe: None,
            login_user: h.login_user,
            jump: h.jump,
            fencing: crate::model::Fencing::Unknown,
        };
        if let Some(jump) = &host.jump {
            check_address("jump.address", &jump.address)?;
            clawfleet_protocol::ssh_key::PublicKey::from_openssh(jump.host_key.trim()).map_err(
                |e| {
                    ServiceError::invalid(
                        Code::InvalidHostKey,
                        format!("jump.hostKey is not an OpenSSH public key: {e}"),
                    )
                },
            )?;
        }
        crate::backend::HostTarget::of(&host).check().map_err(|e| {
            let field = match e.field {
                "login_user" => "loginUser",
                "jump.login_user" => "jump.loginUser",
                other => other,
            };
            ServiceError::invalid(Code::InvalidHostAccess, format!("{field} {}", e.message))
        })?;
        Ok(host)
    }

    /// Creates a Namespace. `may_choose_pool` is false for callers that are not global
    /// admins: they get, for any host or cluster they name, the answer a missing one gets.
    pub async fn create_namespace(
        &self,
        actor: &str,
        n: NewNamespace,
        may_choose_pool: bool,
    ) -> Result<Namespace> {
        check_id("id", &n.id)?;
        let name = n.name.unwrap_or_else(|| n.id.clone());
        check_id("name", &name)?;
        if let Some(cluster) = &n.cluster {
            if !n.hosts.is_empty() {
                return Err(ServiceError::invalid(
                    Code::BackendAmbiguous,
                    "a Namespace is placed on a host pool (hosts) or on a cluster (cluster), not both",
                ));
            }
            check_id("cluster", cluster)?;
            if n.single_tenant {
                return Err(ServiceError::invalid(
                    Code::SingleTenantInvalid,
                    "singleTenant applies to host pools; a cluster Namespace has its own \
                     Kubernetes namespace",
                ));
            }
            if !may_choose_pool || self.store.cluster(cluster).await?.is_none() {
                return Err(ServiceError::invalid(
                    Code::UnknownCluster,
                    format!(
                        "cluster {cluster} is not registered, or this token may not place a \
                         Namespace on it (that needs a global admin token)"
                    ),
                ));
            }
            let inserted = self
                .store
                .insert_namespace(
                    &n.id,
                    &name,
                    &[],
                    Some(cluster),
                    false,
                    crate::clock::now_seconds(),
                    &Enqueue::namespace(WorkKind::EnsureNamespace, &n.id),
                )
                .await?;
            Self::inserted(&n.id, inserted)?;
            self.audit(
                actor,
                "namespace.create",
                &n.id,
                json!({"cluster": cluster}),
            )
            .await?;
            return self
                .store
                .namespace(&n.id)
                .await?
                .ok_or_else(|| ServiceError::not_found("Namespace", &n.id));
        }
        if n.hosts.is_empty() {
            return Err(ServiceError::invalid(
                Code::EmptyPool,
                "hosts must name at least one enrolled host (or cluster a registered cluster)",
            ));
        }
        for h in &n.hosts {
            if !may_choose_pool || self.store.host(h).await?.is_none() {
                return Err(ServiceError::invalid(
                    Code::UnknownHost,
                    format!(
                        "host {h} is not enrolled, or this token may not put it in a pool \
                         (that needs a global admin token)"
                    ),
                ));
            }
        }
        let mut hosts = n.hosts.clone();
        hosts.sort();
        hosts.dedup();
        // A single-tenant pool shares no host at all: HOST_DEDICATED (below) says so.
        if !n.single_tenant {
            self.check_shareable(&n.id, &hosts).await?;
        }
        let inserted = self
            .store
            .insert_namespace(
                &n.id,
                &name,
                &hosts,
                None,
                n.single_tenant,
                crate::clock::now_seconds(),
                &Enqueue::namespace(WorkKind::EnsureNamespace, &n.id),
            )
            .await?;
        Self::inserted(&n.id, inserted)?;
        self.audit(
            actor,
            "namespace.create",
            &n.id,
            json!({"hosts": hosts, "singleTenant": n.single_tenant}),
        )
        .await?;
        self.store
            .namespace(&n.id)
            .await?
            .ok_or_else(|| ServiceError::not_found("Namespace", &n.id))
    }

    /// A host whose last probe says it lacks one of [`SHARED_HOST_NEEDS`] (hostd's
    /// `networkIsolation` or `quotas` saying `unavailable: …`, issues 28 and 26) takes one
    /// Namespace only: refused with that need's code (`HOST_NOT_ISOLATED`,
    /// `HOST_NOT_QUOTA_LIMITED`) when another Namespace already uses it. A host never probed,
    /// or whose hostd predates the report, is not refused.
    ///
    /// [`SHARED_HOST_NEEDS`]: clawfleet_api::model::SHARED_HOST_NEEDS
    async fn check_shareable(&self, id: &str, hosts: &[String]) -> Result<()> {
        let mut others: Option<Vec<Namespace>> = None;
        for h in hosts {
            let Some(host) = self.store.host(h).await? else {
                continue;
            };
            let Some(probe) = host.last_probe.as_ref() else {
                continue;
            };
            let Some((need, why)) = clawfleet_api::model::shared_host_gaps(probe)
                .into_iter()
                .next()
            else {
                continue;
            };
            if others.is_none() {
                others = Some(self.store.namespaces().await?);
            }
            let using: Vec<&Namespace> = others
                .iter()
                .flatten()
                .filter(|o| o.id.as_str() != id && o.hosts.iter().any(|x| x == h))
                .collect();
            // A host of a single-tenant pool is refused as HOST_DEDICATED when inserting.
            if using.iter().any(|o| o.single_tenant) {
                continue;
            }
            if let Some(other) = using.first() {
                return Err(ServiceError::conflict(
                    need.code,
                    format!(
                        "host {h} {} ({why}), and Namespace {} uses it: give this Namespace \
                         other hosts, or make {h} able to (see its probe's {})",
                        need.cannot, other.id, need.field
                    ),
                ));
            }
        }
        Ok(())
    }

    fn inserted(id: &str, outcome: NamespaceInsert) -> Result<()> {
        match outcome {
            NamespaceInsert::Inserted => Ok(()),
            NamespaceInsert::Exists => Err(ServiceError::conflict(
                Code::NamespaceExists,
                format!("Namespace {id} exists"),
            )),
            NamespaceInsert::HostShared { host, namespace } => Err(ServiceError::conflict(
                Code::HostDedicated,
                format!(
                    "host {host} is in the pool of Namespace {namespace}, and a single-tenant \
                     pool shares its hosts with no other Namespace"
                ),
            )),
        }
    }

    pub async fn namespace(&self, id: &str) -> Result<Namespace> {
        self.store
            .namespace(id)
            .await?
            .ok_or_else(|| ServiceError::not_found("Namespace", id))
    }

    /// A Namespace with its newest Namespace-level work item (`ensure-namespace` or
    /// `delete-namespace`: state, attempts, last code and message), so a Namespace that is not
    /// ready on its cluster or pool says why, and whether it is still being retried.
    pub async fn namespace_with_work(&self, id: &str) -> Result<NamespaceStatus> {
        let namespace = self.namespace(id).await?;
        let work = self.store.namespace_work(id, 1).await?.into_iter().next();
        Ok(NamespaceStatus { namespace, work })
    }

    /// [`Service::namespace_with_work`] as the JSON the API answers.
    pub async fn namespace_status(&self, id: &str) -> Result<Value> {
        Ok(json!(self.namespace_with_work(id).await?))
    }

    /// Deletes an empty Namespace (409 while it has Agents).
    pub async fn delete_namespace(&self, actor: &str, id: &str) -> Result<()> {
        self.namespace(id).await?;
        if !self
            .store
            .mark_namespace_deleting(id, &Enqueue::namespace(WorkKind::DeleteNamespace, id))
            .await?
        {
            return Err(ServiceError::conflict(
                Code::NamespaceNotEmpty,
                format!("Namespace {id} still has Agents; delete them first"),
            ));
        }
        self.audit(actor, "namespace.delete", id, json!({})).await
    }

    pub async fn put_configuration(
        &self,
        actor: &str,
        ns: &str,
        id: &str,
        document: Value,
        new: bool,
    ) -> Result<ConfigurationWritten> {
        let namespace = self.namespace(ns).await?;
        check_id("id", id)?;
        // Refuse what can never be deployed now, not at deploy time.
        rendered_for(&namespace, &document)?;
        self.check_secret_references(ns, &document).await?;
        let canonical = clawfleet_protocol::Configuration::new(document.clone())
            .map_err(|e| ServiceError::invalid(Code::ConfigurationRefused, e.to_string()))?;
        let generation = self
            .store
            .put_configuration(ns, id, canonical.value(), new, now())
            .await?
            .ok_or_else(|| {
                if new {
                    ServiceError::conflict(
                        Code::ConfigurationExists,
                        format!("configuration {id} exists; PUT a new generation"),
                    )
                } else {
                    ServiceError::not_found("configuration", id)
                }
            })?;
        self.audit(
            actor,
            if new {
                "configuration.create"
            } else {
                "configuration.update"
            },
            &format!("{ns}/{id}"),
            json!({"generation": generation}),
        )
        .await?;
        Ok(ConfigurationWritten {
            namespace_id: ns.to_owned(),
            id: id.to_owned(),
            generation,
            document,
        })
    }

    pub async fn create_agent(&self, actor: &str, ns: &str, a: NewAgent) -> Result<Agent> {
        let namespace = self.namespace(ns).await?;
        if namespace.deleting {
            return Err(ServiceError::conflict(
                Code::NamespaceDeleting,
                format!("Namespace {ns} is being deleted"),
            ));
        }
        let id = check_id("id", &a.id)?;
        let sp = a
            .service_principal_id
            .unwrap_or_else(|| format!("sp-{}", a.id));
        let sp: String = sp.chars().take(63).collect();
        let sp = check_id("servicePrincipalId", &sp)?;
        let configuration_id = check_id("configurationId", &a.configuration_id)?;
        if let Some(auth) = &a.harness_auth
            && auth.method != HARNESS_AUTH_RUNTIME
        {
            let shown: String = auth.method.chars().take(64).collect();
            return Err(ServiceError::invalid(
                Code::HarnessAuthUnsupported,
                format!(
                    "harnessAuth.method {shown:?} is not supported; it must be \"runtime\": \
                     operator-managed credentials stay on the host"
                ),
            ));
        }
        if self
            .store
            .configuration(&namespace.id, &configuration_id)
            .await?
            .is_none()
        {
            return Err(ServiceError::invalid(
                Code::UnknownConfiguration,
                format!("configuration {} does not exist", a.configuration_id),
            ));
        }
        let files = workspace::validate(&a.workspace_files)?;
        let egress = own_egress(a.egress)?;
        let agent = Agent {
            namespace_id: namespace.id.clone(),
            id,
            service_principal_id: sp,
            configuration_id,
            desired_state: DesiredState::Stopped,
            host: None,
            port: None,
            active_revision_id: None,
            served_revision_id: None,
            restore: a.restore.unwrap_or(crate::model::RestorePolicy::None),
            created_at: now(),
            egress,
        };
        if !self.store.insert_agent(&agent, &files, now()).await? {
            return Err(ServiceError::conflict(
                Code::AgentExists,
                format!("Agent {} exists", a.id),
            ));
        }
        // Names and sizes only: the audit never holds a file's content.
        let mut details = if files.is_empty() {
            json!({})
        } else {
            json!({"workspaceFiles": files.iter().map(|f| {
                let m = f.meta();
                json!({"name": m.name.as_str(), "size": m.size, "sha256": m.sha256.as_str()})
            }).collect::<Vec<_>>()})
        };
        if let Some(e) = &agent.egress {
            details["egress"] = json!(e);
        }
        self.audit(actor, "agent.create", &format!("{ns}/{}", a.id), details)
            .await?;
        self.agent(ns, &a.id).await
    }

    pub async fn agent(&self, ns: &str, id: &str) -> Result<Agent> {
        self.store
            .agent(ns, id)
            .await?
            .ok_or_else(|| ServiceError::not_found("Agent", id))
    }

    pub async fn patch_agent(
        &self,
        actor: &str,
        ns: &str,
        id: &str,
        p: AgentPatch,
    ) -> Result<Agent> {
        let agent = self.agent(ns, id).await?;
        // Checked before anything is written; `Some(None)` drops the Agent's own settings.
        let egress = p.egress.clone().map(|e| own_egress(Some(e))).transpose()?;
        if let Some(cfg) = &p.configuration_id {
            if let Some(rollout) = self.store.open_rollout_of(ns, id).await? {
                return Err(in_rollout(ns, id, rollout));
            }
            let cfg_id = check_id("configurationId", cfg)?;
            if self
                .store
                .configuration(&agent.namespace_id, &cfg_id)
                .await?
                .is_none()
            {
                return Err(ServiceError::invalid(
                    Code::UnknownConfiguration,
                    format!("configuration {cfg} does not exist"),
                ));
            }
            self.store.set_agent_configuration(ns, id, cfg).await?;
        }
        if let Some(restore) = p.restore {
            self.store.set_agent_restore(ns, id, restore).await?;
        }
        if let Some(egress) = &egress {
            self.store.set_agent_egress(ns, id, egress.as_ref()).await?;
        }
        self.audit(
            actor,
            "agent.update",
            &format!("{ns}/{id}"),
            json!({"configurationId": p.configuration_id, "restore": p.restore, "egress": p.egress}),
        )
        .await?;
        self.agent(ns, id).await
    }

    /// Creates the next immutable revision from the Agent's configuration and queues it;
    /// returns it with the id of the work that deploys it. Refused while the Agent belongs to
    /// an open rollout (the rollout deploys it).
    pub async fn deploy(&self, actor: &str, ns: &str, id: &str) -> Result<(Revision, i64)> {
        let agent = self.agent_not_deleting(ns, id).await?;
        let cfg = self
            .store
            .configuration(&agent.namespace_id, &agent.configuration_id)
            .await?
            .ok_or_else(|| ServiceError::not_found("configuration", &agent.configuration_id))?;
        let mut rev = self
            .build_revision(&self.namespace(ns).await?, &agent.id, &cfg)
            .await?;
        // The store allocates the number and id inside its transaction.
        // The revision, its work and the audit event in one transaction.
        let work = match self
            .store
            .create_revision_audited(&mut rev, actor, now())
            .await?
        {
            RevisionInsert::Queued(work) => work,
            RevisionInsert::InRollout(rollout) => return Err(in_rollout(ns, id, rollout)),
        };
        Ok((rev, work))
    }

    /// A new revision of an Agent from one Configuration generation (number and id are
    /// allocated by the store), bound to the newest version of every secret it refers to.
    async fn build_revision(
        &self,
        ns: &Namespace,
        agent: &Ident,
        cfg: &crate::model::Configuration,
    ) -> Result<Revision> {
        let mut rendered = rendered_for(ns, &cfg.document)?;
        render::serve_control_ui_at(
            &mut rendered,
            &clawfleet_api::routes::control_ui_path(ns.id.as_str(), agent.as_str()),
        )
        .map_err(|r| ServiceError::invalid(Code::ConfigurationRefused, r.to_string()))?;
        let secrets = self.bind_secrets(&ns.id, &mut rendered).await?;
        let canonical = clawfleet_protocol::Configuration::new(rendered.clone())
            .map_err(|e| ServiceError::invalid(Code::ConfigurationRefused, e.to_string()))?;
        let configuration_hash = canonical.hash();
        Ok(Revision {
            namespace_id: ns.id.clone(),
            agent_id: agent.clone(),
            // Number 0 and its id until the store allocates both in its transaction.
            id: crate::store::revision_id(0, &configuration_hash)?,
            number: 0,
            configuration_id: cfg.id.clone(),
            configuration_generation: cfg.generation,
            configuration_hash,
            status: RevisionStatus::Pending,
            last_attempt: None,
            runtime_failure: None,
            created_at: now(),
            rendered,
            secrets,
            staged: false,
        })
    }

    /// Re-applies the Agent's active revision on request (`occ agent reconcile`): a normal,
    /// audited deployment pass of the same revision, which puts a stopped unit or a changed
    /// `current` back. Returns the revision and the work id.
    pub async fn reconcile(&self, actor: &str, ns: &str, id: &str) -> Result<(String, i64)> {
        let agent = self.agent_not_deleting(ns, id).await?;
        let active = match (agent.desired_state, agent.active_revision_id) {
            (DesiredState::Running, Some(active)) => active,
            _ => {
                return Err(ServiceError::conflict(
                    Code::NothingToReconcile,
                    format!(
                        "Agent {ns}/{id} is not meant to run or has no active revision; deploy it instead"
                    ),
                ));
            }
        };
        if let Some(rollout) = self.store.open_rollout_of(ns, id).await? {
            return Err(in_rollout(ns, id, rollout));
        }
        let work = self
            .store
            .enqueue(&Enqueue::deploy(ns, id, &active))
            .await?;
        self.audit(
            actor,
            "agent.reconcile",
            &format!("{ns}/{id}"),
            json!({"revisionId": active, "workId": work}),
        )
        .await?;
        Ok((active.to_string(), work))
    }

    /// The Agent, unless it is being deleted (409 `AGENT_DELETING`).
    async fn agent_not_deleting(&self, ns: &str, id: &str) -> Result<Agent> {
        let agent = self.agent(ns, id).await?;
        if agent.desired_state == DesiredState::Deleted {
            return Err(ServiceError::conflict(
                Code::AgentDeleting,
                format!("Agent {id} is being deleted"),
            ));
        }
        Ok(agent)
    }

    /// Queues a stop; returns the id of the work that realises it.
    pub async fn stop(&self, actor: &str, ns: &str, id: &str) -> Result<i64> {
        self.agent_not_deleting(ns, id).await?;
        let work = self
            .store
            .set_desired(
                ns,
                id,
                DesiredState::Stopped,
                Some(&Enqueue::agent(WorkKind::Stop, ns, id)),
            )
            .await?
            .ok_or_else(|| ServiceError::not_found("Agent", id))?;
        self.audit(
            actor,
            "agent.stop",
            &format!("{ns}/{id}"),
            json!({"workId": work}),
        )
        .await?;
        Ok(work)
    }

    /// Queues the deletion; returns the id of the work that realises it.
    pub async fn delete_agent(&self, actor: &str, ns: &str, id: &str) -> Result<i64> {
        self.agent(ns, id).await?;
        let work = self
            .store
            .set_desired(
                ns,
                id,
                DesiredState::Deleted,
                Some(&Enqueue::agent(WorkKind::DeleteAgent, ns, id)),
            )
            .await?
            .ok_or_else(|| ServiceError::not_found("Agent", id))?;
        self.audit(
            actor,
            "agent.delete",
            &format!("{ns}/{id}"),
            json!({"workId": work}),
        )
        .await?;
        Ok(work)
    }

    /// One work item of an Agent (what `occ ... --wait` follows).
    pub async fn work_item(&self, ns: &str, agent: &str, id: i64) -> Result<WorkRecord> {
        self.namespace(ns).await?;
        self.store
            .work_item(ns, agent, id)
            .await?
            .ok_or_else(|| ServiceError::not_found("work item", &id.to_string()))
    }

    /// Desired state, active and served revision, per-revision progress, open work, and the
    /// newest work items with their last attempts (stop and delete work included).
    pub async fn deployment_status(&self, ns: &str, id: &str) -> Result<DeploymentStatus> {
        let agent = self.agent(ns, id).await?;
        let revisions = self.store.revisions(ns, id).await?;
        let work = self.store.open_work(ns, id).await?;
        let recent = self.store.recent_work(ns, id, RECENT_WORK).await?;
        // Converged: nothing open, and the newest request of its kind did not fail.
        let newest_failed = |kinds: &[WorkKind]| {
            recent
                .iter()
                .find(|w| kinds.contains(&w.kind))
                .is_some_and(|w| w.state == WorkState::Failed)
        };
        let converged = work.is_empty()
            && match agent.desired_state {
                DesiredState::Running => {
                    let newest = revisions.last();
                    newest.is_some_and(|r| {
                        r.status == RevisionStatus::Active
                            && agent.active_revision_id.as_deref() == Some(r.id.as_str())
                            && agent.served_revision_id.as_deref() == Some(r.id.as_str())
                    })
                }
                DesiredState::Stopped => {
                    agent.active_revision_id.is_none() && !newest_failed(&[WorkKind::Stop])
                }
                DesiredState::Deleted => false,
            };
        // The newest work's last code, for tables and scripts.
        let last_code = recent
            .first()
            .and_then(|w| w.last_attempt.as_ref())
            .map(|a| a.code.clone());
        Ok(DeploymentStatus {
            namespace_id: ns.to_owned(),
            agent_id: id.to_owned(),
            desired_state: agent.desired_state,
            host: agent.host,
            port: agent.port,
            active_revision_id: agent.active_revision_id.map(String::from),
            served_revision_id: agent.served_revision_id.map(String::from),
            converged,
            revisions,
            open_work: work,
            recent_work: recent,
            last_code,
        })
    }
}

/// A host or jump host address: an IP address or DNS name (never an option-like `-…`).
fn check_address(field: &str, address: &str) -> Result<()> {
    if address.is_empty()
        || address.starts_with('-')
        || !address
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-'))
    {
        return Err(ServiceError::invalid(
            Code::InvalidAddress,
            format!("{field} {address:?} must be an IP address or DNS name"),
        ));
    }
    Ok(())
}
