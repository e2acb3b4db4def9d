//! The router, built from the API contract's route table (`clawfleet_api::route_table!`, the
//! one list of routes; `clawfleet_api::ROUTES` and `/openapi.json` come from it too): each
//! row's handler with its access check in front and its success status, and compile-time
//! checks that the handler decodes the row's request type and answers its response type.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::MethodFilter;
use clawfleet_api::Method;

use super::access::authorize;
use super::extract::{StrictJson, StrictQuery};
use super::{
    ApiError, AppState, NoContent, Paged, Reply, Text, agents, clusters, gateway, gateway_proxy,
    hosts, namespaces, plans, rollouts, runtime, secrets, system, tokens,
};
use crate::backend::Backend;

fn filter(method: Method) -> MethodFilter {
    match method {
        Method::Get => MethodFilter::GET,
        Method::Post => MethodFilter::POST,
        Method::Put => MethodFilter::PUT,
        Method::Patch => MethodFilter::PATCH,
        Method::Delete => MethodFilter::DELETE,
    }
}

/// A handler whose future ends in `Result<O, ApiError>`, whatever its extractors (`Args`).
trait Answers<Args, O> {}

macro_rules! answers {
    ($($arg:ident),*) => {
        impl<F, Fut, O, $($arg,)*> Answers<($($arg,)*), O> for F
        where
            F: FnOnce($($arg),*) -> Fut,
            Fut: Future<Output = Result<O, ApiError>>,
        {
        }
    };
}

answers!();
answers!(A1);
answers!(A1, A2);
answers!(A1, A2, A3);
answers!(A1, A2, A3, A4);
answers!(A1, A2, A3, A4, A5);
answers!(A1, A2, A3, A4, A5, A6);
answers!(A1, A2, A3, A4, A5, A6, A7);

/// The position of an extractor among a handler's arguments.
struct At<const N: usize>;

/// No extractor is required.
struct Nothing;

/// A handler's arguments (`Self`, a tuple) include the extractor `X` (at `P`).
trait Takes<X, P> {}

impl<T> Takes<(), Nothing> for T {}

macro_rules! takes {
    ($k:literal; [$($before:ident)*]; [$($after:ident)*]) => {
        impl<X, $($before,)* $($after,)*> Takes<X, At<$k>> for ($($before,)* X, $($after,)*) {}
    };
}

// One impl per arity (1 to 7 extractors) and position.
takes!(0; []; []);
takes!(0; []; [A1]);
takes!(1; [B1]; []);
takes!(0; []; [A1 A2]);
takes!(1; [B1]; [A1]);
takes!(2; [B1 B2]; []);
takes!(0; []; [A1 A2 A3]);
takes!(1; [B1]; [A1 A2]);
takes!(2; [B1 B2]; [A1]);
takes!(3; [B1 B2 B3]; []);
takes!(0; []; [A1 A2 A3 A4]);
takes!(1; [B1]; [A1 A2 A3]);
takes!(2; [B1 B2]; [A1 A2]);
takes!(3; [B1 B2 B3]; [A1]);
takes!(4; [B1 B2 B3 B4]; []);
takes!(0; []; [A1 A2 A3 A4 A5]);
takes!(1; [B1]; [A1 A2 A3 A4]);
takes!(2; [B1 B2]; [A1 A2 A3]);
takes!(3; [B1 B2 B3]; [A1 A2]);
takes!(4; [B1 B2 B3 B4]; [A1]);
takes!(5; [B1 B2 B3 B4 B5]; []);
takes!(0; []; [A1 A2 A3 A4 A5 A6]);
takes!(1; [B1]; [A1 A2 A3 A4 A5]);
takes!(2; [B1 B2]; [A1 A2 A3 A4]);
takes!(3; [B1 B2 B3]; [A1 A2 A3]);
takes!(4; [B1 B2 B3 B4]; [A1 A2]);
takes!(5; [B1 B2 B3 B4 B5]; [A1]);
takes!(6; [B1 B2 B3 B4 B5 B6]; []);

/// The handler as it is, once it is known to answer `O` (the row's response type) and to
/// decode `X` (the row's request: `StrictJson<T>`, `StrictQuery<T>`, or `()` for none).
fn bind<O, X, Args, P, H>(handler: H) -> H
where
    H: Answers<Args, O>,
    Args: Takes<X, P>,
{
    handler
}

/// The router's paths of a table path: itself, but for a gateway route (ending in
/// `{path}`, the rest of the path with its slashes) the prefix with a wildcard, the prefix
/// alone (the gateway's root), and the prefix without its last slash: the Control UI opens
/// its WebSocket there, and a browser given that address is redirected to the root
/// (`gateway_proxy`).
fn axum_paths(path: &'static str) -> Vec<String> {
    match path.strip_suffix(clawfleet_api::routes::PROXY_PATH_PARAM) {
        Some(prefix) => vec![
            format!("{prefix}{{*path}}"),
            prefix.to_owned(),
            prefix.trim_end_matches('/').to_owned(),
        ],
        None => vec![path.to_owned()],
    }
}

/// Gives a successful answer the route's success status from the table.
async fn success<const STATUS: u16>(mut response: Response) -> Response {
    if response.status().is_success()
        && !gateway_proxy::is_pass_through(&response)
        && let Ok(status) = StatusCode::from_u16(STATUS)
    {
        *response.status_mut() = status;
    }
    response
}

/// The extractor a handler decodes a row's request with.
macro_rules! decodes {
    (Empty) => { () };
    (Upgrade) => { () };
    (Proxy) => { () };
    (Json < $t:ident >) => { StrictJson<clawfleet_api::types::$t> };
    (Query < $t:ident >) => { StrictQuery<clawfleet_api::types::$t> };
}

/// The type a handler answers for a row's response.
macro_rules! reply {
    (Json < $t:ident >) => { Reply<clawfleet_api::types::$t> };
    (List < $t:ident >) => { Reply<Vec<clawfleet_api::types::$t>> };
    (Page < $t:ident >) => { Paged<clawfleet_api::types::$t> };
    (Text) => { Text };
    (NoContent) => { NoContent };
    (Upgrade) => { gateway::Switching };
    (Proxy) => { gateway_proxy::Proxied };
}

macro_rules! add_routes {
    ($( $method:ident $path:literal, $access:ident $(($role:ident))?,
        $req:ident $(< $reqty:ident >)? -> $success:literal $resp:ident $(< $respty:ident >)?
        => $module:ident :: $handler:ident, $summary:literal; )*) => {
        /// Adds every route of the table: its access check in front of its handler, and the
        /// table's success status on its answer.
        pub(super) fn add_routes<B: Backend>(
            mut router: Router<Arc<AppState<B>>>,
            state: &Arc<AppState<B>>,
        ) -> Router<Arc<AppState<B>>> {
            $(
                let method_router = axum::routing::on(
                        filter(Method::$method),
                        bind::<reply!($resp $(< $respty >)?), decodes!($req $(< $reqty >)?), _, _, _>(
                            $module::$handler::<B>,
                        ),
                    )
                    .route_layer(axum::middleware::map_response(success::<$success>))
                    .route_layer(axum::middleware::from_fn_with_state(
                        (
                            state.clone(),
                            clawfleet_api::Access::$access $((clawfleet_api::Role::$role))?,
                        ),
                        authorize::<B>,
                    ));
                for path in axum_paths($path) {
                    router = router.route(&path, method_router.clone());
                }
            )*
            router
        }
    };
}

clawfleet_api::route_table!(add_routes);
