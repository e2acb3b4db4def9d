//! `occ`: the clawfleet coordinator (`occ init`, `occ serve`) and its CLI over the HTTP API.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use clawfleet_protocol::ssh_key::{
    Algorithm, LineEnding, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr,
};
use clawfleet_protocol::{Principal, signing::load_signing_key};
use coordinator::api::AppState;
use coordinator::client::Client;
use coordinator::codes::Code;
use coordinator::config::{Config, DEFAULT_CONFIG_PATH};
use coordinator::model::{Grant, Role};
use coordinator::service::Service;
use coordinator::ssh::{SshBackend, SshSettings};
use coordinator::store::Store;
use coordinator::worker::Worker;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(name = "occ", version, about = "clawfleet coordinator")]
struct Cli {
    /// Configuration file (default /etc/clawfleet/occ.toml, or OCC_CONFIG_PATH).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Coordinator URL for client commands (default: from the configuration's listen).
    #[arg(long, global = true)]
    server: Option<String>,
    /// API token for client commands (default: OCC_TOKEN, then the state dir's admin.token).
    #[arg(long, global = true)]
    token: Option<String>,
    /// Output format of client commands.
    #[arg(long, global = true, value_enum, default_value = "table")]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the state directory, the SSH login and signing keys, the database and the first
    /// admin token (idempotent).
    Init,
    /// Run the API and the deployment worker.
    Serve,
    /// Print the `hostd enrol` command that authorises this coordinator on a host.
    #[command(name = "enrol-command")]
    PrintEnrol,
    /// Namespaces.
    #[command(subcommand)]
    Namespace(NamespaceCmd),
    /// Configurations (native openclaw.json documents).
    #[command(subcommand)]
    Configuration(ConfigurationCmd),
    /// Agents.
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Hosts.
    #[command(subcommand)]
    Host(HostCmd),
    /// Kubernetes clusters.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// API tokens.
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Register a cluster: its kubeconfig is validated, the cluster probed, then stored.
    Add {
        name: String,
        /// The kubeconfig file (HTTPS with a CA; a token or a client certificate).
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The context to use (default: the kubeconfig's current-context).
        #[arg(long)]
        context: Option<String>,
        /// The gateway image, pinned by digest (`repo@sha256:…`).
        #[arg(long)]
        gateway_image: Option<String>,
        /// A JSON file with the cluster's other settings (camelCase keys).
        #[arg(long)]
        settings: Option<PathBuf>,
    },
    /// List registered clusters.
    List,
    /// Show one cluster (never its credentials).
    Get { name: String },
    /// Forget a cluster no Namespace uses.
    Remove { name: String },
}

#[derive(Subcommand, Debug)]
enum NamespaceCmd {
    /// Create a Namespace on a host pool (--hosts) or on a cluster (--cluster).
    Create {
        id: String,
        /// Comma-separated host pool.
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "cluster",
            conflicts_with = "cluster"
        )]
        hosts: Vec<String>,
        /// A registered Kubernetes cluster.
        #[arg(long)]
        cluster: Option<String>,
        /// A display name (default: the id).
        #[arg(long)]
        name: Option<String>,
    },
    /// List the Namespaces the token may read.
    List,
    /// Show a Namespace: its pool or cluster and whether it is ready.
    Get { id: String },
    /// Delete an empty Namespace (refused while it has Agents).
    Delete { id: String },
}

#[derive(Subcommand, Debug)]
enum ConfigurationCmd {
    /// Create a Configuration from an openclaw.json document.
    Create {
        namespace: String,
        id: String,
        /// JSON file with the document.
        #[arg(long)]
        file: PathBuf,
    },
    /// Add a generation to a Configuration (Agents use it on their next deploy).
    Update {
        namespace: String,
        id: String,
        /// JSON file with the document.
        #[arg(long)]
        file: PathBuf,
    },
    /// Show a Configuration's latest generation.
    Get { namespace: String, id: String },
}

