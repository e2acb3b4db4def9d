//! `probe`: the API server's version, mapped onto hostd's probe result.

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::result::{PortRange, ProbeResult};
use clawfleet_protocol::{Fingerprint, SUPPORTED_VERSIONS};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};

use crate::backend::{ClusterProbe, MINIMUM_KUBERNETES_MINOR, ProbeWarning};
use crate::client::{Requests, status_of};
use crate::names;
use crate::settings::ClusterSettings;

/// The leading digits of a version part (`"37+"` → 37).
fn number(part: &str) -> Option<u32> {
    let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `GET /version` and the warnings it gives.
pub(crate) async fn version(r: &Requests) -> Result<ClusterProbe, Failure> {
    let client = r.client();
    let info = r
        .read("get /version", || client.apiserver_version())
        .await?;
    let (major, minor) = match (number(&info.major), number(&info.minor)) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return Err(Failure::new(
                FailureCode::KubernetesApiRejected,
                "get /version: the server's major/minor version does not parse",
            ));
        }
    };
    let mut warnings = Vec::new();
    if major < 1 || (major == 1 && minor < MINIMUM_KUBERNETES_MINOR) {
        warnings.push(ProbeWarning {
            code: FailureCode::KubernetesVersionBelowMinimum.as_str(),
            message: format!(
                "the API server runs {} ({major}.{minor}); clawfleet is tested on 1.{MINIMUM_KUBERNETES_MINOR} and later",
                info.git_version
            ),
        });
    }
    Ok(ClusterProbe {
        server_version: info.git_version,
        major,
        minor,
        warnings,
    })
}

/// `probe`.
pub(crate) async fn probe(
    r: &Requests,
    cluster_name: &str,
    ca_fingerprint: &str,
    settings: &ClusterSettings,
) -> Result<ProbeResult, Failure> {
    let v = version(r).await?;
    let systemd_version = v.server_text();
    let api: Api<Deployment> = Api::all(r.client());
    let lp = ListParams::default().labels(&format!("{}={}", names::MANAGED_BY, names::MANAGER));
    let limit = crate::client::REQUEST_TIMEOUT.min(r.remaining());
    let agents = match tokio::time::timeout(limit, api.list_metadata(&lp)).await {
        Ok(Ok(list)) => u32::try_from(list.items.len()).unwrap_or(u32::MAX),
        // Counting is informative; a token without cluster-wide list rights still probes.
        Ok(Err(e)) if status_of(&e) == Some(403) => 0,
        Ok(Err(e)) => return Err(crate::client::api_failure("list Deployments", &e)),
        Err(_) => {
            return Err(Failure::new(
                FailureCode::KubernetesApiUnavailable,
                "list Deployments: no answer from the Kubernetes API in time",
            ));
        }
    };
    let host_key = Fingerprint::new(ca_fingerprint).map_err(|e| {
        Failure::new(
            FailureCode::Internal,
            format!("the CA fingerprint is not a fingerprint: {e}"),
        )
    })?;
    Ok(ProbeResult {
        hostd_version: format!("clawfleet-kube {}", env!("CARGO_PKG_VERSION")),
        protocol_versions: SUPPORTED_VERSIONS.to_vec(),
        system_host_name: cluster_name.to_owned(),
        host_key,
        systemd_version: Some(systemd_version),
        missing_tools: Vec::new(),
        port_range: PortRange {
            start: settings.gateway_port,
            end: settings.gateway_port,
        },
        max_agents: settings.quota.pods,
        agents,
        quotas: None,
        network_isolation: None,
    })
}
