//! Pure rendering of every object the backend writes, and of the cluster's `openclaw.json`.
//!
//! Nothing here talks to a cluster; the backend applies exactly what these functions return, so
//! the unit tests below pin names, labels, selectors, securityContext and probes.
//!
//! Where the cluster rendering of `openclaw.json` differs from a host's, and why:
//! - `gateway.bind` becomes `"lan"`: OpenClaw's bind mode for `0.0.0.0` (its gateway
//!   configuration reference: "`lan` (`0.0.0.0`)"; host aliases such as `"0.0.0.0"`
//!   are not accepted as bind values). In a Pod the gateway must listen on the Pod address for
//!   its Service and for the kubelet's readiness probe; loopback would be unreachable.
//! - Password auth is mandatory (`gateway.auth.mode: "password"`, the password from the
//!   Agent's Secret as `OPENCLAW_GATEWAY_PASSWORD`): once the gateway listens beyond loopback,
//!   the NetworkPolicies limit who can connect and the password is what authenticates.
//! - No trusted-proxy setting remains allowed: `gateway.auth.mode: "trusted-proxy"`,
//!   `gateway.auth.trustedProxy` and `gateway.trustedProxies` are refused. Pod addresses are
//!   reassigned on every restart and shared by every workload of a peer namespace, so no
//!   source address identifies a proxy clawfleet controls, and trusting forwarded identity or
//!   client-address headers from one would let any Pod the policies admit assert them.
//! - `gateway.port` stays absent (the port is the cluster setting, passed as
//!   `OPENCLAW_GATEWAY_PORT`, as hosts pass theirs).
//! - The coordinator's per-secret file providers become one exec provider, `clawfleet`, and
//!   each reference `{"source": "exec", "provider": "clawfleet", "id": "<name>"}`: OpenClaw's
//!   file provider refuses the kubelet's projected files (see [`crate::secrets`]).

use std::collections::BTreeMap;

use clawfleet_protocol::operation::{AgentRef, NamespaceRef, RevisionRef};
use clawfleet_protocol::{Configuration, Ident};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, LimitRange, Namespace, PersistentVolumeClaim, ResourceQuota, Secret, Service,
    ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::names::{self, Markers, Tenant};
use crate::settings::{ClusterSettings, PeerSelector};

/// Where the state volume is mounted; HOME is its root, the gateway state below it.
pub const STATE_MOUNT: &str = "/var/lib/openclaw";
/// Where the revision ConfigMap is mounted (read-only).
pub const CONFIG_MOUNT: &str = "/etc/openclaw";
/// Seconds the kubelet waits after SIGTERM (the gateway drains; idle it stops in 0.4-2 s).
pub const TERMINATION_GRACE_SECONDS: i64 = 60;

/// Why a revision or object cannot be rendered for a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RenderError {
    #[error("`{field}`: {reason}")]
    Refused { field: String, reason: String },
    #[error("internal rendering error for {object}: {reason}")]
    Shape { object: String, reason: String },
}

fn refuse(field: &str, reason: &str) -> RenderError {
    RenderError::Refused {
        field: field.to_owned(),
        reason: reason.to_owned(),
    }
}

pub(crate) fn typed<T: serde::de::DeserializeOwned>(
    object: &str,
    v: Value,
) -> Result<T, RenderError> {
    serde_json::from_value(v).map_err(|e| RenderError::Shape {
        object: object.to_owned(),
        reason: e.to_string(),
    })
}

