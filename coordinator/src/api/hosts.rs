//! Enrolled hosts.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::Value;

use super::access::Caller;
use super::extract::{NoBody, StrictJson};
use super::{ApiError, ApiResult, S, ok};
use crate::backend::{Backend, CallOptions, HostTarget};
use crate::codes::Code;
use crate::service::{HostUpdate, NewHost, ServiceError};

pub(super) async fn enrol_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewHost>,
) -> ApiResult {
    ok(
        StatusCode::CREATED,
        st.service.enrol_host(&caller.token_id, req)?,
    )
}

pub(super) async fn list_hosts<B: Backend>(State(st): S<B>) -> ApiResult {
    ok(
        StatusCode::OK,
        st.service.store.hosts().map_err(ServiceError::from)?,
    )
}

/// The enrolled host of that name, or 404.
fn enrolled_host<B: Backend>(
    st: &super::AppState<B>,
    host: &str,
) -> Result<crate::model::Host, ApiError> {
    st.service
        .store
        .host(host)
        .map_err(ServiceError::from)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                Code::NotFound,
                format!("host {host} is not enrolled"),
            )
        })
}

pub(super) async fn get_host<B: Backend>(State(st): S<B>, Path(host): Path<String>) -> ApiResult {
    let h = enrolled_host(&st, &host)?;
    ok(StatusCode::OK, h)
}

pub(super) async fn update_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(host): Path<String>,
    StrictJson(req): StrictJson<HostUpdate>,
) -> ApiResult {
    let update = NewHost {
        name: host,
        address: req.address,
        port: req.port,
        host_key: req.host_key,
        max_agents: req.max_agents,
    };
    ok(
        StatusCode::OK,
        st.service.update_host(&caller.token_id, update)?,
    )
}

pub(super) async fn delete_host<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(host): Path<String>,
) -> ApiResult {
    st.service.delete_host(&caller.token_id, &host)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn probe_host<B: Backend>(
    State(st): S<B>,
    Path(host): Path<String>,
    _: NoBody,
) -> ApiResult {
    let h = enrolled_host(&st, &host)?;
    let target = HostTarget::of(&h).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidStoredId,
            e.to_string(),
        )
    })?;
    let op = clawfleet_protocol::Operation::Probe(clawfleet_protocol::operation::ProbeArgs {});
    match st.backend.call(&target, op, CallOptions::default()).await {
        Ok(result) => {
            let value = serde_json::to_value(&result).unwrap_or(Value::Null);
            st.service
                .store
                .set_host_probe(&host, &value)
                .map_err(ServiceError::from)?;
            ok(StatusCode::OK, value)
        }
        Err(e) => Err(ApiError::from_target(
            if e.is_retryable() {
                StatusCode::BAD_GATEWAY
            } else {
                StatusCode::CONFLICT
            },
            e.code(),
            e.to_string(),
        )),
    }
}
