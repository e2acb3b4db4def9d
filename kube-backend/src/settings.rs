//! Per-cluster settings: what every Agent's gateway on that cluster runs with.
//!
//! Decoded strictly (camelCase, unknown fields refused) and then [`ClusterSettings::validate`]d,
//! each error naming its field, so nothing that cannot be rendered is ever stored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why settings cannot be used; the field is named in the settings' own camelCase spelling.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("`{field}`: {reason}")]
pub struct SettingsError {
    pub field: String,
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> SettingsError {
    SettingsError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The gateway command of the reference image: the node binary running OpenClaw's entry point
/// in the foreground.
pub fn default_gateway_command() -> Vec<String> {
    ["node", "/app/openclaw.mjs", "gateway", "run"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

/// OpenClaw's own default gateway port.
pub const DEFAULT_GATEWAY_PORT: u16 = 18789;

fn default_port() -> u16 {
    DEFAULT_GATEWAY_PORT
}

fn default_state_size() -> String {
    "1Gi".to_owned()
}

/// Everything clawfleet needs to know about one cluster besides its credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSettings {
    /// The gateway image, pinned by digest: `registry/name@sha256:<64 hex>`.
    pub gateway_image: String,
    /// Development only: accept a tag instead of a digest.
    #[serde(default)]
    pub allow_unpinned_image: bool,
    /// The command that starts OpenClaw's gateway in the image (no shell).
    #[serde(default = "default_gateway_command")]
    pub gateway_command: Vec<String>,
    /// The port the gateway listens on in its Pod, passed as `OPENCLAW_GATEWAY_PORT`.
    #[serde(default = "default_port")]
    pub gateway_port: u16,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub quota: Quota,
    /// Node labels every gateway Pod requires.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// StorageClass of the state volumes; the cluster default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// Size of each Agent's state volume.
    #[serde(default = "default_state_size")]
    pub state_volume_size: String,
    /// Where the cluster DNS runs: the only egress every Pod gets besides HTTPS.
    #[serde(default)]
    pub dns: PeerSelector,
    /// Who may reach the gateway port (for example an ingress controller).
    #[serde(default)]
    pub gateway_clients: Vec<PeerSelector>,
    /// Existing namespaces the operator chose for some Namespaces (Namespace id → namespace
    /// name), adopted after their safety checks instead of a managed `oce-…` one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub adopted_namespaces: BTreeMap<String, String>,
}

/// CPU and memory of each gateway container; also the Namespace's LimitRange defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    pub requests: CpuMemory,
    pub limits: CpuMemory,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            requests: CpuMemory {
                cpu: "250m".to_owned(),
                memory: "1Gi".to_owned(),
            },
            limits: CpuMemory {
                cpu: "2".to_owned(),
                memory: "2Gi".to_owned(),
            },
        }
    }
}

/// Kubernetes quantities, e.g. `cpu: "500m"`, `memory: "1Gi"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuMemory {
    pub cpu: String,
    pub memory: String,
}

/// The ResourceQuota of each tenant namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quota {
    /// Pods at most (one per Agent, plus one while a Recreate rollout replaces it).
    pub pods: u32,
}

impl Default for Quota {
    fn default() -> Self {
        Self { pods: 20 }
    }
}

/// Pods in one namespace, chosen by labels: a NetworkPolicy peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerSelector {
    pub namespace: String,
    #[serde(default)]
    pub pod_labels: BTreeMap<String, String>,
}

impl Default for PeerSelector {
    /// The usual cluster DNS: CoreDNS labelled `k8s-app=kube-dns` in kube-system.
    fn default() -> Self {
        Self {
            namespace: "kube-system".to_owned(),
            pod_labels: BTreeMap::from([("k8s-app".to_owned(), "kube-dns".to_owned())]),
        }
    }
}

impl ClusterSettings {
    /// Settings with every default and this image.
    pub fn new(gateway_image: impl Into<String>) -> Self {
        Self {
            gateway_image: gateway_image.into(),
            allow_unpinned_image: false,
            gateway_command: default_gateway_command(),
            gateway_port: DEFAULT_GATEWAY_PORT,
            resources: Resources::default(),
            quota: Quota::default(),
            node_selector: BTreeMap::new(),
            storage_class: None,
            state_volume_size: default_state_size(),
            dns: PeerSelector::default(),
            gateway_clients: Vec::new(),
            adopted_namespaces: BTreeMap::new(),
        }
    }

    /// The Kubernetes namespace of a clawfleet Namespace on this cluster.
    pub fn tenant(&self, namespace_id: &clawfleet_protocol::Ident) -> crate::names::Tenant {
        match self.adopted_namespaces.get(namespace_id.as_str()) {
            Some(name) => crate::names::Tenant::adopted(namespace_id, name),
            None => crate::names::Tenant::managed(namespace_id),
        }
    }

