//! The systemd unit of one Agent. Its text depends only on the Agent (never on the revision),
//! so a revision cutover is a pointer flip plus a relaunch of the gateway inside the running
//! unit (`crate::supervise`) or a `RestartUnit`, with no daemon-reload.

use std::fmt::Write;

use clawfleet_protocol::Ident;

use crate::config::UnitResources;
use crate::layout::AgentPaths;

/// The first line of every unit hostd writes; a unit file without it is not ours.
pub const HEADER_PREFIX: &str = "# Managed by clawfleet hostd; do not edit.";

/// Where the package installs hostd; the unit starts the gateway through it
/// ([`crate::launch`]).
pub const LAUNCHER: &str = "/usr/sbin/hostd";

/// The unit file's mode: root reads it (systemd does), Agents and other local users do not.
/// With 0644 every Agent could list every tenant on the host and read its port, paths and
/// launch settings (issue 26, N14).
pub const FILE_MODE: u32 = 0o640;

/// Journal sockets an Agent may not write to: over them a process sets its own
/// `SYSLOG_IDENTIFIER` and could forge lines tagged `hostd` (issue 26, N7). Its stdout and
/// stderr still reach the journal, through the stream systemd connects before the gateway
/// starts, tagged with the unit's `SyslogIdentifier=`. (`/dev/log` is a link to the second.)
pub const JOURNAL_SOCKETS: [&str; 2] = [
    "/run/systemd/journal/socket",
    "/run/systemd/journal/dev-log",
];

/// An Agent whose network is its own (issue 28): its namespace, the oneshot unit that makes
/// it, and the socket unit and front service that hold its public port on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentNet {
    /// The namespace's name: its `resolv.conf` and host-side link are named after it
    /// ([`crate::netns`]; systemd holds the namespace itself, unnamed).
    pub netns: String,
    /// `clawfleet-net-<hash>.service`: makes the namespace (at boot too) and removes it.
    pub net_unit: String,
    /// `clawfleet-front-<hash>.socket`: PID 1 listens on the Agent's port.
    pub socket_unit: String,
    /// `clawfleet-front-<hash>.service`: joins each connection to the gateway.
    pub front_unit: String,
    /// How long a connection waits for the gateway during a cutover.
    pub hold_ms: u64,
    /// TCP ports the Agent may reach on public addresses (`[network] egress_ports`).
    pub egress_ports: Vec<u16>,
    /// IPv4 CIDRs the Agent may reach on any port (`[network] egress_allow`).
    pub egress_allow: Vec<String>,
    /// The resolvers the Agent's `resolv.conf` names (`[network] dns`; empty: the host's).
    pub dns: Vec<std::net::Ipv4Addr>,
}

impl AgentNet {
    /// The names for the Agent whose gateway unit is `unit_name`.
    pub fn for_unit(unit_name: &str, hold_ms: u64) -> AgentNet {
        let hash = unit_name
            .strip_prefix("clawfleet-agent-")
            .and_then(|r| r.strip_suffix(".service"))
            .unwrap_or(unit_name);
        AgentNet {
            netns: crate::netns::name_for_unit(unit_name),
            net_unit: format!("clawfleet-net-{hash}.service"),
            socket_unit: format!("clawfleet-front-{hash}.socket"),
            front_unit: format!("clawfleet-front-{hash}.service"),
            hold_ms,
            egress_ports: crate::config::DEFAULT_EGRESS_PORTS.to_vec(),
            egress_allow: Vec::new(),
            dns: Vec::new(),
        }
    }

    /// The units in the order they are stopped (the gateway's unit first, before these).
    pub fn stop_order(&self) -> [&str; 3] {
        [&self.front_unit, &self.socket_unit, &self.net_unit]
    }

