//! The coordinator's data model as the API shows it: the types live in the API contract
//! (`clawfleet_api::model`, re-exported here); what never leaves the coordinator (a cluster's
//! credentials, a secret's value) and what needs the Kubernetes backend is here.

pub use clawfleet_api::model::*;
use clawfleet_protocol::SecretFingerprint;
use serde_json::Value;

/// The stored form of a cluster's `probe` answer: in a cluster's words, never hostd's
/// (`systemdVersion`, `hostKey`); `None` for an answer of another operation.
pub fn cluster_probe_record(result: &clawfleet_protocol::OperationResult) -> Option<Value> {
    match result {
        clawfleet_protocol::OperationResult::Probe(p) => {
            serde_json::to_value(clawfleet_kube::ClusterProbeReport::from_probe_result(p)).ok()
        }
        _ => None,
    }
}

/// The cluster as shown: a probe stored before clusters had their own words (hostd's
/// `ProbeResult` shape, tagged `"op": "probe"`) is shown in a cluster's words.
pub fn shown_cluster(mut cluster: Cluster) -> Cluster {
    if let Some(v) = &cluster.last_probe
        && let Ok(result) = serde_json::from_value::<clawfleet_protocol::OperationResult>(v.clone())
    {
        cluster.last_probe = cluster_probe_record(&result);
    }
    cluster
}

/// A cluster with its credentials (CA, token or client certificate), for the backend only.
#[derive(Clone, PartialEq)]
pub struct ClusterRecord {
    pub cluster: Cluster,
    /// Private: never returned by the API, never logged.
    pub credentials: Value,
}

impl std::fmt::Debug for ClusterRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterRecord")
            .field("cluster", &self.cluster)
            .field("credentials", &"<redacted>")
            .finish()
    }
}

/// A secret version's value for the worker, which delivers it to a target: wiped from memory
/// when dropped, and never printed (its `Debug` shows the fingerprint only).
pub struct SecretValue {
    pub value: zeroize::Zeroizing<Vec<u8>>,
    pub fingerprint: SecretFingerprint,
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretValue")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}
