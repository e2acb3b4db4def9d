//! Liveness, the OpenAPI document and metrics.

use axum::extract::State;
use axum::response::IntoResponse;
use serde_json::json;

use super::{ApiResult, S};
use crate::backend::Backend;

/// How long `/healthz` waits for the database.
const HEALTH_DATABASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// 200 while the database answers a cheap query within [`HEALTH_DATABASE_TIMEOUT`]; 503
/// `DATABASE_UNAVAILABLE` otherwise (a coordinator that cannot reach its state cannot serve).
pub(super) async fn healthz<B: Backend>(State(st): S<B>) -> ApiResult {
    if let Err(e) = st.service.database_answers(HEALTH_DATABASE_TIMEOUT).await {
        tracing::warn!("health check: the database does not answer: {e}");
        return Err(super::ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            crate::codes::Code::DatabaseUnavailable,
            format!("the database does not answer: {e}"),
        )
        .retry_after(1));
    }
    Ok(axum::Json(json!({"status": "ok", "database": "ok"})).into_response())
}

pub(super) async fn openapi_document<B: Backend>(State(_): S<B>) -> ApiResult {
    Ok(axum::Json(super::openapi::document()).into_response())
}

pub(super) async fn audit<B: Backend>(
    State(st): S<B>,
    super::extract::StrictQuery(query): super::extract::StrictQuery<crate::service::AuditQuery>,
) -> ApiResult {
    Ok(axum::Json(st.service.audit_events(&query).await?).into_response())
}

pub(super) async fn metrics<B: Backend>(State(st): S<B>) -> ApiResult {
    let m = st.service.metrics().await?;
    let mut out = String::from("# TYPE clawfleet_work gauge\n");
    for (kind, state, n) in m.work {
        out.push_str(&format!(
            "clawfleet_work{{kind=\"{kind}\",state=\"{state}\"}} {n}\n"
        ));
    }
    out.push_str(&format!(
        "# TYPE clawfleet_hosts gauge\nclawfleet_hosts {}\n",
        m.hosts
    ));
    out.push_str(&format!(
        "# TYPE clawfleet_agents gauge\nclawfleet_agents {}\n",
        m.agents
    ));
    out.push_str(&format!(
        "# TYPE clawfleet_work_pending gauge\nclawfleet_work_pending {}\n\
         # TYPE clawfleet_work_oldest_pending_seconds gauge\nclawfleet_work_oldest_pending_seconds {}\n",
        m.work_pending, m.oldest_pending_seconds
    ));
    out.push_str(&format!(
        "# TYPE clawfleet_targets gauge\nclawfleet_targets{{state=\"reachable\"}} {}\nclawfleet_targets{{state=\"unreachable\"}} {}\n",
        m.targets_reachable, m.targets_unreachable
    ));
    out.push_str("# TYPE clawfleet_agents_sync gauge\n");
    for (state, n) in m.agents_by_sync {
        out.push_str(&format!("clawfleet_agents_sync{{state=\"{state}\"}} {n}\n"));
    }
    out.push_str("# TYPE clawfleet_rollouts gauge\n");
    for (state, n) in m.rollouts_by_state {
        out.push_str(&format!("clawfleet_rollouts{{state=\"{state}\"}} {n}\n"));
    }
    out.push_str(&crate::metrics::render());
    Ok(([("content-type", "text/plain; version=0.0.4")], out).into_response())
}
