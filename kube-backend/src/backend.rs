//! [`KubeBackend`]: the entry point the coordinator calls with one operation for one cluster.
//!
//! What each operation does (objects and names in [`crate::render`] and [`crate::names`]):
//!
//! - `probe`: `GET /version`. A server below 1.35 is a warning, not a refusal. Mapped onto
//!   hostd's `ProbeResult`: `hostdVersion` = `clawfleet-kube <version>`, `systemHostName` = the
//!   cluster name, `hostKey` = SHA-256 of the pinned CA certificate (the cluster's identity, as
//!   a host key is a host's), `systemdVersion` = `kubernetes <gitVersion>` followed by
//!   ` (warning KUBERNETES_VERSION_BELOW_MINIMUM: …)` when below 1.35, `missingTools` empty,
//!   `portRange` = the gateway port, `maxAgents` = the pod quota, `agents` = clawfleet's
//!   Deployments on the cluster. [`KubeBackend::probe_cluster`] gives the same as a typed value,
//!   and [`ClusterProbeReport::from_probe_result`] turns the answer into a cluster's words
//!   (`serverVersion`, `caFingerprint`, `warnings`, `gatewayPort`), which is what the
//!   coordinator stores and shows: no host word reaches an operator for a cluster.
//! - `ensure-namespace`: the tenant namespace `oce-<15 hex>` (restricted Pod Security), its
//!   ResourceQuota, LimitRange, default-deny, DNS and gateway-ingress NetworkPolicies.
//!   Another namespace claiming the same Namespace id is a conflict.
//!   A Namespace listed in `ClusterSettings::adopted_namespaces` uses that existing
//!   namespace instead: never created; adopted only when it is restricted under Pod Security,
//!   carries no other tenant's or clawfleet-managed markers, and holds no NetworkPolicy that
//!   is not this tenant's; the claim (`clawfleet.dev/namespace-id`, `clawfleet.dev/adopted`)
//!   is a server-side apply fenced by the resourceVersion checked.
//! - `delete-namespace`: a managed namespace: a DELETE with its uid as precondition, then
//!   waits until it is gone (`DEADLINE_EXCEEDED`, retryable, while it still terminates at the
//!   deadline). An adopted one stays: every object carrying this tenant's markers is checked,
//!   then deleted (uid preconditions, Pods awaited), then the claim is released (an empty
//!   apply drops exactly the fields clawfleet owned).
//! - `prepare-revision`: the Agent's ServiceAccount, state PVC (created once, never patched),
//!   password Secret (created once), egress policy, the Service (created inactive, never
//!   touched here once it exists) and the revision's immutable ConfigMap. Never touches the
//!   Deployment. `ready: false` when the Deployment already runs a newer revision.
//! - `activate-revision`: applies the Deployment with this revision's template (Recreate) and
//!   points the Service at it, then waits for readiness as observed: observedGeneration, a
//!   settled rollout, readyReplicas, a Ready Pod of this revision and an EndpointSlice owned by
//!   the Service's uid with a ready endpoint. Blockers end the wait early once they have held
//!   for a few seconds: `REVISION_UNSCHEDULABLE`, `REVISION_IMAGE_PULL_FAILED`,
//!   `NAMESPACE_POD_QUOTA_EXCEEDED`; still not ready at the deadline: `REVISION_INCOMPLETE`.
//!   A retried activation re-applies nothing new and waits again. With `restore` (the last
//!   served revision), the candidate gets half of the time left; when it does not become ready
//!   (incomplete, unschedulable, image pull), the predecessor's template is applied again and
//!   waited for, and the result says `restored`.
//! - `verify-revision`: the revision's ConfigMap exists, is ours and matches; no writes.
//! - `stop-revision`: deletes the Deployment if it carries this revision or an older one
//!   (uid and resourceVersion preconditions): the named revision may never have reached the
//!   Deployment (an activation refused before its apply), and the stop still stops what runs.
//!   A Deployment carrying a newer revision (a successor) stays. Sets the Service inactive
//!   and waits until every Pod of the Agent is gone; keeps PVC, Secret and ConfigMaps.
//!   Repeatable.
//! - `retire-revision`: stop if the Deployment carries exactly this revision, then delete its
//!   ConfigMap (uid precondition), unless a successor's Pods still run its template (below).
//! - Secrets ([`KubeBackend::put_secrets`], [`crate::secrets`]): the Agent's Secret
//!   `gw-secrets-<s>` holds exactly the bound versions (POST, or PUT with uid and
//!   resourceVersion; an empty set deletes it), mounted read-only at `/run/clawfleet/secrets`
//!   in a Pod whose configuration binds secrets, resolved by the gateway through the managed
//!   exec provider `clawfleet`. An activation whose rendered configuration is exactly the one
//!   the Pods run and binds secrets (a rotation) keeps the Pod template (the Deployment's
//!   `clawfleet.dev/pod-revision-id` names the revision the Pods run, its
//!   `clawfleet.dev/revision-id` the activated one): no new Pod; the Secret already changed in
//!   place. The kept revision's ConfigMap stays until an activation moves the Pods to another
//!   template.
//! - `delete-agent`: checks every object of the Agent first, then deletes the Deployment,
//!   waits for its Pods, then the Service, ConfigMaps, Secrets (password, workspace, secrets), PVC, ServiceAccount and policy.
//!   An object at one of the Agent's names that clawfleet never made (no managed-by label) is
//!   left untouched and logged; a tampered object of ours refuses the whole delete.
//! - Pod template drift: the Deployment carries a fingerprint of the template it was applied
//!   with ([`crate::render::workload_fingerprint`]: each container's image, command and
//!   args). `status` reports a live template that differs as the problem
//!   `namespaces/<ns>/agents/<agent>/workload` (the coordinator's drift sweep makes it the
//!   Agent's `workload-changed` drift), and `activate-revision` replaces (PUT, uid and
//!   resourceVersion fenced) rather than applies such a Deployment, so a reconcile restores
//!   the containers list exactly.
//! - 401/403: retryable (`KUBERNETES_API_UNAVAILABLE`) within 30 s of a connection error or of
//!   the identity's last accepted request ([`crate::auth_window`]), permanent otherwise;
//!   `ensure-namespace` keeps a refusal retryable so that granting rights later recovers it.
//! - `status`: hostd's `Inventory` shape. Per Agent: `account` = the ServiceAccount name,
//!   revisions from the ConfigMaps, and an `AgentObservation` where `current` is the revision
//!   the Deployment's template carries, `served` that revision when it is observed ready and
//!   the Service selects it, `port` the gateway port, and `unit` the Deployment: `name` its
//!   name, `activeState` `active` (ready) / `activating` / `failed` (a blocker above) /
//!   `inactive` (no Deployment), `subState` the Pod's phase or waiting reason, `nRestarts` the
//!   containers' restart count, `enabled` whether the Deployment exists.
//! - `agent-runtime` and `agent-logs`: the Agent's newest Pod, its events and its gateway
//!   container's log, within the protocol's page limits ([`crate::ops::runtime`]).
//! - Fencing: prepare, activate, stop, retire and delete-agent carry the claim's fence, checked
//!   and recorded on the Agent's ServiceAccount before they write ([`crate::ops::fence`]).
//! - `operation-status`: always `unknown`. Calls to a cluster are synchronous request and
//!   answer from the coordinator's own process, so there is no remote journal to ask: when a
//!   call is interrupted the coordinator retries the (idempotent) operation, which observes
//!   the cluster as it is.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clawfleet_protocol::Operation;
use clawfleet_protocol::failure::{Failure, FailureClass, FailureCode};
use clawfleet_protocol::result::{
    OperationResult, OperationState, OperationStatusResult, ProbeResult,
};

