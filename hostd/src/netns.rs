//! Each Agent's own network namespace (issue 28), held by systemd: the Agent's
//! `clawfleet-net-<hash>.service` runs with `PrivateNetwork=yes` and `RemainAfterExit=yes`,
//! and its gateway and front units join that namespace (`JoinsNamespaceOf=`). systemd keeps it
//! while those units are loaded and removes it, with the Agent's veth pair, when they stop;
//! it is made again at every boot. The gateway listens on the loopback inside it, which no
//! sibling Agent can reach or bind, on any kernel (no Landlock needed).
//!
//! Nothing is bound under `/run/netns`: a bound namespace is an entry (two, with iproute2's
//! shared `/run/netns`) in the host's mount table, which systemd reads whole at every
//! hardened unit's start, so each Agent made every later gateway start slower (the Agent
//! unit's sandbox took 85 ms with no other Agent, 223 ms beside 100).
//!
//! `hostd netns-up` runs inside the namespace (and refuses to run in the host's); it reaches
//! the host's namespace, through PID 1's, only from a thread of its own ([`run_in`]): a
//! network namespace is a per-thread attribute, a command started from that thread runs in
//! it, and a socket keeps the namespace it was made in. hostd finds an Agent's namespace
//! through a process of its gateway's unit ([`of_unit`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

/// Where hostd before systemd-held namespaces bound them (iproute2's place): an Agent's
/// namespace still bound there is removed when its network unit stops.
pub const RUN_DIR: &str = "/run/netns";

/// PID 1's network namespace: the host's.
const HOST_NETNS: &str = "/proc/1/ns/net";

/// Where iproute2's `ip` may be; the first that exists is used.
const IP_PATHS: [&str; 4] = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];

/// Why a namespace could not be made, removed or entered.
#[derive(Debug, Error)]
pub enum NetnsError {
    #[error("iproute2's ip is not installed (looked for {})", IP_PATHS.join(", "))]
    NoIp,
    #[error("`ip {args}` failed: {detail}")]
    Ip { args: String, detail: String },
    #[error("cannot enter the network namespace {path}: {source}")]
    Enter {
        path: String,
        source: std::io::Error,
    },
    #[error("the thread that entered the network namespace {path} ended abnormally")]
    Thread { path: String },
    #[error(
        "hostd netns-up runs only inside the Agent's own network namespace (its unit's PrivateNetwork=yes), not in the host's"
    )]
    HostNamespace,
}

/// The namespace name of the Agent whose unit is `unit_name`
/// (`clawfleet-agent-<h>.service` → `clawfleet-<h>`).
pub fn name_for_unit(unit_name: &str) -> String {
    let hash = unit_name
        .strip_prefix("clawfleet-agent-")
        .and_then(|r| r.strip_suffix(".service"))
        .unwrap_or(unit_name);
    format!("clawfleet-{hash}")
}

/// Where the old layout bound the namespace.
pub fn path(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(name)
}

/// Whether `name` is a name [`name_for_unit`] gives: nothing else reaches `ip`.
pub fn is_name(name: &str) -> bool {
    name.strip_prefix("clawfleet-")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn ip_binary() -> Result<&'static str, NetnsError> {
    IP_PATHS
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .ok_or(NetnsError::NoIp)
}

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    run(ip_binary()?, args, &args.join(" "))
}

/// Runs `program` with `args`; a failure names it as `ip {shown}` ([`NetnsError::Ip`]) with
/// what it printed.
fn run(program: &str, args: &[&str], shown: &str) -> Result<(), NetnsError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| NetnsError::Ip {
            args: shown.to_owned(),
            detail: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetnsError::Ip {
        args: shown.to_owned(),
        detail: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// In the Agent's own namespace (its network unit's, where this runs): the loopback up, and
/// with `egress` its way out. Idempotent (the unit's reload runs it again).
pub fn up(name: &str, egress: Option<&Egress>) -> Result<(), NetnsError> {
    if in_host_namespace()? {
        return Err(NetnsError::HostNamespace);
    }
    ip(&["link", "set", "lo", "up"])?;
    if let Some(egress) = egress {
        egress.plumb(name)?;
    }
    Ok(())
}

/// Whether this thread is in the host's network namespace (PID 1's).
fn in_host_namespace() -> Result<bool, NetnsError> {
    Ok(ns_id(Path::new("/proc/thread-self/ns/net"))? == ns_id(Path::new(HOST_NETNS))?)
}

/// What identifies the namespace a `/proc/…/ns/net` file (or a link to one) is.
fn ns_id(path: &Path) -> Result<(u64, u64), NetnsError> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|source| NetnsError::Enter {
            path: path.display().to_string(),
            source,
        })
}

