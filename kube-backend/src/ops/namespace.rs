//! `ensure-namespace` and `delete-namespace`: the tenant namespace and its namespace-wide
//! objects. A managed namespace (`oce-…`) is created and deleted as a whole; an adopted one
//! (the operator's, named in the cluster settings) is claimed after its safety checks, and on
//! deletion only what clawfleet owns in it is removed, then the claim.

use std::time::Duration;

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::NamespaceArgs;
use clawfleet_protocol::result::{DeleteNamespaceResult, EnsureNamespaceResult};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, LimitRange, Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Secret, Service,
    ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};

use crate::client::Requests;
use crate::names::{self, Markers, Tenant};
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

fn missing(t: &Tenant, why: &str) -> Failure {
    Failure::new(
        FailureCode::NamespaceMissing,
        format!(
            "the Kubernetes namespace {} of Namespace {} {why}; run ensure-namespace",
            t.name, t.id
        ),
    )
}

fn check_restricted(t: &Tenant, n: &Namespace) -> Result<(), Failure> {
    let enforce = n
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PSA_ENFORCE))
        .map(String::as_str);
    if enforce != Some("restricted") {
        return Err(conflict(
            &format!("Namespace {}", t.name),
            &format!("label {PSA_ENFORCE} is not \"restricted\""),
        ));
    }
    Ok(())
}

/// The owned (managed, or adopted and claimed) tenant namespace; `None` when absent, or
/// adopted but not claimed yet. Checks the markers and that Pod Security is restricted.
pub(crate) async fn owned_namespace(
    r: &Requests,
    t: &Tenant,
) -> Result<Option<Namespace>, Failure> {
    let found = namespaces(r).get(r, &t.name).await?;
    let Some(n) = found else { return Ok(None) };
    if t.adopted && !is_claimed(&n) {
        foreign_claim(t, &n)?;
        return Ok(None);
    }
    check_owned(
        "Namespace",
        None,
        &t.name,
        &n.metadata,
        &t.namespace_markers(),
    )?;
    check_restricted(t, &n)?;
    Ok(Some(n))
}

fn is_claimed(n: &Namespace) -> bool {
    let l = n.metadata.labels.as_ref();
    l.is_some_and(|l| l.contains_key(names::NAMESPACE_ID) || l.contains_key(names::ADOPTED))
}

/// An adopted namespace must not be someone else's: no managed-by=clawfleet (a managed
/// namespace is never adopted), no other tenant's markers.
fn foreign_claim(t: &Tenant, n: &Namespace) -> Result<(), Failure> {
    let l = n.metadata.labels.as_ref();
    let a = n.metadata.annotations.as_ref();
    let object = format!("Namespace {}", t.name);
    if l.and_then(|l| l.get(names::MANAGED_BY)).map(String::as_str) == Some(names::MANAGER) {
        return Err(conflict(
            &object,
            &format!(
                "label {} says clawfleet manages it; it cannot be adopted",
                names::MANAGED_BY
            ),
        ));
    }
    for key in [names::NAMESPACE_ID, names::ADOPTED] {
        if l.is_some_and(|l| l.contains_key(key)) || a.is_some_and(|a| a.contains_key(key)) {
            return Err(conflict(&object, &format!("marker {key} is already set")));
        }
    }
    Ok(())
}

/// The tenant namespace must exist, be ours, and not be terminating.
pub(crate) async fn require_namespace(r: &Requests, t: &Tenant) -> Result<Namespace, Failure> {
    match owned_namespace(r, t).await? {
        None => Err(missing(t, "does not exist or is not adopted yet")),
        Some(n) if n.metadata.deletion_timestamp.is_some() => Err(missing(t, "is terminating")),
        Some(n) => Ok(n),
    }
}

/// No other namespace may claim this Namespace id.
async fn check_unique_claim(r: &Requests, t: &Tenant) -> Result<(), Failure> {
    let api: Api<Namespace> = Api::all(r.client());
    let lp = ListParams::default().labels(&format!("{}={}", names::NAMESPACE_ID, t.id));
    let list = r.read("list Namespaces", || api.list_metadata(&lp)).await?;
    if list
        .items
        .iter()
        .any(|n| n.metadata.name.as_deref() != Some(t.name.as_str()))
    {
        return Err(conflict(
            &format!("Namespace {}", t.name),
            &format!(
                "another Kubernetes namespace already carries label {} for this Namespace",
                names::NAMESPACE_ID
            ),
        ));
    }
    Ok(())
}

