//! Liveness, the OpenAPI document and metrics.

use axum::extract::State;
use clawfleet_api::model::AuditEvent;
use clawfleet_api::openapi::OpenApiDocument;
use clawfleet_api::responses::Health;

use super::{ApiResult, Reply, S, Text, ok};
use crate::backend::Backend;
use crate::codes::Code;

/// How long `/healthz` waits for the database.
const HEALTH_DATABASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// 200 while the database answers a cheap query within [`HEALTH_DATABASE_TIMEOUT`]; 503
/// `DATABASE_UNAVAILABLE` otherwise (a coordinator that cannot reach its state cannot serve).
pub(super) async fn healthz<B: Backend>(State(st): S<B>) -> ApiResult<Reply<Health>> {
    if let Err(e) = st.service.database_answers(HEALTH_DATABASE_TIMEOUT).await {
        tracing::warn!("health check: the database does not answer: {e}");
        return Err(super::ApiError::new(
            Code::DatabaseUnavailable,
            format!("the database does not answer: {e}"),
        )
        .retry_after(1));
    }
    ok(Health::ok())
}

/// `/openapi.json`, from the route table, with every code.
pub fn openapi() -> OpenApiDocument {
    clawfleet_api::openapi::document()
}

pub(super) async fn openapi_document<B: Backend>(
    State(_): S<B>,
) -> ApiResult<Reply<OpenApiDocument>> {
    ok(openapi())
}

pub(super) async fn audit<B: Backend>(
    State(st): S<B>,
    super::extract::StrictQuery(query): super::extract::StrictQuery<crate::service::AuditQuery>,
) -> ApiResult<Reply<Vec<AuditEvent>>> {
    ok(st.service.audit_events(&query).await?)
}

pub(super) async fn metrics<B: Backend>(State(st): S<B>) -> ApiResult<Text> {
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
    Ok(Text(out))
}
