//! The real-hosts tier through `occ`: coordinators, the store and real test hosts (systemd,
//! sshd, hostd) booted by `clawfleet-vm-tests`. Each module is one area of the product.

#[path = "../console_support/mod.rs"]
mod console_support;
#[path = "../fleet_support/mod.rs"]
mod fleet_support;

mod console;
mod defects;
mod egress;
mod fleet;
mod gateway_route;
mod gateway_tunnel;
mod ha;
mod hooks;
mod plan;
mod restore;
mod rollout;
mod runtime;
mod secrets;
mod workspace;
