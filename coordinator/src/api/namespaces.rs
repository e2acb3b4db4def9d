//! Namespaces and their Configurations.

use axum::extract::{Path, State};
use clawfleet_api::model::{Configuration, Namespace};
use clawfleet_api::responses::{ConfigurationWritten, NamespaceDeleting, NamespaceStatus};

use super::access::Caller;
use super::extract::{StrictJson, StrictQuery};
use super::{ApiResult, Paged, Reply, S, ok, paged};
use crate::backend::Backend;
use crate::model::Role;
use crate::service::page::PageQuery;
use crate::service::{ConfigurationUpdate, NewConfiguration, NewNamespace};

pub(super) async fn create_namespace<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewNamespace>,
) -> ApiResult<Reply<Namespace>> {
    caller.require(&req.id, Role::Admin)?;
    // Choosing a host pool or a cluster needs a global admin; anyone else gets the answer a
    // missing host or cluster gets, so the refusal does not reveal which ones exist.
    let may_choose = caller.is_global(Role::Admin);
    ok(st
        .service
        .create_namespace(&caller.token_id, req, may_choose)
        .await?)
}

pub(super) async fn list_namespaces<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictQuery(q): StrictQuery<PageQuery>,
) -> ApiResult<Paged<Namespace>> {
    paged(
        st.service
            .namespaces_page(|n| caller.may(&n.id, Role::Read), &q)
            .await?,
    )
}

pub(super) async fn get_namespace<B: Backend>(
    State(st): S<B>,
    Path(ns): Path<String>,
) -> ApiResult<Reply<NamespaceStatus>> {
    ok(st.service.namespace_with_work(&ns).await?)
}

pub(super) async fn delete_namespace<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
) -> ApiResult<Reply<NamespaceDeleting>> {
    st.service.delete_namespace(&caller.token_id, &ns).await?;
    ok(NamespaceDeleting {
        namespace_id: ns,
        deleting: true,
    })
}

pub(super) async fn create_configuration<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(ns): Path<String>,
    StrictJson(req): StrictJson<NewConfiguration>,
) -> ApiResult<Reply<ConfigurationWritten>> {
    ok(st
        .service
        .put_configuration(&caller.token_id, &ns, &req.id, req.document, true)
        .await?)
}

pub(super) async fn get_configuration<B: Backend>(
    State(st): S<B>,
    Path((ns, cfg)): Path<(String, String)>,
) -> ApiResult<Reply<Configuration>> {
    ok(st.service.configuration(&ns, &cfg).await?)
}

pub(super) async fn put_configuration<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path((ns, cfg)): Path<(String, String)>,
    StrictJson(req): StrictJson<ConfigurationUpdate>,
) -> ApiResult<Reply<ConfigurationWritten>> {
    ok(st
        .service
        .put_configuration(&caller.token_id, &ns, &cfg, req.document, false)
        .await?)
}
