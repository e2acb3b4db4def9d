//! Secrets of a Namespace: write-only values, readable metadata.

use axum::extract::{Path, State};
use clawfleet_api::model::{Rollout, SecretVersion};
use clawfleet_api::responses::{SecretDeploy, SecretInfo};
use zeroize::Zeroizing;

use super::access::Caller;
use super::extract::{NoBody, StrictJson};
use super::{ApiResult, NoContent, Reply, S, ok};
use crate::backend::Backend;
use crate::service::{NewSecret, NewSecretRollout};

pub(super) async fn set_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewSecret>,
) -> ApiResult<Reply<SecretVersion>> {
    let NewSecret { name, value } = req;
    let value = Zeroizing::new(value.into_bytes());
    ok(st
        .service
        .put_secret(&caller.token_id, &ns, &name, value)
        .await?)
}

pub(super) async fn list_secrets<B: Backend>(
    State(st): S<B>,
    Path(ns): Path<String>,
) -> ApiResult<Reply<Vec<SecretInfo>>> {
    ok(st.service.secrets(&ns).await?)
}

pub(super) async fn get_secret<B: Backend>(
    State(st): S<B>,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<Reply<SecretInfo>> {
    ok(st.service.secret(&ns, &name).await?)
}

pub(super) async fn delete_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<NoContent> {
    st.service
        .delete_secret(&caller.token_id, &ns, &name)
        .await?;
    Ok(NoContent)
}

pub(super) async fn deploy_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    _: NoBody,
) -> ApiResult<Reply<Vec<SecretDeploy>>> {
    ok(st
        .service
        .deploy_secret(&caller.token_id, &ns, &name)
        .await?)
}

pub(super) async fn roll_out_secret<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    StrictJson(req): StrictJson<NewSecretRollout>,
) -> ApiResult<Reply<Rollout>> {
    ok(st
        .service
        .create_secret_rollout(&caller.token_id, &ns, &name, req)
        .await?)
}
