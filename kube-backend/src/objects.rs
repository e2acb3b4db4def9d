//! Reading, checking and writing single objects under the write rules: every object read and
//! checked for its exact ownership markers before any write; server-side apply with field
//! manager `clawfleet` and force=false; Secrets created or replaced with uid + resourceVersion;
//! every delete with a uid precondition.

use std::fmt::Debug;

use clawfleet_protocol::failure::{Failure, FailureCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::{Requests, api_failure, status_of};
use crate::names::{self, Markers};

/// Kind + namespace + name, for messages.
pub(crate) fn label(kind: &str, ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// A permanent ownership conflict naming the object and the marker key, never a value.
pub(crate) fn conflict(object: &str, detail: &str) -> Failure {
    Failure::new(
        FailureCode::KubernetesOwnershipConflict,
        format!("refusing {object}: {detail}; nothing was written"),
    )
}

/// Checks that `meta` is the object asked for and carries exactly `markers`.
pub(crate) fn check_owned(
    kind: &str,
    ns: Option<&str>,
    name: &str,
    meta: &ObjectMeta,
    markers: &Markers,
) -> Result<(), Failure> {
    let object = label(kind, ns, name);
    if meta.name.as_deref() != Some(name) || meta.namespace.as_deref() != ns {
        return Err(conflict(
            &object,
            "the API server answered with another object",
        ));
    }
    let labels = meta.labels.as_ref();
    for (k, v) in &markers.labels {
        if labels.and_then(|l| l.get(*k)) != Some(v) {
            return Err(conflict(
                &object,
                &format!("it is not clawfleet's (label {k} is missing or differs)"),
            ));
        }
    }
    let annotations = meta.annotations.as_ref();
    for (k, v) in &markers.annotations {
        if annotations.and_then(|a| a.get(*k)) != Some(v) {
            return Err(conflict(
                &object,
                &format!("it is not clawfleet's (annotation {k} is missing or differs)"),
            ));
        }
    }
    Ok(())
}

/// Whether an object carries `managed-by=clawfleet`: one clawfleet never made lacks it (an
/// object that has it but other markers is ours, tampered with).
pub(crate) fn made_by_clawfleet(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(names::MANAGED_BY))
        .is_some_and(|v| v == names::MANAGER)
}

/// Whether a 409 is the optimistic-lock kind (a resourceVersion in the request is stale):
/// retryable, unlike a field-manager conflict.
pub(crate) fn stale_resource_version(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.message.contains("the object has been modified"),
        _ => false,
    }
}

/// A typed object API with the names used in messages.
pub(crate) struct Obj<K> {
    pub(crate) api: Api<K>,
    pub(crate) kind: &'static str,
    pub(crate) ns: Option<String>,
}

impl<K> Obj<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    pub(crate) fn what(&self, verb: &str, name: &str) -> String {
        format!("{verb} {}", label(self.kind, self.ns.as_deref(), name))
    }

    /// GET; `None` when absent.
    pub(crate) async fn get(&self, r: &Requests, name: &str) -> Result<Option<K>, Failure> {
        let what = self.what("get", name);
        r.read(&what, || self.api.get_opt(name)).await
    }

    /// GET, then the ownership check; `None` when absent.
    pub(crate) async fn get_owned(
        &self,
        r: &Requests,
        name: &str,
        markers: &Markers,
    ) -> Result<Option<K>, Failure> {
        let obj = self.get(r, name).await?;
        if let Some(o) = &obj {
            check_owned(self.kind, self.ns.as_deref(), name, o.meta(), markers)?;
        }
        Ok(obj)
    }

    /// Server-side apply, force=false. A field conflict means someone else manages part of
    /// the object: an ownership conflict.
    pub(crate) async fn apply(&self, r: &Requests, name: &str, obj: &K) -> Result<K, Failure> {
        let what = self.what("apply", name);
        let params = PatchParams::apply(names::FIELD_MANAGER);
        let res = r
            .write(&what, self.api.patch(name, &params, &Patch::Apply(obj)))
            .await;
        match res {
            Ok(o) => {
                tracing::debug!(object = %label(self.kind, self.ns.as_deref(), name), "applied");
                Ok(o)
            }
            Err(e) if status_of(&e) == Some(409) && !stale_resource_version(&e) => Err(conflict(
                &label(self.kind, self.ns.as_deref(), name),
                "another field manager owns fields clawfleet sets (server-side apply conflict)",
            )),
            Err(e) => Err(api_failure(&what, &e)),
        }
    }

    /// POST.
    pub(crate) async fn create(&self, r: &Requests, name: &str, obj: &K) -> Result<K, Failure> {
        let what = self.what("create", name);
        r.write(&what, self.api.create(&PostParams::default(), obj))
            .await
            .map_err(|e| api_failure(&what, &e))
    }

    /// PUT of a full object whose metadata carries the observed uid and resourceVersion.
    pub(crate) async fn replace(&self, r: &Requests, name: &str, obj: &K) -> Result<K, Failure> {
        let what = self.what("replace", name);
        r.write(&what, self.api.replace(name, &PostParams::default(), obj))
            .await
            .map_err(|e| api_failure(&what, &e))
    }

    /// DELETE with a uid (and optionally resourceVersion) precondition; false when already
    /// gone or already being deleted.
    pub(crate) async fn delete(
        &self,
        r: &Requests,
        name: &str,
        meta: &ObjectMeta,
        with_resource_version: bool,
    ) -> Result<bool, Failure> {
        let what = self.what("delete", name);
        if meta.deletion_timestamp.is_some() {
            // Already going (finalizers still run): nothing new to delete.
            return Ok(false);
        }
        let uid = meta.uid.clone().ok_or_else(|| {
            Failure::new(
                FailureCode::KubernetesApiRejected,
                format!("{what}: the object has no uid to use as a precondition"),
            )
        })?;
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: if with_resource_version {
                    meta.resource_version.clone()
                } else {
                    None
                },
            }),
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match r.write(&what, self.api.delete(name, &params)).await {
            Ok(_) => {
                tracing::info!(object = %label(self.kind, self.ns.as_deref(), name), "deleted");
                Ok(true)
            }
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(api_failure(&what, &e)),
        }
    }
}

impl<K> Obj<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug,
    K::DynamicType: Default,
{
    /// The API of a namespaced kind in `ns`.
    pub(crate) fn namespaced(r: &Requests, ns: &str, kind: &'static str) -> Self {
        Self {
            api: Api::namespaced(r.client(), ns),
            kind,
            ns: Some(ns.to_owned()),
        }
    }
}