/// Every NetworkPolicy already in an adopted namespace must be clawfleet's for this tenant: a
/// foreign policy could open the gateways to anyone.
async fn check_adoptable_policies(r: &Requests, t: &Tenant) -> Result<(), Failure> {
    let api: Api<NetworkPolicy> = Api::namespaced(r.client(), &t.name);
    let lp = ListParams::default();
    let list = r
        .read(&format!("list NetworkPolicies in {}", t.name), || {
            api.list_metadata(&lp)
        })
        .await?;
    let m = Markers::namespace(&t.id);
    for p in &list.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let mut meta = p.metadata.clone();
        meta.namespace = Some(t.name.clone());
        check_owned("NetworkPolicy", Some(&t.name), &name, &meta, &m)?;
    }
    Ok(())
}

/// `ensure-namespace`. A refusal of clawfleet's identity (401/403) is retryable here: creating
/// namespaces needs cluster-scoped rights an operator often grants after registering the
/// cluster, and the coordinator keeps retrying (with backoff, the code shown in the
/// Namespace's status) so that granting them recovers the Namespace.
pub(crate) async fn ensure(
    r: &Requests,
    settings: &ClusterSettings,
    args: &NamespaceArgs,
) -> Result<EnsureNamespaceResult, Failure> {
    ensure_checked(r, settings, args)
        .await
        .map_err(refusal_retryable)
}

/// A 401/403 (as [`crate::client::api_failure`] words it) made retryable.
fn refusal_retryable(f: Failure) -> Failure {
    if f.code == FailureCode::KubernetesApiRejected
        && (f.message.contains("forbidden (403)") || f.message.contains("credentials (401)"))
    {
        let recovery = if f.message.contains("credentials (401)") {
            "the cluster does not accept clawfleet's credentials: it is retried, so replacing them (`occ cluster update`) recovers the Namespace"
        } else {
            "clawfleet's identity lacks the rights ensure-namespace needs: it is retried, so granting them recovers the Namespace"
        };
        return Failure::with_class(
            clawfleet_protocol::failure::FailureClass::Retryable,
            f.code,
            format!("{}; {recovery}", f.message),
        );
    }
    f
}

