//! The Kubernetes backend: clawfleet's typed operations (`clawfleet_protocol::Operation`)
//! carried out on a cluster, answering with the same typed results and failures as hostd.
//! Embedded mode only: one OpenClaw gateway Deployment per Agent.
//!
//! # Public API (what the coordinator calls)
//!
//! ```text
//! // Registration (`occ cluster add NAME --kubeconfig FILE [--context C]`): validate first,
//! // then store the credentials' serde form (it holds the secrets: never return or log it;
//! // Debug and Display redact them; deserializing validates again).
//! // The API refuses file references in text it receives; the CLI inlines them on the
//! // operator's machine (bounded reads, relative paths from the kubeconfig's directory).
//! pub fn parse_kubeconfig(text: &str, context: Option<&str>)
//!     -> Result<ClusterCredentials, KubeconfigError>;   // file references refused
//! pub fn parse_kubeconfig_file(path: &Path, context: Option<&str>)
//!     -> Result<ClusterCredentials, KubeconfigError>;   // files read here
//! pub fn inline_kubeconfig_file(path: &Path, context: Option<&str>)
//!     -> Result<String, KubeconfigError>;               // what `occ cluster add` sends
//! impl ClusterCredentials {
//!     pub fn server(&self) -> &str;  pub fn context(&self) -> &str;
//!     pub fn ca_pem(&self) -> &str;  pub fn auth(&self) -> &ClusterAuth;
//!     pub fn ca_fingerprint(&self) -> String;          // "SHA256:<base64>" of the CA
//! }
//!
//! // Per-cluster settings (serde camelCase, unknown fields refused); errors name the field.
//! pub struct ClusterSettings {
//!     pub gateway_image: String,              // name@sha256:<64 hex>
//!     pub allow_unpinned_image: bool,         // dev only
//!     pub gateway_command: Vec<String>,       // default node /app/openclaw.mjs gateway run
//!     pub gateway_port: u16,                  // default 18789
//!     pub resources: Resources,               // requests/limits cpu+memory
//!     pub quota: Quota,                       // pods (default 20; 0 refuses every Pod)
//!     pub node_selector: BTreeMap<String, String>,
//!     pub storage_class: Option<String>,
//!     pub state_volume_size: String,          // default "1Gi"
//!     pub dns: PeerSelector,                  // default kube-system / k8s-app=kube-dns
//!     pub gateway_clients: Vec<PeerSelector>, // who may reach the gateway port
//!     pub adopted_namespaces: BTreeMap<String, String>, // Namespace id -> existing namespace
//! }
//! impl ClusterSettings {
//!     pub fn new(gateway_image: impl Into<String>) -> Self;   // every default
//!     pub fn from_json(value: serde_json::Value) -> Result<Self, SettingsError>;
//!     pub fn validate(&self) -> Result<(), SettingsError>;
//!     pub fn tenant(&self, namespace_id: &Ident) -> names::Tenant; // where a Namespace lives
//! }
//!
//! // A target: name + credentials + settings (all from the coordinator's store).
//! pub struct Cluster { pub name: String, pub credentials: ClusterCredentials,
//!                      pub settings: ClusterSettings }
//!
//! // The backend: one cached kube::Client per cluster name (rebuilt when its credentials
//! // change). Share it as Arc<KubeBackend>.
//! impl KubeBackend {
//!     pub fn new() -> Self;
//!     pub async fn call(&self, cluster: &Cluster, operation: Operation, deadline: Duration)
//!         -> Result<OperationResult, Failure>;
//!     pub async fn probe_cluster(&self, cluster: &Cluster) -> Result<ClusterProbe, Failure>;
//!     pub async fn missing_access(&self, cluster: &Cluster)    // rbac.rs; at registration
//!         -> Result<Vec<String>, Failure>;
//!     pub fn forget(&self, cluster_name: &str);
//!     // Issue 30: a byte stream to the Agent's gateway port in its current, Ready Pod,
//!     // through the API server's port-forward (gateway_stream.rs).
//!     pub async fn open_gateway_stream(&self, cluster: &Cluster, namespace_id: &Ident,
//!         agent_id: &Ident, timeout: Duration) -> Result<GatewayConnection, GatewayStreamError>;
//!     // Issue 29: `secrets.reload` in the running gateway (through that stream) until it
//!     // holds the recorded fingerprints (ops/reload.rs); a secrets-only activation does it
//!     // itself and answers it in `ActivateResult::secrets_reload`.
//!     pub async fn reload_gateway_secrets(&self, cluster: &Cluster, namespace_id: &Ident,
//!         agent_id: &Ident, deadline: Duration) -> Result<SecretsReload, Failure>;
//! }
//!
//! // A cluster's `probe` answer in cluster words (serverVersion, caFingerprint, warnings,
//! // gatewayPort, ...), never hostd's (systemdVersion, hostKey): what the coordinator shows.
//! impl ClusterProbeReport { pub fn from_probe_result(p: &ProbeResult) -> Self; }
//! ```
//!
//! `call` needs a tokio runtime (the client spawns its connection tasks), and a cached client
//! lives on the runtime that first used it: keep one `KubeBackend` per runtime. `deadline` bounds the
//! whole operation; each request also gets at most 10 s. Failures use the protocol's codes;
//! see [`backend`] for what each operation does and how its results map onto hostd's shapes.

pub mod backend;
pub mod gateway_rpc;
pub mod gateway_stream;
pub mod kubeconfig;
pub mod names;
pub mod rbac;
pub mod render;
pub mod secrets;
pub mod settings;
pub mod workspace;

mod auth_window;
mod client;
mod objects;
mod observe;
mod ops;

#[cfg(test)]
mod shape_tests;

pub use backend::{
    Cluster, ClusterProbe, ClusterProbeReport, ClusterProbeWarning, KubeBackend,
    MINIMUM_KUBERNETES_MINOR, ProbeWarning,
};
pub use client::MAX_RESPONSE_BYTES;
pub use gateway_stream::{GatewayConnection, GatewayStream, GatewayStreamError};
pub use kubeconfig::{
    ClusterAuth, ClusterCredentials, KubeconfigError, inline_kubeconfig_file, parse_kubeconfig,
    parse_kubeconfig_file,
};
pub use secrets::{AgentSecrets, SecretValue};
pub use settings::{ClusterSettings, CpuMemory, PeerSelector, Quota, Resources, SettingsError};