fn map(m: BTreeMap<String, String>) -> Value {
    Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

fn with(mut m: BTreeMap<String, String>, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    for (k, v) in extra {
        m.insert((*k).to_owned(), (*v).to_owned());
    }
    m
}

/// The rendered `openclaw.json` for a Pod (see the module comment), as canonical bytes.
pub fn cluster_configuration(configuration: &Configuration) -> Result<String, RenderError> {
    let mut root = configuration.value().clone();
    let obj = root
        .as_object_mut()
        .ok_or_else(|| refuse("", "the configuration must be an object"))?;
    let gateway = obj
        .entry("gateway")
        .or_insert_with(|| Value::Object(Map::new()));
    let gw = gateway
        .as_object_mut()
        .ok_or_else(|| refuse("gateway", "must be an object"))?;
    match gw.get("mode") {
        None => {}
        Some(Value::String(m)) if m == "local" => {}
        Some(_) => return Err(refuse("gateway.mode", "must be \"local\"")),
    }
    match gw.get("bind") {
        None => {}
        Some(Value::String(b)) if b == "loopback" || b == "lan" => {}
        Some(_) => {
            return Err(refuse(
                "gateway.bind",
                "on a cluster the gateway listens on the Pod address (bind \"lan\"); other binds are refused",
            ));
        }
    }
    if gw.contains_key("port") {
        return Err(refuse(
            "gateway.port",
            "the port is the cluster's gatewayPort setting; remove gateway.port",
        ));
    }
    if gw.contains_key("trustedProxies") {
        return Err(refuse(
            "gateway.trustedProxies",
            "no trusted proxies on a cluster: Pod addresses identify no proxy clawfleet controls",
        ));
    }
    if gw
        .get("tls")
        .and_then(|t| t.get("enabled"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        return Err(refuse(
            "gateway.tls.enabled",
            "native TLS on the gateway listener is not supported",
        ));
    }
    gw.insert("mode".to_owned(), json!("local"));
    gw.insert("bind".to_owned(), json!("lan"));
    let auth = gw
        .entry("auth")
        .or_insert_with(|| Value::Object(Map::new()));
    let auth = auth
        .as_object_mut()
        .ok_or_else(|| refuse("gateway.auth", "must be an object"))?;
    match auth.get("mode") {
        None => {}
        Some(Value::String(m)) if m == "password" => {}
        Some(_) => {
            return Err(refuse(
                "gateway.auth.mode",
                "must be \"password\" on a cluster: the gateway listens beyond loopback",
            ));
        }
    }
    if auth.contains_key("trustedProxy") {
        return Err(refuse(
            "gateway.auth.trustedProxy",
            "trusted-proxy authentication is refused on a cluster",
        ));
    }
    if let Some(p) = auth.get("password") {
        let env_ref = json!({"source": "env", "provider": "default", "id": names::PASSWORD_KEY});
        if *p != env_ref && *p != json!("${OPENCLAW_GATEWAY_PASSWORD}") {
            return Err(refuse(
                "gateway.auth.password",
                "must reference OPENCLAW_GATEWAY_PASSWORD; literal passwords never travel",
            ));
        }
    }
    auth.insert("mode".to_owned(), json!("password"));
    crate::secrets::bind_for_cluster(obj)?;
    let rendered =
        Configuration::new(root).map_err(|e| refuse("", &format!("after rendering: {e}")))?;
    String::from_utf8(rendered.canonical_bytes().to_vec())
        .map_err(|_| refuse("", "the rendered configuration is not UTF-8"))
}

/// The tenant namespace: managed name, markers, restricted Pod Security.
pub fn namespace(ns: &NamespaceRef) -> Result<Namespace, RenderError> {
    let m = Markers::namespace(&ns.id);
    let labels = with(
        m.label_map(),
        &[
            ("pod-security.kubernetes.io/enforce", "restricted"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
            ("pod-security.kubernetes.io/audit", "restricted"),
            ("pod-security.kubernetes.io/warn", "restricted"),
        ],
    );
    let annotations = with(
        m.annotation_map(),
        &[(names::NAMESPACE_NAME, ns.name.as_str())],
    );
    typed(
        "Namespace",
        json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {
                "name": names::tenant_namespace(&ns.id),
                "labels": map(labels), "annotations": map(annotations),
            },
        }),
    )
}

/// The claim clawfleet puts on an adopted namespace: only its own labels and annotations
/// (server-side apply merges them), fenced by the resourceVersion it checked. Pod Security
/// stays the operator's.
pub fn adoption_claim(
    ns: &NamespaceRef,
    name: &str,
    resource_version: Option<String>,
) -> Result<Namespace, RenderError> {
    let t = Tenant::adopted(&ns.id, name);
    let m = t.namespace_markers();
    let annotations = with(
        m.annotation_map(),
        &[
            (names::NAMESPACE_NAME, ns.name.as_str()),
            (names::ADOPTED, "true"),
        ],
    );
    typed(
        "Namespace",
        json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {
                "name": name, "resourceVersion": resource_version,
                "labels": map(m.label_map()), "annotations": map(annotations),
            },
        }),
    )
}