/// Writes the Agent's `resolv.conf` ([`crate::resolv`]), or removes a stale one when no
/// resolver is left for it (the gateway then sees the host's file).
pub fn write_resolv_conf(
    name: &str,
    resolvers: &crate::resolv::Resolvers,
) -> Result<(), NetnsError> {
    let file = crate::resolv::agent_file(name);
    let fail = |e: crate::fsutil::FsError| NetnsError::Ip {
        args: format!("write {}", file.display()),
        detail: e.to_string(),
    };
    if resolvers.nameservers.is_empty() {
        return crate::fsutil::remove_file_if_present(&file)
            .map(|_| ())
            .map_err(fail);
    }
    crate::fsutil::ensure_dir(Path::new(crate::resolv::AGENT_DIR), 0o755).map_err(fail)?;
    crate::fsutil::write_atomic(&file, resolvers.render().as_bytes(), 0o644, |_| Ok(()))
        .map_err(fail)
}

/// At the network unit's stop: removes the Agent's `resolv.conf` and the host side of its
/// veth pair (systemd removes the namespace itself once its units stopped), and a namespace
/// the old layout bound under [`RUN_DIR`]; succeeds when they are not there.
pub fn down(name: &str) -> Result<(), NetnsError> {
    let resolv = crate::resolv::agent_file(name);
    crate::fsutil::remove_file_if_present(&resolv).map_err(|e| NetnsError::Ip {
        args: format!("remove {}", resolv.display()),
        detail: e.to_string(),
    })?;
    let host_link = host_link_name(name);
    in_host(move || {
        if ip(&["link", "show", "dev", &host_link]).is_ok() {
            ip(&["link", "delete", &host_link])?;
        }
        Ok(())
    })?;
    if path(name).exists() {
        // The unit runs in a mount namespace of its own (PrivateTmp=), whose unmounts do not
        // reach the host's: the old binding is removed in PID 1's.
        let ip = ip_binary()?;
        run(
            "nsenter",
            &["--mount=/proc/1/ns/mnt", "--", ip, "netns", "delete", name],
            &format!("netns delete {name} (in PID 1's mount namespace, through nsenter)"),
        )?;
    }
    Ok(())
}

/// Runs `f` on a thread in the host's network namespace (commands it starts run there).
fn in_host<T, F>(f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, NetnsError> + Send + 'static,
{
    run_in(Path::new(HOST_NETNS), f)?
}

/// The host side of an Agent's veth pair: `cfh` and 12 hex of its hash (15 characters, the
/// kernel's limit).
pub fn host_link_name(name: &str) -> String {
    let hash = name.strip_prefix("clawfleet-").unwrap_or(name);
    format!("cfh{}", &hash[..hash.len().min(12)])
}

/// Where Agents' veth pairs take their addresses: a /30 per Agent at 4 × its port, in the
/// shared address space (RFC 6598), which the egress policy denies as a destination.
pub const EGRESS_NET: [u8; 4] = [100, 64, 0, 0];
/// [`EGRESS_NET`]'s prefix length: 4 × 65,536 addresses.
pub const EGRESS_PREFIX: u8 = 14;

/// Destinations an Agent never reaches, whatever the ports allowed: private (RFC 1918),
/// shared (RFC 6598, where the veth pairs live), loopback, link-local (the cloud metadata
/// address 169.254.169.254 among them), this network, IETF protocol assignments, benchmarking,
/// multicast and reserved. The Kubernetes backend's default NetworkPolicy says the same.
pub const DENIED_V4: [&str; 10] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
];