use crate::client::{ClusterClient, MAX_RESPONSE_BYTES, Requests};
use crate::kubeconfig::ClusterCredentials;
use crate::ops;
use crate::settings::ClusterSettings;

/// The oldest Kubernetes minor version (1.x) supported without a warning.
pub const MINIMUM_KUBERNETES_MINOR: u32 = 35;

/// One cluster as the coordinator stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The coordinator's name for the cluster (the cache key of its client).
    pub name: String,
    pub credentials: ClusterCredentials,
    pub settings: ClusterSettings,
}

/// What [`KubeBackend::probe_cluster`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterProbe {
    /// `gitVersion` of the API server, e.g. `v1.37.2`.
    pub server_version: String,
    pub major: u32,
    pub minor: u32,
    /// Not refusals: registration goes on, the operator sees them.
    pub warnings: Vec<ProbeWarning>,
}

/// A warning with its stable code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeWarning {
    /// `KUBERNETES_VERSION_BELOW_MINIMUM`.
    pub code: &'static str,
    pub message: String,
}

/// How the API server's version starts in the probe's `systemdVersion` field.
const SERVER_PREFIX: &str = "kubernetes ";
/// How each warning starts there (`" (warning CODE: message)"`).
const WARNING_OPEN: &str = " (warning ";