/// An apply with no fields: server-side apply then drops every field clawfleet owned on the
/// adopted namespace (its claim), and nothing else.
pub fn release_claim(name: &str) -> Result<Namespace, RenderError> {
    typed(
        "Namespace",
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } }),
    )
}

fn ns_meta(ns: &Tenant, name: &str) -> Value {
    let m = Markers::namespace(&ns.id);
    json!({
        "name": name,
        "namespace": ns.name,
        "labels": map(with(m.label_map(), &[(names::COMPONENT, "namespace")])),
        "annotations": map(m.annotation_map()),
    })
}

pub(crate) fn agent_meta(ns: &Tenant, agent: &AgentRef, name: &str) -> Value {
    let m = Markers::agent(&ns.id, &agent.id);
    json!({
        "name": name,
        "namespace": ns.name,
        "labels": map(with(m.label_map(), &[(names::COMPONENT, "gateway")])),
        "annotations": map(with(
            m.annotation_map(),
            &[(names::SERVICE_PRINCIPAL_ID, agent.service_principal_id.as_str())],
        )),
    })
}

/// The Namespace's ResourceQuota: at most `quota.pods` Pods.
pub fn resource_quota(ns: &Tenant, s: &ClusterSettings) -> Result<ResourceQuota, RenderError> {
    typed(
        "ResourceQuota",
        json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": ns_meta(ns, names::QUOTA),
            "spec": { "hard": { "pods": s.quota.pods.to_string() } },
        }),
    )
}

/// Container defaults, so nothing in the namespace runs unbounded.
pub fn limit_range(ns: &Tenant, s: &ClusterSettings) -> Result<LimitRange, RenderError> {
    let r = &s.resources;
    typed(
        "LimitRange",
        json!({
            "apiVersion": "v1", "kind": "LimitRange",
            "metadata": ns_meta(ns, names::LIMITS),
            "spec": { "limits": [{
                "type": "Container",
                "default": { "cpu": r.limits.cpu, "memory": r.limits.memory },
                "defaultRequest": { "cpu": r.requests.cpu, "memory": r.requests.memory },
            }] },
        }),
    )
}

/// Denies all ingress and egress of every Pod in the namespace; the other policies add to it.
pub fn default_deny(ns: &Tenant) -> Result<NetworkPolicy, RenderError> {
    typed(
        "NetworkPolicy",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": ns_meta(ns, names::DEFAULT_DENY),
            "spec": { "podSelector": {}, "policyTypes": ["Ingress", "Egress"] },
        }),
    )
}

fn peer(p: &PeerSelector) -> Value {
    json!({
        "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": p.namespace } },
        "podSelector": { "matchLabels": map(p.pod_labels.clone()) },
    })
}

/// DNS (UDP and TCP 53) to the configured DNS Pods only.
pub fn allow_dns(ns: &Tenant, s: &ClusterSettings) -> Result<NetworkPolicy, RenderError> {
    typed(
        "NetworkPolicy",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": ns_meta(ns, names::ALLOW_DNS),
            "spec": {
                "podSelector": {},
                "policyTypes": ["Egress"],
                "egress": [{
                    "to": [peer(&s.dns)],
                    "ports": [{ "protocol": "UDP", "port": 53 }, { "protocol": "TCP", "port": 53 }],
                }],
            },
        }),
    )
}

