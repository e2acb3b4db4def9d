//! The SSH tier: the coordinator's SSH backend against the real hostd behind a real sshd, on
//! loopback (`loopback`, `relay`, `enrol`) or on real test hosts (`hosts`).

#[path = "../api_support/mod.rs"]
mod api_support;
#[path = "../ssh_support/mod.rs"]
mod ssh_support;

mod enrol;
mod hosts;
mod loopback;
mod relay;