    /// Decodes settings from JSON and validates them; errors name the field.
    pub fn from_json(value: serde_json::Value) -> Result<Self, SettingsError> {
        let settings: Self = serde_json::from_value(value).map_err(|e| {
            let text = e.to_string();
            let field = text
                .split('`')
                .nth(1)
                .map(str::to_owned)
                .unwrap_or_else(|| "settings".to_owned());
            err(field, text)
        })?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every field; the first problem is returned, naming its field.
    pub fn validate(&self) -> Result<(), SettingsError> {
        check_image(&self.gateway_image, self.allow_unpinned_image)?;
        if self.gateway_command.is_empty() {
            return Err(err("gatewayCommand", "must name at least the program"));
        }
        for (i, word) in self.gateway_command.iter().enumerate() {
            if word.is_empty() || word.chars().any(char::is_control) || word.len() > 1024 {
                return Err(err(
                    format!("gatewayCommand[{i}]"),
                    "must be 1-1024 characters without control characters",
                ));
            }
        }
        if self.gateway_port < 1024 {
            return Err(err(
                "gatewayPort",
                "must be 1024 or higher: the gateway runs without privileges",
            ));
        }
        check_quantity("resources.requests.cpu", &self.resources.requests.cpu, true)?;
        check_quantity("resources.limits.cpu", &self.resources.limits.cpu, true)?;
        check_quantity(
            "resources.requests.memory",
            &self.resources.requests.memory,
            false,
        )?;
        check_quantity(
            "resources.limits.memory",
            &self.resources.limits.memory,
            false,
        )?;
        check_quantity("stateVolumeSize", &self.state_volume_size, false)?;
        for (k, v) in &self.node_selector {
            check_label_key(&format!("nodeSelector.{k}"), k)?;
            check_label_value(&format!("nodeSelector.{k}"), v)?;
        }
        if let Some(class) = &self.storage_class {
            check_dns_subdomain("storageClass", class)?;
        }
        check_peer("dns", &self.dns)?;
        for (i, peer) in self.gateway_clients.iter().enumerate() {
            check_peer(&format!("gatewayClients[{i}]"), peer)?;
        }
        let mut taken = std::collections::BTreeSet::new();
        for (id, name) in &self.adopted_namespaces {
            let field = format!("adoptedNamespaces.{id}");
            clawfleet_protocol::Ident::new(id.as_str())
                .map_err(|e| err(field.clone(), format!("the key is not a Namespace id: {e}")))?;
            check_dns_label(&field, name)?;
            if name.starts_with("oce-") {
                return Err(err(field, "oce- names are clawfleet's managed namespaces"));
            }
            if matches!(
                name.as_str(),
                "default" | "kube-system" | "kube-public" | "kube-node-lease"
            ) {
                return Err(err(field, "system namespaces cannot be adopted"));
            }
            if !taken.insert(name.as_str()) {
                return Err(err(
                    field,
                    "another Namespace already adopts this namespace",
                ));
            }
        }
        Ok(())
    }
}

fn check_image(image: &str, allow_unpinned: bool) -> Result<(), SettingsError> {
    if image.is_empty() || image.len() > 512 || image.chars().any(|c| c.is_whitespace()) {
        return Err(err(
            "gatewayImage",
            "must be an image reference without spaces",
        ));
    }
    match image.rsplit_once("@sha256:") {
        Some((name, digest)) => {
            if name.is_empty()
                || digest.len() != 64
                || !digest
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            {
                return Err(err(
                    "gatewayImage",
                    "the digest must be sha256: followed by 64 lowercase hex digits",
                ));
            }
            Ok(())
        }
        None if allow_unpinned => Ok(()),
        None => Err(err(
            "gatewayImage",
            "must be pinned by digest (name@sha256:<64 hex>); set allowUnpinnedImage only for development",
        )),
    }
}

/// A Kubernetes quantity in the forms clawfleet writes: digits, an optional fraction, an
/// optional suffix (`m` for CPU; binary or decimal SI for memory and storage).
fn check_quantity(field: &str, value: &str, cpu: bool) -> Result<(), SettingsError> {
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(split);
    let number_ok = !number.is_empty()
        && number.chars().filter(|c| *c == '.').count() <= 1
        && !number.starts_with('.')
        && !number.ends_with('.');
    let suffixes: &[&str] = if cpu {
        &["", "m"]
    } else {
        &[
            "", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
        ]
    };
    if !number_ok || !suffixes.contains(&suffix) {
        let example = if cpu { "\"500m\" or \"2\"" } else { "\"1Gi\"" };
        return Err(err(
            field,
            format!("must be a Kubernetes quantity such as {example}"),
        ));
    }
    if number.chars().all(|c| c == '0' || c == '.') {
        return Err(err(field, "must be greater than zero"));
    }
    Ok(())
}

fn check_dns_label(field: &str, v: &str) -> Result<(), SettingsError> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !v.starts_with('-')
        && !v.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(err(
            field,
            "must be a DNS label: 1-63 lowercase letters, digits and '-'",
        ))
    }
}