#[derive(Args, Debug)]
struct WaitArgs {
    /// Wait until the deployment converges, printing progress.
    #[arg(long)]
    wait: bool,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
}

#[derive(Subcommand, Debug)]
enum AgentCmd {
    /// Create an Agent with a Configuration (nothing runs until it is deployed).
    Create {
        namespace: String,
        id: String,
        /// The Configuration the Agent runs.
        #[arg(long)]
        configuration: String,
        /// The service principal the Agent acts as (default: the Agent's id).
        #[arg(long)]
        service_principal: Option<String>,
    },
    /// List a Namespace's Agents.
    List { namespace: String },
    /// Show an Agent: desired state, host or cluster, active and served revision.
    Get { namespace: String, id: String },
    /// Change the Agent's Configuration (deploy afterwards).
    Set {
        namespace: String,
        id: String,
        /// The Configuration the Agent runs from its next deploy on.
        #[arg(long)]
        configuration: String,
    },
    /// Deploy a new revision of the Agent's Configuration.
    Deploy {
        namespace: String,
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Stop the Agent's gateway (its revisions and state are kept).
    Stop {
        namespace: String,
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Delete the Agent from its host or cluster and from the coordinator.
    Delete {
        namespace: String,
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Deployment status: desired state, revisions, open work and the last code.
    Status { namespace: String, id: String },
    /// List the Agent's revisions with their status.
    Revisions { namespace: String, id: String },
}

#[derive(Subcommand, Debug)]
enum HostCmd {
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

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Create a token; grants are NAMESPACE:ROLE (NAMESPACE may be *).
    Create {
        name: String,
        /// NAMESPACE:ROLE (roles: read, operate, deploy, admin; NAMESPACE * for all); repeat.
        #[arg(long = "grant", required = true)]
        grants: Vec<String>,
        /// Refuse the token after this many seconds (e.g. 86400 for a day); default: never.
        #[arg(long = "expires-in", value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..))]
        expires_in: Option<u32>,
    },
    /// Revoke a token by its id.
    Revoke { id: String },
}

fn load_config(cli: &Cli) -> Result<Config> {
    let (path, explicit) = match (&cli.config, std::env::var_os("OCC_CONFIG_PATH")) {
        (Some(p), _) => (p.clone(), true),
        (None, Some(p)) => (PathBuf::from(p), true),
        (None, None) => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
    };
    Ok(Config::load(&path, explicit)?)
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn ensure_key(path: &Path) -> Result<PrivateKey> {
    if path.exists() {
        return load_signing_key(path).with_context(|| format!("cannot use {}", path.display()));
    }
    let key = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519)?;
    write_private(path, key.to_openssh(LineEnding::LF)?.as_bytes())?;
    std::fs::write(
        path.with_extension("pub"),
        format!("{}\n", key.public_key().to_openssh()?),
    )?;
    Ok(key)
}

/// The issuer principal: derived from the signing key, so it names the key.
fn issuer(signing: &PrivateKey) -> Result<Principal> {
    let line = signing.public_key().to_openssh()?;
    let digest = clawfleet_protocol::ident::sha256(line.as_bytes());
    Ok(Principal::new(format!(
        "occ-{}",
        &clawfleet_protocol::ident::hex(&digest)[..12]
    ))?)
}

fn enrol_command(config: &Config) -> Result<String> {
    let login = ensure_key_readonly(&config.login_key())?;
    let signing = ensure_key_readonly(&config.signing_key())?;
    Ok(format!(
        "hostd enrol --ssh-key '{}' --signing-key '{}' --principal {}",
        login.public_key().to_openssh()?,
        signing.public_key().to_openssh()?,
        issuer(&signing)?
    ))
}

fn ensure_key_readonly(path: &Path) -> Result<PrivateKey> {
    load_signing_key(path)
        .with_context(|| format!("cannot use {} (run `occ init` first)", path.display()))
}

fn init(config: &Config) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    for dir in [config.state_dir.clone(), config.state_dir.join("keys")] {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
    }
    ensure_key(&config.login_key())?;
    ensure_key(&config.signing_key())?;
    let store = Store::open(&config.database())?;
    if store.token_count()? == 0 {
        let (id, token) = coordinator::tokens::create(
            &store,
            "admin",
            &[Grant {
                namespace: "*".to_owned(),
                role: Role::Admin,
            }],
        )?;
        let file = config.admin_token_file();
        if file.exists() {
            std::fs::remove_file(&file)?;
        }
        write_private(&file, format!("{token}\n").as_bytes())?;
        println!("created admin token {id} in {}", file.display());
    }
    println!("state directory: {}", config.state_dir.display());
    println!(
        "authorise this coordinator on each host with:\n  {}",
        enrol_command(config)?
    );
    Ok(())
}

async fn serve(config: Config) -> Result<()> {
    let store = Store::open(&config.database()).with_context(|| {
        format!(
            "cannot open {} (run `occ init` first)",
            config.database().display()
        )
    })?;
    let login = ensure_key_readonly(&config.login_key())?;
    let signing = ensure_key_readonly(&config.signing_key())?;
    let principal = issuer(&signing)?;
    let settings = SshSettings {
        connect_timeout: config.ssh.connect_timeout,
        max_parallel_hosts: config.ssh.max_parallel_hosts,
        ..SshSettings::default()
    };
    let backend = Arc::new(coordinator::backends::Backends {
        ssh: Arc::new(SshBackend::new(login, signing, principal, settings)?),
        kube: Arc::new(clawfleet_kube::KubeBackend::new()),
    });
    let worker = Arc::new(Worker::new(
        store.clone(),
        backend.clone(),
        config.worker.clone(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let worker_task = tokio::spawn(worker.clone().run(config.worker.parallelism, stop_rx));
    let state = Arc::new(AppState {
        service: Service::new(store),
        backend,
    });
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(listen = %config.listen, "occ serving");
    eprintln!("occ: serving the API on http://{}", config.listen);
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    coordinator::api::serve(
        listener,
        coordinator::api::router_with(state, &config.api),
        &config.api,
        shutdown,
    )
    .await?;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), worker_task).await;
    Ok(())
}

fn client(cli: &Cli) -> Result<Client> {
    let config = load_config(cli)?;
    let server = cli
        .server
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.listen));
    let token = match (&cli.token, std::env::var("OCC_TOKEN")) {
        (Some(t), _) => Some(t.clone()),
        (None, Ok(t)) => Some(t),
        (None, Err(_)) => std::fs::read_to_string(config.admin_token_file())
            .ok()
            .map(|t| t.trim().to_owned()),
    };
    Ok(Client::new(&server, token)?)
}

fn print(cli: &Cli, value: &Value, columns: &[(&str, &str)]) {
    if cli.output == Output::Json || columns.is_empty() {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
        return;
    }
    let rows: Vec<&Value> = match value {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let cell = |v: &Value| match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| x.to_string())
            })
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|(_, k)| cell(&r[*k])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            table
                .iter()
                .map(|r| r[i].len())
                .max()
                .unwrap_or(0)
                .max(h.len())
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    println!(
        "{}",
        line(columns.iter().map(|(h, _)| h.to_string()).collect())
    );
    for r in table {
        println!("{}", line(r));
    }
}

