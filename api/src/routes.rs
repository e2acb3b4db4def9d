//! The route table: the one list of routes. [`ROUTES`] (and from it `/openapi.json`, see
//! `openapi.rs`) is built here from [`crate::route_table!`]; the coordinator builds its
//! router from the same macro (handler binding, access check, success status), checking at
//! compile time that each handler decodes the route's request and answers its response
//! type. A route therefore cannot be served without being documented, nor answer anything
//! but what its documentation says.

use serde_json::Value;

use crate::access::Access;
use crate::model::Role;

/// An HTTP method the API serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    /// Lower case, as OpenAPI spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
            Method::Put => "put",
            Method::Patch => "patch",
            Method::Delete => "delete",
        }
    }

    /// Upper case, as HTTP spells it.
    pub fn as_http(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// What a route takes as its body.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    /// No body (an empty or all-whitespace body is accepted, anything else is 400).
    None,
    /// A strict JSON object (unknown fields refused) of the type whose JSON Schema this gives.
    Json(fn() -> Value),
    /// No body; query parameters, each a property of the type whose JSON Schema this gives
    /// (unknown parameters refused).
    Query(fn() -> Value),
    /// Whatever the Agent's gateway takes ([`Answer::Proxy`]): the request, its query, body
    /// and headers (but the caller's credentials) go to the gateway unchanged.
    Proxy,
}

impl Body {
    /// Whether the route takes a JSON body.
    pub fn is_json(self) -> bool {
        matches!(self, Body::Json(_))
    }
}

/// What a route answers with its success status.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// A JSON value of the type whose JSON Schema this gives.
    Json(fn() -> Value),
    /// A whole list: a JSON array (the schema is the array's).
    List(fn() -> Value),
    /// One page of a list: a JSON array (the schema is the array's), and the next page's
    /// cursor in the [`NEXT_CURSOR_HEADER`] header when more follow.
    Page(fn() -> Value),
    /// Text of this content type.
    Text(&'static str),
    /// No body (204).
    NoContent,
    /// `101 Switching Protocols` to [`UPGRADE_PROTOCOL`]: from then on the connection carries
    /// a byte stream (the Agent's gateway), no HTTP.
    Upgrade,
    /// Whatever the Agent's gateway answers (its status, headers and body unchanged), or a
    /// WebSocket upgrade (101) the gateway accepted; the route's path ends in
    /// [`PROXY_PATH_PARAM`], the rest of the path on the gateway.
    Proxy,
}

/// The last path parameter of an [`Answer::Proxy`] route: the rest of the path (slashes
/// included, possibly empty), as the gateway sees it.
pub const PROXY_PATH_PARAM: &str = "{path}";

/// Where the coordinator serves an Agent's Control UI: the path of the table's
/// `.../agents/{agent}/ui/{path}` row without its `/{path}`. The gateway is told it as its
/// `gateway.controlUi.basePath` and gets that row's requests with their whole path, so the
/// absolute links the Control UI writes into its page (`<basePath>/assets/...`) and its
/// WebSocket (the page's path) come back through that row.
pub fn control_ui_path(ns: &str, agent: &str) -> String {
    format!("/namespaces/{ns}/agents/{agent}/ui")
}

/// The `Upgrade:` protocol of the [`Answer::Upgrade`] routes.
pub const UPGRADE_PROTOCOL: &str = "clawfleet-gateway";

impl Answer {
    /// The JSON Schema of the body, `None` without one.
    pub fn schema(self) -> Option<Value> {
        match self {
            Answer::Json(s) | Answer::List(s) | Answer::Page(s) => Some(s()),
            Answer::Text(_) => Some(serde_json::json!({"type": "string"})),
            Answer::NoContent | Answer::Upgrade | Answer::Proxy => None,
        }
    }

    /// The content type of the body, `None` without one.
    pub fn content_type(self) -> Option<&'static str> {
        match self {
            Answer::Json(_) | Answer::List(_) | Answer::Page(_) => Some("application/json"),
            Answer::Text(t) => Some(t),
            Answer::NoContent | Answer::Upgrade | Answer::Proxy => None,
        }
    }
}