impl ClusterProbe {
    /// The server facts as the `probe` operation carries them in hostd's `ProbeResult`
    /// (`systemdVersion`): `kubernetes <gitVersion>` and ` (warning CODE: message)` per
    /// warning. [`ClusterProbeReport::from_probe_result`] reads them back.
    pub(crate) fn server_text(&self) -> String {
        let mut text = format!("{SERVER_PREFIX}{}", self.server_version);
        for w in &self.warnings {
            text.push_str(&format!("{WARNING_OPEN}{}: {})", w.code, w.message));
        }
        text
    }
}

/// A cluster's probe in a cluster's words, for the coordinator to store and show: the
/// `probe` operation answers in hostd's `ProbeResult` shape (one result type for every
/// backend), whose host words (`hostdVersion`, `systemdVersion`, `hostKey`, `missingTools`,
/// `portRange`) mean nothing for a cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterProbeReport {
    /// `clawfleet-kube <version>`: the backend that answered.
    pub backend_version: String,
    pub protocol_versions: Vec<u32>,
    /// The API server's `gitVersion`, e.g. `v1.37.2`.
    pub server_version: String,
    /// SHA-256 of the pinned CA certificate: the cluster's identity.
    pub ca_fingerprint: String,
    /// Not refusals (e.g. `KUBERNETES_VERSION_BELOW_MINIMUM`).
    pub warnings: Vec<ClusterProbeWarning>,
    /// The port every gateway listens on in its Pod.
    pub gateway_port: u16,
    /// The Pod quota of each managed namespace.
    pub max_agents: u32,
    /// clawfleet's Deployments on the cluster (0 when the identity may not list them).
    pub agents: u32,
}

/// One warning of a [`ClusterProbeReport`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterProbeWarning {
    pub code: String,
    pub message: String,
}

impl ClusterProbeReport {
    /// The report of a cluster's `probe` answer (see [`ClusterProbe::server_text`] for where
    /// the server's version and warnings travel).
    pub fn from_probe_result(p: &ProbeResult) -> Self {
        let text = p.systemd_version.as_deref().unwrap_or_default();
        let text = text.strip_prefix(SERVER_PREFIX).unwrap_or(text);
        let mut parts = text.split(WARNING_OPEN);
        let server_version = parts.next().unwrap_or_default().to_owned();
        let warnings = parts
            .map(|w| {
                let w = w.strip_suffix(')').unwrap_or(w);
                let (code, message) = w.split_once(": ").unwrap_or((w, ""));
                ClusterProbeWarning {
                    code: code.to_owned(),
                    message: message.to_owned(),
                }
            })
            .collect();
        Self {
            backend_version: p.hostd_version.clone(),
            protocol_versions: p.protocol_versions.clone(),
            server_version,
            ca_fingerprint: p.host_key.as_str().to_owned(),
            warnings,
            gateway_port: p.port_range.start,
            max_agents: p.max_agents,
            agents: p.agents,
        }
    }
}

