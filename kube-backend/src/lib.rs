//! The Kubernetes backend: clawfleet's typed operations (`clawfleet_protocol::Operation`)
//! carried out on a cluster, answering with the same typed results and failures as hostd.
//! Embedded mode only: one OpenClaw gateway Deployment per Agent.
//!
//! # Public API (what the coordinator calls)
//!
//! ```text
//! // Registration (`occ cluster add NAME --kubeconfig FILE [--context C]`): validate first,
//! // store the credentials' serde form (it holds secrets: never return or log it).
//! pub fn parse_kubeconfig(text: &str, context: Option<&str>)
//!     -> Result<ClusterCredentials, KubeconfigError>;
//! pub fn parse_kubeconfig_file(path: &Path, context: Option<&str>)
//!     -> Result<ClusterCredentials, KubeconfigError>;   // relative paths from the file's dir
//!
//! // Per-cluster settings (serde camelCase, unknown fields refused); errors name the field.
//! pub struct ClusterSettings { gateway_image, allow_unpinned_image, gateway_command,
//!     gateway_port, resources, quota, node_selector, storage_class, state_volume_size,
//!     dns, gateway_clients }
//! impl ClusterSettings {
//!     pub fn new(gateway_image) -> Self;
//!     pub fn from_json(serde_json::Value) -> Result<Self, SettingsError>;
//!     pub fn validate(&self) -> Result<(), SettingsError>;
//! }
//!
//! // A target: name + credentials + settings (all from the coordinator's store).
//! pub struct Cluster { pub name: String, pub credentials: ClusterCredentials,
//!                      pub settings: ClusterSettings }
//!
//! // The backend: one cached kube::Client per cluster (rebuilt when its credentials change).
//! impl KubeBackend {
//!     pub fn new() -> Self;
//!     pub async fn call(&self, cluster: &Cluster, operation: Operation, deadline: Duration)
//!         -> Result<OperationResult, Failure>;
//!     pub async fn probe_cluster(&self, cluster: &Cluster) -> Result<ClusterProbe, Failure>;
//!     pub fn forget(&self, cluster_name: &str);
//! }
//! ```
//!
//! `call` needs a tokio runtime (the client spawns its connection tasks). `deadline` bounds the
//! whole operation; each request also gets at most 10 s. Failures use the protocol's codes;
//! see [`backend`] for what each operation does and how its results map onto hostd's shapes.

pub mod backend;
pub mod kubeconfig;
pub mod names;
pub mod render;
pub mod settings;

mod client;
mod objects;
mod observe;
mod ops;

#[cfg(test)]
mod shape_tests;

pub use backend::{Cluster, ClusterProbe, KubeBackend, MINIMUM_KUBERNETES_MINOR, ProbeWarning};
pub use kubeconfig::{
    ClusterAuth, ClusterCredentials, KubeconfigError, parse_kubeconfig, parse_kubeconfig_file,
};
pub use settings::{ClusterSettings, SettingsError};
