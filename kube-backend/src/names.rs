//! Object names and ownership markers, derived deterministically from ids.
//!
//! Names are hashes (DNS-1123 labels, at most 63 characters, starting with a letter), so no id
//! ever has to be escaped and two Agents never share a name. Ids themselves travel in labels
//! and annotations: protocol identifiers are valid label values by construction.

use clawfleet_protocol::Ident;
use clawfleet_protocol::ident::{hex, sha256};

/// `app.kubernetes.io/managed-by`: every object clawfleet writes carries it.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY`].
pub const MANAGER: &str = "clawfleet";
/// The server-side apply field manager.
pub const FIELD_MANAGER: &str = "clawfleet";
/// Label and annotation: the clawfleet Namespace id.
pub const NAMESPACE_ID: &str = "clawfleet.dev/namespace-id";
/// Annotation on the tenant namespace: the clawfleet Namespace name (for `status`).
pub const NAMESPACE_NAME: &str = "clawfleet.dev/namespace-name";
/// Label and annotation: the Agent id.
pub const AGENT_ID: &str = "clawfleet.dev/agent-id";
/// Annotation: the Agent's service principal.
pub const SERVICE_PRINCIPAL_ID: &str = "clawfleet.dev/service-principal-id";
/// Label and annotation: the revision id (ConfigMaps; the Deployment and its Pods).
pub const REVISION_ID: &str = "clawfleet.dev/revision-id";
/// Annotation on the Deployment: the revision its Pod template runs (its ConfigMap and
/// serving label). It is the activated revision ([`REVISION_ID`]) unless that one differs
/// from an earlier revision only in its secrets: then the Pods stay as they are and the
/// Agent's Secret changes in place. Absent on Deployments from before it: the same as
/// [`REVISION_ID`].
pub const POD_REVISION_ID: &str = "clawfleet.dev/pod-revision-id";
/// Annotation: the revision number.
pub const REVISION_NUMBER: &str = "clawfleet.dev/revision-number";
/// Annotation: the configuration hash of the revision.
pub const CONFIGURATION_HASH: &str = "clawfleet.dev/configuration-hash";
/// Annotation on a revision ConfigMap: SHA-256 (hex) of its `openclaw.json`, checked on every
/// read so a ConfigMap recreated with copied markers but other content is refused.
pub const RENDERED_HASH: &str = "clawfleet.dev/rendered-hash";
/// Annotation on the Deployment: the fingerprint of its Pod template as clawfleet applied it
/// (each container's image, command and args; [`crate::render::workload_fingerprint`]), so
/// status and reconcile see a template edited behind clawfleet's back.
pub const WORKLOAD_FINGERPRINT: &str = "clawfleet.dev/workload-fingerprint";
/// Label and annotation on an adopted (operator-chosen) namespace: `"true"`.
pub const ADOPTED: &str = "clawfleet.dev/adopted";
/// Annotation on the Agent's ServiceAccount: the highest fence an operation on the Agent
/// carried ([`crate::ops::fence`]); a lower one is refused with `FENCE_STALE`.
pub const FENCE: &str = "clawfleet.dev/fence";
/// The server-side apply field manager of [`FENCE`] alone, so the Agent's own apply (manager
/// [`FIELD_MANAGER`], which never sets it) neither removes nor conflicts with it.
pub const FENCE_MANAGER: &str = "clawfleet-fence";
/// Label: what an object is for (`namespace`, `gateway`).
pub const COMPONENT: &str = "clawfleet.dev/component";
/// Pod label and Service selector key: which revision a Pod serves. The Service selects
/// [`INACTIVE`] until activation, a value no Pod ever has (Pod values are `r` + hex).
pub const SERVING_REVISION: &str = "clawfleet.dev/serving-revision";
/// The Service selector value before activation.
pub const INACTIVE: &str = "inactive";
/// The label kube-controller-manager puts on a Service's EndpointSlices.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Namespace-wide objects.
pub const QUOTA: &str = "clawfleet-quota";
pub const LIMITS: &str = "clawfleet-limits";
pub const DEFAULT_DENY: &str = "clawfleet-default-deny";
pub const ALLOW_DNS: &str = "clawfleet-allow-dns";
pub const ALLOW_GATEWAY_INGRESS: &str = "clawfleet-allow-gateway-ingress";

/// The container, port and volume names inside the gateway Pod.
pub const CONTAINER: &str = "gateway";
pub const PORT_NAME: &str = "gateway";
/// The Secret key holding the gateway password (the same name as the env var on hosts).
pub const PASSWORD_KEY: &str = "OPENCLAW_GATEWAY_PASSWORD";
/// The ConfigMap key holding the rendered configuration.
pub const CONFIG_KEY: &str = "openclaw.json";

fn digest(domain: &str, id: &str) -> String {
    hex(&sha256(format!("{domain}\0{id}").as_bytes()))
}