/// The Kubernetes backend. Cheap to share (`Arc<KubeBackend>`); one client per cluster.
///
/// The client cache's lock is held only to look up and insert: a client is built outside it,
/// and a poisoned lock is recovered (the map stays consistent whatever panicked), so one
/// cluster's bad credentials never fail another cluster's operations.
#[derive(Debug)]
pub struct KubeBackend {
    clients: Mutex<HashMap<String, ([u8; 32], ClusterClient)>>,
    max_response: u64,
}

impl Default for KubeBackend {
    fn default() -> Self {
        Self {
            clients: Mutex::default(),
            max_response: MAX_RESPONSE_BYTES,
        }
    }
}

impl KubeBackend {
    /// A backend with no clients yet; each is built on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend whose responses are capped at `bytes` instead of
    /// [`crate::client::MAX_RESPONSE_BYTES`].
    pub fn with_max_response_bytes(bytes: u64) -> Self {
        Self {
            max_response: bytes,
            ..Self::default()
        }
    }

    fn clients(&self) -> MutexGuard<'_, HashMap<String, ([u8; 32], ClusterClient)>> {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops the cached client of a cluster (after it was removed or re-registered; a client
    /// for changed credentials is also rebuilt on its own, the cache key being their digest).
    pub fn forget(&self, cluster_name: &str) {
        self.clients().remove(cluster_name);
    }

    /// Opens a byte stream to the Agent's gateway port in its current, Ready Pod through the
    /// API server's port-forward (issue 30's cluster path; [`crate::gateway_stream`]). The
    /// answer names the Pod and the revisions for the audit record. `timeout` bounds finding
    /// the Pod and the upgrade; the stream itself has no idle limit.
    pub async fn open_gateway_stream(
        &self,
        cluster: &Cluster,
        namespace_id: &clawfleet_protocol::Ident,
        agent_id: &clawfleet_protocol::Ident,
        timeout: Duration,
    ) -> Result<crate::GatewayConnection, crate::GatewayStreamError> {
        use crate::GatewayStreamError;
        cluster.settings.validate().map_err(|e| {
            GatewayStreamError::Cluster(Failure::new(
                FailureCode::KubernetesConfigurationInvalid,
                format!("cluster {} settings: {e}", cluster.name),
            ))
        })?;
        let cc = self
            .client_for(cluster)
            .map_err(GatewayStreamError::Cluster)?;
        crate::gateway_stream::open(&cc, &cluster.settings, namespace_id, agent_id, timeout).await
    }

    /// The cluster's checked settings and client, for calls that must end by `deadline`.
    fn requests(&self, cluster: &Cluster, deadline: Duration) -> Result<Requests, Failure> {
        cluster.settings.validate().map_err(|e| {
            Failure::new(
                FailureCode::KubernetesConfigurationInvalid,
                format!("cluster {} settings: {e}", cluster.name),
            )
        })?;
        Ok(Requests {
            cc: self.client_for(cluster)?,
            deadline: Instant::now() + deadline,
        })
    }

    fn client_for(&self, cluster: &Cluster) -> Result<ClusterClient, Failure> {
        let key = cluster.credentials.cache_key();
        if let Some((k, c)) = self.clients().get(&cluster.name)
            && *k == key
        {
            return Ok(c.clone());
        }
        let c = ClusterClient::new(&cluster.credentials, self.max_response)?;
        self.clients()
            .insert(cluster.name.clone(), (key, c.clone()));
        Ok(c)
    }

    /// Runs one operation against one cluster within `deadline`, unfenced.
    pub async fn call(
        &self,
        cluster: &Cluster,
        operation: Operation,
        deadline: Duration,
    ) -> Result<OperationResult, Failure> {
        self.call_fenced(cluster, operation, deadline, None).await
    }

