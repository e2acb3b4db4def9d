//! The HTTP API (axum 0.8): bearer tokens with per-Namespace roles, strict JSON bodies, stable
//! error codes, an audit event for every change, `/openapi.json`, `/healthz` and `/metrics`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::backend::{Backend, CallOptions, ClusterTarget, HostTarget, Target};
use crate::model::{Grant, Role};
use crate::service::{
    AgentPatch, ConfigurationUpdate, HostUpdate, NewAgent, NewConfiguration, NewHost, NewNamespace,
    Service, ServiceError,
};
use crate::tokens;

/// Shared state of the API.
pub struct AppState<B: Backend> {
    pub service: Service,
    pub backend: Arc<B>,
}

impl<B: Backend> std::fmt::Debug for AppState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// An API error: status, stable code, message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match &e {
            ServiceError::Invalid { code, .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, code, e.to_string())
            }
            ServiceError::NotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", e.to_string())
            }
            ServiceError::Conflict { code, .. } => {
                ApiError::new(StatusCode::CONFLICT, code, e.to_string())
            }
            ServiceError::Store(inner) => {
                tracing::error!("store failure: {inner}");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "STORE_FAILURE",
                    "the state store failed; see the coordinator log",
                )
            }
        }
    }
}

type ApiResult = Result<Response, ApiError>;

/// The caller, once authenticated.
struct Caller {
    token_id: String,
    grants: Vec<Grant>,
}

impl Caller {
    fn may(&self, namespace: &str, role: Role) -> bool {
        self.grants
            .iter()
            .any(|g| (g.namespace == "*" || g.namespace == namespace) && g.role >= role)
    }

    fn require(&self, namespace: &str, role: Role) -> Result<(), ApiError> {
        if self.may(namespace, role) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "FORBIDDEN",
                format!(
                    "this token lacks the {} role for {}",
                    role.as_str(),
                    if namespace == "*" {
                        "all Namespaces"
                    } else {
                        namespace
                    }
                ),
            ))
        }
    }
}

fn authenticate<B: Backend>(state: &AppState<B>, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", m);
    let value = headers
        .get("authorization")
        .ok_or_else(|| unauthorized("an Authorization: Bearer <token> header is required"))?
        .to_str()
        .map_err(|_| unauthorized("the Authorization header is not text"))?;
    let token = value
        .strip_prefix("Bearer ")
        .ok_or_else(|| unauthorized("the Authorization header must be Bearer <token>"))?;
    let (id, grants) = state
        .service
        .store
        .token_by_hash(&tokens::hash(token.trim()))
        .map_err(ServiceError::from)?
        .ok_or_else(|| unauthorized("the token is unknown or revoked"))?;
    Ok(Caller {
        token_id: id,
        grants,
    })
}

/// Strict JSON decoding of a body; its size was already bounded by the router's
/// `DefaultBodyLimit` (a JSON 413 through [`json_errors`]).
fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    clawfleet_protocol::envelope::decode_json("request body", bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "INVALID_BODY", e.to_string()))
}

fn ok(status: StatusCode, value: impl serde::Serialize) -> ApiResult {
    Ok((status, axum::Json(value)).into_response())
}

