//! The router, built from the API contract's route table (`clawfleet_api::route_table!`, the
//! one list of routes; `clawfleet_api::ROUTES` and `/openapi.json` come from it too): each
//! row's handler with its access check in front and its success status, and a compile-time
//! check that the handler answers the row's response type.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::MethodFilter;
use clawfleet_api::Method;

use super::access::authorize;
use super::{
    ApiError, AppState, NoContent, Paged, Reply, Text, agents, clusters, hosts, namespaces, plans,
    rollouts, runtime, secrets, system, tokens,
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

/// The handler as it is, once it is known to answer `O` (the row's response type).
fn answering<O, Args, H: Answers<Args, O>>(handler: H) -> H {
    handler
}

/// Gives a successful answer the route's success status from the table.
async fn success<const STATUS: u16>(mut response: Response) -> Response {
    if response.status().is_success()
        && let Ok(status) = StatusCode::from_u16(STATUS)
    {
        *response.status_mut() = status;
    }
    response
}

/// The type a handler answers for a row's response.
macro_rules! reply {
    (Json < $t:ident >) => { Reply<clawfleet_api::types::$t> };
    (List < $t:ident >) => { Reply<Vec<clawfleet_api::types::$t>> };
    (Page < $t:ident >) => { Paged<clawfleet_api::types::$t> };
    (Text) => { Text };
    (NoContent) => { NoContent };
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
                router = router.route(
                    $path,
                    axum::routing::on(
                        filter(Method::$method),
                        answering::<reply!($resp $(< $respty >)?), _, _>($module::$handler::<B>),
                    )
                    .route_layer(axum::middleware::map_response(success::<$success>))
                    .route_layer(axum::middleware::from_fn_with_state(
                        (
                            state.clone(),
                            clawfleet_api::Access::$access $((clawfleet_api::Role::$role))?,
                        ),
                        authorize::<B>,
                    )),
                );
            )*
            router
        }
    };
}

clawfleet_api::route_table!(add_routes);
