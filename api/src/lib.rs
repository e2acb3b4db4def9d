//! The coordinator's HTTP API as a contract, with no I/O: the route table (method, path,
//! access, request, success status and response of every route), every request and response
//! type, and the OpenAPI document built from them. The coordinator serves it (its router is
//! built from [`route_table!`], and each handler must answer its route's response type); `occ`'s
//! client is [`client::Api`], generated from the same table.
//!
//! | module | what |
//! | --- | --- |
//! | [`routes`] | [`route_table!`], [`ROUTES`], [`Route`] |
//! | [`access`] | [`Access`]: who may call a route |
//! | [`model`] | the resources as answers show them (Namespace, Agent, Revision, …) |
//! | [`requests`] | request bodies and query strings |
//! | [`responses`] | every other answer |
//! | [`codes`] | every stable code ([`codes::AnyCode`]: the coordinator's [`codes::Code`] and the protocol's), with class, HTTP status and description |
//! | [`openapi`] | `/openapi.json` |
//! | [`client`] | [`client::Api`]: one typed method per route, over any [`client::Transport`] |

pub mod access;
pub mod client;
pub mod codes;
pub mod model;
pub mod openapi;
pub mod requests;
pub mod responses;
pub mod routes;

pub use access::Access;
pub use model::Role;
pub use routes::{Answer, Body, Method, ROUTES, Route};

/// Every type the route table names, by its name in the table.
pub mod types {
    pub use crate::model::*;
    pub use crate::openapi::OpenApiDocument;
    pub use crate::requests::*;
    pub use crate::responses::*;
}