/// The header that carries the next page's cursor on a [`Answer::Page`] answer.
pub const NEXT_CURSOR_HEADER: &str = "x-next-cursor";

/// The content type of the text answers (`/metrics`: Prometheus' text format).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The JSON Schema (2020-12, as OpenAPI 3.1 uses) of a request type as it is read, every
/// subschema inline.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    generator.into_root_schema_for::<T>().to_value()
}

/// The JSON Schema of a response type as it is written (fields skipped when empty are not
/// required), every subschema inline.
pub fn response_schema_of<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    generator.into_root_schema_for::<T>().to_value()
}

/// One route.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
    pub body: Body,
    /// The status of a successful answer.
    pub success: u16,
    /// What a successful answer carries.
    pub answer: Answer,
    /// The handler's name, used as the OpenAPI operationId.
    pub operation: &'static str,
    pub summary: &'static str,
}

/// The route table, handed to `$callback!` as one list of rows:
///
/// ```text
/// Method "/path/{param}", Access, Request -> status Response => module::handler, "summary";
/// ```
///
/// `Access` is `Public`, `Token`, or `Global`, `Namespace`, `Scoped` with a [`Role`] in
/// parentheses; `Request` is `Empty`, `Json<T>`, `Query<T>` or `Upgrade` (an HTTP upgrade
/// request, no body) or `Proxy` (anything, for the Agent's gateway); `Response` is
/// `Json<T>`, `List<T>`, `Page<T>`, `Text`, `NoContent`, `Upgrade` (101, then a byte stream)
/// or `Proxy` (the gateway's own answer; the path ends in [`PROXY_PATH_PARAM`]). Every `T` names an item of
/// `clawfleet_api::types`; `module::handler` names the coordinator's handler (its name is
/// the OpenAPI operationId). The order is the order `/openapi.json` lists them.
#[macro_export]
macro_rules! route_table {
    ($callback:ident) => {
        $callback! {
            Get "/healthz", Public, Empty -> 200 Json<Health>
                => system::healthz, "Liveness";
            Get "/openapi.json", Public, Empty -> 200 Json<OpenApiDocument>
                => system::openapi_document, "This document";
            Get "/metrics", Global(Read), Empty -> 200 Text
                => system::metrics, "Prometheus metrics (text format)";
            Get "/audit", Global(Admin), Query<AuditQuery> -> 200 List<AuditEvent>
                => system::audit, "The newest audit events (who changed or read what), optionally of one action";
            Get "/drift", Global(Read), Query<DriftQuery> -> 200 List<DriftRow>
                => runtime::drift, "The drift sweep's findings per Agent: synced, drift (with the reason), unreachable, converging";
            Post "/drift/sweep", Global(Operate), Empty -> 200 List<DriftRow>
                => runtime::sweep_now, "Run a drift sweep now (it never repairs) and answer its findings";
            Post "/namespaces", Scoped(Admin), Json<NewNamespace> -> 201 Json<Namespace>
                => namespaces::create_namespace, "Create a Namespace on a host pool or a cluster (choosing either needs a global admin token)";
            Get "/namespaces", Token, Query<PageQuery> -> 200 Page<Namespace>
                => namespaces::list_namespaces, "List the Namespaces the token may read";
            Get "/namespaces/{ns}", Namespace(Read), Empty -> 200 Json<NamespaceStatus>
                => namespaces::get_namespace, "Get a Namespace, with its newest ensure or delete work (state, attempts, last code and message)";
            Delete "/namespaces/{ns}", Namespace(Admin), Empty -> 202 Json<NamespaceDeleting>
                => namespaces::delete_namespace, "Delete an empty Namespace (409 while it has Agents)";
            Post "/namespaces/{ns}/configurations", Namespace(Deploy), Json<NewConfiguration> -> 201 Json<ConfigurationWritten>
                => namespaces::create_configuration, "Create a Configuration";
            Get "/namespaces/{ns}/configurations/{cfg}", Namespace(Read), Empty -> 200 Json<Configuration>
                => namespaces::get_configuration, "Get a Configuration's latest generation";
            Put "/namespaces/{ns}/configurations/{cfg}", Namespace(Deploy), Json<ConfigurationUpdate> -> 200 Json<ConfigurationWritten>
                => namespaces::put_configuration, "Add a Configuration generation";
            Post "/namespaces/{ns}/secrets", Namespace(Deploy), Json<NewSecret> -> 201 Json<SecretVersion>
                => secrets::set_secret, "Write a new version of a secret (its value is never returned, logged or audited; the answer is its version and sha256 fingerprint)";
            Get "/namespaces/{ns}/secrets", Namespace(Read), Empty -> 200 List<SecretInfo>
                => secrets::list_secrets, "List secrets: names, versions, fingerprints, who wrote them when, and which Agents' revisions use which version (never values)";
            Get "/namespaces/{ns}/secrets/{name}", Namespace(Read), Empty -> 200 Json<SecretInfo>
                => secrets::get_secret, "One secret's versions and users (never its value)";
            Delete "/namespaces/{ns}/secrets/{name}", Namespace(Deploy), Empty -> 204 NoContent
                => secrets::delete_secret, "Delete every version of a secret (409 naming the Agents while their current revisions bind it)";
            Post "/namespaces/{ns}/secrets/{name}/deploy", Namespace(Deploy), Empty -> 202 List<SecretDeploy>
                => secrets::deploy_secret, "Deploy a new revision, bound to the newest version, to every Agent whose current revision binds an older one, all at once";
            Post "/namespaces/{ns}/secrets/{name}/rollouts", Namespace(Deploy), Json<NewSecretRollout> -> 201 Json<Rollout>
                => secrets::roll_out_secret, "Roll the newest version out as a rollout (canary, waves, failure budget) to every running Agent whose current revision binds an older one; each keeps its Configuration generation";
            Post "/namespaces/{ns}/agents", Namespace(Deploy), Json<NewAgent> -> 201 Json<Agent>
                => agents::create_agent, "Create an Agent";
            Get "/namespaces/{ns}/agents", Namespace(Read), Query<PageQuery> -> 200 Page<Agent>
                => agents::list_agents, "List Agents";
            Get "/namespaces/{ns}/agents/{agent}", Namespace(Read), Empty -> 200 Json<Agent>
                => agents::get_agent, "Get an Agent";
            Get "/namespaces/{ns}/agents/{agent}/workspace", Namespace(Read), Empty -> 200 Json<WorkspaceSetupInfo>
                => agents::get_workspace, "The Agent's initial workspace files (names, sizes, sha256; never content) and their setup state: pending, applied, failed";
            Patch "/namespaces/{ns}/agents/{agent}", Namespace(Deploy), Json<AgentPatch> -> 200 Json<Agent>
                => agents::patch_agent, "Change an Agent's Configuration";
            Delete "/namespaces/{ns}/agents/{agent}", Namespace(Deploy), Empty -> 202 Json<AgentDeleting>
                => agents::delete_agent, "Delete an Agent";
            Post "/namespaces/{ns}/agents/{agent}/deploy", Namespace(Deploy), Query<DeployQuery> -> 202 Json<Deployment>
                => agents::deploy, "Deploy a new revision (with planToken: only while that plan is still current)";
            Post "/namespaces/{ns}/agents/{agent}/plan", Namespace(Deploy), Empty -> 200 Json<DeployPlan>
                => plans::plan_deploy, "What deploying the next revision would change on its target (read-only), and the plan token";
            Post "/namespaces/{ns}/agents/{agent}/stop", Namespace(Operate), Empty -> 202 Json<Stopping>
                => agents::stop, "Stop the Agent";
            Get "/namespaces/{ns}/agents/{agent}/gateway-tunnel", Namespace(Deploy), Upgrade -> 101 Upgrade
                => gateway::gateway_tunnel, "A byte stream to the Agent's gateway (HTTP upgrade to clawfleet-gateway; `occ agent connect`), audited per stream, closed on token revocation, stop, delete or a new active revision";
            Get "/namespaces/{ns}/agents/{agent}/gateway/{path}", Namespace(Deploy), Proxy -> 200 Proxy
                => gateway::gateway_get, "GET on the Agent's gateway at {path} (its Control UI in a browser signed in to the console, its HTTP API, and its WebSocket: an upgrade is relayed, audited per stream and closed with 1012 when the Agent's gateway goes away); the caller's Cookie and Authorization are removed and the gateway's own password is added, an Origin other than the coordinator's is refused";
            Get "/namespaces/{ns}/agents/{agent}/ui/{path}", Namespace(Deploy), Proxy -> 200 Proxy
                => gateway::control_ui_get, "The Agent's OpenClaw Control UI in a browser signed in to the console, and its WebSocket: the gateway serves it at this path (its gateway.controlUi.basePath, set by the coordinator), so the whole path is passed on; credentials and Origin as for the gateway route";
            Post "/namespaces/{ns}/agents/{agent}/gateway/{path}", Namespace(Deploy), Proxy -> 200 Proxy
                => gateway::gateway_post, "POST on the Agent's gateway at {path}; the caller's Cookie and Authorization are removed and the gateway's own password is added, an Origin other than the coordinator's is refused";
            Put "/namespaces/{ns}/agents/{agent}/gateway/{path}", Namespace(Deploy), Proxy -> 200 Proxy
                => gateway::gateway_put, "PUT on the Agent's gateway at {path}; the caller's Cookie and Authorization are removed and the gateway's own password is added, an Origin other than the coordinator's is refused";
            Patch "/namespaces/{ns}/agents/{agent}/gateway/{path}", Namespace(Deploy), Proxy -> 200 Proxy
                => gateway::gateway_patch, "PATCH on the Agent's gateway at {path}; the caller's Cookie and Authorization are removed and the gateway's own password is added, an Origin other than the coordinator's is refused";
            Delete "/namespaces/{ns}/agents/{agent}/gateway/{path}", Namespace(Deploy), Proxy -> 200 Proxy
                => gateway::gateway_delete, "DELETE on the Agent's gateway at {path}; the caller's Cookie and Authorization are removed and the gateway's own password is added, an Origin other than the coordinator's is refused";
            Post "/namespaces/{ns}/agents/{agent}/reconcile", Namespace(Operate), Empty -> 202 Json<Reconciling>
                => runtime::reconcile, "Re-apply the active revision (an audited deployment pass of the same revision)";
            Get "/namespaces/{ns}/agents/{agent}/revisions", Namespace(Read), Query<PageQuery> -> 200 Page<Revision>
                => agents::list_revisions, "List revisions";
            Get "/namespaces/{ns}/agents/{agent}/revisions/{rev}", Namespace(Read), Empty -> 200 Json<Revision>
                => agents::get_revision, "Get a revision";
            Get "/namespaces/{ns}/agents/{agent}/deployment-status", Namespace(Read), Empty -> 200 Json<DeploymentStatus>
                => agents::deployment_status, "Desired state, active and served revision, progress";
            Get "/namespaces/{ns}/agents/{agent}/work/{work}", Namespace(Read), Empty -> 200 Json<WorkRecord>
                => agents::get_work, "One work item (deploy, stop, delete) with its last attempt";
            Get "/namespaces/{ns}/agents/{agent}/runtime", Namespace(Read), Empty -> 200 Json<AgentRuntime>
                => runtime::runtime, "The Agent's unit or Pod now: state, restarts, last exit, memory, CPU, tasks, served revision (rate limited per token)";
            Get "/namespaces/{ns}/agents/{agent}/runtime/logs", Namespace(Read), Query<LogsQuery> -> 200 Json<AgentLogPage>
                => runtime::logs, "One redacted page of the Agent's log (at most 1,000 lines and 512 KiB, audited, rate limited per token)";
            Post "/namespaces/{ns}/rollouts", Namespace(Deploy), Json<NewRollout> -> 201 Json<Rollout>
                => rollouts::create_rollout, "Roll a Configuration's latest generation out to many Agents: canary first, then waves of at most maxParallel, one failure budget";
            Post "/namespaces/{ns}/rollouts/plan", Namespace(Deploy), Json<NewRollout> -> 200 Json<RolloutPlan>
                => plans::plan_rollout, "What the rollout would change on each Agent's target (read-only), and the plan token";
            Get "/namespaces/{ns}/rollouts", Namespace(Read), Empty -> 200 List<Rollout>
                => rollouts::list_rollouts, "The Namespace's newest rollouts (at most 50), newest first";
            Get "/namespaces/{ns}/rollouts/{rollout}", Namespace(Read), Empty -> 200 Json<Rollout>
                => rollouts::get_rollout, "A rollout with every Agent's state, wave, revision and outcome";
            Post "/namespaces/{ns}/rollouts/{rollout}/pause", Namespace(Deploy), Empty -> 200 Json<Rollout>
                => rollouts::pause_rollout, "Pause a running rollout (deploys in flight finish)";
            Post "/namespaces/{ns}/rollouts/{rollout}/resume", Namespace(Deploy), Empty -> 200 Json<Rollout>
                => rollouts::resume_rollout, "Resume a paused rollout";
            Post "/namespaces/{ns}/rollouts/{rollout}/promote", Namespace(Deploy), Empty -> 200 Json<Rollout>
                => rollouts::promote_rollout, "Start the next wave of a rollout waiting for promotion (or skip the pause between waves)";
            Post "/namespaces/{ns}/rollouts/{rollout}/abort", Namespace(Deploy), Empty -> 200 Json<Rollout>
                => rollouts::abort_rollout, "Abort a rollout: Agents not started are skipped, the others stay as they are";
            Post "/hosts", Global(Admin), Json<NewHost> -> 201 Json<Host>
                => hosts::enrol_host, "Enrol a host (pins its key)";
            Get "/hosts", Global(Admin), Query<PageQuery> -> 200 Page<Host>
                => hosts::list_hosts, "List hosts";
            Get "/hosts/{host}", Global(Admin), Empty -> 200 Json<Host>
                => hosts::get_host, "Get a host";
            Put "/hosts/{host}", Global(Admin), Json<HostUpdate> -> 200 Json<Host>
                => hosts::update_host, "Re-pin a host's key, address or capacity";
            Delete "/hosts/{host}", Global(Admin), Empty -> 204 NoContent
                => hosts::delete_host, "Forget a host (409 while a Namespace's pool names it)";
            Post "/hosts/{host}/probe", Global(Admin), Empty -> 200 Json<HostProbe>
                => hosts::probe_host, "Probe a host over SSH";
            Post "/clusters", Global(Admin), Json<NewCluster> -> 201 Json<Cluster>
                => clusters::add_cluster, "Register a Kubernetes cluster (kubeconfig validated, then probed)";
            Get "/clusters", Global(Admin), Query<PageQuery> -> 200 Page<Cluster>
                => clusters::list_clusters, "List clusters (never their credentials)";
            Get "/clusters/{cluster}", Global(Admin), Empty -> 200 Json<Cluster>
                => clusters::get_cluster, "Get a cluster";
            Put "/clusters/{cluster}", Global(Admin), Json<ClusterUpdate> -> 200 Json<Cluster>
                => clusters::update_cluster, "Replace a cluster's credentials and settings (validated, probed and access-checked like a registration)";
            Delete "/clusters/{cluster}", Global(Admin), Empty -> 204 NoContent
                => clusters::delete_cluster, "Forget a cluster (409 while a Namespace uses it)";
            Post "/tokens", Global(Admin), Json<NewToken> -> 201 Json<CreatedToken>
                => tokens::create_token, "Create a token (optionally expiring)";
            Delete "/tokens/{id}", Global(Admin), Empty -> 204 NoContent
                => tokens::revoke_token, "Revoke a token";
        }
    };
}

