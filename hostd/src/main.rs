//! `hostd`: the clawfleet helper on every host.
//!
//! - `hostd serve`: the forced command of the coordinator's SSH key; framed, signed operations
//!   on stdin, results and progress on stdout.
//! - `hostd apply FILE`: one signed operation from a file (signature in `FILE.sig`).
//! - `hostd status`: the host's inventory, read-only.
//! - `hostd enrol`: authorise a coordinator.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use clawfleet_protocol::Fingerprint;
use clawfleet_protocol::result::{Inventory, Outcome};
use clawfleet_protocol::ssh_key::PublicKey;
use hostd::config::{Config, DEFAULT_CONFIG_PATH};
use hostd::engine::{Engine, inventory};
use hostd::enrol::{EnrolRequest, enrol};
use hostd::real::RealSystem;
use hostd::session::{Responder, read_envelope_files, serve_while};
use hostd::supervise;

#[derive(Parser, Debug)]
#[command(name = "hostd", version, about = "clawfleet host helper")]
struct Cli {
    /// Configuration file (default /etc/clawfleet/hostd.toml; a missing default file means
    /// all defaults).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve one SSH session (the forced command).
    Serve {
        /// The coordinator login key the session authenticated with, as `hostd enrol` writes
        /// it into the key's forced command: sessions are bounded per key. An id may begin
        /// with `-` (base64url), so a value that does is still the value.
        #[arg(long, allow_hyphen_values = true)]
        key: Option<String>,
    },
    /// Relay gateway streams for the coordinator (what `serve` does when the session asked
    /// for `hostd relay`).
    #[command(hide = true)]
    Relay,
    /// Verify and execute one signed operation from a file; the signature is FILE.sig unless
    /// --signature says otherwise. Prints the result as JSON.
    Apply {
        file: PathBuf,
        #[arg(long)]
        signature: Option<PathBuf>,
    },
    /// Show Namespaces, Agents, revisions, current, served and unit state (read-only).
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Only this Namespace id.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Authorise a coordinator: its SSH key (forced command) and its signing key.
    Enrol {
        /// The coordinator's SSH public key: an OpenSSH line, or a path to a .pub file.
        #[arg(long)]
        ssh_key: String,
        /// The coordinator's operation-signing public key: an OpenSSH line, or a path.
        #[arg(long)]
        signing_key: String,
        /// The issuer principal the coordinator signs as.
        #[arg(long)]
        principal: String,
        /// root's authorized_keys.
        #[arg(long, default_value = hostd::enrol::DEFAULT_AUTHORIZED_KEYS)]
        authorized_keys: PathBuf,
        /// The command the coordinator's key is forced to run.
        #[arg(long, default_value = hostd::enrol::DEFAULT_FORCED_COMMAND)]
        forced_command: String,
        /// For hosts that forbid root login: the coordinator logs in as this system user
        /// (created if missing), whose key is forced to run `sudo -n /usr/sbin/hostd serve`,
        /// and a sudoers drop-in lets it run exactly that as root.
        #[arg(long, value_name = "NAME", conflicts_with_all = ["authorized_keys", "forced_command"])]
        login_user: Option<String>,
    },
    /// The Agent unit's ExecStart: confines binds to the Agent's port, then execs the gateway.
    #[command(hide = true)]
    ExecGateway {
        /// The only TCP port the gateway may bind.
        #[arg(long)]
        port: u16,
        /// The Agent directory: with a workspace setup requested there, the gateway starts
        /// only once its completion marker exists.
        #[arg(long)]
        agent_dir: Option<PathBuf>,
        /// Stay as the unit's main process and run the gateway as a child, relaunching it
        /// in place on SIGHUP (hostd/src/supervise.rs), instead of becoming the gateway.
        #[arg(long)]
        supervise: bool,
        /// With --supervise: how long a relaunch waits for the old gateway to stop before
        /// killing it (the unit's TimeoutStopSec=).
        #[arg(long, default_value_t = 90, value_name = "SECONDS")]
        stop_timeout_secs: u64,
        /// With --supervise: how long a relaunch waits, once the old gateway is gone, for
        /// hostd's signal to start the new one (SIGUSR1) before it starts it anyway.
        #[arg(long, default_value_t = 30, value_name = "SECONDS")]
        start_wait_secs: u64,
        /// The gateway command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// An Agent's front (its port socket unit's service, in the Agent's network namespace):
    /// joins each connection to the gateway, waiting for it during a cutover.
    #[command(hide = true)]
    Front {
        /// The gateway's port on the namespace's loopback.
        #[arg(long)]
        port: u16,
        /// How long a connection waits for the gateway, in milliseconds.
        #[arg(long)]
        hold_ms: u64,
        /// At most this many connections at once.
        #[arg(long, default_value_t = 4096)]
        max_connections: usize,
    },
    /// The Agent's network unit: makes its network namespace (idempotent).
    #[command(hide = true)]
    NetnsUp {
        #[arg(long)]
        name: String,
        /// The Agent's port (its veth pair's /30 is derived from it).
        #[arg(long)]
        port: Option<u16>,
        /// A TCP port the Agent may reach on public addresses (repeatable).
        #[arg(long = "egress-port")]
        egress_ports: Vec<u16>,
        /// An IPv4 CIDR the Agent may reach on any port (repeatable).
        #[arg(long = "egress-allow")]
        egress_allow: Vec<clawfleet_protocol::egress::Cidr>,
        /// A resolver for the Agent's `resolv.conf` (repeatable; `[network] dns`). Without
        /// one, the host's reachable resolvers are used.
        #[arg(long = "dns")]
        dns: Vec<std::net::Ipv4Addr>,
    },
    /// The Agent's network unit on stop: removes its network namespace.
    #[command(hide = true)]
    NetnsDown {
        #[arg(long)]
        name: String,
    },
    /// The Agent unit's `ExecStartPre=+` (as root): writes the Agent's secrets from their
    /// credentials into the unit's runtime directory, owned by the Agent's account, 0400.
    #[command(hide = true)]
    SecretFiles {
        /// The Agent directory (its `secrets/` holds the credentials and the manifest).
        #[arg(long)]
        agent_dir: PathBuf,
        /// The unit's runtime directory.
        #[arg(long)]
        runtime_dir: PathBuf,
        /// The Agent's account.
        #[arg(long)]
        account: String,
    },
}

/// Logs to journald (stderr without one), at the levels `HOSTD_LOG` names as a target list
/// (`info`, `hostd=debug,zbus=warn`, `off`), `info` by default or when it does not parse.
fn init_logging() {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber_lean as tracing_subscriber;
    let filter = std::env::var("HOSTD_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing::level_filters::LevelFilter::INFO)
        });
    let journald = tracing_journald::layer().ok();
    let stderr = journald.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(journald)
        .with(stderr)
        .try_init();
}

