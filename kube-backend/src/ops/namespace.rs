//! `ensure-namespace` and `delete-namespace`: the tenant namespace and its namespace-wide
//! objects.

use std::time::Duration;

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::NamespaceArgs;
use clawfleet_protocol::result::{DeleteNamespaceResult, EnsureNamespaceResult};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};

use crate::client::Requests;
use crate::names::{self, Markers};
use crate::objects::{Obj, check_owned, conflict};
use crate::ops::{pause_within, render_failure};
use crate::render;
use crate::settings::ClusterSettings;

const PSA_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

fn namespaces(r: &Requests) -> Obj<Namespace> {
    Obj {
        api: Api::all(r.client()),
        kind: "Namespace",
        ns: None,
    }
}

fn missing(ns: &Ident, why: &str) -> Failure {
    Failure::new(
        FailureCode::NamespaceMissing,
        format!("the tenant namespace of Namespace {ns} {why}; run ensure-namespace"),
    )
}

/// The owned, Active tenant namespace; `None` when absent. Checks the markers and that Pod
/// Security is still restricted.
pub(crate) async fn owned_namespace(
    r: &Requests,
    ns: &Ident,
) -> Result<Option<Namespace>, Failure> {
    let name = names::tenant_namespace(ns);
    let found = namespaces(r)
        .get_owned(r, &name, &Markers::namespace(ns))
        .await?;
    if let Some(n) = &found
        && n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PSA_ENFORCE))
            .map(String::as_str)
            != Some("restricted")
    {
        return Err(conflict(
            &format!("Namespace {name}"),
            &format!("label {PSA_ENFORCE} is not \"restricted\""),
        ));
    }
    Ok(found)
}

/// The tenant namespace must exist, be ours, and not be terminating.
pub(crate) async fn require_namespace(r: &Requests, ns: &Ident) -> Result<Namespace, Failure> {
    match owned_namespace(r, ns).await? {
        None => Err(missing(ns, "does not exist")),
        Some(n) if n.metadata.deletion_timestamp.is_some() => Err(missing(ns, "is terminating")),
        Some(n) => Ok(n),
    }
}

/// No other namespace may claim this Namespace id.
async fn check_unique_claim(r: &Requests, ns: &Ident) -> Result<(), Failure> {
    let api: Api<Namespace> = Api::all(r.client());
    let lp = ListParams::default().labels(&format!("{}={ns}", names::NAMESPACE_ID));
    let list = r.read("list Namespaces", || api.list_metadata(&lp)).await?;
    let mine = names::tenant_namespace(ns);
    if list
        .items
        .iter()
        .any(|n| n.metadata.name.as_deref() != Some(mine.as_str()))
    {
        return Err(conflict(
            &format!("Namespace {mine}"),
            &format!(
                "another Kubernetes namespace already carries label {} for this Namespace",
                names::NAMESPACE_ID
            ),
        ));
    }
    Ok(())
}