/// An Agent's way out (issue 28): a veth pair to the host, masqueraded there, and a policy
/// in the Agent's namespace (which the Agent, without capabilities, cannot change): TCP to
/// `ports` on public addresses, plus `allow` (CIDRs the operator opens, on any port), DNS to
/// the resolvers of its `resolv.conf` ([`crate::resolv`], even on private addresses) and to
/// public ones; nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    /// The Agent's port: its /30 is at 4 × port in [`EGRESS_NET`].
    pub port: u16,
    /// TCP ports allowed to public addresses.
    pub ports: Vec<u16>,
    /// IPv4 CIDRs allowed on any port (checked before the denied ranges).
    pub allow: Vec<clawfleet_protocol::egress::Cidr>,
    /// The resolvers the Agent's `resolv.conf` names: port 53 to them is allowed (checked
    /// before the denied ranges).
    pub resolvers: Vec<std::net::Ipv4Addr>,
}

impl Egress {
    /// (host side, Agent side) addresses of the Agent's /30.
    pub fn addresses(&self) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
        let base = u32::from(std::net::Ipv4Addr::from(EGRESS_NET)) + u32::from(self.port) * 4;
        (
            std::net::Ipv4Addr::from(base + 1),
            std::net::Ipv4Addr::from(base + 2),
        )
    }

    /// The Agent namespace's nftables ruleset.
    pub fn agent_rules(&self) -> String {
        // An nftables set's elements.
        fn set<T: std::fmt::Display>(items: &[T]) -> String {
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
        let allow = if self.allow.is_empty() {
            String::new()
        } else {
            format!("        ip daddr {{ {} }} accept\n", set(&self.allow))
        };
        let tcp = if self.ports.is_empty() {
            String::new()
        } else {
            format!("        tcp dport {{ {} }} accept\n", set(&self.ports))
        };
        let resolvers = if self.resolvers.is_empty() {
            String::new()
        } else {
            let list = set(&self.resolvers);
            format!(
                "        ip daddr {{ {list} }} udp dport 53 accept\n        ip daddr {{ {list} }} tcp dport 53 accept\n"
            )
        };
        format!(
            "table inet clawfleet\ndelete table inet clawfleet\ntable inet clawfleet {{\n    chain output {{\n        type filter hook output priority filter; policy drop;\n        oifname \"lo\" accept\n        ct state established,related accept\n{allow}{resolvers}        ip daddr {{ {denied} }} drop\n        meta nfproto ipv6 drop\n{tcp}        udp dport 53 accept\n        tcp dport 53 accept\n    }}\n    chain input {{\n        type filter hook input priority filter; policy drop;\n        iifname \"lo\" accept\n        ct state established,related accept\n    }}\n}}\n",
            denied = DENIED_V4.join(", ")
        )
    }

    /// The host's nftables ruleset, shared by every Agent: masquerade what leaves from the
    /// Agents' range, and nothing from an Agent to the host itself or to another Agent.
    pub fn host_rules() -> String {
        let net = format!("{}/{EGRESS_PREFIX}", std::net::Ipv4Addr::from(EGRESS_NET));
        format!(
            "table ip clawfleet\ndelete table ip clawfleet\ntable ip clawfleet {{\n    chain postrouting {{\n        type nat hook postrouting priority srcnat; policy accept;\n        ip saddr {net} oifname != \"cfh*\" masquerade\n    }}\n    chain forward {{\n        type filter hook forward priority filter; policy accept;\n        iifname \"cfh*\" oifname \"cfh*\" drop\n    }}\n    chain input {{\n        type filter hook input priority filter; policy accept;\n        iifname \"cfh*\" drop\n    }}\n}}\n"
        )
    }

    /// From inside the Agent's namespace: makes the veth pair (the host's end moved to PID 1's
    /// namespace), the addresses, the route and both rulesets. Run again (the network unit's
    /// reload, after the Agent's egress changed), it keeps a whole pair and its connections and
    /// loads the rulesets anew; half a pair (a crash between the two steps) is made again.
    fn plumb(&self, name: &str) -> Result<(), NetnsError> {
        let host_link = host_link_name(name);
        let agent_end = ip(&["link", "show", "dev", "eth0"]).is_ok();
        let probe = host_link.clone();
        let host_end = in_host(move || Ok(ip(&["link", "show", "dev", &probe]).is_ok()))?;
        if !(host_end && agent_end) {
            if agent_end {
                ip(&["link", "delete", "eth0"])?;
            }
            if host_end {
                let stale = host_link.clone();
                in_host(move || ip(&["link", "delete", &stale]))?;
            }
            ip(&[
                "link", "add", &host_link, "type", "veth", "peer", "name", "eth0",
            ])?;
            ip(&["link", "set", &host_link, "netns", "1"])?;
        }
        let (host, agent) = self.addresses();
        let link = host_link.clone();
        in_host(move || {
            ip(&["addr", "replace", &format!("{host}/30"), "dev", &link])?;
            ip(&["link", "set", &link, "up"])?;
            // Forwarding in the host's namespace (per namespace): written only when off, so a
            // host that turned it on itself (or where /proc/sys is read-only) is left alone.
            let forward = "/proc/sys/net/ipv4/ip_forward";
            if std::fs::read_to_string(forward)
                .map(|v| v.trim() != "1")
                .unwrap_or(true)
            {
                std::fs::write(forward, b"1\n").map_err(|e| NetnsError::Ip {
                    args: "sysctl net.ipv4.ip_forward=1".into(),
                    detail: e.to_string(),
                })?;
            }
            nft(&Self::host_rules(), "host")
        })?;
        ip(&["addr", "replace", &format!("{agent}/30"), "dev", "eth0"])?;
        ip(&["link", "set", "eth0", "up"])?;
        ip(&["route", "replace", "default", "via", &host.to_string()])?;
        nft(&self.agent_rules(), name)
    }
}