fn check_dns_subdomain(field: &str, v: &str) -> Result<(), SettingsError> {
    if v.is_empty() || v.len() > 253 {
        return Err(err(field, "must be 1-253 characters"));
    }
    for part in v.split('.') {
        check_dns_label(field, part)?;
    }
    Ok(())
}

fn label_name_ok(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn check_label_key(field: &str, key: &str) -> Result<(), SettingsError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        check_dns_subdomain(field, p)?;
    }
    if !label_name_ok(name) {
        return Err(err(
            field,
            "is not a valid label key (optional DNS prefix, then 1-63 of [A-Za-z0-9._-])",
        ));
    }
    Ok(())
}

fn check_label_value(field: &str, v: &str) -> Result<(), SettingsError> {
    if v.is_empty() || label_name_ok(v) {
        Ok(())
    } else {
        Err(err(
            field,
            "is not a valid label value (0-63 of [A-Za-z0-9._-], alphanumeric at both ends)",
        ))
    }
}

fn check_peer(field: &str, peer: &PeerSelector) -> Result<(), SettingsError> {
    check_dns_label(&format!("{field}.namespace"), &peer.namespace)?;
    for (k, v) in &peer.pod_labels {
        check_label_key(&format!("{field}.podLabels.{k}"), k)?;
        check_label_value(&format!("{field}.podLabels.{k}"), v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const PINNED: &str = "registry.example/openclaw-gateway@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn field_of(v: serde_json::Value) -> String {
        ClusterSettings::from_json(v).unwrap_err().field
    }

    #[test]
    fn defaults_are_valid() {
        let s = ClusterSettings::from_json(serde_json::json!({ "gatewayImage": PINNED })).unwrap();
        assert_eq!(s.gateway_port, 18789);
        assert_eq!(s.gateway_command, default_gateway_command());
        assert_eq!(s, ClusterSettings::new(PINNED));
    }

    #[test]
    fn unpinned_images_need_the_dev_flag() {
        assert_eq!(
            field_of(serde_json::json!({ "gatewayImage": "openclaw:latest" })),
            "gatewayImage"
        );
        assert_eq!(
            field_of(serde_json::json!({ "gatewayImage": "x@sha256:abc" })),
            "gatewayImage"
        );
        ClusterSettings::from_json(
            serde_json::json!({ "gatewayImage": "openclaw:latest", "allowUnpinnedImage": true }),
        )
        .unwrap();
    }

    #[test]
    fn each_bad_field_is_named() {
        let base = |k: &str, v: serde_json::Value| {
            let mut o = serde_json::json!({ "gatewayImage": PINNED });
            o[k] = v;
            field_of(o)
        };
        assert_eq!(
            base("gatewayCommand", serde_json::json!([])),
            "gatewayCommand"
        );
        assert_eq!(base("gatewayPort", serde_json::json!(80)), "gatewayPort");
        assert_eq!(
            base(
                "resources",
                serde_json::json!({"requests":{"cpu":"lots","memory":"1Gi"},"limits":{"cpu":"1","memory":"1Gi"}})
            ),
            "resources.requests.cpu"
        );
        assert_eq!(
            base("stateVolumeSize", serde_json::json!("1 GB")),
            "stateVolumeSize"
        );
        assert_eq!(
            base("nodeSelector", serde_json::json!({"bad key!": "x"})),
            "nodeSelector.bad key!"
        );
        assert_eq!(
            base("storageClass", serde_json::json!("Fast_SSD")),
            "storageClass"
        );
        assert_eq!(
            base("dns", serde_json::json!({"namespace": "Kube System"})),
            "dns.namespace"
        );
        assert_eq!(
            base(
                "gatewayClients",
                serde_json::json!([{"namespace":"ok","podLabels":{"app":"-bad"}}])
            ),
            "gatewayClients[0].podLabels.app"
        );
        assert_eq!(base("surprise", serde_json::json!(1)), "surprise");
        assert_eq!(
            base(
                "adoptedNamespaces",
                serde_json::json!({"ns-1": "oce-0123456789abcde"})
            ),
            "adoptedNamespaces.ns-1"
        );
        assert_eq!(
            base(
                "adoptedNamespaces",
                serde_json::json!({"ns-1": "kube-system"})
            ),
            "adoptedNamespaces.ns-1"
        );
        assert_eq!(
            base("adoptedNamespaces", serde_json::json!({"bad id!": "team"})),
            "adoptedNamespaces.bad id!"
        );
        assert_eq!(
            base(
                "adoptedNamespaces",
                serde_json::json!({"a": "team", "b": "team"})
            ),
            "adoptedNamespaces.b"
        );
    }
}
