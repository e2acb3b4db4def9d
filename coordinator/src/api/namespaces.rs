//! Namespaces and their Configurations.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::json;

use super::access::Caller;
use super::extract::StrictJson;
use super::{ApiError, ApiResult, S, ok};
use crate::backend::Backend;
use crate::codes::Code;
use crate::model::Role;
use crate::service::{ConfigurationUpdate, NewConfiguration, NewNamespace, ServiceError};

pub(super) async fn create_namespace<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewNamespace>,
) -> ApiResult {
    caller.require(&req.id, Role::Admin)?;
    // Choosing a host pool or a cluster needs a global admin; anyone else gets the answer a
    // missing host or cluster gets, so the refusal does not reveal which ones exist.
    let may_choose = caller.is_global(Role::Admin);
    ok(
        StatusCode::CREATED,
        st.service
            .create_namespace(&caller.token_id, req, may_choose)?,
    )
}

pub(super) async fn list_namespaces<B: Backend>(State(st): S<B>, caller: Caller) -> ApiResult {
    let all = st.service.store.namespaces().map_err(ServiceError::from)?;
    let visible: Vec<_> = all
        .into_iter()
        .filter(|n| caller.may(&n.id, Role::Read))
        .collect();
    ok(StatusCode::OK, visible)
}

pub(super) async fn get_namespace<B: Backend>(
    State(st): S<B>,
    Path(ns): Path<String>,
) -> ApiResult {
    ok(StatusCode::OK, st.service.namespace(&ns)?)
}

pub(super) async fn delete_namespace<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
) -> ApiResult {
    st.service.delete_namespace(&caller.token_id, &ns)?;
    ok(
        StatusCode::ACCEPTED,
        json!({"namespaceId": ns, "deleting": true}),
    )
}

pub(super) async fn create_configuration<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewConfiguration>,
) -> ApiResult {
    ok(
        StatusCode::CREATED,
        st.service
            .put_configuration(&caller.token_id, &ns, &req.id, req.document, true)?,
    )
}

pub(super) async fn get_configuration<B: Backend>(
    State(st): S<B>,
    Path((ns, cfg)): Path<(String, String)>,
) -> ApiResult {
    st.service.namespace(&ns)?;
    let c = st
        .service
        .store
        .configuration(&ns, &cfg)
        .map_err(ServiceError::from)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                Code::NotFound,
                format!("configuration {cfg} does not exist"),
            )
        })?;
    ok(StatusCode::OK, c)
}

pub(super) async fn put_configuration<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, cfg)): Path<(String, String)>,
    StrictJson(req): StrictJson<ConfigurationUpdate>,
) -> ApiResult {
    ok(
        StatusCode::OK,
        st.service
            .put_configuration(&caller.token_id, &ns, &cfg, req.document, false)?,
    )
}