/// Where nftables' `nft` may be.
const NFT_PATHS: [&str; 2] = ["/usr/sbin/nft", "/sbin/nft"];

fn nft_binary() -> Result<&'static str, NetnsError> {
    NFT_PATHS
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| NetnsError::Ip {
            args: "nft".into(),
            detail: format!(
                "nftables' nft is not installed (looked for {})",
                NFT_PATHS.join(", ")
            ),
        })
}

/// Loads `rules` with `nft -f -` in this thread's namespace (`shown` names it in errors).
fn nft(rules: &str, shown: &str) -> Result<(), NetnsError> {
    use std::io::Write as _;
    let shown = format!("nft -f - ({shown})");
    let fail = |detail: String| NetnsError::Ip {
        args: shown.clone(),
        detail,
    };
    let mut child = Command::new(nft_binary()?)
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Whether nftables' `nft` is installed, for the probe.
pub fn nft_installed() -> Result<(), String> {
    nft_binary().map(|_| ()).map_err(|e| e.to_string())
}

/// The network namespace of a running process of the service `unit` that is not in the
/// host's (its gateway, once started), opened; `None` when none runs. The process is read
/// from the unit's cgroup, and checked to be still in it after its namespace was opened, so
/// the file is the unit's namespace even if the process ended since.
pub fn of_unit(unit: &str) -> Result<Option<std::fs::File>, NetnsError> {
    use std::os::unix::fs::MetadataExt as _;
    let host = ns_id(Path::new(HOST_NETNS))?;
    let member = crate::cgroup::of_service(unit);
    let Some(procs) = crate::cgroup::procs_path(Path::new(crate::cgroup::ROOT), &member) else {
        return Ok(None);
    };
    let Ok(pids) = crate::cgroup::read_pids(&procs) else {
        return Ok(None);
    };
    for pid in pids {
        let Ok(file) = std::fs::File::open(format!("/proc/{pid}/ns/net")) else {
            continue;
        };
        let Ok(meta) = file.metadata() else {
            continue;
        };
        let still = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| crate::cgroup::own_group(&c) == Some(member.as_str()));
        if still && (meta.dev(), meta.ino()) != host {
            return Ok(Some(file));
        }
    }
    Ok(None)
}