/// `ensure-namespace`.
pub(crate) async fn ensure(
    r: &Requests,
    settings: &ClusterSettings,
    args: &NamespaceArgs,
) -> Result<EnsureNamespaceResult, Failure> {
    let ns = &args.namespace.id;
    let tenant = names::tenant_namespace(ns);
    // Render everything before any request.
    let ns_obj = render::namespace(&args.namespace).map_err(render_failure)?;
    let quota = render::resource_quota(ns, settings).map_err(render_failure)?;
    let limits = render::limit_range(ns, settings).map_err(render_failure)?;
    let deny = render::default_deny(ns).map_err(render_failure)?;
    let dns = render::allow_dns(ns, settings).map_err(render_failure)?;
    let ingress = render::allow_gateway_ingress(ns, settings).map_err(render_failure)?;
    let m = Markers::namespace(ns);

    // Check first.
    check_unique_claim(r, ns).await?;
    let existing = owned_namespace(r, ns).await?;
    if existing
        .as_ref()
        .is_some_and(|n| n.metadata.deletion_timestamp.is_some())
    {
        return Err(Failure::new(
            FailureCode::NamespaceMissing,
            format!("namespace {tenant} is still terminating; retry when it is gone"),
        ));
    }
    let quotas: Obj<ResourceQuota> = Obj::namespaced(r, &tenant, "ResourceQuota");
    let ranges: Obj<LimitRange> = Obj::namespaced(r, &tenant, "LimitRange");
    let policies: Obj<NetworkPolicy> = Obj::namespaced(r, &tenant, "NetworkPolicy");
    if existing.is_some() {
        quotas.get_owned(r, names::QUOTA, &m).await?;
        ranges.get_owned(r, names::LIMITS, &m).await?;
        for name in [
            names::DEFAULT_DENY,
            names::ALLOW_DNS,
            names::ALLOW_GATEWAY_INGRESS,
        ] {
            policies.get_owned(r, name, &m).await?;
        }
    }

    // Then write: the namespace first, the default deny before anything that allows.
    namespaces(r).apply(r, &tenant, &ns_obj).await?;
    quotas.apply(r, names::QUOTA, &quota).await?;
    ranges.apply(r, names::LIMITS, &limits).await?;
    policies.apply(r, names::DEFAULT_DENY, &deny).await?;
    policies.apply(r, names::ALLOW_DNS, &dns).await?;
    policies
        .apply(r, names::ALLOW_GATEWAY_INGRESS, &ingress)
        .await?;
    let created = existing.is_none();
    if created {
        tracing::info!(namespace = %ns, tenant = %tenant, "tenant namespace created");
    }
    Ok(EnsureNamespaceResult {
        namespace_id: ns.clone(),
        created,
    })
}

/// `delete-namespace`: a managed namespace goes as a whole (uid precondition), and the call
/// waits until Kubernetes has finished terminating it.
pub(crate) async fn delete(
    r: &Requests,
    args: &NamespaceArgs,
) -> Result<DeleteNamespaceResult, Failure> {
    let ns = &args.namespace.id;
    let tenant = names::tenant_namespace(ns);
    let Some(existing) = owned_namespace(r, ns).await? else {
        return Ok(DeleteNamespaceResult {
            namespace_id: ns.clone(),
            removed: false,
            agents_removed: 0,
        });
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(r.client(), &tenant);
    let lp = ListParams::default().labels(&format!("{}={}", names::MANAGED_BY, names::MANAGER));
    let agents = r
        .read("list ServiceAccounts", || accounts.list_metadata(&lp))
        .await?
        .items
        .iter()
        .filter(|a| {
            a.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(names::AGENT_ID))
        })
        .count();
    if existing.metadata.deletion_timestamp.is_none() {
        namespaces(r)
            .delete(r, &tenant, &existing.metadata, false)
            .await?;
    }
    let mut pause = Duration::from_millis(200);
    loop {
        let now = namespaces(r).get(r, &tenant).await?;
        match now {
            None => break,
            Some(n) if n.metadata.uid != existing.metadata.uid => {
                // A new namespace of the same name: ours is gone; do not touch the new one.
                check_owned(
                    "Namespace",
                    None,
                    &tenant,
                    &n.metadata,
                    &Markers::namespace(ns),
                )?;
                break;
            }
            Some(_) => {}
        }
        if !pause_within(r, pause).await {
            return Err(Failure::new(
                FailureCode::DeadlineExceeded,
                format!("namespace {tenant} is still terminating at the deadline; retry"),
            ));
        }
        pause = (pause * 3 / 2).min(Duration::from_secs(1));
    }
    tracing::info!(namespace = %ns, tenant = %tenant, "tenant namespace deleted");
    Ok(DeleteNamespaceResult {
        namespace_id: ns.clone(),
        removed: true,
        agents_removed: u32::try_from(agents).unwrap_or(u32::MAX),
    })
}