/// The route table: method, path, role, and summary. `/openapi.json` is generated from it.
pub const ROUTES: &[(&str, &str, &str, &str)] = &[
    (
        "post",
        "/namespaces",
        "admin",
        "Create a Namespace with a host pool",
    ),
    ("get", "/namespaces", "read", "List Namespaces"),
    ("get", "/namespaces/{ns}", "read", "Get a Namespace"),
    (
        "delete",
        "/namespaces/{ns}",
        "admin",
        "Delete an empty Namespace (409 while it has Agents)",
    ),
    (
        "post",
        "/namespaces/{ns}/configurations",
        "deploy",
        "Create a Configuration",
    ),
    (
        "get",
        "/namespaces/{ns}/configurations/{cfg}",
        "read",
        "Get a Configuration's latest generation",
    ),
    (
        "put",
        "/namespaces/{ns}/configurations/{cfg}",
        "deploy",
        "Add a Configuration generation",
    ),
    (
        "post",
        "/namespaces/{ns}/agents",
        "deploy",
        "Create an Agent",
    ),
    ("get", "/namespaces/{ns}/agents", "read", "List Agents"),
    (
        "get",
        "/namespaces/{ns}/agents/{agent}",
        "read",
        "Get an Agent",
    ),
    (
        "patch",
        "/namespaces/{ns}/agents/{agent}",
        "deploy",
        "Change an Agent's Configuration",
    ),
    (
        "delete",
        "/namespaces/{ns}/agents/{agent}",
        "deploy",
        "Delete an Agent",
    ),
    (
        "post",
        "/namespaces/{ns}/agents/{agent}/deploy",
        "deploy",
        "Deploy a new revision (bodyless)",
    ),
    (
        "post",
        "/namespaces/{ns}/agents/{agent}/stop",
        "operate",
        "Stop the Agent (bodyless)",
    ),
    (
        "get",
        "/namespaces/{ns}/agents/{agent}/revisions",
        "read",
        "List revisions",
    ),
    (
        "get",
        "/namespaces/{ns}/agents/{agent}/revisions/{rev}",
        "read",
        "Get a revision",
    ),
    (
        "get",
        "/namespaces/{ns}/agents/{agent}/deployment-status",
        "read",
        "Desired state, active and served revision, progress",
    ),
    (
        "get",
        "/namespaces/{ns}/agents/{agent}/work/{id}",
        "read",
        "One work item (deploy, stop, delete) with its last attempt",
    ),
    ("post", "/hosts", "admin", "Enrol a host (pins its key)"),
    ("get", "/hosts", "admin", "List hosts"),
    ("get", "/hosts/{host}", "admin", "Get a host"),
    (
        "put",
        "/hosts/{host}",
        "admin",
        "Re-pin a host's key, address or capacity",
    ),
    (
        "post",
        "/hosts/{host}/probe",
        "admin",
        "Probe a host over SSH",
    ),
    (
        "post",
        "/clusters",
        "admin",
        "Register a Kubernetes cluster (kubeconfig validated, then probed)",
    ),
    (
        "get",
        "/clusters",
        "admin",
        "List clusters (never their credentials)",
    ),
    ("get", "/clusters/{cluster}", "admin", "Get a cluster"),
    (
        "delete",
        "/clusters/{cluster}",
        "admin",
        "Forget a cluster (409 while a Namespace uses it)",
    ),
    ("post", "/tokens", "admin", "Create a token"),
    ("delete", "/tokens/{id}", "admin", "Revoke a token"),
    ("get", "/openapi.json", "none", "This document"),
    ("get", "/healthz", "none", "Liveness"),
    ("get", "/metrics", "none", "Prometheus metrics"),
];

fn openapi() -> Value {
    let mut paths = serde_json::Map::new();
    for (method, path, role, summary) in ROUTES {
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = json!({
            "summary": summary,
            "x-clawfleet-role": role,
            "security": if *role == "none" { json!([]) } else { json!([{"bearer": []}]) },
            "responses": {"default": {"description": "JSON; errors are {\"error\": {\"code\", \"message\"}}"}},
        });
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "clawfleet coordinator", "version": env!("CARGO_PKG_VERSION")},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    })
}