/// Runs `f` on a thread of its own that has entered the namespace at `path` (sockets `f`
/// makes stay in it), and returns what `f` returned.
pub fn run_in<T, F>(path: &Path, f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| NetnsError::Enter {
        path: shown.clone(),
        source,
    })?;
    run_in_file(file, shown, f)
}

/// [`run_in`] for a namespace already open (`shown` names it in errors).
pub fn run_in_file<T, F>(file: std::fs::File, shown: String, f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let thread = std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        Ok::<T, std::io::Error>(f())
    });
    match thread.join() {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(source)) => Err(NetnsError::Enter {
            path: shown,
            source,
        }),
        Err(_) => Err(NetnsError::Thread { path: shown }),
    }
}

/// Whether this host can give each Agent a namespace of its own: `ip` is installed and the
/// kernel lets hostd make a network namespace. The error names what is missing.
///
/// It makes a namespace on a thread of its own (gone with the thread: nothing is left
/// behind) and brings its loopback up there with `ip`, which runs in the thread's namespace.
pub fn probe() -> Result<(), String> {
    let ip = ip_binary().map_err(|e| e.to_string())?;
    nft_installed()?;
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
            format!("the kernel refuses hostd a network namespace (unshare: {e})")
        })?;
        let out = Command::new(ip)
            .args(["link", "set", "lo", "up"])
            .output()
            .map_err(|e| format!("cannot run {ip}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "hostd cannot configure a network namespace (`ip link set lo up` in a new one: {}; CAP_NET_ADMIN missing?)",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    })
    .join()
    .map_err(|_| "the thread that tried to make a network namespace ended abnormally".to_owned())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_unit() {
        let n = name_for_unit("clawfleet-agent-0123456789abcdef0123456789abcdef.service");
        assert_eq!(n, "clawfleet-0123456789abcdef0123456789abcdef");
        assert!(is_name(&n));
        assert!(!is_name("clawfleet-xyz"));
        assert!(!is_name("other"));
        assert_eq!(
            path(&n),
            Path::new("/run/netns/clawfleet-0123456789abcdef0123456789abcdef")
        );
    }

    #[test]
    fn egress_addresses_and_rules() {
        let e = Egress {
            port: 18700,
            ports: vec![443, 8443],
            allow: vec!["10.1.2.0/24".parse().unwrap()],
            resolvers: vec![std::net::Ipv4Addr::new(10, 0, 0, 2)],
        };
        let (host, agent) = e.addresses();
        // 100.64.0.0 + 4 × 18700 = 100.65.36.48.
        assert_eq!(host.to_string(), "100.65.36.49");
        assert_eq!(agent.to_string(), "100.65.36.50");
        let top = Egress {
            port: 65535,
            ..e.clone()
        }
        .addresses()
        .1;
        assert_eq!(top.to_string(), "100.67.255.254", "inside 100.64.0.0/14");
        let rules = e.agent_rules();
        assert!(rules.contains("policy drop;"), "{rules}");
        assert!(rules.contains("tcp dport { 443, 8443 } accept"), "{rules}");
        let allow = rules.find("ip daddr { 10.1.2.0/24 } accept").unwrap();
        let deny = rules.find("169.254.0.0/16").unwrap();
        assert!(allow < deny, "allowed CIDRs are checked first: {rules}");
        let dns = rules
            .find("ip daddr { 10.0.0.2 } udp dport 53 accept")
            .unwrap();
        assert!(
            rules.contains("ip daddr { 10.0.0.2 } tcp dport 53 accept"),
            "{rules}"
        );
        assert!(
            dns < deny,
            "the resolvers are checked before the denied ranges: {rules}"
        );
        for d in DENIED_V4 {
            assert!(rules.contains(d), "{d}: {rules}");
        }
        assert_eq!(
            host_link_name("clawfleet-0123456789abcdef0123456789abcdef"),
            "cfh0123456789ab"
        );
        assert!(
            Egress::host_rules().contains("ip saddr 100.64.0.0/14 oifname != \"cfh*\" masquerade")
        );
    }
}
