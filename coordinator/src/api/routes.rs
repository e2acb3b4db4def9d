//! The route table: the one list of routes. The router ([`add_routes`]), `/openapi.json`
//! (`openapi.rs`) and the authorization sweep in `coordinator/tests/api.rs` are all built from
//! [`ROUTES`], so a route cannot be served without being documented and checked.

use std::sync::Arc;

use axum::Router;
use axum::routing::MethodFilter;

use super::access::{Access, authorize};
use super::{
    AppState, agents, clusters, hosts, namespaces, plans, rollouts, runtime, secrets, system,
    tokens,
};
use crate::backend::Backend;
use crate::model::Role;
use crate::service::page::PageQuery;
use crate::service::{
    AgentPatch, AuditQuery, ClusterUpdate, ConfigurationUpdate, DeployQuery, DriftQuery,
    HostUpdate, LogsQuery, NewAgent, NewCluster, NewConfiguration, NewHost, NewNamespace,
    NewRollout, NewSecret, NewSecretRollout,
};
use tokens::NewToken;

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

    fn filter(self) -> MethodFilter {
        match self {
            Method::Get => MethodFilter::GET,
            Method::Post => MethodFilter::POST,
            Method::Put => MethodFilter::PUT,
            Method::Patch => MethodFilter::PATCH,
            Method::Delete => MethodFilter::DELETE,
        }
    }
}

/// What a route takes as its body.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    /// No body (an empty or all-whitespace body is accepted, anything else is 400).
    None,
    /// A strict JSON object (unknown fields refused) of the type whose JSON Schema this gives.
    Json(fn() -> serde_json::Value),
    /// No body; query parameters, each a property of the type whose JSON Schema this gives
    /// (unknown parameters refused).
    Query(fn() -> serde_json::Value),
}

impl Body {
    /// Whether the route takes a JSON body.
    pub fn is_json(self) -> bool {
        matches!(self, Body::Json(_))
    }
}

/// The JSON Schema (2020-12, as OpenAPI 3.1 uses) of a request type, every subschema inline.
pub fn schema_of<T: schemars::JsonSchema>() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    generator.into_root_schema_for::<T>().to_value()
}

macro_rules! body {
    (Empty) => {
        Body::None
    };
    (Json < $t:ty >) => {
        Body::Json(schema_of::<$t>)
    };
    (Query < $t:ty >) => {
        Body::Query(schema_of::<$t>)
    };
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
    /// The handler's name, used as the OpenAPI operationId.
    pub operation: &'static str,
    pub summary: &'static str,
}

macro_rules! route_table {
    ($( $method:ident $path:literal, $access:expr, $body:ident $(< $ty:ty >)?, $success:literal
        => $module:ident :: $handler:ident, $summary:literal; )*) => {
        /// Every route the API serves, in the order `/openapi.json` lists them.
        pub const ROUTES: &[Route] = &[$(Route {
            method: Method::$method,
            path: $path,
            access: $access,
            body: body!($body $(< $ty >)?),
            success: $success,
            operation: stringify!($handler),
            summary: $summary,
        },)*];

        /// Adds every route of [`ROUTES`] with its access check in front of its handler.
        pub(super) fn add_routes<B: Backend>(
            mut router: Router<Arc<AppState<B>>>,
            state: &Arc<AppState<B>>,
        ) -> Router<Arc<AppState<B>>> {
            $(
                router = router.route(
                    $path,
                    axum::routing::on(Method::$method.filter(), $module::$handler::<B>).route_layer(
                        axum::middleware::from_fn_with_state(
                            (state.clone(), $access),
                            authorize::<B>,
                        ),
                    ),
                );
            )*
            router
        }
    };
}

use Access::{Global, Namespace, Public, Scoped, Token};
use Role::{Admin, Deploy, Operate, Read};