async fn ensure_checked(
    r: &Requests,
    settings: &ClusterSettings,
    args: &NamespaceArgs,
) -> Result<EnsureNamespaceResult, Failure> {
    let t = settings.tenant(&args.namespace.id);
    let tenant = t.name.clone();
    // Render everything before any request.
    let ns_obj = render::namespace(&args.namespace).map_err(render_failure)?;
    let quota = render::resource_quota(&t, settings).map_err(render_failure)?;
    let limits = render::limit_range(&t, settings).map_err(render_failure)?;
    let deny = render::default_deny(&t).map_err(render_failure)?;
    let dns = render::allow_dns(&t, settings).map_err(render_failure)?;
    let ingress = render::allow_gateway_ingress(&t, settings).map_err(render_failure)?;
    let m = Markers::namespace(&t.id);

    // Check first.
    check_unique_claim(r, &t).await?;
    let existing = owned_namespace(r, &t).await?;
    if existing
        .as_ref()
        .is_some_and(|n| n.metadata.deletion_timestamp.is_some())
    {
        return Err(Failure::new(
            FailureCode::NamespaceMissing,
            format!("namespace {tenant} is still terminating; retry when it is gone"),
        ));
    }
    let claim = if t.adopted && existing.is_none() {
        // Not claimed yet: it must exist, be restricted, hold no foreign policy.
        let Some(n) = namespaces(r).get(r, &tenant).await? else {
            return Err(missing(
                &t,
                "does not exist (an adopted namespace is never created)",
            ));
        };
        if n.metadata.deletion_timestamp.is_some() {
            return Err(missing(&t, "is terminating"));
        }
        foreign_claim(&t, &n)?;
        check_restricted(&t, &n)?;
        check_adoptable_policies(r, &t).await?;
        Some(
            render::adoption_claim(
                &args.namespace,
                &tenant,
                n.metadata.resource_version.clone(),
            )
            .map_err(render_failure)?,
        )
    } else {
        None
    };
    let quotas: Obj<ResourceQuota> = Obj::namespaced(r, &tenant, "ResourceQuota");
    let ranges: Obj<LimitRange> = Obj::namespaced(r, &tenant, "LimitRange");
    let policies: Obj<NetworkPolicy> = Obj::namespaced(r, &tenant, "NetworkPolicy");
    if existing.is_some() && !t.adopted {
        // A namespace made before clawfleet's first ensure (carrying its labels) gets the
        // adoption's check too: no NetworkPolicy in it that is not this tenant's.
        check_adoptable_policies(r, &t).await?;
    }
    if existing.is_some() || claim.is_some() {
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

    // Then write: the namespace (or the claim) first, the default deny before what allows.
    match &claim {
        Some(c) => {
            namespaces(r).apply(r, &tenant, c).await?;
            tracing::info!(namespace = %t.id, tenant = %tenant, "namespace adopted");
        }
        None if !t.adopted => {
            namespaces(r).apply(r, &tenant, &ns_obj).await?;
        }
        None => {}
    }
    quotas.apply(r, names::QUOTA, &quota).await?;
    ranges.apply(r, names::LIMITS, &limits).await?;
    policies.apply(r, names::DEFAULT_DENY, &deny).await?;
    policies.apply(r, names::ALLOW_DNS, &dns).await?;
    policies
        .apply(r, names::ALLOW_GATEWAY_INGRESS, &ingress)
        .await?;
    let created = existing.is_none();
    if created && !t.adopted {
        tracing::info!(namespace = %t.id, tenant = %tenant, "tenant namespace created");
    }
    Ok(EnsureNamespaceResult {
        namespace_id: t.id.clone(),
        created,
    })
}

async fn count_agents(r: &Requests, t: &Tenant) -> Result<u32, Failure> {
    let accounts: Api<ServiceAccount> = Api::namespaced(r.client(), &t.name);
    let lp = ListParams::default().labels(&Markers::namespace(&t.id).selector());
    let n = r
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
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// `delete-namespace`.
pub(crate) async fn delete(
    r: &Requests,
    settings: &ClusterSettings,
    args: &NamespaceArgs,
) -> Result<DeleteNamespaceResult, Failure> {
    let t = settings.tenant(&args.namespace.id);
    // A managed namespace's name that some other party's namespace holds (clawfleet never made
    // it): it is not this Namespace's to delete; left untouched and reported, and the deletion
    // completes rather than failing forever.
    if !t.adopted
        && let Some(n) = namespaces(r).get(r, &t.name).await?
        && !crate::objects::made_by_clawfleet(&n.metadata)
    {
        tracing::warn!(namespace = %t.id, tenant = %t.name, "delete-namespace leaves Namespace {} untouched: clawfleet did not make it", t.name);
        return Ok(DeleteNamespaceResult {
            namespace_id: t.id.clone(),
            removed: false,
            agents_removed: 0,
        });
    }
    let Some(existing) = owned_namespace(r, &t).await? else {
        return Ok(DeleteNamespaceResult {
            namespace_id: t.id.clone(),
            removed: false,
            agents_removed: 0,
        });
    };
    let agents = count_agents(r, &t).await?;
    if t.adopted {
        release_adopted(r, &t).await?;
    } else {
        delete_managed(r, &t, &existing).await?;
    }
    Ok(DeleteNamespaceResult {
        namespace_id: t.id.clone(),
        removed: true,
        agents_removed: agents,
    })
}

/// A managed namespace goes as a whole (uid precondition); waits until Kubernetes has finished
/// terminating it.
async fn delete_managed(r: &Requests, t: &Tenant, existing: &Namespace) -> Result<(), Failure> {
    let tenant = &t.name;
    if existing.metadata.deletion_timestamp.is_none() {
        namespaces(r)
            .delete(r, tenant, &existing.metadata, false)
            .await?;
    }
    let mut pause = Duration::from_millis(200);
    loop {
        let now = namespaces(r).get(r, tenant).await?;
        match now {
            None => break,
            Some(n) if n.metadata.uid != existing.metadata.uid => {
                // A new namespace of the same name: ours is gone; do not touch the new one.
                check_owned(
                    "Namespace",
                    None,
                    tenant,
                    &n.metadata,
                    &t.namespace_markers(),
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
    tracing::info!(namespace = %t.id, tenant = %tenant, "tenant namespace deleted");
    Ok(())
}

/// Everything of one kind in the namespace that carries this tenant's markers, each checked.
async fn owned_of_kind<K>(
    r: &Requests,
    t: &Tenant,
    kind: &'static str,
) -> Result<(Obj<K>, Vec<(String, ObjectMeta)>), Failure>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let obj: Obj<K> = Obj::namespaced(r, &t.name, kind);
    let m = Markers::namespace(&t.id);
    let lp = ListParams::default().labels(&m.selector());
    let list = r
        .read(&format!("list {kind}s in {}", t.name), || {
            obj.api.list_metadata(&lp)
        })
        .await?;
    if list
        .metadata
        .continue_
        .as_deref()
        .is_some_and(|c| !c.is_empty())
    {
        return Err(Failure::new(
            FailureCode::KubernetesApiRejected,
            format!("list {kind}s in {}: the answer is paginated", t.name),
        ));
    }
    let mut out = Vec::new();
    for item in list.items {
        let name = item.metadata.name.clone().unwrap_or_default();
        let mut meta = item.metadata;
        meta.namespace = Some(t.name.clone());
        check_owned(kind, Some(&t.name), &name, &meta, &m)?;
        out.push((name, meta));
    }
    Ok((obj, out))
}

async fn delete_all<K>(
    r: &Requests,
    obj: &Obj<K>,
    items: &[(String, ObjectMeta)],
) -> Result<(), Failure>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    for (name, meta) in items {
        obj.delete(r, name, meta, false).await?;
    }
    Ok(())
}

/// An adopted namespace stays: everything clawfleet owns in it goes (checked first, each with
/// a uid precondition, Pods awaited), then the claim is released.
async fn release_adopted(r: &Requests, t: &Tenant) -> Result<(), Failure> {
    // Check first: every object carrying this tenant's markers must be exactly ours.
    let deployments = owned_of_kind::<Deployment>(r, t, "Deployment").await?;
    let services = owned_of_kind::<Service>(r, t, "Service").await?;
    let config_maps = owned_of_kind::<ConfigMap>(r, t, "ConfigMap").await?;
    let secrets = owned_of_kind::<Secret>(r, t, "Secret").await?;
    let claims = owned_of_kind::<PersistentVolumeClaim>(r, t, "PersistentVolumeClaim").await?;
    let accounts = owned_of_kind::<ServiceAccount>(r, t, "ServiceAccount").await?;
    let policies = owned_of_kind::<NetworkPolicy>(r, t, "NetworkPolicy").await?;
    let quotas = owned_of_kind::<ResourceQuota>(r, t, "ResourceQuota").await?;
    let ranges = owned_of_kind::<LimitRange>(r, t, "LimitRange").await?;

    delete_all(r, &deployments.0, &deployments.1).await?;
    let pods: Api<Pod> = Api::namespaced(r.client(), &t.name);
    let lp = ListParams::default().labels(&Markers::namespace(&t.id).selector());
    let mut pause = Duration::from_millis(100);
    loop {
        let left = r
            .read(&format!("list Pods in {}", t.name), || {
                pods.list_metadata(&lp)
            })
            .await?;
        if left.items.is_empty() {
            break;
        }
        if !pause_within(r, pause).await {
            return Err(Failure::new(
                FailureCode::DeadlineExceeded,
                format!(
                    "{} gateway Pod(s) in {} are still terminating; retry",
                    left.items.len(),
                    t.name
                ),
            ));
        }
        pause = (pause * 3 / 2).min(Duration::from_secs(1));
    }
    delete_all(r, &services.0, &services.1).await?;
    delete_all(r, &config_maps.0, &config_maps.1).await?;
    delete_all(r, &secrets.0, &secrets.1).await?;
    delete_all(r, &claims.0, &claims.1).await?;
    delete_all(r, &accounts.0, &accounts.1).await?;
    delete_all(r, &policies.0, &policies.1).await?;
    delete_all(r, &quotas.0, &quotas.1).await?;
    delete_all(r, &ranges.0, &ranges.1).await?;
    let release = render::release_claim(&t.name).map_err(render_failure)?;
    namespaces(r).apply(r, &t.name, &release).await?;
    tracing::info!(namespace = %t.id, tenant = %t.name, "adopted namespace released");
    Ok(())
}