/// The gateway port of every gateway Pod, from the configured gateway clients only (none
/// configured: nobody).
pub fn allow_gateway_ingress(
    ns: &Tenant,
    s: &ClusterSettings,
) -> Result<NetworkPolicy, RenderError> {
    let from: Vec<Value> = s.gateway_clients.iter().map(peer).collect();
    let ingress = if from.is_empty() {
        json!([])
    } else {
        json!([{ "from": from, "ports": [{ "protocol": "TCP", "port": s.gateway_port }] }])
    };
    typed(
        "NetworkPolicy",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": ns_meta(ns, names::ALLOW_GATEWAY_INGRESS),
            "spec": {
                "podSelector": { "matchLabels": {
                    names::MANAGED_BY: names::MANAGER, names::COMPONENT: "gateway",
                } },
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }),
    )
}

/// The labels that select one Agent's gateway Pods (the Deployment's selector).
pub fn pod_selector(agent: &Ident) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::MANAGED_BY.to_owned(), names::MANAGER.to_owned()),
        (names::AGENT_ID.to_owned(), agent.to_string()),
    ])
}

/// The Agent's ServiceAccount: no API token is ever mounted.
pub fn service_account(ns: &Tenant, agent: &AgentRef) -> Result<ServiceAccount, RenderError> {
    typed(
        "ServiceAccount",
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": agent_meta(ns, agent, &names::agent(&agent.id).gateway),
            "automountServiceAccountToken": false,
        }),
    )
}

/// The state volume, kept across revisions and stops.
pub fn state_claim(
    ns: &Tenant,
    agent: &AgentRef,
    s: &ClusterSettings,
) -> Result<PersistentVolumeClaim, RenderError> {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": s.state_volume_size } },
    });
    if let Some(class) = &s.storage_class {
        spec["storageClassName"] = json!(class);
    }
    typed(
        "PersistentVolumeClaim",
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": agent_meta(ns, agent, &names::agent(&agent.id).state),
            "spec": spec,
        }),
    )
}

/// The gateway password Secret (created once; `password` is random).
pub fn password_secret(
    ns: &Tenant,
    agent: &AgentRef,
    password: &str,
) -> Result<Secret, RenderError> {
    typed(
        "Secret",
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": agent_meta(ns, agent, &names::agent(&agent.id).password),
            "type": "Opaque",
            "stringData": { names::PASSWORD_KEY: password },
        }),
    )
}

/// The cluster's ceiling for an Agent's egress (protocol/src/egress.rs): TCP ports to public
/// addresses, and no other range. An Agent's own settings may only narrow it.
pub const EGRESS_PORTS: &[u16] = &[443];

/// Egress of the Agent's Pods: TCP on `ports` (the cluster's [`EGRESS_PORTS`], or the Agent's
/// narrowing of them) to public addresses only (model providers, channels). With no port the
/// policy has no egress rule: the Pods reach nothing but what the Namespace's DNS policy
/// allows.
pub fn egress_policy(
    ns: &Tenant,
    agent: &AgentRef,
    ports: &[u16],
) -> Result<NetworkPolicy, RenderError> {
    let mut spec = json!({
        "podSelector": { "matchLabels": map(pod_selector(&agent.id)) },
        "policyTypes": ["Egress"],
    });
    if !ports.is_empty() {
        let ports: Vec<Value> = ports
            .iter()
            .map(|p| json!({ "protocol": "TCP", "port": p }))
            .collect();
        spec["egress"] = json!([{
            "to": [{ "ipBlock": { "cidr": "0.0.0.0/0", "except": [
                "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12",
                "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8",
            ] } }],
            "ports": ports,
        }]);
    }
    typed(
        "NetworkPolicy",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": agent_meta(ns, agent, &names::agent(&agent.id).egress),
            "spec": spec,
        }),
    )
}