    /// Runs one operation within `deadline`, carrying the fence of the coordinator's claim on
    /// the Agent ([`ops::fence`]): a fenced operation whose fence is lower than the Agent's is
    /// refused with `FENCE_STALE` before it writes anything.
    pub async fn call_fenced(
        &self,
        cluster: &Cluster,
        operation: Operation,
        deadline: Duration,
        fence: Option<u64>,
    ) -> Result<OperationResult, Failure> {
        let r = self.requests(cluster, deadline)?;
        let kind = operation.kind();
        let removes = matches!(
            operation,
            Operation::DeleteAgent(_)
                | Operation::DeleteNamespace(_)
                | Operation::StopRevision(_)
                | Operation::RetireRevision(_)
        );
        let started = Instant::now();
        let out = match ops::fence::check(&r, &cluster.settings, &operation, fence).await {
            Err(f) => Err(f),
            Ok(()) => {
                run(
                    &r,
                    &cluster.name,
                    &cluster.credentials,
                    &cluster.settings,
                    operation,
                )
                .await
            }
        };
        // Removing things must stay possible once expired or revoked credentials are replaced
        // (`occ cluster update`): a 401/403 there is retryable, not the end of the deletion.
        let out = match out {
            Err(f) if removes && crate::client::auth_refused(&f) => Err(Failure::with_class(
                FailureClass::Retryable,
                f.code,
                format!(
                    "{}; retried once the cluster's credentials are replaced (occ cluster update)",
                    f.message
                ),
            )),
            other => other,
        };
        match &out {
            Ok(_) => {
                tracing::info!(cluster = %cluster.name, op = %kind, elapsed_ms = started.elapsed().as_millis() as u64, "operation succeeded")
            }
            Err(f) => {
                tracing::warn!(cluster = %cluster.name, op = %kind, code = %f.code, message = %f.message, "operation failed")
            }
        }
        out
    }

    /// Puts an Agent's whole set of secrets into its Secret on the cluster (an empty set
    /// removes it), within `deadline`, fenced like the Agent's other changes
    /// ([`crate::ops::secrets`]). The values go only to the API server; the result and every
    /// log line carry names, versions and fingerprints.
    pub async fn put_secrets(
        &self,
        cluster: &Cluster,
        args: &crate::secrets::AgentSecrets,
        deadline: Duration,
        fence: Option<u64>,
    ) -> Result<clawfleet_protocol::sealed::PutSecretsResult, Failure> {
        let r = self.requests(cluster, deadline)?;
        let started = Instant::now();
        let out = match ops::fence::check_agent(
            &r,
            &cluster.settings,
            &args.namespace.id,
            &args.agent.id,
            fence,
        )
        .await
        {
            Err(f) => Err(f),
            Ok(()) => Box::pin(ops::secrets::put(&r, &cluster.settings, args)).await,
        };
        match &out {
            Ok(_) => {
                tracing::info!(cluster = %cluster.name, op = "put-secrets", elapsed_ms = started.elapsed().as_millis() as u64, "operation succeeded")
            }
            Err(f) => {
                tracing::warn!(cluster = %cluster.name, op = "put-secrets", code = %f.code, message = %f.message, "operation failed")
            }
        }
        out
    }

    /// Asks the Agent's running gateway to reload its secrets and verifies what it then holds
    /// against the versions the Agent's Secret records (issue 29; `src/ops/reload.rs`):
    /// through the API server's port-forward, repeated while the kubelet has not projected
    /// the new Secret yet, until `deadline`. The activation of a secrets-only change does this
    /// itself and answers it in `ActivateResult::secrets_reload`, as hostd does; this asks again
    /// on its own, for a caller that wants to see what the running gateway holds now.
    pub async fn reload_gateway_secrets(
        &self,
        cluster: &Cluster,
        namespace_id: &clawfleet_protocol::Ident,
        agent_id: &clawfleet_protocol::Ident,
        deadline: Duration,
    ) -> Result<clawfleet_protocol::result::SecretsReload, Failure> {
        let r = self.requests(cluster, deadline)?;
        let started = Instant::now();
        let out =
            ops::reload::reload_and_verify(&r, &cluster.settings, namespace_id, agent_id).await;
        match &out {
            Ok(v) => {
                tracing::info!(cluster = %cluster.name, op = "reload-secrets", agent = %agent_id, result = ?v, elapsed_ms = started.elapsed().as_millis() as u64, "operation succeeded")
            }
            Err(f) => {
                tracing::warn!(cluster = %cluster.name, op = "reload-secrets", agent = %agent_id, code = %f.code, message = %f.message, "operation failed")
            }
        }
        out
    }

