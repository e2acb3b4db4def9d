//! The in-process tier: the real API, service, worker and stores, with hosts as hostd's engine
//! in this process (`hostd_engine`) and a real sshd only where a test starts one. No root, no
//! test host.

#[path = "../api_support/mod.rs"]
mod api_support;
#[path = "../console_support/mod.rs"]
mod console_support;
#[path = "../hostd_engine/mod.rs"]
mod hostd_engine;

mod api;
mod api_codes;
mod api_hardening;
mod api_secrets;
mod cli;
mod cluster_registration;
mod config_refusals;
mod console;
mod gateway_access;
mod gateway_route;
mod init;
mod kube_secret_resolver;
mod rollouts;
mod schemathesis;
mod store_suite;
mod worker_codes;
mod worker_secrets;
mod worker_state_machine;

mod fixtures;
