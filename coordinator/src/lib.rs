//! The clawfleet coordinator: desired state in SQLite, the deployment worker, the HTTP API,
//! the SSH backend that pushes signed operations to hostd, and the dispatch to the Kubernetes
//! backend for cluster Namespaces.

pub mod api;
pub mod backend;
pub mod backends;
pub mod backoff;
pub mod client;
pub mod clock;
pub mod codes;
pub mod config;
pub mod control;
pub mod fault;
pub mod metrics;
pub mod model;
pub mod render;
pub mod service;
pub mod ssh;
pub mod store;
pub mod targets;
pub mod tokens;
pub mod worker;