    /// The Agent's managed gateway password from its password Secret, `None` when the
    /// Agent has no such Secret or key (its configuration takes no password): for the
    /// coordinator's gateway route to add at the last hop, never shown to its caller.
    pub async fn gateway_password(
        &self,
        cluster: &Cluster,
        namespace_id: &clawfleet_protocol::Ident,
        agent_id: &clawfleet_protocol::Ident,
        deadline: Duration,
    ) -> Result<Option<zeroize::Zeroizing<String>>, Failure> {
        let r = self.requests(cluster, deadline)?;
        ops::reload::managed_password(&r, &cluster.settings, namespace_id, agent_id).await
    }

    /// The permissions of [`crate::rbac`] the cluster's credentials lack, each as text
    /// naming the verb, resource and where (empty: all held). Without adopted namespaces in
    /// the settings, the managed ClusterRole's rules cluster-wide; with them, the adopted
    /// Role's rules in each adopted namespace and the cluster-scoped reads and claim.
    pub async fn missing_access(&self, cluster: &Cluster) -> Result<Vec<String>, Failure> {
        use crate::rbac;
        let r = Requests {
            cc: self.client_for(cluster)?,
            deadline: Instant::now() + Duration::from_secs(30),
        };
        let adopted = &cluster.settings.adopted_namespaces;
        let wanted = if adopted.is_empty() {
            rbac::permissions(&rbac::rules(rbac::MANAGED), None, None)
        } else {
            let mut w = Vec::new();
            for ns in adopted.values() {
                w.extend(rbac::permissions(
                    &rbac::rules(rbac::ADOPTED_NAMESPACED),
                    Some(ns),
                    None,
                ));
                for p in rbac::permissions(&rbac::rules(rbac::ADOPTED_CLUSTER), None, None) {
                    // The claim patches the adopted namespace itself, nothing else.
                    let name = (p.verb == "patch").then(|| ns.clone());
                    let p = rbac::Permission { name, ..p };
                    if !w.contains(&p) {
                        w.push(p);
                    }
                }
            }
            w
        };
        let missing = rbac::missing(&r, wanted).await?;
        if !missing.is_empty() {
            tracing::warn!(cluster = %cluster.name, missing = missing.len(), "the cluster's identity lacks permissions");
        }
        Ok(missing.iter().map(ToString::to_string).collect())
    }

    /// `/version` and its warnings, typed.
    pub async fn probe_cluster(&self, cluster: &Cluster) -> Result<ClusterProbe, Failure> {
        let r = Requests {
            cc: self.client_for(cluster)?,
            deadline: Instant::now() + Duration::from_secs(15),
        };
        ops::probe::version(&r).await
    }
}