/// Builds the router.
pub fn router<B: Backend>(state: Arc<AppState<B>>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/openapi.json", get(|| async { axum::Json(openapi()) }))
        .route("/metrics", get(metrics::<B>))
        .route(
            "/namespaces",
            post(create_namespace::<B>).get(list_namespaces::<B>),
        )
        .route(
            "/namespaces/{ns}",
            get(get_namespace::<B>).delete(delete_namespace::<B>),
        )
        .route(
            "/namespaces/{ns}/configurations",
            post(create_configuration::<B>),
        )
        .route(
            "/namespaces/{ns}/configurations/{cfg}",
            get(get_configuration::<B>).put(put_configuration::<B>),
        )
        .route(
            "/namespaces/{ns}/agents",
            post(create_agent::<B>).get(list_agents::<B>),
        )
        .route(
            "/namespaces/{ns}/agents/{agent}",
            get(get_agent::<B>)
                .patch(patch_agent::<B>)
                .delete(delete_agent::<B>),
        )
        .route("/namespaces/{ns}/agents/{agent}/deploy", post(deploy::<B>))
        .route("/namespaces/{ns}/agents/{agent}/stop", post(stop::<B>))
        .route(
            "/namespaces/{ns}/agents/{agent}/revisions",
            get(list_revisions::<B>),
        )
        .route(
            "/namespaces/{ns}/agents/{agent}/revisions/{rev}",
            get(get_revision::<B>),
        )
        .route(
            "/namespaces/{ns}/agents/{agent}/deployment-status",
            get(deployment_status::<B>),
        )
        .route(
            "/namespaces/{ns}/agents/{agent}/work/{id}",
            get(get_work::<B>),
        )
        .route("/hosts", post(enrol_host::<B>).get(list_hosts::<B>))
        .route(
            "/hosts/{host}",
            get(get_host::<B>)
                .put(update_host::<B>)
                .delete(delete_host::<B>),
        )
        .route("/hosts/{host}/probe", post(probe_host::<B>))
        .route("/clusters", post(add_cluster::<B>).get(list_clusters::<B>))
        .route(
            "/clusters/{cluster}",
            get(get_cluster::<B>).delete(delete_cluster::<B>),
        )
        .route("/tokens", post(create_token::<B>))
        .route("/tokens/{id}", axum::routing::delete(revoke_token::<B>))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "NO_SUCH_ROUTE",
                "no such route; see /openapi.json",
            )
        })
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// The largest request body accepted.
pub const MAX_BODY: usize = 1024 * 1024;

/// Gives the framework's own rejections (body too large, method not allowed, unsupported
/// media type, ...) the API's JSON error shape, so every error a client sees is
/// `{"error": {"code", "message"}}`.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (code, message) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            "BODY_TOO_LARGE",
            format!("request bodies are limited to {} KiB", MAX_BODY / 1024),
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            "METHOD_NOT_ALLOWED",
            "this route does not take that method; see /openapi.json".to_owned(),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "UNSUPPORTED_MEDIA_TYPE",
            "request bodies must be JSON".to_owned(),
        ),
        s if s.is_server_error() => (
            "INTERNAL_ERROR",
            "the coordinator failed; see its log".to_owned(),
        ),
        _ => (
            "INVALID_REQUEST",
            format!(
                "the request was refused: {}",
                status.canonical_reason().unwrap_or("bad request")
            ),
        ),
    };
    ApiError::new(status, code, message).into_response()
}

type S<B> = State<Arc<AppState<B>>>;

async fn metrics<B: Backend>(State(st): S<B>) -> ApiResult {
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

async fn create_namespace<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    if !caller.grants.iter().any(|g| g.role == Role::Admin) {
        caller.require("*", Role::Admin)?;
    }
    let req: NewNamespace = body(&bytes)?;
    caller.require(&req.id, Role::Admin)?;
    ok(
        StatusCode::CREATED,
        st.service.create_namespace(&caller.token_id, req)?,
    )
}

async fn list_namespaces<B: Backend>(State(st): S<B>, headers: HeaderMap) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    let all = st.service.store.namespaces().map_err(ServiceError::from)?;
    let visible: Vec<_> = all
        .into_iter()
        .filter(|n| caller.may(&n.id, Role::Read))
        .collect();
    ok(StatusCode::OK, visible)
}

async fn get_namespace<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(ns): Path<String>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    ok(StatusCode::OK, st.service.namespace(&ns)?)
}

async fn delete_namespace<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(ns): Path<String>,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Admin)?;
    st.service.delete_namespace(&caller.token_id, &ns)?;
    ok(
        StatusCode::ACCEPTED,
        json!({"namespaceId": ns, "deleting": true}),
    )
}

async fn create_configuration<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(ns): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Deploy)?;
    let req: NewConfiguration = body(&bytes)?;
    ok(
        StatusCode::CREATED,
        st.service
            .put_configuration(&caller.token_id, &ns, &req.id, req.document, true)?,
    )
}

async fn get_configuration<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, cfg)): Path<(String, String)>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    st.service.namespace(&ns)?;
    let c = st
        .service
        .store
        .configuration(&ns, &cfg)
        .map_err(ServiceError::from)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("configuration {cfg} does not exist"),
            )
        })?;
    ok(StatusCode::OK, c)
}