/// The Agent's Service; `serving` is a revision's [`names::serving_value`] once activated,
/// [`names::INACTIVE`] before.
pub fn service(
    ns: &Tenant,
    agent: &AgentRef,
    s: &ClusterSettings,
    serving: &str,
) -> Result<Service, RenderError> {
    let selector = with(
        pod_selector(&agent.id),
        &[(names::SERVING_REVISION, serving)],
    );
    typed(
        "Service",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": agent_meta(ns, agent, &names::agent(&agent.id).gateway),
            "spec": {
                "type": "ClusterIP",
                "selector": map(selector),
                "ports": [{
                    "name": names::PORT_NAME, "protocol": "TCP",
                    "port": s.gateway_port, "targetPort": names::PORT_NAME,
                }],
            },
        }),
    )
}

fn revision_annotations(rev: &RevisionRef) -> [(&'static str, String); 3] {
    [
        (names::REVISION_ID, rev.id.to_string()),
        (names::REVISION_NUMBER, rev.number.to_string()),
        (
            names::CONFIGURATION_HASH,
            rev.configuration_hash.as_str().to_owned(),
        ),
    ]
}

/// SHA-256 (hex) of a rendered `openclaw.json`.
pub fn rendered_hash(rendered: &str) -> String {
    clawfleet_protocol::ident::hex(&clawfleet_protocol::ident::sha256(rendered.as_bytes()))
}

/// The revision's immutable ConfigMap holding the cluster-rendered `openclaw.json`.
pub fn config_map(
    ns: &Tenant,
    agent: &AgentRef,
    rev: &RevisionRef,
    rendered: &str,
) -> Result<ConfigMap, RenderError> {
    let m = Markers::revision(&ns.id, &agent.id, &rev.id);
    let mut annotations = m.annotation_map();
    for (k, v) in revision_annotations(rev) {
        annotations.insert(k.to_owned(), v);
    }
    annotations.insert(names::RENDERED_HASH.to_owned(), rendered_hash(rendered));
    typed(
        "ConfigMap",
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": names::revision_config_map(&agent.id, &rev.id),
                "namespace": ns.name,
                "labels": map(with(m.label_map(), &[(names::COMPONENT, "gateway")])),
                "annotations": map(annotations),
            },
            "immutable": true,
            "data": { names::CONFIG_KEY: rendered },
        }),
    )
}

/// What the Pod template of an Agent's Deployment runs, beyond the cluster settings.
#[derive(Debug, Clone, Copy)]
pub struct Template<'a> {
    /// The revision whose ConfigMap the Pods mount and whose serving label they carry: the
    /// activated revision, or an earlier one with the same rendered configuration (a
    /// secrets-only change keeps the Pod: the Secret changes in place).
    pub revision: &'a RevisionRef,
    /// Whether the Pod mounts the Agent's secrets ([`crate::secrets`]).
    pub secrets: bool,
}

/// The Agent's gateway Deployment running revision `rev` with its own template and no
/// secrets ([`deployment_for`]).
pub fn deployment(
    ns: &Tenant,
    agent: &AgentRef,
    rev: &RevisionRef,
    s: &ClusterSettings,
    workspace: Option<&[clawfleet_protocol::workspace::WorkspaceFileMeta]>,
) -> Result<Deployment, RenderError> {
    let template = Template {
        revision: rev,
        secrets: false,
    };
    deployment_for(ns, agent, rev, template, s, workspace)
}