const CLUSTER_COLUMNS: &[(&str, &str)] = &[("CLUSTER", "name"), ("SERVER", "server")];

const AGENT_COLUMNS: &[(&str, &str)] = &[
    ("AGENT", "id"),
    ("DESIRED", "desiredState"),
    ("HOST", "host"),
    ("PORT", "port"),
    ("ACTIVE", "activeRevisionId"),
    ("SERVED", "servedRevisionId"),
];

/// Exit codes of `occ` (documented in docs/operator-guide.md, "Exit codes").
mod exit {
    /// The command did what was asked (with `--wait`: the requested work converged).
    pub const OK: u8 = 0;
    /// The command failed: bad configuration, the API refused the request, or it was
    /// unreachable.
    pub const ERROR: u8 = 1;
    /// With `--wait`: the requested work failed (its code and message are printed).
    pub const WORK_FAILED: u8 = 3;
    /// With `--wait`: the request was overtaken before it took effect (a newer deploy, a
    /// stop, or the Agent meant to run again).
    pub const SUPERSEDED: u8 = 4;
    /// With `--wait`: the timeout passed before the work finished.
    pub const TIMED_OUT: u8 = 5;
}

/// How a `--wait` ended when it did not converge; `main` turns it into the exit code.
#[derive(Debug)]
struct WaitFailure {
    exit: u8,
    message: String,
}