    /// The companion unit files and their text, for an Agent listening on `port`.
    pub fn render(&self, namespace: &Ident, agent: &Ident, port: u16) -> Vec<(String, String)> {
        let head = header(namespace, agent);
        let net = format!(
            "{head}
[Unit]
Description=clawfleet Agent network
Before=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
PrivateNetwork=yes
PrivateTmp=yes
ExecStart={LAUNCHER} netns-up --name {ns} --port {port}{egress}
ExecReload={LAUNCHER} netns-up --name {ns} --port {port}{egress}
ExecStop={LAUNCHER} netns-down --name {ns}
",
            ns = self.netns,
            egress = self
                .egress_ports
                .iter()
                .map(|p| format!(" --egress-port {p}"))
                .chain(
                    self.egress_allow
                        .iter()
                        .map(|c| format!(" --egress-allow {c}"))
                )
                .chain(self.dns.iter().map(|a| format!(" --dns {a}")))
                .collect::<String>()
        );
        // FreeBind: a host without IPv6 on its loopback still gets the IPv4 socket.
        let socket = format!(
            "{head}
[Unit]
Description=clawfleet Agent port

[Socket]
ListenStream=127.0.0.1:{port}
ListenStream=[::1]:{port}
BindIPv6Only=ipv6-only
FreeBind=yes
NoDelay=yes
Backlog=4096
Service={front}
",
            front = self.front_unit
        );
        let front = format!(
            "{head}
[Unit]
Description=clawfleet Agent front
Requires={net} {socket}
After={net} {socket}
JoinsNamespaceOf={net}

[Service]
Type=simple
ExecStart={LAUNCHER} front --port {port} --hold-ms {hold}
PrivateNetwork=yes
Restart=always
RestartSec=100ms
DynamicUser=yes
LimitNOFILE=65536
TasksMax=8192
MemoryMax=256M
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
NoNewPrivileges=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictNamespaces=yes
RestrictRealtime=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
RestrictAddressFamilies=AF_INET AF_INET6
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
SystemCallArchitectures=native
CapabilityBoundingSet=
AmbientCapabilities=
",
            net = self.net_unit,
            socket = self.socket_unit,
            hold = self.hold_ms
        );
        vec![
            (self.net_unit.clone(), net),
            (self.socket_unit.clone(), socket),
            (self.front_unit.clone(), front),
        ]
    }
}

/// The ownership line for an Agent.
pub fn header(namespace: &Ident, agent: &Ident) -> String {
    format!("{HEADER_PREFIX} namespace={namespace} agent={agent}")
}

/// Whether unit text carries the exact ownership line of this Agent as its first line.
pub fn is_owned_by(text: &str, namespace: &Ident, agent: &Ident) -> bool {
    text.lines().next() == Some(header(namespace, agent).as_str())
}

