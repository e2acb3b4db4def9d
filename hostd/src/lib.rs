//! hostd: the clawfleet helper on every host.
//!
//! It reads signed operations (see `clawfleet-protocol`), checks them against the host's
//! allowed_signers and identity, and realises them: per-Agent accounts, immutable revision
//! snapshots, the `current` pointer, and one hardened systemd unit per Agent.

pub mod cgroup;
pub mod config;
pub mod engine;
pub mod enrol;
pub mod fake;
pub mod fault;
pub mod front;
pub mod fsutil;
pub mod gateway_rpc;
pub mod journal;
pub mod launch;
pub mod layout;
pub mod listener;
pub mod lock;
pub mod login_user;
pub mod markers;
pub mod netns;
pub mod priority;
pub mod quota;
pub mod real;
pub mod relay;
pub mod resolv;
pub mod secrets;
pub mod session;
pub mod sock_diag;
pub mod start_env;
pub mod supervise;
pub mod system;
pub mod trash;
pub mod uids;
pub mod unit;
pub mod unit_log;