/// The Agent's gateway Deployment with revision `rev` activated and its Pods running
/// `template`; with a workspace manifest, its Pod first runs the init container that applies
/// the files once (workspace.rs); with secrets, the one that installs their resolver
/// (secrets.rs). The Deployment's annotations name `rev`, [`names::POD_REVISION_ID`] the
/// template's revision.
pub fn deployment_for(
    ns: &Tenant,
    agent: &AgentRef,
    rev: &RevisionRef,
    template: Template<'_>,
    s: &ClusterSettings,
    workspace: Option<&[clawfleet_protocol::workspace::WorkspaceFileMeta]>,
) -> Result<Deployment, RenderError> {
    let n = names::agent(&agent.id);
    let mut meta = agent_meta(ns, agent, &n.gateway);
    for (k, v) in revision_annotations(rev) {
        meta["annotations"][k] = json!(v);
    }
    let pod_rev = template.revision;
    meta["annotations"][names::POD_REVISION_ID] = json!(pod_rev.id.as_str());
    let serving = names::serving_value(&pod_rev.id);
    let pod_labels = with(
        pod_selector(&agent.id),
        &[
            (names::NAMESPACE_ID, ns.id.as_str()),
            (names::REVISION_ID, pod_rev.id.as_str()),
            (names::SERVING_REVISION, &serving),
            (names::COMPONENT, "gateway"),
        ],
    );
    let pod_annotations: BTreeMap<String, String> = revision_annotations(pod_rev)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let port = s.gateway_port;
    let r = &s.resources;
    let env = json!([
        { "name": "HOME", "value": STATE_MOUNT },
        { "name": "OPENCLAW_STATE_DIR", "value": format!("{STATE_MOUNT}/state") },
        { "name": "OPENCLAW_CONFIG_PATH", "value": format!("{CONFIG_MOUNT}/{}", names::CONFIG_KEY) },
        { "name": "OPENCLAW_CONFIG_READONLY", "value": "1" },
        { "name": "OPENCLAW_DISABLE_BONJOUR", "value": "1" },
        { "name": "OPENCLAW_GATEWAY_PORT", "value": port.to_string() },
        { "name": "TMPDIR", "value": "/tmp" },
        { "name": names::PASSWORD_KEY, "valueFrom": { "secretKeyRef": {
            "name": n.password, "key": names::PASSWORD_KEY, "optional": false,
        } } },
    ]);
    let mut container = json!({
        "name": names::CONTAINER,
        "image": s.gateway_image,
        "imagePullPolicy": "IfNotPresent",
        "command": s.gateway_command,
        "ports": [{ "name": names::PORT_NAME, "containerPort": port, "protocol": "TCP" }],
        "env": env,
        "readinessProbe": {
            "httpGet": { "path": "/readyz", "port": names::PORT_NAME, "scheme": "HTTP" },
            "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 3, "successThreshold": 1,
        },
        "resources": {
            "requests": { "cpu": r.requests.cpu, "memory": r.requests.memory },
            "limits": { "cpu": r.limits.cpu, "memory": r.limits.memory },
        },
        "securityContext": {
            "runAsNonRoot": true,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "privileged": false,
            "capabilities": { "drop": ["ALL"] },
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "volumeMounts": [
            { "name": "config", "mountPath": CONFIG_MOUNT, "readOnly": true },
            { "name": "state", "mountPath": STATE_MOUNT },
            { "name": "tmp", "mountPath": "/tmp" },
        ],
    });
    let mut pod_spec = json!({
        "serviceAccountName": n.gateway,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "containers": [container],
        "volumes": [
            { "name": "config", "configMap": {
                "name": names::revision_config_map(&agent.id, &pod_rev.id),
                "optional": false,
                "items": [{ "key": names::CONFIG_KEY, "path": names::CONFIG_KEY }],
            } },
            { "name": "state", "persistentVolumeClaim": { "claimName": n.state } },
            { "name": "tmp", "emptyDir": { "sizeLimit": "256Mi" } },
        ],
    });
    let mut init_containers = Vec::new();
    if let Some(manifest) = workspace {
        let (init, volume) = crate::workspace::init_container_and_volume(
            agent,
            manifest,
            &s.gateway_image,
            &container["securityContext"],
        );
        init_containers.push(init);
        if let Some(v) = pod_spec["volumes"].as_array_mut() {
            v.push(volume);
        }
    }
    if template.secrets {
        let (init, mounts, volumes) =
            crate::secrets::pod_parts(agent, &s.gateway_image, &container["securityContext"]);
        init_containers.push(init);
        if let Some(m) = container["volumeMounts"].as_array_mut() {
            m.extend(mounts);
        }
        if let Some(v) = pod_spec["volumes"].as_array_mut() {
            v.extend(volumes);
        }
        pod_spec["containers"] = json!([container]);
    }
    if !init_containers.is_empty() {
        pod_spec["initContainers"] = json!(init_containers);
    }
    if !s.node_selector.is_empty() {
        pod_spec["nodeSelector"] = map(s.node_selector.clone());
    }
    let mut dep: Deployment = typed(
        "Deployment",
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "revisionHistoryLimit": 2,
                "strategy": { "type": "Recreate" },
                "selector": { "matchLabels": map(pod_selector(&agent.id)) },
                "template": {
                    "metadata": { "labels": map(pod_labels), "annotations": map(pod_annotations) },
                    "spec": pod_spec,
                },
            },
        }),
    )?;
    let fingerprint = workload_fingerprint(&dep);
    dep.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            names::WORKLOAD_FINGERPRINT.to_owned(),
            fingerprint.to_text(),
        );
    Ok(dep)
}

