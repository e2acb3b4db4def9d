//! `occ host`: enrolled hosts, their pinned keys and probes.

use anyhow::{Context, Result};
use clap::Subcommand;
use clawfleet_api::types::{Host, HostProbe, HostUpdate, Jump, NewHost};
use clawfleet_protocol::OperationResult;
use coordinator::client::{Api, Client, all_pages};

use super::Cli;
use super::out::{note, say};
use super::table::{Column, col, print_fields, print_one, print_rows};

const ENROLLED_COLUMNS: &[Column<Host>] = &[
    col("HOST", |h| h.name.to_string()),
    col("ADDRESS", |h| h.address.clone()),
    col("FINGERPRINT", |h| h.fingerprint.clone()),
];

const LIST_COLUMNS: &[Column<Host>] = &[
    col("HOST", |h| h.name.to_string()),
    col("ADDRESS", |h| h.address.clone()),
    col("PORT", |h| h.port.to_string()),
    col("MAX", |h| h.max_agents.to_string()),
    col("FENCING", |h| h.fencing.as_str().to_owned()),
    col("FINGERPRINT", |h| h.fingerprint.clone()),
];

#[derive(Subcommand, Debug)]
pub(crate) enum HostCmd {
    /// Enrol a host: pins its SSH host key (refused when hostd there answers to another name).
    Enrol {
        /// hostd's host name there (`host_name` in its hostd.toml, else /etc/hostname): every
        /// operation is addressed to it, and hostd refuses any other.
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
        /// Log in as this user, on a host that forbids root login (`hostd enrol --login-user`).
        #[arg(long)]
        login_user: Option<String>,
        /// Reach the host through this jump host: ADDRESS or ADDRESS:PORT (as the jump host
        /// resolves --address).
        #[arg(long, requires = "jump_host_key")]
        jump: Option<String>,
        /// The jump host's public key line, or a path to it (pinned like the host's).
        #[arg(long, requires = "jump")]
        jump_host_key: Option<String>,
        /// The account on the jump host (it only forwards); default: the coordinator's.
        #[arg(long, requires = "jump")]
        jump_login_user: Option<String>,
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
/// `sharing`: the Namespaces whose pools name the host.
fn report_probe(name: &str, probe: &HostProbe, sharing: &[String]) {
    for warning in probe_warnings(name, probe, sharing) {
        note(&warning);
    }
}

/// The Namespaces whose pools name `host` (none when they cannot be listed: the warnings
/// then say only what the host lacks).
fn sharing(c: &Client, host: &str) -> Vec<String> {
    all_pages(None, |q| c.list_namespaces([], q))
        .map(|all| {
            all.into_iter()
                .filter(|n| n.hosts.iter().any(|h| h == host))
                .map(|n| n.id.to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The warnings of [`report_probe`], one sentence each.
fn probe_warnings(name: &str, probe: &HostProbe, sharing: &[String]) -> Vec<String> {
    let OperationResult::Probe(probe) = &probe.0 else {
        return vec![format!(
            "warning: host {name} answered the probe with a {:?} result",
            probe.0.kind()
        )];
    };
    let mut out = Vec::new();
    if !probe.missing_tools.is_empty() {
        out.push(format!(
            "warning: host {name} lacks {}; deploys there fail (GATEWAY_COMMAND_MISSING or MISSING_TOOL) until it is installed",
            probe.missing_tools.join(", ")
        ));
    }
    if !probe
        .protocol_versions
        .contains(&clawfleet_protocol::FENCED_VERSION)
    {
        out.push(format!(
            "warning: host {name} runs a hostd from before fencing (protocol versions [{}]); it works, unfenced: upgrade it before running several coordinators",
            super::table::list(&probe.protocol_versions)
        ));
    }
    out.extend(gap_warnings(
        name,
        &serde_json::to_value(probe).unwrap_or_default(),
        sharing,
    ));
    out
}

/// What a host's probe (as stored) says it lacks to be shared by Namespaces
/// ([`clawfleet_api::model::SHARED_HOST_NEEDS`]), one warning each; `sharing`: the Namespaces
/// whose pools name it, which the coordinator no longer refuses when they are already there.
fn gap_warnings(name: &str, probe: &serde_json::Value, sharing: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (need, why) in clawfleet_api::model::shared_host_gaps(probe) {
        let code = need.code.as_str();
        out.push(if sharing.len() > 1 {
            format!(
                "warning: host {name} {} ({why}), yet Namespaces {} share it: the coordinator refuses only new ones ({code}); move all but one of them to other hosts, or make {name} able to",
                need.cannot,
                sharing.join(", ")
            )
        } else {
            format!(
                "warning: host {name} {} ({why}); it takes Agents of one Namespace only (a second is refused with {code})",
                need.cannot
            )
        });
    }
    out
}

/// A public key given as its line, or as a path to a file holding it.
fn key_line(arg: &str) -> Result<String> {
    if arg.starts_with("ssh-") {
        return Ok(arg.to_owned());
    }
    Ok(std::fs::read_to_string(arg)
        .with_context(|| format!("cannot read {arg}"))?
        .trim()
        .to_owned())
}

/// `--jump ADDRESS[:PORT]` (an IPv6 address in brackets when a port follows).
fn parse_jump(arg: &str, host_key: String, login_user: Option<String>) -> Result<Jump> {
    let (address, port) = match arg.rsplit_once(':') {
        Some((a, p)) if !a.contains(':') || a.starts_with('[') => (
            a.trim_start_matches('[').trim_end_matches(']'),
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .with_context(|| format!("--jump {arg}: the port {p:?} is not 1 to 65535"))?,
        ),
        _ => (arg, 22),
    };
    anyhow::ensure!(!address.is_empty(), "--jump {arg}: no address");
    Ok(Jump {
        address: address.to_owned(),
        port,
        host_key,
        login_user,
    })
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
            login_user,
            jump,
            jump_host_key,
            jump_login_user,
        } => {
            let key = key_line(host_key)?;
            let jump = match (jump, jump_host_key) {
                (Some(j), Some(k)) => Some(parse_jump(j, key_line(k)?, jump_login_user.clone())?),
                _ => None,
            };
            let v = if *replace {
                c.update_host(
                    [name],
                    &HostUpdate {
                        address: address.clone(),
                        port: *port,
                        host_key: key.trim().to_owned(),
                        max_agents: *max_agents,
                        login_user: login_user.clone(),
                        jump: jump.clone(),
                    },
                )?
            } else {
                c.enrol_host(
                    [],
                    &NewHost {
                        name: name.clone(),
                        address: address.clone(),
                        port: *port,
                        host_key: key.trim().to_owned(),
                        max_agents: *max_agents,
                        login_user: login_user.clone(),
                        jump,
                    },
                )?
            };
            print_one(cli, &v, ENROLLED_COLUMNS);
            // Probe at once, so a host that lacks the gateway command says so now.
            match c.probe_host([name]) {
                Ok(probe) => report_probe(name, &probe, &sharing(c, name)),
                Err(e) => note(&format!(
                    "note: host {name} is enrolled, but its probe failed: {e}. If hostd is not enrolled there yet, run the `occ enrol-command` line on the host, then `occ host probe {name}`"
                )),
            }
        }
        HostCmd::List => print_rows(
            cli,
            &all_pages(None, |q| c.list_hosts([], q))?,
            LIST_COLUMNS,
        ),
        HostCmd::Get { name } => {
            let host = c.get_host([name])?;
            print_fields(cli, &host);
            if let Some(probe) = &host.last_probe {
                for warning in gap_warnings(name, probe, &sharing(c, name)) {
                    note(&warning);
                }
            }
        }
        HostCmd::Remove { name } => {
            c.delete_host([name])?;
            say(&format!("host {name} removed"));
        }
        HostCmd::Probe { name } => {
            let v = c.probe_host([name])?;
            print_fields(cli, &v);
            report_probe(name, &v, &sharing(c, name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawfleet_protocol::result::{PortRange, ProbeResult};

    fn probe(network_isolation: Option<&str>) -> HostProbe {
        probe_with(network_isolation, None)
    }

    fn probe_with(network_isolation: Option<&str>, quotas: Option<&str>) -> HostProbe {
        HostProbe(OperationResult::Probe(ProbeResult {
            hostd_version: "0.1.0".into(),
            protocol_versions: vec![clawfleet_protocol::FENCED_VERSION],
            system_host_name: "h".into(),
            host_key: serde_json::from_value(serde_json::json!(
                "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"
            ))
            .expect("a fingerprint"),
            systemd_version: None,
            missing_tools: vec![],
            port_range: PortRange {
                start: 18700,
                end: 18799,
            },
            max_agents: 10,
            agents: 0,
            quotas: quotas.map(str::to_owned),
            network_isolation: network_isolation.map(str::to_owned),
        }))
    }

    #[test]
    fn an_unisolated_host_is_named_with_what_is_missing() {
        assert!(probe_warnings("h1", &probe(Some("namespaces")), &[]).is_empty());
        assert!(probe_warnings("h1", &probe(None), &[]).is_empty());
        let w = probe_warnings(
            "h1",
            &probe(Some("unavailable: no CAP_NET_ADMIN; binds not confined")),
            &[],
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("host h1 cannot isolate")
                && w[0].contains("no CAP_NET_ADMIN")
                && w[0].contains(clawfleet_api::codes::Code::HostNotIsolated.as_str()),
            "{w:?}"
        );
    }

    /// Issue 26, N6: a host without per-Agent quotas is named with what is missing and the
    /// code a second Namespace gets; a host already shared when its probe says so names the
    /// Namespaces sharing it.
    #[test]
    fn a_host_without_quotas_is_named_with_what_is_missing_and_who_shares_it() {
        let enforced = probe_with(Some("namespaces"), Some("enforced: project quotas"));
        assert!(probe_warnings("h1", &enforced, &["a".into(), "b".into()]).is_empty());
        let lacking = probe_with(
            Some("namespaces"),
            Some("unavailable: the file system of /var/lib/clawfleet has no project quotas"),
        );
        let w = probe_warnings("h1", &lacking, &["a".into()]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("host h1 cannot limit each Agent's disk")
                && w[0].contains("has no project quotas")
                && w[0].contains(clawfleet_api::codes::Code::HostNotQuotaLimited.as_str()),
            "{w:?}"
        );
        let w = probe_warnings("h1", &lacking, &["a".into(), "b".into()]);
        assert!(
            w.len() == 1 && w[0].contains("yet Namespaces a, b share it"),
            "{w:?}"
        );
    }
}