/// The request body of a row, as [`Body`].
macro_rules! request_body {
    (Empty) => {
        Body::None
    };
    (Upgrade) => {
        Body::None
    };
    (Proxy) => {
        Body::Proxy
    };
    (Json < $t:ident >) => {
        Body::Json(schema_of::<crate::types::$t>)
    };
    (Query < $t:ident >) => {
        Body::Query(schema_of::<crate::types::$t>)
    };
}

/// The answer of a row, as [`Answer`].
macro_rules! answer {
    (Json < $t:ident >) => {
        Answer::Json(response_schema_of::<crate::types::$t>)
    };
    (List < $t:ident >) => {
        Answer::List(response_schema_of::<Vec<crate::types::$t>>)
    };
    (Page < $t:ident >) => {
        Answer::Page(response_schema_of::<Vec<crate::types::$t>>)
    };
    (Text) => {
        Answer::Text(TEXT_CONTENT_TYPE)
    };
    (NoContent) => {
        Answer::NoContent
    };
    (Upgrade) => {
        Answer::Upgrade
    };
    (Proxy) => {
        Answer::Proxy
    };
}

macro_rules! routes {
    ($( $method:ident $path:literal, $access:ident $(($role:ident))?,
        $req:ident $(< $reqty:ident >)? -> $success:literal $resp:ident $(< $respty:ident >)?
        => $module:ident :: $handler:ident, $summary:literal; )*) => {
        /// Every route the API serves, in the order `/openapi.json` lists them.
        pub const ROUTES: &[Route] = &[$(Route {
            method: Method::$method,
            path: $path,
            access: Access::$access $((Role::$role))?,
            body: request_body!($req $(< $reqty >)?),
            success: $success,
            answer: answer!($resp $(< $respty >)?),
            operation: stringify!($handler),
            summary: $summary,
        },)*];
    };
}