fn load_config(cli: &Cli) -> Result<Config> {
    let (path, explicit) = match &cli.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
    };
    Ok(Config::load(&path, explicit)?)
}

/// What tells a changed configuration file apart: inode, size and modification time (`None`
/// when it cannot be read, e.g. no file and the defaults in use).
fn config_stamp(path: &std::path::Path) -> Option<(u64, u64, std::time::SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()?))
}

fn host_fingerprint(config: &Config) -> Result<Fingerprint> {
    let text = std::fs::read_to_string(&config.host_key)
        .with_context(|| format!("cannot read the host key {}", config.host_key.display()))?;
    let key = PublicKey::from_openssh(text.trim())
        .with_context(|| format!("{} is not an OpenSSH public key", config.host_key.display()))?;
    Ok(Fingerprint::of(&key))
}

/// A key given as text or as a path to a file holding it.
fn key_text(arg: &str) -> Result<String> {
    if arg.starts_with("ssh-") {
        return Ok(arg.to_owned());
    }
    let text =
        std::fs::read_to_string(arg).with_context(|| format!("cannot read key file {arg}"))?;
    Ok(text.trim().to_owned())
}

/// Marks the session closed when the peer goes away: SIGHUP/SIGTERM/SIGINT, or stdout's reader
/// closing (poll reports POLLHUP/POLLERR on our end).
fn watch_session(closed: &Arc<AtomicBool>) -> Result<()> {
    for signal in [
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ] {
        signal_hook::flag::register(signal, closed.clone())
            .context("cannot install the signal handlers")?;
    }
    let flag = closed.clone();
    std::thread::spawn(move || {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let stdout = std::io::stdout();
        loop {
            let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
            if poll(&mut fds, PollTimeout::ZERO).is_ok()
                && fds[0]
                    .revents()
                    .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
            {
                flag.store(true, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    Ok(())
}

fn print_table(inv: &Inventory) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<20} {:<20} {:<6} {:<16} {:<16} {:<24} REVISIONS",
        "NAMESPACE", "AGENT", "PORT", "CURRENT", "SERVED", "UNIT"
    );
    for ns in &inv.namespaces {
        if ns.agents.is_empty() {
            let _ = writeln!(out, "{:<20} {:<20}", ns.id.as_str(), "-");
        }
        for a in &ns.agents {
            let o = &a.observation;
            let unit = o
                .unit
                .as_ref()
                .map(|u| {
                    format!(
                        "{}/{}{}",
                        u.active_state,
                        u.sub_state,
                        if u.enabled { " enabled" } else { "" }
                    )
                })
                .unwrap_or_else(|| "-".to_owned());
            let revs: Vec<String> = a
                .revisions
                .iter()
                .map(|r| format!("{}#{}", r.id, r.number))
                .collect();
            let _ = writeln!(
                out,
                "{:<20} {:<20} {:<6} {:<16} {:<16} {:<24} {}",
                ns.id.as_str(),
                a.id.as_str(),
                o.port.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                o.current.as_ref().map(|c| c.as_str()).unwrap_or("-"),
                o.served.as_ref().map(|c| c.as_str()).unwrap_or("-"),
                unit,
                revs.join(",")
            );
        }
    }
    for ns in &inv.namespaces {
        for a in &ns.agents {
            if let Some(why) = &a.unit_drift {
                let _ = writeln!(out, "unit drift: {}/{}: {why}", ns.id, a.id);
            }
        }
    }
    for p in &inv.problems {
        let _ = writeln!(out, "problem: {}: {}", p.path, p.message);
    }
}

/// `hostd relay`: gateway streams over this session's stdin and stdout until it closes.
fn relay(cli: &Cli) -> Result<ExitCode> {
    // Before any thread starts, so all of the relay's inherit it.
    if let Err(e) = hostd::priority::set_nice(hostd::priority::RELAY_NICE) {
        tracing::warn!("the relay keeps its CPU priority (setpriority: {e})");
    }
    let config = load_config(cli)?;
    let system = RealSystem::new()?;
    let engine = Engine::new(&config, &system, host_fingerprint(&config)?);
    let verifier = hostd::session::verifier(&config, &engine.host_key);
    let resolver = Arc::new(hostd::relay::MarkerResolver {
        layout: engine.layout.clone(),
    });
    let settings = hostd::relay::RelaySettings {
        max_streams: config.limits.max_relay_streams,
        idle_timeout: config.limits.relay_idle_timeout,
        slots: Some(engine.layout.relay_slots_dir()),
    };
    tracing::info!("relay session started");
    hostd::relay::run(
        verifier,
        resolver,
        settings,
        std::io::stdin(),
        std::io::stdout(),
        hostd::session::now_unix,
    )?;
    Ok(ExitCode::SUCCESS)
}

fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.command {
        Command::Enrol {
            ssh_key,
            signing_key,
            principal,
            authorized_keys,
            forced_command,
            login_user,
        } => {
            let config = load_config(&cli)?;
            let mut req = EnrolRequest::new(key_text(ssh_key)?, key_text(signing_key)?, principal);
            req.authorized_keys = authorized_keys.clone();
            req.allowed_signers = config.allowed_signers.clone();
            req.host_key = config.host_key.clone();
            req.forced_command = forced_command.clone();
            req.login_user = login_user.as_ref().map(|name| {
                let mut lu = hostd::login_user::LoginUserRequest::new(name);
                lu.state_root = config.state_root.clone();
                lu
            });
            let outcome = enrol(&req)?;
            println!("{}", serde_json::to_string_pretty(&outcome)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { json, namespace } => {
            let config = load_config(&cli)?;
            let system = RealSystem::new()?;
            let host_key = host_fingerprint(&config)?;
            let engine = Engine::new(&config, &system, host_key);
            let only = match namespace {
                Some(n) => Some(
                    clawfleet_protocol::Ident::new(n.as_str())
                        .with_context(|| format!("--namespace {n:?} is not a valid id"))?,
                ),
                None => None,
            };
            let inv = inventory(&engine, only.as_ref());
            if *json {
                println!("{}", serde_json::to_string_pretty(&inv)?);
            } else {
                print_table(&inv);
                println!(
                    "quotas: {}",
                    hostd::quota::support(&config.state_root).describe()
                );
                println!(
                    "network isolation: {}",
                    hostd::engine::network_isolation(&engine)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Apply { file, signature } => {
            let sig_path = signature
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{}.sig", file.display())));
            // Input first, answered as typed failures like every other refusal.
            let signed = match read_envelope_files(file, &sig_path) {
                Ok(s) => s,
                Err(failure) => {
                    let reply = clawfleet_protocol::result::ResultMessage {
                        operation_id: None,
                        outcome: Outcome::Failed { failure },
                    };
                    println!("{}", serde_json::to_string_pretty(&reply)?);
                    return Ok(ExitCode::from(1));
                }
            };
            let config = load_config(&cli)?;
            let system = RealSystem::new()?;
            let engine = Engine::new(&config, &system, host_fingerprint(&config)?);
            let responder = Responder::new(&engine, &config)?;
            let closed = Arc::new(AtomicBool::new(false));
            watch_session(&closed)?;
            let cancelled = || closed.load(Ordering::SeqCst);
            let mut progress = |p: clawfleet_protocol::result::Progress| {
                eprintln!(
                    "step {} ({} ms)",
                    hostd::engine::step_name(p.step),
                    p.elapsed_ms
                );
            };
            let reply = responder.respond(&signed, &cancelled, &mut progress);
            println!("{}", serde_json::to_string_pretty(&reply)?);
            Ok(match reply.outcome {
                Outcome::Succeeded { .. } => ExitCode::SUCCESS,
                Outcome::Failed { .. } => ExitCode::from(1),
            })
        }
        Command::ExecGateway { .. }
        | Command::Front { .. }
        | Command::NetnsUp { .. }
        | Command::NetnsDown { .. } => Ok(ExitCode::from(1)),
        Command::SecretFiles {
            agent_dir,
            runtime_dir,
            account,
        } => {
            let (n, kept) = hostd::secrets::materialise(agent_dir, runtime_dir, account)
                .with_context(|| format!("cannot write the secrets of {account}"))?;
            tracing::info!(account = %account, secrets = n, kept, "secret files written");
            // What this start's environment files hold, for a later relaunch in place
            // (hostd/src/start_env.rs). Without the record the next cutover restarts the
            // unit, so a failure here only costs time.
            if let Err(e) = hostd::start_env::record(agent_dir) {
                tracing::warn!(account = %account, "the environment of this start is not recorded ({e}); the next cutover restarts the unit");
                if let Err(e) = hostd::start_env::forget(agent_dir) {
                    tracing::warn!(account = %account, "an older record of the environment cannot be removed either ({e})");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Relay => relay(&cli),
        Command::Serve { .. }
            if std::env::var("SSH_ORIGINAL_COMMAND").as_deref()
                == Ok(hostd::relay::RELAY_COMMAND) =>
        {
            relay(&cli)
        }
        Command::Serve { key } => {
            let key = match key.as_deref() {
                Some(k) => Some(hostd::session::LoginKeyId::new(k)?),
                // A login user's forced `sudo -n hostd serve` (see `hostd enrol
                // --login-user`): sudo sets SUDO_USER, which the user cannot choose.
                None => std::env::var("SUDO_USER")
                    .ok()
                    .and_then(|u| hostd::session::LoginKeyId::new(&format!("user-{u}")).ok()),
            };
            let path = cli
                .config
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
            let loaded = config_stamp(&path);
            let config = load_config(&cli)?;
            let system = RealSystem::new()?;
            let engine = Engine::new(&config, &system, host_fingerprint(&config)?);
            let mut responder = Responder::new(&engine, &config)?;
            responder.set_login_key(key);
            let closed = Arc::new(AtomicBool::new(false));
            watch_session(&closed)?;
            let stale = || config_stamp(&path) != loaded;
            serve_while(
                &responder,
                std::io::stdin(),
                std::io::stdout(),
                closed,
                &stale,
            )?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `exec-gateway --supervise`: runs as the Agent inside its unit, like `exec-gateway`, but
/// stays and runs the gateway as a child (hostd/src/supervise.rs); ends as the gateway ended.
fn supervise_gateway(
    port: u16,
    agent_dir: Option<&std::path::Path>,
    waits: supervise::Waits,
    command: &[String],
) -> ExitCode {
    if let Err(e) = supervise::block_signals().and_then(|()| hostd::launch::confine(port)) {
        eprintln!("hostd exec-gateway: {e}");
        return ExitCode::from(1);
    }
    let guard = || match agent_dir {
        Some(dir) => hostd::engine::workspace::guard(dir, 0),
        None => Ok(()),
    };
    let s = supervise::Supervised {
        command,
        waits,
        guard: &guard,
    };
    match supervise::run(&s) {
        Ok(end) => ExitCode::from(supervise::end_like(end)),
        Err(e) => {
            eprintln!("hostd exec-gateway: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::ExecGateway {
        port,
        agent_dir,
        supervise: true,
        stop_timeout_secs,
        start_wait_secs,
        command,
    } = &cli.command
    {
        let waits = supervise::Waits {
            stop: Duration::from_secs(*stop_timeout_secs),
            start: Duration::from_secs(*start_wait_secs),
        };
        return supervise_gateway(*port, agent_dir.as_deref(), waits, command);
    }
    if let Command::ExecGateway {
        port,
        agent_dir,
        command,
        ..
    } = &cli.command
    {
        // Runs as the Agent inside its unit: no configuration, no journal connection; it
        // becomes the gateway or says why not (the unit's journal has stderr).
        if let Some(dir) = agent_dir
            && let Err(why) = hostd::engine::workspace::guard(dir, 0)
        {
            eprintln!("hostd exec-gateway: {why}");
            // 78 (EX_CONFIG) is the unit's RestartPreventExitStatus: no crash loop.
            return ExitCode::from(78);
        }
        return match hostd::launch::exec_gateway(*port, command) {
            Ok(never) => match never {},
            Err(e) => {
                eprintln!("hostd exec-gateway: {e}");
                ExitCode::from(1)
            }
        };
    }
    match &cli.command {
        Command::Front {
            port,
            hold_ms,
            max_connections,
        } => {
            let front = hostd::front::Front {
                port: *port,
                hold: Duration::from_millis(*hold_ms),
                max_connections: *max_connections,
            };
            return match hostd::front::run(front) {
                Ok(never) => match never {},
                Err(e) => {
                    eprintln!("hostd front: {e}");
                    ExitCode::from(1)
                }
            };
        }
        Command::NetnsUp { name, .. } | Command::NetnsDown { name } => {
            if !hostd::netns::is_name(name) {
                eprintln!("hostd netns: {name:?} is not the name of an Agent's network namespace");
                return ExitCode::from(2);
            }
            let done = match &cli.command {
                Command::NetnsUp {
                    port,
                    egress_ports,
                    egress_allow,
                    dns,
                    ..
                } => {
                    let resolvers = hostd::resolv::discover(
                        dns,
                        std::path::Path::new(hostd::resolv::ETC_RESOLV_CONF),
                        std::path::Path::new(hostd::resolv::RESOLVED_UPSTREAMS),
                    );
                    let egress = port.map(|port| hostd::netns::Egress {
                        port,
                        ports: egress_ports.clone(),
                        allow: egress_allow.clone(),
                        resolvers: resolvers.nameservers.clone(),
                    });
                    hostd::netns::up(name, egress.as_ref()).and_then(|()| {
                        if egress.is_none() {
                            return Ok(());
                        }
                        // The unit's journal says which resolvers the Agent got.
                        if resolvers.nameservers.is_empty() {
                            eprintln!(
                                "hostd netns: no resolver an Agent can reach ({} names only loopback ones, and {} none): the Agent resolves no names; set [network] dns in hostd.toml",
                                hostd::resolv::ETC_RESOLV_CONF,
                                hostd::resolv::RESOLVED_UPSTREAMS
                            );
                        } else {
                            eprintln!(
                                "hostd netns: the Agent's resolvers, from {}: {:?}",
                                resolvers.source, resolvers.nameservers
                            );
                        }
                        hostd::netns::write_resolv_conf(name, &resolvers)
                    })
                }
                _ => hostd::netns::down(name),
            };
            return match done {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("hostd netns: {e}");
                    ExitCode::from(1)
                }
            };
        }
        _ => {}
    }
    init_logging();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hostd: {e:#}");
            if matches!(std::env::args().nth(1).as_deref(), Some("serve")) {
                // The coordinator reads stdout only; a clear line on stderr is all we can do.
                tracing::error!("hostd serve could not start: {e:#}");
            }
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A login key id is base64url and may begin with `-`; written either way by an enrol,
    /// it is the value of `--key` (one such id made every session exit "unexpected
    /// argument '-V'").
    #[test]
    fn a_key_id_beginning_with_a_hyphen_is_the_value_of_key() {
        for args in [
            ["hostd", "serve", "--key", "-Vx8_a-b"],
            ["hostd", "serve", "--key=-Vx8_a-b", "--config=/dev/null"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            match cli.command {
                Command::Serve { key } => assert_eq!(key.as_deref(), Some("-Vx8_a-b")),
                other => panic!("{other:?}"),
            }
        }
    }
}