/// `oce-` + the first 15 hex characters of sha256(Namespace id): the seed's managed name.
pub fn tenant_namespace(namespace_id: &Ident) -> String {
    let h = hex(&sha256(namespace_id.as_str().as_bytes()));
    format!("oce-{}", &h[..15])
}

/// The Kubernetes namespace a clawfleet Namespace lives in: the managed `oce-…` one, or an
/// operator's existing namespace that clawfleet adopted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: Ident,
    /// The Kubernetes namespace's name.
    pub name: String,
    pub adopted: bool,
}

impl Tenant {
    /// The managed namespace of a Namespace id.
    pub fn managed(id: &Ident) -> Self {
        Self {
            id: id.clone(),
            name: tenant_namespace(id),
            adopted: false,
        }
    }

    /// An adopted namespace.
    pub fn adopted(id: &Ident, name: &str) -> Self {
        Self {
            id: id.clone(),
            name: name.to_owned(),
            adopted: true,
        }
    }

    /// The markers of the Kubernetes Namespace object itself. A managed one carries
    /// `managed-by=clawfleet`; an adopted one stays the operator's and carries
    /// [`ADOPTED`] instead.
    pub fn namespace_markers(&self) -> Markers {
        if self.adopted {
            Markers {
                labels: vec![
                    (NAMESPACE_ID, self.id.to_string()),
                    (ADOPTED, "true".to_owned()),
                ],
                annotations: vec![(NAMESPACE_ID, self.id.to_string())],
            }
        } else {
            Markers::namespace(&self.id)
        }
    }
}

/// The names of one Agent's objects in its tenant namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentNames {
    /// 20 hex characters of sha256 over the Agent id.
    pub suffix: String,
    /// Deployment, Service and ServiceAccount: `gw-<suffix>`.
    pub gateway: String,
    /// The state PVC: `gw-state-<suffix>`.
    pub state: String,
    /// The password Secret: `gw-password-<suffix>`.
    pub password: String,
    /// The egress NetworkPolicy: `gw-egress-<suffix>`.
    pub egress: String,
    /// The initial workspace files Secret: `gw-workspace-<suffix>` (workspace.rs).
    pub workspace: String,
    /// The Agent's secrets Secret: `gw-secrets-<suffix>` (secrets.rs).
    pub secrets: String,
}

/// Names for an Agent.
pub fn agent(agent_id: &Ident) -> AgentNames {
    let suffix = digest("agent", agent_id.as_str())[..20].to_owned();
    AgentNames {
        gateway: format!("gw-{suffix}"),
        state: format!("gw-state-{suffix}"),
        password: format!("gw-password-{suffix}"),
        egress: format!("gw-egress-{suffix}"),
        workspace: format!("gw-workspace-{suffix}"),
        secrets: format!("gw-secrets-{suffix}"),
        suffix,
    }
}

/// The revision ConfigMap: `gw-<agent suffix>-rev-<16 hex of the revision id>`.
pub fn revision_config_map(agent_id: &Ident, revision_id: &Ident) -> String {
    let r = &digest("revision", revision_id.as_str())[..16];
    format!("gw-{}-rev-{r}", agent(agent_id).suffix)
}

/// The [`SERVING_REVISION`] value of a revision's Pods: `r` + 16 hex.
pub fn serving_value(revision_id: &Ident) -> String {
    format!("r{}", &digest("revision", revision_id.as_str())[..16])
}

/// Exact labels and annotations an object at an owned name must carry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Markers {
    pub labels: Vec<(&'static str, String)>,
    pub annotations: Vec<(&'static str, String)>,
}

impl Markers {
    /// Namespace-level objects (and the tenant namespace itself).
    pub fn namespace(namespace_id: &Ident) -> Self {
        Self {
            labels: vec![
                (MANAGED_BY, MANAGER.to_owned()),
                (NAMESPACE_ID, namespace_id.to_string()),
            ],
            annotations: vec![(NAMESPACE_ID, namespace_id.to_string())],
        }
    }

    /// One Agent's objects.
    pub fn agent(namespace_id: &Ident, agent_id: &Ident) -> Self {
        let mut m = Self::namespace(namespace_id);
        m.labels.push((AGENT_ID, agent_id.to_string()));
        m.annotations.push((AGENT_ID, agent_id.to_string()));
        m
    }

    /// One revision's objects (the ConfigMap).
    pub fn revision(namespace_id: &Ident, agent_id: &Ident, revision_id: &Ident) -> Self {
        let mut m = Self::agent(namespace_id, agent_id);
        m.labels.push((REVISION_ID, revision_id.to_string()));
        m.annotations.push((REVISION_ID, revision_id.to_string()));
        m
    }

    /// `k=v,k=v` over the labels, for list calls.
    pub fn selector(&self) -> String {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The labels as a map.
    pub fn label_map(&self) -> std::collections::BTreeMap<String, String> {
        self.labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    /// The annotations as a map.
    pub fn annotation_map(&self) -> std::collections::BTreeMap<String, String> {
        self.annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }
}

/// Whether `name` is a DNS-1123 label that may also name a Service (starts with a letter).
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}
