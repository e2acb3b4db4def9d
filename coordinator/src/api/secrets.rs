//! Secrets of a Namespace: write-only values, readable metadata.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use zeroize::Zeroizing;

use super::access::Caller;
use super::extract::{NoBody, StrictJson};
use super::{ApiResult, S, ok};
use crate::backend::Backend;
use crate::service::{NewSecret, NewSecretRollout};

pub(super) async fn set_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewSecret>,
) -> ApiResult {
    let NewSecret { name, value } = req;
    let value = Zeroizing::new(value.into_bytes());
    ok(
        StatusCode::CREATED,
        st.service
            .put_secret(&caller.token_id, &ns, &name, value)
            .await?,
    )
}

pub(super) async fn list_secrets<B: Backend>(State(st): S<B>, Path(ns): Path<String>) -> ApiResult {
    ok(StatusCode::OK, st.service.secrets(&ns).await?)
}

pub(super) async fn get_secret<B: Backend>(
    State(st): S<B>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult {
    ok(StatusCode::OK, st.service.secret(&ns, &name).await?)
}

pub(super) async fn delete_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult {
    st.service
        .delete_secret(&caller.token_id, &ns, &name)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn deploy_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult {
    ok(
        StatusCode::ACCEPTED,
        st.service
            .deploy_secret(&caller.token_id, &ns, &name)
            .await?,
    )
}

pub(super) async fn roll_out_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    StrictJson(req): StrictJson<NewSecretRollout>,
) -> ApiResult {
    ok(
        StatusCode::CREATED,
        st.service
            .create_secret_rollout(&caller.token_id, &ns, &name, req)
            .await?,
    )
}