/// What a Deployment's Pod template runs, field by field: for every container and init
/// container (by name), short hashes of its image, command and args. None of these is
/// defaulted by the API server, so the live template gives the same value as the applied one
/// until someone edits it (a swapped image, a replaced command, an injected sidecar).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkloadFingerprint(BTreeMap<String, BTreeMap<String, String>>);

fn short_hash<T: serde::Serialize>(v: &T) -> String {
    let text = serde_json::to_string(v).unwrap_or_default();
    let mut h = clawfleet_protocol::ident::hex(&clawfleet_protocol::ident::sha256(text.as_bytes()));
    h.truncate(12);
    h
}

/// The fingerprint of a Deployment's Pod template as it is (rendered or read back).
pub fn workload_fingerprint(dep: &Deployment) -> WorkloadFingerprint {
    let mut out = BTreeMap::new();
    let spec = dep.spec.template.spec.as_ref();
    let lists = spec.map(|s| {
        [
            ("container", s.containers.as_slice()),
            (
                "init container",
                s.init_containers.as_deref().unwrap_or_default(),
            ),
        ]
    });
    for (kind, list) in lists.into_iter().flatten() {
        for c in list {
            let fields = BTreeMap::from([
                ("image".to_owned(), short_hash(&c.image)),
                ("command".to_owned(), short_hash(&c.command)),
                ("args".to_owned(), short_hash(&c.args)),
            ]);
            out.insert(format!("{kind} {}", c.name), fields);
        }
    }
    WorkloadFingerprint(out)
}

impl WorkloadFingerprint {
    /// The annotation's text.
    pub fn to_text(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_default()
    }

    /// Reads the annotation back; `None` when it is not one.
    pub fn from_text(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok().map(Self)
    }

    /// How `live` differs from this (the applied template), in words; `None` when it does
    /// not. Names containers and fields, never values.
    pub fn differences(&self, live: &WorkloadFingerprint) -> Option<String> {
        let mut out = Vec::new();
        for (name, fields) in &live.0 {
            match self.0.get(name) {
                None => out.push(format!("{name} was added")),
                Some(applied) => {
                    let changed: Vec<&str> = fields
                        .iter()
                        .filter(|(k, v)| applied.get(*k) != Some(*v))
                        .map(|(k, _)| k.as_str())
                        .collect();
                    if !changed.is_empty() {
                        out.push(format!("{name}: {} changed", changed.join(", ")));
                    }
                }
            }
        }
        for name in self.0.keys() {
            if !live.0.contains_key(name) {
                out.push(format!("{name} was removed"));
            }
        }
        (!out.is_empty()).then(|| out.join("; "))
    }
}

#[cfg(test)]
mod tests;
