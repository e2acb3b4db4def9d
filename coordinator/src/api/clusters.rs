//! Registered Kubernetes clusters; their credentials are never shown.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::access::Caller;
use super::extract::StrictJson;
use super::{ApiError, ApiResult, S, ok};
use crate::backend::{Backend, CallOptions, ClusterTarget, Target};
use crate::service::NewCluster;

pub(super) async fn add_cluster<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewCluster>,
) -> ApiResult {
    let mut record = st.service.validate_cluster(&req).await?;
    // Prove the credentials reach the API server before anything is stored.
    let target = Target::Cluster(ClusterTarget {
        name: record.cluster.name.clone(),
        record: record.clone(),
    });
    let op = clawfleet_protocol::Operation::Probe(clawfleet_protocol::operation::ProbeArgs {});
    match st.backend.call(&target, op, CallOptions::default()).await {
        Ok(result) => {
            // Stored in a cluster's words (serverVersion, caFingerprint), not hostd's.
            record.cluster.last_probe = crate::model::Cluster::probe_record(&result);
        }
        Err(e) => {
            return Err(ApiError::from_target(
                if e.is_retryable() {
                    StatusCode::BAD_GATEWAY
                } else {
                    StatusCode::BAD_REQUEST
                },
                e.code(),
                format!("the cluster's probe failed, nothing was stored: {e}"),
            ));
        }
    }
    ok(
        StatusCode::CREATED,
        st.service.store_cluster(&caller.token_id, &record).await?,
    )
}

pub(super) async fn list_clusters<B: Backend>(State(st): S<B>) -> ApiResult {
    ok(StatusCode::OK, st.service.clusters().await?)
}

pub(super) async fn get_cluster<B: Backend>(
    State(st): S<B>,
    Path(cluster): Path<String>,
) -> ApiResult {
    ok(StatusCode::OK, st.service.cluster(&cluster).await?)
}

pub(super) async fn delete_cluster<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(cluster): Path<String>,
) -> ApiResult {
    st.service
        .delete_cluster(&caller.token_id, &cluster)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