route_table!(routes);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_ui_path_is_a_proxy_row_of_the_table() {
        let row = format!("{}/{PROXY_PATH_PARAM}", control_ui_path("{ns}", "{agent}"));
        assert!(
            ROUTES
                .iter()
                .any(|r| r.path == row && matches!(r.answer, Answer::Proxy)),
            "no proxy row {row}"
        );
    }

    #[test]
    fn every_route_is_unique_and_its_access_fits_its_path() {
        let mut seen = std::collections::HashSet::new();
        for r in ROUTES {
            assert!(
                seen.insert((r.method, r.path)),
                "{} {} twice",
                r.method.as_str(),
                r.path
            );
            if matches!(r.access, Access::Namespace(_)) {
                assert!(r.path.starts_with("/namespaces/{ns}"), "{}", r.path);
            }
            if r.body.is_json() {
                assert_ne!(r.method, Method::Get, "{}", r.path);
            }
            let proxy = matches!(r.answer, Answer::Proxy);
            assert_eq!(proxy, matches!(r.body, Body::Proxy), "{}", r.path);
            assert_eq!(proxy, r.path.ends_with(PROXY_PATH_PARAM), "{}", r.path);
        }
    }

    /// 204 is the status of exactly the routes that answer no body; every other answer has a
    /// body and a 2xx status.
    #[test]
    fn no_content_goes_with_204_only() {
        for r in ROUTES {
            let empty = matches!(r.answer, Answer::NoContent);
            assert_eq!(empty, r.success == 204, "{} {}", r.method.as_str(), r.path);
            let upgrade = matches!(r.answer, Answer::Upgrade);
            assert_eq!(upgrade, r.success == 101, "{}", r.path);
            assert!(upgrade || (200..300).contains(&r.success), "{}", r.path);
        }
    }

    /// Every answer with a body has a schema that says something: not `{}` or `true`, and for
    /// JSON an object or an array (of objects) with its properties.
    #[test]
    fn every_answer_with_a_body_has_a_schema() {
        for r in ROUTES {
            let route = format!("{} {}", r.method.as_str(), r.path);
            let Some(schema) = r.answer.schema() else {
                continue;
            };
            let o = schema.as_object();
            assert!(
                o.is_some_and(|o| !o.is_empty()),
                "{route}: empty schema {schema}"
            );
            match r.answer {
                Answer::Json(_) => {
                    assert_eq!(schema["type"], "object", "{route}: {schema}");
                    assert!(
                        schema["properties"]
                            .as_object()
                            .is_some_and(|p| !p.is_empty())
                            || schema["required"].is_array(),
                        "{route}: no properties in {schema}"
                    );
                }
                Answer::List(_) | Answer::Page(_) => {
                    assert_eq!(schema["type"], "array", "{route}: {schema}");
                    assert_eq!(schema["items"]["type"], "object", "{route}: {schema}");
                }
                Answer::Text(_) => assert_eq!(schema["type"], "string"),
                Answer::NoContent | Answer::Upgrade | Answer::Proxy => {}
            }
        }
    }
}