async fn put_configuration<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, cfg)): Path<(String, String)>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Deploy)?;
    let req: ConfigurationUpdate = body(&bytes)?;
    ok(
        StatusCode::OK,
        st.service
            .put_configuration(&caller.token_id, &ns, &cfg, req.document, false)?,
    )
}

async fn create_agent<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(ns): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Deploy)?;
    let req: NewAgent = body(&bytes)?;
    ok(
        StatusCode::CREATED,
        st.service.create_agent(&caller.token_id, &ns, req)?,
    )
}

async fn list_agents<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(ns): Path<String>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    st.service.namespace(&ns)?;
    ok(
        StatusCode::OK,
        st.service.store.agents(&ns).map_err(ServiceError::from)?,
    )
}

async fn get_agent<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    ok(StatusCode::OK, st.service.agent(&ns, &agent)?)
}

async fn patch_agent<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent)): Path<(String, String)>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Deploy)?;
    let req: AgentPatch = body(&bytes)?;
    ok(
        StatusCode::OK,
        st.service.patch_agent(&caller.token_id, &ns, &agent, req)?,
    )
}

async fn delete_agent<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Deploy)?;
    let work = st.service.delete_agent(&caller.token_id, &ns, &agent)?;
    ok(
        StatusCode::ACCEPTED,
        json!({"namespaceId": ns, "agentId": agent, "deleting": true, "workId": work}),
    )
}

fn bodyless(bytes: &Bytes) -> Result<(), ApiError> {
    if bytes.iter().any(|b| !b.is_ascii_whitespace()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "UNEXPECTED_BODY",
            "this route takes no body",
        ));
    }
    Ok(())
}

async fn deploy<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent)): Path<(String, String)>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Deploy)?;
    bodyless(&bytes)?;
    let (rev, work) = st.service.deploy(&caller.token_id, &ns, &agent)?;
    let mut value = serde_json::to_value(&rev).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            format!("cannot encode the revision: {e}"),
        )
    })?;
    value["workId"] = json!(work);
    ok(StatusCode::ACCEPTED, value)
}

async fn stop<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent)): Path<(String, String)>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require(&ns, Role::Operate)?;
    bodyless(&bytes)?;
    let work = st.service.stop(&caller.token_id, &ns, &agent)?;
    ok(
        StatusCode::ACCEPTED,
        json!({"namespaceId": ns, "agentId": agent, "desiredState": "stopped", "workId": work}),
    )
}

async fn get_work<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent, id)): Path<(String, String, String)>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    let id: i64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_IDENTIFIER",
            format!("work id {id:?} must be a whole number"),
        )
    })?;
    ok(StatusCode::OK, st.service.work_item(&ns, &agent, id)?)
}

async fn list_revisions<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    st.service.agent(&ns, &agent)?;
    ok(
        StatusCode::OK,
        st.service
            .store
            .revisions(&ns, &agent)
            .map_err(ServiceError::from)?,
    )
}

async fn get_revision<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent, rev)): Path<(String, String, String)>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    let r = st
        .service
        .store
        .revision(&ns, &agent, &rev)
        .map_err(ServiceError::from)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("revision {rev} does not exist"),
            )
        })?;
    ok(StatusCode::OK, r)
}

async fn deployment_status<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path((ns, agent)): Path<(String, String)>,
) -> ApiResult {
    authenticate(&st, &headers)?.require(&ns, Role::Read)?;
    ok(StatusCode::OK, st.service.deployment_status(&ns, &agent)?)
}

async fn enrol_host<B: Backend>(State(st): S<B>, headers: HeaderMap, bytes: Bytes) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    let req: NewHost = body(&bytes)?;
    ok(
        StatusCode::CREATED,
        st.service.enrol_host(&caller.token_id, req)?,
    )
}

async fn list_hosts<B: Backend>(State(st): S<B>, headers: HeaderMap) -> ApiResult {
    authenticate(&st, &headers)?.require("*", Role::Admin)?;
    ok(
        StatusCode::OK,
        st.service.store.hosts().map_err(ServiceError::from)?,
    )
}

