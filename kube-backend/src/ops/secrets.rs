//! Putting an Agent's secrets on a cluster: its Secret `gw-secrets-<suffix>` holds exactly the
//! set given (an empty set deletes it). Created with a POST; a changed set replaces it with a
//! PUT carrying the uid and resourceVersion read (a Secret changed meanwhile is a 409, and the
//! worker retries the whole operation); an unchanged one is not written. A Secret at that name
//! that is not the Agent's is refused with `KUBERNETES_OWNERSHIP_CONFLICT` before anything is
//! written. The running Pod is not touched: the kubelet projects the new content into its
//! volume, where the resolver reads it at the gateway's next resolution (see
//! [`crate::secrets`]).

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::sealed::PutSecretsResult;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;

use crate::client::Requests;
use crate::names::{self, Markers};
use crate::objects::Obj;
use crate::ops::namespace::require_namespace;
use crate::ops::render_failure;
use crate::secrets::{self, AgentSecrets};
use crate::settings::ClusterSettings;

/// Whether a Deployment's Pod template mounts the Agent's secrets Secret.
fn mounts(d: &Deployment, secret_name: &str) -> bool {
    d.spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| {
            v.iter().any(|v| {
                v.secret
                    .as_ref()
                    .and_then(|s| s.secret_name.as_deref())
                    .is_some_and(|n| n == secret_name)
            })
        })
}

/// Puts the Agent's whole set of secrets.
pub(crate) async fn put(
    r: &Requests,
    settings: &ClusterSettings,
    args: &AgentSecrets,
) -> Result<PutSecretsResult, Failure> {
    args.check().map_err(|(field, message)| {
        Failure::new(
            FailureCode::InvalidInput,
            format!("at `{field}`: {message}"),
        )
    })?;
    let ns = &args.namespace.id;
    let agent = &args.agent;
    let t = settings.tenant(ns);
    // Rendered before the first request.
    let want = if args.secrets.is_empty() {
        None
    } else {
        Some(secrets::secret(&t, agent, args).map_err(render_failure)?)
    };
    require_namespace(r, &t).await?;
    let n = names::agent(&agent.id);
    let markers = Markers::agent(ns, &agent.id);
    let objects: Obj<Secret> = Obj::namespaced(r, &t.name, "Secret");
    let deployments: Obj<Deployment> = Obj::namespaced(r, &t.name, "Deployment");
    let live = objects.get_owned(r, &n.secrets, &markers).await?;
    let changed = match (&want, &live) {
        (None, None) => false,
        (None, Some(l)) => objects.delete(r, &n.secrets, &l.metadata, false).await?,
        (Some(w), None) => {
            objects.create(r, &n.secrets, w).await?;
            true
        }
        (Some(w), Some(l)) if secrets::same_content(l, w) => false,
        (Some(w), Some(l)) => {
            let mut put = w.clone();
            put.metadata.uid = l.metadata.uid.clone();
            put.metadata.resource_version = l.metadata.resource_version.clone();
            objects.replace(r, &n.secrets, &put).await?;
            true
        }
    };
    let versions = args.versions();
    let list = versions
        .iter()
        .map(|v| format!("{}@{} {}", v.name, v.version, v.fingerprint))
        .collect::<Vec<_>>()
        .join(", ");
    tracing::info!(agent = %agent.id, tenant = %t.name, secrets = %list, changed, "the Agent's secrets Secret holds this set");
    let delivered = match deployments.get_owned(r, &n.gateway, &markers).await? {
        Some(d) => want.is_some() && mounts(&d, &n.secrets),
        None => false,
    };
    Ok(PutSecretsResult {
        secrets: versions,
        changed,
        delivered_to_running_gateway: delivered,
    })
}
