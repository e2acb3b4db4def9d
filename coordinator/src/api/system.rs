//! Liveness, the OpenAPI document and metrics.

use axum::extract::State;
use axum::response::IntoResponse;
use serde_json::json;

use super::{ApiResult, S};
use crate::backend::Backend;
use crate::service::ServiceError;

pub(super) async fn healthz<B: Backend>(State(_): S<B>) -> ApiResult {
    Ok(axum::Json(json!({"status": "ok"})).into_response())
}

pub(super) async fn openapi_document<B: Backend>(State(_): S<B>) -> ApiResult {
    Ok(axum::Json(super::openapi::document()).into_response())
}

pub(super) async fn metrics<B: Backend>(State(st): S<B>) -> ApiResult {
    let mut out = String::from("# TYPE clawfleet_work gauge\n");
    for (kind, state, n) in st.service.store.work_counts().map_err(ServiceError::from)? {
        out.push_str(&format!(
            "clawfleet_work{{kind=\"{kind}\",state=\"{state}\"}} {n}\n"
        ));
    }
    let hosts = st.service.store.hosts().map_err(ServiceError::from)?.len();
    out.push_str(&format!(
        "# TYPE clawfleet_hosts gauge\nclawfleet_hosts {hosts}\n"
    ));
    let mut agents = 0;
    for ns in st.service.store.namespaces().map_err(ServiceError::from)? {
        agents += st
            .service
            .store
            .agents(&ns.id)
            .map_err(ServiceError::from)?
            .len();
    }
    out.push_str(&format!(
        "# TYPE clawfleet_agents gauge\nclawfleet_agents {agents}\n"
    ));
    Ok(([("content-type", "text/plain; version=0.0.4")], out).into_response())
}
