//! hostd: the clawfleet helper on every host.
//!
//! It reads signed operations (see `clawfleet-protocol`), checks them against the host's
//! allowed_signers and identity, and realises them: per-Agent accounts, immutable revision
//! snapshots, the `current` pointer, and one hardened systemd unit per Agent.

pub mod system;
pub mod enrol;
pub mod real;