/// The enrolled host of that name, or 404.
fn enrolled_host<B: Backend>(st: &AppState<B>, host: &str) -> Result<crate::model::Host, ApiError> {
    st.service
        .store
        .host(host)
        .map_err(ServiceError::from)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("host {host} is not enrolled"),
            )
        })
}

async fn get_host<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(host): Path<String>,
) -> ApiResult {
    authenticate(&st, &headers)?.require("*", Role::Admin)?;
    let h = enrolled_host(&st, &host)?;
    ok(StatusCode::OK, h)
}

async fn update_host<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(host): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    let req: HostUpdate = body(&bytes)?;
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

async fn delete_host<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(host): Path<String>,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    st.service.delete_host(&caller.token_id, &host)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn probe_host<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(host): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    bodyless(&bytes)?;
    let h = enrolled_host(&st, &host)?;
    let target = HostTarget::of(&h).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INVALID_STORED_ID",
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
        Err(e) => Err(ApiError::new(
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

async fn add_cluster<B: Backend>(State(st): S<B>, headers: HeaderMap, bytes: Bytes) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    let req: crate::service::NewCluster = body(&bytes)?;
    let mut record = st.service.validate_cluster(&req)?;
    // Prove the credentials reach the API server before anything is stored.
    let target = Target::Cluster(ClusterTarget {
        name: record.cluster.name.clone(),
        record: record.clone(),
    });
    let op = clawfleet_protocol::Operation::Probe(clawfleet_protocol::operation::ProbeArgs {});
    match st.backend.call(&target, op, CallOptions::default()).await {
        Ok(result) => {
            record.cluster.last_probe = serde_json::to_value(&result).ok();
        }
        Err(e) => {
            return Err(ApiError::new(
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
        st.service.store_cluster(&caller.token_id, &record)?,
    )
}

async fn list_clusters<B: Backend>(State(st): S<B>, headers: HeaderMap) -> ApiResult {
    authenticate(&st, &headers)?.require("*", Role::Admin)?;
    ok(
        StatusCode::OK,
        st.service.store.clusters().map_err(ServiceError::from)?,
    )
}

async fn get_cluster<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(cluster): Path<String>,
) -> ApiResult {
    authenticate(&st, &headers)?.require("*", Role::Admin)?;
    ok(StatusCode::OK, st.service.cluster(&cluster)?)
}

async fn delete_cluster<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(cluster): Path<String>,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    st.service.delete_cluster(&caller.token_id, &cluster)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewToken {
    name: String,
    grants: Vec<Grant>,
}

async fn create_token<B: Backend>(State(st): S<B>, headers: HeaderMap, bytes: Bytes) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    let req: NewToken = body(&bytes)?;
    if req.grants.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_BODY",
            "grants must not be empty",
        ));
    }
    for g in &req.grants {
        if g.namespace != "*" {
            clawfleet_protocol::Ident::new(g.namespace.as_str()).map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "INVALID_IDENTIFIER",
                    format!("grants.namespace {e}"),
                )
            })?;
        }
    }
    let (id, secret) = tokens::create(&st.service.store, &req.name, &req.grants).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "TOKEN_FAILURE",
            e.to_string(),
        )
    })?;
    st.service
        .store
        .audit(
            &caller.token_id,
            "token.create",
            &id,
            &json!({"grants": req.grants}),
            crate::worker::now_ms() / 1000,
        )
        .map_err(ServiceError::from)?;
    ok(
        StatusCode::CREATED,
        json!({"id": id, "token": secret, "grants": req.grants}),
    )
}

async fn revoke_token<B: Backend>(
    State(st): S<B>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    let caller = authenticate(&st, &headers)?;
    caller.require("*", Role::Admin)?;
    if !st
        .service
        .store
        .revoke_token(&id)
        .map_err(ServiceError::from)?
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("token {id} does not exist"),
        ));
    }
    st.service
        .store
        .audit(
            &caller.token_id,
            "token.revoke",
            &id,
            &json!({}),
            crate::worker::now_ms() / 1000,
        )
        .map_err(ServiceError::from)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