route_table! {
    Get "/healthz", Public, Empty, 200 => system::healthz, "Liveness";
    Get "/openapi.json", Public, Empty, 200 => system::openapi_document, "This document";
    Get "/metrics", Global(Read), Empty, 200 => system::metrics, "Prometheus metrics (text format)";
    Get "/audit", Global(Admin), Query<AuditQuery>, 200 => system::audit,
        "The newest audit events (who changed or read what), optionally of one action";
    Get "/drift", Global(Read), Query<DriftQuery>, 200 => runtime::drift,
        "The drift sweep's findings per Agent: synced, drift (with the reason), unreachable, converging";
    Post "/drift/sweep", Global(Operate), Empty, 200 => runtime::sweep_now,
        "Run a drift sweep now (it never repairs) and answer its findings";

    Post "/namespaces", Scoped(Admin), Json<NewNamespace>, 201 => namespaces::create_namespace,
        "Create a Namespace on a host pool or a cluster (choosing either needs a global admin token)";
    Get "/namespaces", Token, Query<PageQuery>, 200 => namespaces::list_namespaces,
        "List the Namespaces the token may read";
    Get "/namespaces/{ns}", Namespace(Read), Empty, 200 => namespaces::get_namespace,
        "Get a Namespace, with its newest ensure or delete work (state, attempts, last code and message)";
    Delete "/namespaces/{ns}", Namespace(Admin), Empty, 202 => namespaces::delete_namespace,
        "Delete an empty Namespace (409 while it has Agents)";
    Post "/namespaces/{ns}/configurations", Namespace(Deploy), Json<NewConfiguration>, 201
        => namespaces::create_configuration, "Create a Configuration";
    Get "/namespaces/{ns}/configurations/{cfg}", Namespace(Read), Empty, 200
        => namespaces::get_configuration, "Get a Configuration's latest generation";
    Put "/namespaces/{ns}/configurations/{cfg}", Namespace(Deploy), Json<ConfigurationUpdate>, 200
        => namespaces::put_configuration, "Add a Configuration generation";

    Post "/namespaces/{ns}/secrets", Namespace(Deploy), Json<NewSecret>, 201 => secrets::set_secret,
        "Write a new version of a secret (its value is never returned, logged or audited; the answer is its version and sha256 fingerprint)";
    Get "/namespaces/{ns}/secrets", Namespace(Read), Empty, 200 => secrets::list_secrets,
        "List secrets: names, versions, fingerprints, who wrote them when, and which Agents' revisions use which version (never values)";
    Get "/namespaces/{ns}/secrets/{name}", Namespace(Read), Empty, 200 => secrets::get_secret,
        "One secret's versions and users (never its value)";
    Delete "/namespaces/{ns}/secrets/{name}", Namespace(Deploy), Empty, 204 => secrets::delete_secret,
        "Delete every version of a secret (409 naming the Agents while their current revisions bind it)";
    Post "/namespaces/{ns}/secrets/{name}/deploy", Namespace(Deploy), Empty, 202 => secrets::deploy_secret,
        "Deploy a new revision, bound to the newest version, to every Agent whose current revision binds an older one, all at once";
    Post "/namespaces/{ns}/secrets/{name}/rollouts", Namespace(Deploy), Json<NewSecretRollout>, 201
        => secrets::roll_out_secret,
        "Roll the newest version out as a rollout (canary, waves, failure budget) to every running Agent whose current revision binds an older one; each keeps its Configuration generation";

    Post "/namespaces/{ns}/agents", Namespace(Deploy), Json<NewAgent>, 201 => agents::create_agent,
        "Create an Agent";
    Get "/namespaces/{ns}/agents", Namespace(Read), Query<PageQuery>, 200 => agents::list_agents, "List Agents";
    Get "/namespaces/{ns}/agents/{agent}", Namespace(Read), Empty, 200 => agents::get_agent,
        "Get an Agent";
    Get "/namespaces/{ns}/agents/{agent}/workspace", Namespace(Read), Empty, 200 => agents::get_workspace,
        "The Agent's initial workspace files (names, sizes, sha256; never content) and their setup state: pending, applied, failed";
    Patch "/namespaces/{ns}/agents/{agent}", Namespace(Deploy), Json<AgentPatch>, 200 => agents::patch_agent,
        "Change an Agent's Configuration";
    Delete "/namespaces/{ns}/agents/{agent}", Namespace(Deploy), Empty, 202 => agents::delete_agent,
        "Delete an Agent";
    Post "/namespaces/{ns}/agents/{agent}/deploy", Namespace(Deploy), Query<DeployQuery>, 202
        => agents::deploy,
        "Deploy a new revision (with planToken: only while that plan is still current)";
    Post "/namespaces/{ns}/agents/{agent}/plan", Namespace(Deploy), Empty, 200 => plans::plan_deploy,
        "What deploying the next revision would change on its target (read-only), and the plan token";
    Post "/namespaces/{ns}/agents/{agent}/stop", Namespace(Operate), Empty, 202 => agents::stop,
        "Stop the Agent";
    Post "/namespaces/{ns}/agents/{agent}/reconcile", Namespace(Operate), Empty, 202
        => runtime::reconcile, "Re-apply the active revision (an audited deployment pass of the same revision)";
    Get "/namespaces/{ns}/agents/{agent}/revisions", Namespace(Read), Query<PageQuery>, 200
        => agents::list_revisions, "List revisions";
    Get "/namespaces/{ns}/agents/{agent}/revisions/{rev}", Namespace(Read), Empty, 200
        => agents::get_revision, "Get a revision";
    Get "/namespaces/{ns}/agents/{agent}/deployment-status", Namespace(Read), Empty, 200
        => agents::deployment_status, "Desired state, active and served revision, progress";
    Get "/namespaces/{ns}/agents/{agent}/work/{work}", Namespace(Read), Empty, 200
        => agents::get_work, "One work item (deploy, stop, delete) with its last attempt";
    Get "/namespaces/{ns}/agents/{agent}/runtime", Namespace(Read), Empty, 200 => runtime::runtime,
        "The Agent's unit or Pod now: state, restarts, last exit, memory, CPU, tasks, served revision (rate limited per token)";
    Get "/namespaces/{ns}/agents/{agent}/runtime/logs", Namespace(Read), Query<LogsQuery>, 200
        => runtime::logs, "One redacted page of the Agent's log (at most 1,000 lines and 512 KiB, audited, rate limited per token)";

    Post "/namespaces/{ns}/rollouts", Namespace(Deploy), Json<NewRollout>, 201
        => rollouts::create_rollout,
        "Roll a Configuration's latest generation out to many Agents: canary first, then waves of at most maxParallel, one failure budget";
    Post "/namespaces/{ns}/rollouts/plan", Namespace(Deploy), Json<NewRollout>, 200
        => plans::plan_rollout,
        "What the rollout would change on each Agent's target (read-only), and the plan token";
    Get "/namespaces/{ns}/rollouts", Namespace(Read), Empty, 200 => rollouts::list_rollouts,
        "The Namespace's newest rollouts (at most 50), newest first";
    Get "/namespaces/{ns}/rollouts/{rollout}", Namespace(Read), Empty, 200 => rollouts::get_rollout,
        "A rollout with every Agent's state, wave, revision and outcome";
    Post "/namespaces/{ns}/rollouts/{rollout}/pause", Namespace(Deploy), Empty, 200
        => rollouts::pause_rollout, "Pause a running rollout (deploys in flight finish)";
    Post "/namespaces/{ns}/rollouts/{rollout}/resume", Namespace(Deploy), Empty, 200
        => rollouts::resume_rollout, "Resume a paused rollout";
    Post "/namespaces/{ns}/rollouts/{rollout}/promote", Namespace(Deploy), Empty, 200
        => rollouts::promote_rollout,
        "Start the next wave of a rollout waiting for promotion (or skip the pause between waves)";
    Post "/namespaces/{ns}/rollouts/{rollout}/abort", Namespace(Deploy), Empty, 200
        => rollouts::abort_rollout,
        "Abort a rollout: Agents not started are skipped, the others stay as they are";

    Post "/hosts", Global(Admin), Json<NewHost>, 201 => hosts::enrol_host, "Enrol a host (pins its key)";
    Get "/hosts", Global(Admin), Query<PageQuery>, 200 => hosts::list_hosts, "List hosts";
    Get "/hosts/{host}", Global(Admin), Empty, 200 => hosts::get_host, "Get a host";
    Put "/hosts/{host}", Global(Admin), Json<HostUpdate>, 200 => hosts::update_host,
        "Re-pin a host's key, address or capacity";
    Delete "/hosts/{host}", Global(Admin), Empty, 204 => hosts::delete_host,
        "Forget a host (409 while a Namespace's pool names it)";
    Post "/hosts/{host}/probe", Global(Admin), Empty, 200 => hosts::probe_host,
        "Probe a host over SSH";

    Post "/clusters", Global(Admin), Json<NewCluster>, 201 => clusters::add_cluster,
        "Register a Kubernetes cluster (kubeconfig validated, then probed)";
    Get "/clusters", Global(Admin), Query<PageQuery>, 200 => clusters::list_clusters,
        "List clusters (never their credentials)";
    Get "/clusters/{cluster}", Global(Admin), Empty, 200 => clusters::get_cluster, "Get a cluster";
    Put "/clusters/{cluster}", Global(Admin), Json<ClusterUpdate>, 200 => clusters::update_cluster,
        "Replace a cluster's credentials and settings (validated, probed and access-checked like a registration)";
    Delete "/clusters/{cluster}", Global(Admin), Empty, 204 => clusters::delete_cluster,
        "Forget a cluster (409 while a Namespace uses it)";

    Post "/tokens", Global(Admin), Json<NewToken>, 201 => tokens::create_token,
        "Create a token (optionally expiring)";
    Delete "/tokens/{id}", Global(Admin), Empty, 204 => tokens::revoke_token, "Revoke a token";
}

#[cfg(test)]
mod tests {
    use super::*;

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
            if matches!(r.access, Namespace(_)) {
                assert!(r.path.starts_with("/namespaces/{ns}"), "{}", r.path);
            }
            if r.body.is_json() {
                assert_ne!(r.method, Method::Get, "{}", r.path);
            }
        }
    }
}
