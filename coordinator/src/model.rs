//! The coordinator's data model as the API shows it: the types live in the API contract
//! (`clawfleet_api::model`), with what never leaves the coordinator (a cluster's credentials,
//! a secret's value) in the store's model (`clawfleet_store::model`), both re-exported here;
//! what needs the Kubernetes backend is here.

pub use clawfleet_store::model::*;
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
