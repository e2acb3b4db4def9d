//! The clawfleet coordinator: desired state in SQLite, the deployment worker, the HTTP API,
//! and the SSH backend that pushes signed operations to hostd.

pub mod api;
pub mod backend;
pub mod client;
pub mod config;
pub mod fake;
pub mod model;
pub mod render;
pub mod service;
pub mod ssh;
pub mod store;
pub mod tokens;
pub mod worker;
