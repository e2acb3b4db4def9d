//! The data model the store keeps: the types the API shows live in the API contract
//! (`clawfleet_api::model`, re-exported here); what never leaves the coordinator (a cluster's
//! credentials, a secret's value) is here.

pub use clawfleet_api::model::*;
use clawfleet_protocol::SecretFingerprint;
use serde_json::Value;

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
