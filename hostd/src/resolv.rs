//! DNS for an Agent in its own network namespace (issue 28).
//!
//! The host's `/etc/resolv.conf` often names a resolver on the host's loopback (systemd-resolved's
//! stub, `127.0.0.53`), which an Agent's namespace cannot reach, and a resolver on a private
//! address (a cloud network's, `10.0.0.2`), which the Agent's egress policy denies. So each
//! Agent gets a `resolv.conf` of its own, bind-mounted over `/etc/resolv.conf` in its gateway
//! unit, naming resolvers it can reach, and its policy opens port 53 to exactly those:
//!
//! - `[network] dns` in `hostd.toml`, when the operator names them;
//! - else the IPv4 resolvers of `/etc/resolv.conf` that are not on a loopback;
//! - else, when it names only loopback ones, the upstream servers systemd-resolved lists in
//!   `/run/systemd/resolve/resolv.conf`.
//!
//! The file keeps the host's `search`, `domain` and `options` lines. An Agent's network unit
//! writes it when it makes the namespace, so a host whose resolvers change gives them to an
//! Agent when the Agent's network is made again (the next restart-class cutover or a reboot).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// The host's resolver configuration.
pub const ETC_RESOLV_CONF: &str = "/etc/resolv.conf";
/// systemd-resolved's list of the upstream servers behind its stub.
pub const RESOLVED_UPSTREAMS: &str = "/run/systemd/resolve/resolv.conf";
/// Where each Agent's own file is kept (a tmpfs: made again with the namespace at boot).
pub const AGENT_DIR: &str = "/run/clawfleet-net";

/// The Agent's file, by its network namespace's name.
pub fn agent_file(netns: &str) -> PathBuf {
    Path::new(AGENT_DIR).join(format!("{netns}.resolv.conf"))
}

/// What an Agent's `resolv.conf` holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolvers {
    /// Resolvers the Agent may reach on port 53.
    pub nameservers: Vec<Ipv4Addr>,
    /// The host's `search`, `domain` and `options` lines, as they are.
    pub lines: Vec<String>,
    /// Where the nameservers came from, for the log.
    pub source: &'static str,
}

/// The nameservers and kept lines of a `resolv.conf`.
fn parse(text: &str) -> (Vec<IpAddr>, Vec<String>) {
    let mut servers = Vec::new();
    let mut lines = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                // An IPv6 address may carry a zone (`fe80::1%eth0`): not one an Agent reaches.
                if let Some(Ok(ip)) = words.next().map(str::parse::<IpAddr>) {
                    servers.push(ip);
                }
            }
            Some("search" | "domain" | "options") => lines.push(line.to_owned()),
            _ => {}
        }
    }
    (servers, lines)
}

fn reachable(servers: &[IpAddr]) -> Vec<Ipv4Addr> {
    servers
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_unspecified() => Some(*v4),
            _ => None,
        })
        .collect()
}

/// The resolvers for Agents: `configured` when given, else found from the host's files
/// (`etc`, then `upstreams` when `etc` names only loopback resolvers). A file that cannot
/// be read counts as empty.
pub fn discover(configured: &[Ipv4Addr], etc: &Path, upstreams: &Path) -> Resolvers {
    let (servers, lines) = parse(&std::fs::read_to_string(etc).unwrap_or_default());
    if !configured.is_empty() {
        return Resolvers {
            nameservers: configured.to_vec(),
            lines,
            source: "[network] dns",
        };
    }
    let found = reachable(&servers);
    if !found.is_empty() || !servers.iter().any(IpAddr::is_loopback) {
        return Resolvers {
            nameservers: found,
            lines,
            source: ETC_RESOLV_CONF,
        };
    }
    let (upstream, _) = parse(&std::fs::read_to_string(upstreams).unwrap_or_default());
    Resolvers {
        nameservers: reachable(&upstream),
        lines,
        source: RESOLVED_UPSTREAMS,
    }
}

impl Resolvers {
    /// The Agent's `resolv.conf` text.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# Written by hostd for an Agent's network namespace (the host's resolvers it may reach).\n",
        );
        for ns in &self.nameservers {
            out.push_str(&format!("nameserver {ns}\n"));
        }
        for line in &self.lines {
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn files(etc: &str, upstreams: Option<&str>) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let e = d.path().join("resolv.conf");
        let u = d.path().join("upstreams.conf");
        std::fs::write(&e, etc).unwrap();
        if let Some(text) = upstreams {
            std::fs::write(&u, text).unwrap();
        }
        (d, e, u)
    }

    #[test]
    fn the_stub_resolver_gives_way_to_systemd_resolveds_upstreams() {
        let (_d, e, u) = files(
            "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch corp.example\n",
            Some("nameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver 2001:db8::53\n"),
        );
        let r = discover(&[], &e, &u);
        assert_eq!(r.nameservers, [Ipv4Addr::new(10, 0, 0, 2)]);
        assert_eq!(r.source, RESOLVED_UPSTREAMS);
        assert_eq!(
            r.render().lines().skip(1).collect::<Vec<_>>(),
            [
                "nameserver 10.0.0.2",
                "options edns0 trust-ad",
                "search corp.example"
            ]
        );
    }

    #[test]
    fn reachable_resolvers_of_the_host_are_kept_and_loopback_ones_dropped() {
        let (_d, e, u) = files(
            "nameserver 127.0.0.1\nnameserver 192.0.2.53\nnameserver ::1\n",
            Some("nameserver 10.9.9.9\n"),
        );
        let r = discover(&[], &e, &u);
        assert_eq!(r.nameservers, [Ipv4Addr::new(192, 0, 2, 53)]);
        assert_eq!(r.source, ETC_RESOLV_CONF);
    }

    #[test]
    fn configured_resolvers_win_and_nothing_found_is_empty() {
        let (_d, e, u) = files("nameserver 127.0.0.53\n", None);
        assert!(discover(&[], &e, &u).nameservers.is_empty());
        let r = discover(&[Ipv4Addr::new(10, 1, 1, 1)], &e, &u);
        assert_eq!(r.nameservers, [Ipv4Addr::new(10, 1, 1, 1)]);
        assert_eq!(r.source, "[network] dns");
        let missing = discover(&[], Path::new("/nonexistent/resolv.conf"), &u);
        assert!(missing.nameservers.is_empty());
    }
}
