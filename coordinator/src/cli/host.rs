//! `occ host`: enrolled hosts, their pinned keys and probes.

use anyhow::{Context, Result};
use clap::Subcommand;
use coordinator::client::Client;
use coordinator::service::{HostUpdate, NewHost};
use serde_json::Value;

use super::Cli;
use super::table::print;

#[derive(Subcommand, Debug)]
pub(crate) enum HostCmd {
    /// Enrol a host: pins its SSH host key.
    Enrol {
        name: String,
        /// The host's IP address or DNS name.
        #[arg(long)]
        address: String,
        /// The host's SSH port.
        #[arg(long, default_value_t = 22)]
        port: u16,
        /// The host's public key line, or a path to it.
        #[arg(long)]
        host_key: String,
        /// How many Agents the host may run.
        #[arg(long, default_value_t = 100)]
        max_agents: u32,
        /// Re-pin an already enrolled host (after a legitimate re-key or move).
        #[arg(long)]
        replace: bool,
    },
    /// List enrolled hosts.
    List,
    /// Show one host and its last probe.
    Get { name: String },
    /// Probe a host over SSH: hostd's version, systemd, tools and Agents.
    Probe { name: String },
    /// Forget a host that no Namespace pool and no Agent uses.
    Remove { name: String },
}

/// Prints what a probe found missing, so an operator sees it at enrolment and probe time.
fn report_probe(name: &str, probe: &Value) {
    let missing: Vec<&str> = probe["missingTools"]
        .as_array()
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !missing.is_empty() {
        eprintln!(
            "warning: host {name} lacks {}; deploys there fail (GATEWAY_COMMAND_MISSING or MISSING_TOOL) until it is installed",
            missing.join(", ")
        );
    }
    let fenced = probe["protocolVersions"].as_array().is_some_and(|v| {
        v.iter()
            .any(|x| x.as_u64() == Some(u64::from(clawfleet_protocol::FENCED_VERSION)))
    });
    if !fenced {
        eprintln!(
            "warning: host {name} runs a hostd from before fencing (protocol versions {}); it works, unfenced: upgrade it before running several coordinators",
            probe["protocolVersions"]
        );
    }
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &HostCmd) -> Result<()> {
    match cmd {
        HostCmd::Enrol {
            name,
            address,
            port,
            host_key,
            max_agents,
            replace,
        } => {
            let key = if host_key.starts_with("ssh-") {
                host_key.clone()
            } else {
                std::fs::read_to_string(host_key)
                    .with_context(|| format!("cannot read {host_key}"))?
            };
            let v = if *replace {
                c.send(
                    "PUT",
                    &format!("/hosts/{name}"),
                    &HostUpdate {
                        address: address.clone(),
                        port: *port,
                        host_key: key.trim().to_owned(),
                        max_agents: *max_agents,
                    },
                )?
            } else {
                c.send(
                    "POST",
                    "/hosts",
                    &NewHost {
                        name: name.clone(),
                        address: address.clone(),
                        port: *port,
                        host_key: key.trim().to_owned(),
                        max_agents: *max_agents,
                    },
                )?
            };
            print(
                cli,
                &v,
                &[
                    ("HOST", "name"),
                    ("ADDRESS", "address"),
                    ("FINGERPRINT", "fingerprint"),
                ],
            );
            // Probe at once, so a host that lacks the gateway command says so now.
            match c.request("POST", &format!("/hosts/{name}/probe"), None) {
                Ok(probe) => report_probe(name, &probe),
                Err(e) => eprintln!(
                    "note: host {name} is enrolled but its probe failed ({e}); run `occ host probe {name}` once hostd is enrolled there"
                ),
            }
        }
        HostCmd::List => print(
            cli,
            &c.request("GET", "/hosts", None)?,
            &[
                ("HOST", "name"),
                ("ADDRESS", "address"),
                ("PORT", "port"),
                ("MAX", "maxAgents"),
                ("FENCING", "fencing"),
                ("FINGERPRINT", "fingerprint"),
            ],
        ),
        HostCmd::Get { name } => print(
            cli,
            &c.request("GET", &format!("/hosts/{name}"), None)?,
            &[],
        ),
        HostCmd::Remove { name } => {
            c.request("DELETE", &format!("/hosts/{name}"), None)?;
            println!("host {name} removed");
        }
        HostCmd::Probe { name } => {
            let v = c.request("POST", &format!("/hosts/{name}/probe"), None)?;
            print(cli, &v, &[]);
            report_probe(name, &v);
        }
    }
    Ok(())
}