impl std::fmt::Display for WaitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WaitFailure {}

fn wait_failure(exit: u8, message: String) -> anyhow::Error {
    anyhow::Error::new(WaitFailure { exit, message })
}

/// What a `--wait` follows: the work item the request queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    /// A deploy; converged when its work finished with `REVISION_ACTIVATED`.
    Deploy,
    /// A stop; converged when its work finished with the Agent stopped.
    Stop,
    /// A delete; converged when its work finished with the Agent gone.
    Delete,
}

/// Codes a finished work item may end with that mean "done as asked".
fn converged_code(what: Waited, code: &str) -> bool {
    let code = Code::parse(code);
    match what {
        Waited::Deploy => code == Some(Code::RevisionActivated),
        Waited::Stop => matches!(code, Some(Code::RevisionStopped | Code::AgentGone)),
        Waited::Delete => code == Some(Code::AgentDeleted),
    }
}

/// Follows one work item until it finishes, printing each change of its progress, and
/// returns the final deployment status (null once a deleted Agent is gone). A failed,
/// overtaken or timed-out item is an error carrying its exit code.
fn wait(
    client: &Client,
    ns: &str,
    agent: &str,
    work_id: i64,
    what: Waited,
    args: &WaitArgs,
) -> Result<Value> {
    let start = Instant::now();
    let mut last = String::new();
    let label = match what {
        Waited::Deploy => "deploy",
        Waited::Stop => "stop",
        Waited::Delete => "delete",
    };
    loop {
        let work = client.request(
            "GET",
            &format!("/namespaces/{ns}/agents/{agent}/work/{work_id}"),
            None,
        )?;
        let status = match client.request(
            "GET",
            &format!("/namespaces/{ns}/agents/{agent}/deployment-status"),
            None,
        ) {
            Ok(s) => s,
            Err(coordinator::client::ClientError::Api { status: 404, .. })
                if what == Waited::Delete =>
            {
                Value::Null
            }
            Err(e) => return Err(e.into()),
        };
        let state = work["state"].as_str().unwrap_or("-");
        let code = work["lastAttempt"]["code"].as_str().unwrap_or("");
        let message = work["lastAttempt"]["message"].as_str().unwrap_or("");
        let revision = work["revisionId"].as_str().unwrap_or("-");
        let line = if status.is_null() {
            format!("{label} {state} {code}")
        } else {
            let rev_status = status["revisions"]
                .as_array()
                .and_then(|revs| revs.iter().find(|r| r["id"] == work["revisionId"]))
                .and_then(|r| r["status"].as_str())
                .unwrap_or("-");
            format!(
                "{label}{} {state} {code} · desired {} · active {} · served {}{}",
                if what == Waited::Deploy {
                    format!(" {revision} ({rev_status})")
                } else {
                    String::new()
                },
                status["desiredState"].as_str().unwrap_or("-"),
                status["activeRevisionId"].as_str().unwrap_or("-"),
                status["servedRevisionId"].as_str().unwrap_or("-"),
                match work["attempts"].as_u64() {
                    Some(n) if n > 0 => format!(" · attempts {n}"),
                    _ => String::new(),
                },
            )
        };
        if line != last {
            eprintln!("[{:>5.1}s] {agent}: {line}", start.elapsed().as_secs_f64());
            last = line;
        }
        let subject = if what == Waited::Deploy {
            format!("{agent} {revision}")
        } else {
            format!("{label} of {agent}")
        };
        match state {
            "done" if converged_code(what, code) => return Ok(status),
            "done" => {
                let served = status["servedRevisionId"].as_str().unwrap_or("nothing");
                return Err(wait_failure(
                    exit::SUPERSEDED,
                    format!("{subject} was overtaken: {code} {message} ({served} serves)"),
                ));
            }
            "failed" => {
                let served = status["servedRevisionId"].as_str().unwrap_or("nothing");
                return Err(wait_failure(
                    exit::WORK_FAILED,
                    format!("{subject} failed: {code} {message} ({served} serves)"),
                ));
            }
            _ => {}
        }
        if start.elapsed() > Duration::from_secs(args.timeout) {
            return Err(wait_failure(
                exit::TIMED_OUT,
                format!(
                    "{subject} not finished after {} s (last: {code} {message})",
                    args.timeout
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
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
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

fn run_client(cli: &Cli) -> Result<()> {
    let c = client(cli)?;
    match &cli.command {
        Command::Namespace(cmd) => match cmd {
            NamespaceCmd::Create {
                id,
                hosts,
                cluster,
                name,
            } => {
                let v = c.request(
                    "POST",
                    "/namespaces",
                    Some(&json!({"id": id, "name": name, "hosts": hosts, "cluster": cluster})),
                )?;
                print(
                    cli,
                    &v,
                    &[
                        ("NAMESPACE", "id"),
                        ("HOSTS", "hosts"),
                        ("CLUSTER", "cluster"),
                        ("READY", "ready"),
                    ],
                );
            }
            NamespaceCmd::List => print(
                cli,
                &c.request("GET", "/namespaces", None)?,
                &[
                    ("NAMESPACE", "id"),
                    ("NAME", "name"),
                    ("HOSTS", "hosts"),
                    ("READY", "ready"),
                    ("DELETING", "deleting"),
                ],
            ),
            NamespaceCmd::Get { id } => print(
                cli,
                &c.request("GET", &format!("/namespaces/{id}"), None)?,
                &[
                    ("NAMESPACE", "id"),
                    ("HOSTS", "hosts"),
                    ("READY HOSTS", "readyHosts"),
                    ("READY", "ready"),
                ],
            ),
            NamespaceCmd::Delete { id } => print(
                cli,
                &c.request("DELETE", &format!("/namespaces/{id}"), None)?,
                &[],
            ),
        },
        Command::Configuration(cmd) => match cmd {
            ConfigurationCmd::Create {
                namespace,
                id,
                file,
            } => {
                let v = c.request(
                    "POST",
                    &format!("/namespaces/{namespace}/configurations"),
                    Some(&json!({"id": id, "document": read_json(file)?})),
                )?;
                print(
                    cli,
                    &v,
                    &[("CONFIGURATION", "id"), ("GENERATION", "generation")],
                );
            }
            ConfigurationCmd::Update {
                namespace,
                id,
                file,
            } => {
                let v = c.request(
                    "PUT",
                    &format!("/namespaces/{namespace}/configurations/{id}"),
                    Some(&json!({"document": read_json(file)?})),
                )?;
                print(
                    cli,
                    &v,
                    &[("CONFIGURATION", "id"), ("GENERATION", "generation")],
                );
            }
            ConfigurationCmd::Get { namespace, id } => print(
                cli,
                &c.request(
                    "GET",
                    &format!("/namespaces/{namespace}/configurations/{id}"),
                    None,
                )?,
                &[],
            ),
        },
        Command::Agent(cmd) => match cmd {
            AgentCmd::Create {
                namespace,
                id,
                configuration,
                service_principal,
            } => {
                let v = c.request("POST", &format!("/namespaces/{namespace}/agents"), Some(&json!({"id": id, "configurationId": configuration, "servicePrincipalId": service_principal})))?;
                print(cli, &v, AGENT_COLUMNS);
            }
            AgentCmd::List { namespace } => print(
                cli,
                &c.request("GET", &format!("/namespaces/{namespace}/agents"), None)?,
                AGENT_COLUMNS,
            ),
            AgentCmd::Get { namespace, id } => print(
                cli,
                &c.request("GET", &format!("/namespaces/{namespace}/agents/{id}"), None)?,
                AGENT_COLUMNS,
            ),
            AgentCmd::Set {
                namespace,
                id,
                configuration,
            } => {
                let v = c.request(
                    "PATCH",
                    &format!("/namespaces/{namespace}/agents/{id}"),
                    Some(&json!({"configurationId": configuration})),
                )?;
                print(cli, &v, AGENT_COLUMNS);
            }
            AgentCmd::Deploy {
                namespace,
                id,
                wait: w,
            } => {
                let rev = c.request(
                    "POST",
                    &format!("/namespaces/{namespace}/agents/{id}/deploy"),
                    None,
                )?;
                print(
                    cli,
                    &rev,
                    &[
                        ("REVISION", "id"),
                        ("NUMBER", "number"),
                        ("STATUS", "status"),
                        ("HASH", "configurationHash"),
                    ],
                );
                if w.wait {
                    let work = rev["workId"]
                        .as_i64()
                        .context("the deploy answer has no workId")?;
                    let status = wait(&c, namespace, id, work, Waited::Deploy, w)?;
                    print(
                        cli,
                        &status,
                        &[
                            ("AGENT", "agentId"),
                            ("HOST", "host"),
                            ("PORT", "port"),
                            ("ACTIVE", "activeRevisionId"),
                            ("SERVED", "servedRevisionId"),
                            ("CONVERGED", "converged"),
                        ],
                    );
                }
            }
            AgentCmd::Stop {
                namespace,
                id,
                wait: w,
            } => {
                let v = c.request(
                    "POST",
                    &format!("/namespaces/{namespace}/agents/{id}/stop"),
                    None,
                )?;
                if w.wait {
                    let work = v["workId"]
                        .as_i64()
                        .context("the stop answer has no workId")?;
                    wait(&c, namespace, id, work, Waited::Stop, w)?;
                    println!("{id}: stopped");
                } else {
                    println!("{id}: stop requested");
                }
            }
            AgentCmd::Delete {
                namespace,
                id,
                wait: w,
            } => {
                let v = c.request(
                    "DELETE",
                    &format!("/namespaces/{namespace}/agents/{id}"),
                    None,
                )?;
                if w.wait {
                    let work = v["workId"]
                        .as_i64()
                        .context("the delete answer has no workId")?;
                    wait(&c, namespace, id, work, Waited::Delete, w)?;
                    println!("{id}: deleted");
                } else {
                    println!("{id}: deletion requested");
                }
            }
            AgentCmd::Status { namespace, id } => print(
                cli,
                &c.request(
                    "GET",
                    &format!("/namespaces/{namespace}/agents/{id}/deployment-status"),
                    None,
                )?,
                &[
                    ("AGENT", "agentId"),
                    ("DESIRED", "desiredState"),
                    ("HOST", "host"),
                    ("PORT", "port"),
                    ("ACTIVE", "activeRevisionId"),
                    ("SERVED", "servedRevisionId"),
                    ("CONVERGED", "converged"),
                    ("LAST CODE", "lastCode"),
                ],
            ),
            AgentCmd::Revisions { namespace, id } => print(
                cli,
                &c.request(
                    "GET",
                    &format!("/namespaces/{namespace}/agents/{id}/revisions"),
                    None,
                )?,
                &[
                    ("REVISION", "id"),
                    ("NUMBER", "number"),
                    ("STATUS", "status"),
                    ("CONFIGURATION", "configurationId"),
                    ("GEN", "configurationGeneration"),
                ],
            ),
        },
        Command::Host(cmd) => match cmd {
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
                    c.request("PUT", &format!("/hosts/{name}"), Some(&json!({"address": address, "port": port, "hostKey": key.trim(), "maxAgents": max_agents})))?
                } else {
                    c.request("POST", "/hosts", Some(&json!({"name": name, "address": address, "port": port, "hostKey": key.trim(), "maxAgents": max_agents})))?
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
        },
        Command::Token(cmd) => match cmd {
            TokenCmd::Create {
                name,
                grants,
                expires_in,
            } => {
                let mut parsed = Vec::new();
                for g in grants {
                    let (ns, role) = g
                        .split_once(':')
                        .with_context(|| format!("grant {g:?} must be NAMESPACE:ROLE"))?;
                    parsed.push(json!({"namespace": ns, "role": role}));
                }
                print(
                    cli,
                    &c.request(
                        "POST",
                        "/tokens",
                        Some(&json!({
                            "name": name,
                            "grants": parsed,
                            "expiresAt": expires_in
                                .map(|s| coordinator::clock::now_seconds() + i64::from(s)),
                        })),
                    )?,
                    &[("ID", "id"), ("TOKEN", "token"), ("EXPIRES", "expiresAt")],
                );
            }
            TokenCmd::Revoke { id } => {
                c.request("DELETE", &format!("/tokens/{id}"), None)?;
                println!("token {id} revoked");
            }
        },
        Command::Cluster(cmd) => match cmd {
            ClusterCmd::Add {
                name,
                kubeconfig,
                context,
                gateway_image,
                settings,
            } => {
                let text = std::fs::read_to_string(kubeconfig)
                    .with_context(|| format!("cannot read {}", kubeconfig.display()))?;
                let mut settings = match settings {
                    Some(p) => read_json(p)?,
                    None => json!({}),
                };
                if let Some(image) = gateway_image {
                    settings["gatewayImage"] = json!(image);
                }
                let v = c.request(
                    "POST",
                    "/clusters",
                    Some(&json!({"name": name, "kubeconfig": text, "context": context, "settings": settings})),
                )?;
                print(cli, &v, CLUSTER_COLUMNS);
                // The probe's version warnings (e.g. KUBERNETES_VERSION_BELOW_MINIMUM) are
                // not refusals; say them.
                if let Some(version) = v["lastProbe"]["systemdVersion"].as_str()
                    && let Some(at) = version.find("(warning ")
                {
                    eprintln!(
                        "warning: cluster {name}: {}",
                        version[at..].trim_matches(['(', ')'])
                    );
                }
            }
            ClusterCmd::List => print(cli, &c.request("GET", "/clusters", None)?, CLUSTER_COLUMNS),
            ClusterCmd::Get { name } => print(
                cli,
                &c.request("GET", &format!("/clusters/{name}"), None)?,
                CLUSTER_COLUMNS,
            ),
            ClusterCmd::Remove { name } => {
                c.request("DELETE", &format!("/clusters/{name}"), None)?;
                println!("{name}: removed");
            }
        },
        Command::Init | Command::Serve | Command::PrintEnrol => {}
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OCC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let result = match &cli.command {
        Command::Init => load_config(&cli).and_then(|c| init(&c)),
        Command::PrintEnrol => {
            load_config(&cli).and_then(|c| enrol_command(&c).map(|s| println!("{s}")))
        }
        Command::Serve => load_config(&cli).and_then(|config| {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?
                .block_on(serve(config))
        }),
        _ => run_client(&cli),
    };
    match result {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("occ: {e:#}");
            match e.downcast_ref::<WaitFailure>() {
                Some(w) => ExitCode::from(w.exit),
                None => ExitCode::from(exit::ERROR),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every verb has a one-line help, and so has every option.
    #[test]
    fn every_verb_and_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in cmd.get_subcommands() {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_name() == "help" {
                    continue;
                }
                if sub.get_about().is_none() {
                    missing.push(format!("{here}: no help"));
                }
                for arg in sub.get_arguments() {
                    if !arg.is_positional() && arg.get_help().is_none() && arg.get_id() != "help" {
                        missing.push(format!("{here} --{}: no help", arg.get_id()));
                    }
                }
                walk(sub, &here, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "occ", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