/// Dispatches one operation (also used by the request-shape tests with a mock client).
pub(crate) async fn run(
    r: &Requests,
    cluster_name: &str,
    creds: &ClusterCredentials,
    settings: &ClusterSettings,
    operation: Operation,
) -> Result<OperationResult, Failure> {
    Ok(match operation {
        Operation::Probe(_) => OperationResult::Probe(
            Box::pin(ops::probe::probe(
                r,
                cluster_name,
                &creds.ca_fingerprint(),
                settings,
            ))
            .await?,
        ),
        Operation::EnsureNamespace(a) => OperationResult::EnsureNamespace(
            Box::pin(ops::namespace::ensure(r, settings, &a)).await?,
        ),
        Operation::DeleteNamespace(a) => OperationResult::DeleteNamespace(
            Box::pin(ops::namespace::delete(r, settings, &a)).await?,
        ),
        Operation::PrepareRevision(a) => OperationResult::PrepareRevision(
            Box::pin(ops::revision::prepare(r, settings, &a)).await?,
        ),
        Operation::ActivateRevision(a) => OperationResult::ActivateRevision(
            Box::pin(ops::revision::activate(r, settings, &a)).await?,
        ),
        Operation::VerifyRevision(a) => {
            OperationResult::VerifyRevision(Box::pin(ops::revision::verify(r, settings, &a)).await?)
        }
        Operation::StopRevision(a) => {
            OperationResult::StopRevision(Box::pin(ops::revision::stop(r, settings, &a)).await?)
        }
        Operation::RetireRevision(a) => {
            OperationResult::RetireRevision(Box::pin(ops::revision::retire(r, settings, &a)).await?)
        }
        Operation::DeleteAgent(a) => {
            OperationResult::DeleteAgent(Box::pin(ops::agent::delete(r, settings, &a)).await?)
        }
        Operation::Status(a) => {
            OperationResult::Status(Box::pin(ops::status::status(r, settings, &a)).await?)
        }
        Operation::AgentRuntime(a) => OperationResult::AgentRuntime(Box::new(
            Box::pin(ops::runtime::runtime(r, settings, &a)).await?,
        )),
        Operation::AgentLogs(a) => {
            OperationResult::AgentLogs(Box::pin(ops::runtime::logs(r, settings, &a)).await?)
        }
        // Plans are answered by host pools only for now; the coordinator shows this as 501
        // BACKEND_UNSUPPORTED, as for a hostd that predates an operation. Egress settings the
        // cluster would refuse are refused first, as the prepare would refuse them.
        Operation::PlanRevision(a) => {
            ops::revision::egress_ports(a.egress.as_ref())?;
            return Err(Failure::new(
                FailureCode::OperationUnsupported,
                "unknown operation \"plan-revision\" on a Kubernetes cluster: this backend \
                 does not plan deploys yet",
            ));
        }
        // Clusters get their secrets in clear over the API server's TLS connection, from the
        // coordinator's own process (`KubeBackend::put_secrets`), never sealed to a host key.
        Operation::PutSecrets(_) => {
            return Err(Failure::new(
                FailureCode::InvalidInput,
                "\"put-secrets\" carries values sealed to a host key, which a Kubernetes \
                 cluster has none of; a cluster takes an Agent's secrets through \
                 KubeBackend::put_secrets",
            ));
        }
        Operation::OperationStatus(a) => OperationResult::OperationStatus(OperationStatusResult {
            operation_id: a.operation_id,
            state: OperationState::Unknown,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeconfig::ClusterAuth;

    fn cluster(name: &str, credentials: ClusterCredentials) -> Cluster {
        Cluster {
            name: name.to_owned(),
            credentials,
            settings: ClusterSettings::new(format!("r/x@sha256:{}", "1".repeat(64))),
        }
    }

    fn good_credentials() -> ClusterCredentials {
        use base64::Engine as _;
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .unwrap()
            .cert
            .pem();
        let doc = serde_json::json!({
            "clusters": [{ "name": "c", "cluster": { "server": "https://127.0.0.1:1",
                "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca) } }],
            "users": [{ "name": "u", "user": { "token": "t" } }],
            "contexts": [{ "name": "x", "context": { "cluster": "c", "user": "u" } }],
            "current-context": "x",
        });
        crate::parse_kubeconfig(&doc.to_string(), None).unwrap()
    }

    /// Issue 27 N2: a stored token holding a newline made kube's builder panic while the
    /// client cache's lock was held; every later call, to any cluster, then failed with
    /// "the client cache lock is poisoned" until restart. Now the panic is caught, fails only
    /// its own cluster with a code, and the cache serves every other cluster.
    #[tokio::test]
    async fn a_panicking_client_build_fails_only_its_own_cluster() {
        let backend = KubeBackend::new();
        let bad = cluster(
            "bad",
            good_credentials().with_auth_unchecked(ClusterAuth::Token {
                token: "abc\ndef".to_owned(),
            }),
        );
        let good = cluster("good", good_credentials());
        let first =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backend.client_for(&bad)));
        let second = backend.client_for(&good);
        assert!(
            second.is_ok(),
            "another cluster's client: {:?}",
            second.err()
        );
        let first = first.expect("building the bad cluster's client panicked into its caller");
        assert_eq!(
            first.unwrap_err().code,
            FailureCode::KubernetesConfigurationInvalid
        );
    }
}
