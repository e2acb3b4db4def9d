//! Registered Kubernetes clusters; their credentials are never shown.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use clawfleet_api::model::Cluster;

use super::access::Caller;
use super::extract::{StrictJson, StrictQuery};
use super::{ApiError, ApiResult, NoContent, Paged, Reply, S, ok, paged};
use crate::backend::{Backend, CallOptions, ClusterTarget, Target};
use crate::codes::Code;
use crate::model::ClusterRecord;
use crate::service::page::PageQuery;
use crate::service::{ClusterUpdate, NewCluster};

/// Proves, before anything is stored, that the credentials reach the API server (a probe)
/// and hold the permissions clawfleet needs; records the probe's answer in a cluster's words
/// ([`crate::model::cluster_probe_record`]).
async fn probe_and_check<B: Backend>(
    st: &super::AppState<B>,
    record: &mut ClusterRecord,
) -> Result<(), ApiError> {
    let target = ClusterTarget {
        name: record.cluster.name.clone(),
        record: record.clone(),
    };
    let op = clawfleet_protocol::Operation::Probe(clawfleet_protocol::operation::ProbeArgs {});
    let failed = |e: &crate::backend::CallError, what: &str| {
        ApiError::from_target(
            if e.is_retryable() {
                StatusCode::BAD_GATEWAY
            } else {
                StatusCode::BAD_REQUEST
            },
            e.code().as_str(),
            format!("the cluster's {what} failed, nothing was stored: {e}"),
        )
    };
    match st
        .backend
        .call(Target::Cluster(target.clone()), op, CallOptions::default())
        .await
    {
        // Stored in a cluster's words (serverVersion, caFingerprint, warnings), not hostd's;
        // on an update this replaces the previous probe.
        Ok(result) => record.cluster.last_probe = crate::model::cluster_probe_record(&result),
        Err(e) => return Err(failed(&e, "probe")),
    }
    let missing = st
        .backend
        .missing_cluster_access(&target)
        .await
        .map_err(|e| failed(&e, "access check"))?;
    if !missing.is_empty() {
        return Err(ApiError::new(
            Code::ClusterAccessInsufficient,
            format!(
                "the kubeconfig's identity lacks permissions clawfleet needs, nothing was \
                 stored: {}; bind the roles in kube-backend/rbac/ (see the operator guide)",
                missing.join(", ")
            ),
        ));
    }
    Ok(())
}

pub(super) async fn add_cluster<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewCluster>,
) -> ApiResult<Reply<Cluster>> {
    let mut record = st.service.validate_cluster(&req).await?;
    probe_and_check(&st, &mut record).await?;
    ok(st.service.store_cluster(&caller.token_id, &record).await?)
}

/// Replaces a cluster's credentials and settings, validated, probed and checked like a
/// registration. The Kubernetes backend's cached client is keyed by the credentials' digest,
/// so the next call uses the new ones.
pub(super) async fn update_cluster<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(cluster): Path<String>,
    StrictJson(req): StrictJson<ClusterUpdate>,
) -> ApiResult<Reply<Cluster>> {
    let mut record = st.service.validate_cluster_update(&cluster, &req).await?;
    probe_and_check(&st, &mut record).await?;
    ok(st
        .service
        .store_cluster_update(&caller.token_id, &record, req.kubeconfig.is_some())
        .await?)
}

pub(super) async fn list_clusters<B: Backend>(
    State(st): S<B>,
    StrictQuery(q): StrictQuery<PageQuery>,
) -> ApiResult<Paged<Cluster>> {
    paged(st.service.clusters_page(&q).await?)
}

pub(super) async fn get_cluster<B: Backend>(
    State(st): S<B>,
    Path(cluster): Path<String>,
) -> ApiResult<Reply<Cluster>> {
    ok(st.service.cluster(&cluster).await?)
}

pub(super) async fn delete_cluster<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(cluster): Path<String>,
) -> ApiResult<NoContent> {
    st.service
        .delete_cluster(&caller.token_id, &cluster)
        .await?;
    Ok(NoContent)
}