/// Renders the unit.
#[allow(clippy::too_many_arguments)]
pub fn render(
    namespace: &Ident,
    agent: &Ident,
    paths: &AgentPaths,
    port: u16,
    gateway_command: &[String],
    resources: &UnitResources,
    stop_timeout_secs: u64,
    net: Option<&AgentNet>,
) -> String {
    let dir = paths.dir.display();
    let mut u = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(u, "{}", header(namespace, agent));
    let _ = writeln!(u, "[Unit]");
    // systemd shows every unit's description to every local user over D-Bus: no tenant's
    // names there, only the unit's hash (the header above, in a file only root reads, has
    // them).
    let _ = writeln!(u, "Description=clawfleet Agent");
    let _ = writeln!(u, "After=network-online.target");
    let _ = writeln!(u, "Wants=network-online.target");
    // Cutovers restart the unit; systemd's default start limit (5 in 10 s) would refuse a
    // sixth quick cutover. Crash loops are already paced by RestartSec.
    let _ = writeln!(u, "StartLimitIntervalSec=0");
    if let Some(net) = net {
        // Its own network namespace, held by systemd for its network unit (crate::netns),
        // and its port held by the host (issue 28).
        let _ = writeln!(u, "Requires={}", net.net_unit);
        let _ = writeln!(u, "Wants={}", net.socket_unit);
        let _ = writeln!(u, "After={} {}", net.net_unit, net.socket_unit);
        let _ = writeln!(u, "JoinsNamespaceOf={}", net.net_unit);
    }
    let _ = writeln!(u);
    let _ = writeln!(u, "[Service]");
    let _ = writeln!(u, "Type=simple");
    if net.is_some() {
        let _ = writeln!(u, "PrivateNetwork=yes");
    }
    let _ = writeln!(u, "User={}", paths.account);
    let _ = writeln!(u, "Group={}", paths.account);
    let _ = writeln!(u, "WorkingDirectory={}", paths.state.display());
    let _ = writeln!(u, "Environment=HOME={}", paths.home.display());
    let _ = writeln!(
        u,
        "Environment=OPENCLAW_STATE_DIR={}",
        paths.state.display()
    );
    let _ = writeln!(
        u,
        "Environment=OPENCLAW_CONFIG_PATH={}",
        paths.live_config.display()
    );
    let _ = writeln!(u, "Environment=OPENCLAW_GATEWAY_PORT={port}");
    let _ = writeln!(u, "Environment=OPENCLAW_DISABLE_BONJOUR=1");
    // Optional ("-") each (crate::layout::ENV_FILES, in this order): the gateway password,
    // present only when a revision's configuration uses password auth; the operator's own
    // credentials, which hostd never writes and reads only to redact their values from the
    // Agent's logs (engine/runtime.rs); what the operator's before-workload-start hooks
    // returned (engine/hooks.rs). crate::start_env records what a start read.
    for file in paths.env_files() {
        let _ = writeln!(u, "EnvironmentFile=-{}", file.display());
    }
    // Secrets: in clear only in the unit's runtime directory (tmpfs, removed by systemd
    // whenever the unit stops), written there before every start by hostd as root, and seen
    // by the gateway read-only at the fixed path (crate::secrets).
    for line in crate::secrets::unit_lines(&paths.unit_name, &paths.dir, &paths.account) {
        let _ = writeln!(u, "{line}");
    }
    // The launcher confines binds to the Agent's port (Landlock), refuses to start while a
    // requested workspace setup has not completed (engine/workspace.rs), then runs the
    // gateway as its child and stays, so that a cutover relaunches the gateway inside this
    // sandbox instead of restarting the unit (crate::supervise).
    let _ = writeln!(
        u,
        "ExecStart={LAUNCHER} exec-gateway --supervise --stop-timeout-secs {stop_timeout_secs} --port {port} --agent-dir {dir} -- {}",
        gateway_command.join(" ")
    );
    let _ = writeln!(u, "Restart=always");
    let _ = writeln!(u, "RestartSec=2");
    let _ = writeln!(u, "RestartPreventExitStatus=78");
    let _ = writeln!(u, "KillSignal=SIGTERM");
    let _ = writeln!(u, "TimeoutStopSec={stop_timeout_secs}");
    let _ = writeln!(u, "UMask=0077");
    let _ = writeln!(u, "ProtectSystem=strict");
    if let Some(net) = net {
        // Resolvers the Agent's namespace can reach, written by its network unit
        // (crate::resolv); optional ("-"): without one it sees the host's file.
        let _ = writeln!(
            u,
            "BindReadOnlyPaths=-{}:/etc/resolv.conf",
            crate::resolv::agent_file(&net.netns).display()
        );
    }
    let _ = writeln!(
        u,
        "ReadWritePaths={} {}",
        paths.state.display(),
        paths.home.display()
    );
    let _ = writeln!(u, "ProtectHome=yes");
    let _ = writeln!(u, "PrivateTmp=yes");
    let _ = writeln!(u, "PrivateDevices=yes");
    // PrivateDevices= bind-mounts the host's /dev/shm into the private /dev; siblings must not
    // share it, so it gets its own empty tmpfs.
    let _ = writeln!(
        u,
        "TemporaryFileSystem=/dev/shm:rw,nosuid,nodev,noexec,mode=1777"
    );
    let _ = writeln!(u, "PrivateIPC=yes");
    let _ = writeln!(u, "RemoveIPC=yes");
    let _ = writeln!(u, "NoNewPrivileges=yes");
    let _ = writeln!(u, "ProtectKernelTunables=yes");
    let _ = writeln!(u, "ProtectKernelModules=yes");
    let _ = writeln!(u, "ProtectKernelLogs=yes");
    let _ = writeln!(u, "ProtectControlGroups=yes");
    let _ = writeln!(u, "ProtectClock=yes");
    let _ = writeln!(u, "ProtectHostname=yes");
    let _ = writeln!(u, "ProtectProc=invisible");
    let _ = writeln!(u, "ProcSubset=pid");
    // No user, mount, network, ... namespaces: inside one an Agent would regain every
    // capability.
    let _ = writeln!(u, "RestrictNamespaces=yes");
    // Its own user namespace (mapping only root and the Agent's user and group): the kernel
    // lets the owner of a file change its project id and project-inherit flag from the init
    // user namespace only, so inside this one the Agent cannot move its files out of the
    // project quota hostd gives it (issue 26, N6; crate::quota).
    let _ = writeln!(u, "PrivateUsers=yes");
    let _ = writeln!(u, "RestrictRealtime=yes");
    // Not RestrictSUIDSGID=yes: it makes openat2(2) fail with ENOSYS, and the OpenClaw gateway
    // needs openat2 for its lock (found by the real-gateway test). Not
    // MemoryDenyWriteExecute=yes: Node's JIT needs writable executable memory.
    let _ = writeln!(u, "LockPersonality=yes");
    let _ = writeln!(u, "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6");
    // The port is the Agent's, not the revision's, so the unit stays revision-independent.
    // (Needs systemd built with its BPF framework; where it is not, systemd ignores these.)
    let _ = writeln!(u, "SocketBindAllow=tcp:{port}");
    let _ = writeln!(u, "SocketBindDeny=any");
    let _ = writeln!(u, "SystemCallFilter=@system-service");
    // The launcher's Landlock calls (systemd 252's @system-service lacks them).
    let _ = writeln!(
        u,
        "SystemCallFilter=landlock_create_ruleset landlock_add_rule landlock_restrict_self"
    );
    let _ = writeln!(u, "SystemCallFilter=~@privileged");
    let _ = writeln!(u, "SystemCallErrorNumber=EPERM");
    let _ = writeln!(u, "SystemCallArchitectures=native");
    let _ = writeln!(u, "CapabilityBoundingSet=");
    let _ = writeln!(u, "AmbientCapabilities=");
    let _ = writeln!(u, "DevicePolicy=closed");
    let _ = writeln!(u, "KeyringMode=private");
    // The kernel keeps a persistent keyring per uid, reachable by any later process of that
    // uid (keyctl KEYCTL_GET_PERSISTENT): no keyring calls at all (issue 26, N5; uids are
    // also never reused, crate::uids).
    let _ = writeln!(u, "SystemCallFilter=~@keyring");
    // Its output is tagged with the unit's name, and it cannot reach the journal's native
    // or syslog socket to tag lines as anything else.
    let _ = writeln!(
        u,
        "SyslogIdentifier={}",
        paths.unit_name.trim_end_matches(".service")
    );
    let _ = writeln!(
        u,
        "InaccessiblePaths={}",
        JOURNAL_SOCKETS.map(|p| format!("-{p}")).join(" ")
    );
    if let Some((interval, burst)) = resources.log_rate_limit {
        let _ = writeln!(u, "LogRateLimitIntervalSec={interval}");
        let _ = writeln!(u, "LogRateLimitBurst={burst}");
    }
    if let Some(m) = &resources.memory_max {
        let _ = writeln!(u, "MemoryMax={m}");
    }
    if let Some(c) = &resources.cpu_quota {
        let _ = writeln!(u, "CPUQuota={c}");
    }
    if let Some(t) = resources.tasks_max {
        let _ = writeln!(u, "TasksMax={t}");
    }
    let _ = writeln!(u);
    let _ = writeln!(u, "[Install]");
    let _ = writeln!(u, "WantedBy=multi-user.target");
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    #[test]
    fn unit_is_revision_independent_and_hardened() {
        let ns = Ident::new("ns").unwrap();
        let agent = Ident::new("a1").unwrap();
        let layout = Layout::new("/var/lib/clawfleet", "/etc/systemd/system");
        let paths = layout.agent(&ns, &agent);
        let cmd = vec!["/usr/bin/gw".to_owned(), "run".to_owned()];
        let text = render(
            &ns,
            &agent,
            &paths,
            18700,
            &cmd,
            &UnitResources::default(),
            30,
            None,
        );
        assert!(is_owned_by(&text, &ns, &agent));
        assert!(
            text.contains(&format!(
                "ExecStart=/usr/sbin/hostd exec-gateway --supervise --stop-timeout-secs 30 --port 18700 --agent-dir {} -- /usr/bin/gw run\n",
                paths.dir.display()
            )),
            "{text}"
        );
        assert!(!is_owned_by(&text, &ns, &Ident::new("a2").unwrap()));
        for needle in [
            "User=cfa-",
            "Group=cfa-",
            "/config/openclaw.json\n",
            "OPENCLAW_GATEWAY_PORT=18700",
            "ProtectSystem=strict",
            "RestartPreventExitStatus=78",
            "CapabilityBoundingSet=\n",
            "RestrictNamespaces=yes\n",
            "PrivateUsers=yes\n",
            "PrivateIPC=yes\n",
            "RemoveIPC=yes\n",
            "TemporaryFileSystem=/dev/shm:",
            "ProtectProc=invisible\n",
            "ProcSubset=pid\n",
            "ProtectKernelLogs=yes\n",
            "ProtectClock=yes\n",
            "ProtectHostname=yes\n",
            "RestrictRealtime=yes\n",
            "LockPersonality=yes\n",
            "SocketBindAllow=tcp:18700\n",
            "SocketBindDeny=any\n",
            "SystemCallFilter=~@keyring\n",
            "InaccessiblePaths=-/run/systemd/journal/socket -/run/systemd/journal/dev-log\n",
        ] {
            assert!(text.contains(needle), "missing {needle}\n{text}");
        }
        assert!(!text.contains("revisions/"));
        // Nothing systemd shows every local user names a tenant.
        assert!(text.contains("\nDescription=clawfleet Agent\n"), "{text}");
        let tag = format!(
            "\nSyslogIdentifier={}\n",
            paths.unit_name.trim_end_matches(".service")
        );
        assert!(text.contains(&tag), "{text}");
        // What the real gateway needs: Node's JIT and openat2.
        assert!(!text.contains("MemoryDenyWriteExecute"));
        assert!(!text.contains("RestrictSUIDSGID"));
        let limited = render(
            &ns,
            &agent,
            &paths,
            18700,
            &cmd,
            &UnitResources {
                memory_max: Some("2G".into()),
                cpu_quota: None,
                tasks_max: Some(512),
                log_rate_limit: Some((30, 1000)),
            },
            30,
            None,
        );
        assert!(limited.contains("MemoryMax=2G\n") && limited.contains("TasksMax=512\n"));
        assert!(
            limited.contains("LogRateLimitIntervalSec=30\nLogRateLimitBurst=1000\n"),
            "{limited}"
        );
    }

    #[test]
    fn an_agent_with_its_own_network_joins_its_namespace_behind_a_host_held_port() {
        let ns = Ident::new("ns").unwrap();
        let agent = Ident::new("a1").unwrap();
        let layout = Layout::new("/var/lib/clawfleet", "/etc/systemd/system");
        let paths = layout.agent(&ns, &agent);
        let net = AgentNet::for_unit(&paths.unit_name, 5000);
        let hash = paths
            .unit_name
            .trim_start_matches("clawfleet-agent-")
            .trim_end_matches(".service");
        assert_eq!(net.netns, format!("clawfleet-{hash}"));
        let cmd = vec!["/usr/bin/gw".to_owned()];
        let text = render(
            &ns,
            &agent,
            &paths,
            18700,
            &cmd,
            &UnitResources::default(),
            30,
            Some(&net),
        );
        for needle in [
            format!("JoinsNamespaceOf=clawfleet-net-{hash}.service\n"),
            "PrivateNetwork=yes\n".to_owned(),
            format!("Requires=clawfleet-net-{hash}.service\n"),
            format!("Wants=clawfleet-front-{hash}.socket\n"),
        ] {
            assert!(text.contains(&needle), "missing {needle}\n{text}");
        }
        let files = net.render(&ns, &agent, 18700);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                format!("clawfleet-net-{hash}.service"),
                format!("clawfleet-front-{hash}.socket"),
                format!("clawfleet-front-{hash}.service"),
            ]
        );
        for (_, body) in &files {
            assert!(is_owned_by(body, &ns, &agent), "{body}");
        }
        assert!(files[0].1.contains(&format!(
            "ExecStart=/usr/sbin/hostd netns-up --name clawfleet-{hash} --port 18700 --egress-port 443\n"
        )));
        // localhost resolves to ::1 first on Debian: both loopbacks are the host's.
        assert!(
            files[1]
                .1
                .contains("ListenStream=127.0.0.1:18700\nListenStream=[::1]:18700\n")
        );
        assert!(
            files[2]
                .1
                .contains("ExecStart=/usr/sbin/hostd front --port 18700 --hold-ms 5000\n")
        );
        // systemd holds the namespace for the net unit; no mount of it anywhere.
        assert!(
            files[0].1.contains("\nPrivateNetwork=yes\n"),
            "{}",
            files[0].1
        );
        assert!(
            files[2]
                .1
                .contains(&format!("JoinsNamespaceOf=clawfleet-net-{hash}.service\n"))
                && files[2].1.contains("\nPrivateNetwork=yes\n"),
            "{}",
            files[2].1
        );
        for (_, body) in &files {
            assert!(!body.contains("/run/netns"), "{body}");
        }
        assert!(!text.contains("/run/netns"), "{text}");
        assert!(files[2].1.contains("DynamicUser=yes\n"));
    }
}
