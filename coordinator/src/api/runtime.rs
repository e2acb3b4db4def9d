//! The Agent's runtime and log, read through its backend; the drift sweep's findings and a
//! reconcile on request. Both reach a host or cluster, so both
//! spend the token's read budget (`ratelimit.rs`); log reads are audited by the service.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use clawfleet_api::model::DriftRow;
use clawfleet_api::responses::{AgentLogPage, AgentRuntime, Reconciling};
use clawfleet_protocol::FailureCode;

use super::access::Caller;
use super::extract::StrictQuery;
use super::ratelimit::ReadLimiter;
use super::{ApiError, ApiResult, Reply, S, ok};
use crate::backend::{Backend, CallError};
use crate::codes::Code;
use crate::service::{LogsQuery, RuntimeError};

/// Spends one read of hosts and clusters (runtime, logs, plans) from the token's budget.
pub(super) fn spend(limiter: &ReadLimiter, caller: &Caller) -> Result<(), ApiError> {
    limiter.take(&caller.token_id).map_err(|wait| {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        ApiError::new(
            Code::RateLimited,
            format!(
                "this token made too many reads of hosts and clusters (runtime, logs, plans; \
                 api.runtime_reads_per_minute); retry in {seconds} s"
            ),
        )
        .retry_after(seconds.max(1))
    })
}

pub(crate) fn call_error(e: RuntimeError) -> ApiError {
    match e {
        RuntimeError::Service(s) => s.into(),
        RuntimeError::Call(CallError::Failed(f)) if f.is_unsupported() => ApiError::new(
            Code::BackendUnsupported,
            format!(
                "the target does not support this operation: a host's hostd predates it \
                     (upgrade hostd there), or the backend does not offer it ({})",
                f.message
            ),
        ),
        RuntimeError::Call(CallError::Failed(f)) => {
            let status = match f.code {
                FailureCode::AgentMissing | FailureCode::PreviousRunMissing => {
                    StatusCode::NOT_FOUND
                }
                FailureCode::LogCursorInvalid => StatusCode::BAD_REQUEST,
                _ if f.is_retryable() => StatusCode::BAD_GATEWAY,
                _ => StatusCode::CONFLICT,
            };
            ApiError::from_target(status, f.code.as_str(), f.to_string())
        }
        RuntimeError::Call(e) => ApiError::from_call(&e),
    }
}

pub(super) async fn runtime<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Extension(limiter): Extension<Arc<ReadLimiter>>,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult<Reply<AgentRuntime>> {
    spend(&limiter, &caller)?;
    let runtime = st
        .service
        .agent_runtime(&*st.backend, &ns, &agent)
        .await
        .map_err(call_error)?;
    ok(runtime)
}

pub(super) async fn logs<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Extension(limiter): Extension<Arc<ReadLimiter>>,
    Path((ns, agent)): Path<(String, String)>,
    StrictQuery(query): StrictQuery<LogsQuery>,
) -> ApiResult<Reply<AgentLogPage>> {
    spend(&limiter, &caller)?;
    let page = st
        .service
        .agent_logs(&*st.backend, &caller.token_id, &ns, &agent, &query)
        .await
        .map_err(call_error)?;
    Ok(Reply::new(AgentLogPage::new(&ns, &agent, page)).no_store())
}

pub(super) async fn drift<B: Backend>(
    State(st): S<B>,
    StrictQuery(query): StrictQuery<crate::service::DriftQuery>,
) -> ApiResult<Reply<Vec<DriftRow>>> {
    ok(st.service.drift(&query).await?)
}

pub(super) async fn sweep_now<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    _: super::extract::NoBody,
) -> ApiResult<Reply<Vec<DriftRow>>> {
    let rows = st
        .service
        .sweep_drift(&*st.backend, &caller.token_id)
        .await?;
    ok(rows)
}

pub(super) async fn reconcile<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, agent)): Path<(String, String)>,
    _: super::extract::NoBody,
) -> ApiResult<Reply<Reconciling>> {
    let (revision, work) = st.service.reconcile(&caller.token_id, &ns, &agent).await?;
    ok(Reconciling {
        namespace_id: ns,
        agent_id: agent,
        revision_id: revision,
        work_id: work,
    })
}
