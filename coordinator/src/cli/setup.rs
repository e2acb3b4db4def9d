//! `occ init`, `occ serve` and `occ enrol-command`: the state directory, its keys and first
//! token, and the serving process (API and worker).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clawfleet_protocol::atomic_file::{self, Attributes};
use clawfleet_protocol::ssh_key::{
    Algorithm, LineEnding, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr,
};
use clawfleet_protocol::{Principal, signing::load_signing_key};
use coordinator::api::AppState;
use coordinator::config::Config;
use coordinator::model::{Grant, Role};
use coordinator::service::Service;
use coordinator::ssh::SshBackend;
use coordinator::worker::Worker;

/// The key at `path`, generated first if there is none. A new private key appears complete
/// or not at all (`atomic_file::create_once`, mode 0600) and is never replaced; its `.pub`
/// is replaced atomically.
fn ensure_key(path: &Path) -> Result<PrivateKey> {
    let load = || load_signing_key(path).with_context(|| format!("cannot use {}", path.display()));
    if path.exists() {
        return load();
    }
    let key = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519)?;
    let private = key.to_openssh(LineEnding::LF)?;
    if !atomic_file::create_once(path, private.as_bytes(), 0o600)? {
        // Another `occ init` wrote it first: use that one.
        return load();
    }
    atomic_file::write_atomic(
        &path.with_extension("pub"),
        format!("{}\n", key.public_key().to_openssh()?).as_bytes(),
        Attributes::mode(0o644),
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

pub(crate) fn enrol_command(config: &Config, login_user: Option<&str>) -> Result<String> {
    let login = ensure_key_readonly(&config.login_key())?;
    let signing = ensure_key_readonly(&config.signing_key())?;
    let mut line = format!(
        "hostd enrol --ssh-key '{}' --signing-key '{}' --principal {}",
        login.public_key().to_openssh()?,
        signing.public_key().to_openssh()?,
        issuer(&signing)?
    );
    if let Some(user) = login_user {
        // The rule the host record applies, so the printed line is safe to paste into a shell.
        coordinator::backend::check_login_user(user)
            .map_err(|m| anyhow::anyhow!("--login-user {user:?} {m}"))?;
        line.push_str(&format!(" --login-user {user}"));
    }
    Ok(line)
}

fn ensure_key_readonly(path: &Path) -> Result<PrivateKey> {
    load_signing_key(path)
        .with_context(|| format!("cannot use {} (run `occ init` first)", path.display()))
}

/// Where `occ init` hands a new admin token (`--admin-token-file`), if anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenOut {
    /// No flag and no terminal (the packaged unit's `ExecStartPre`, whose output the journal
    /// keeps): no token is created.
    Nowhere,
    /// Printed once on stdout: `--admin-token-file -`, or no flag with stdout a terminal.
    Stdout,
    /// Written to a new file (0600) the operator named; an existing file is never replaced.
    File(std::path::PathBuf),
}

impl TokenOut {
    /// From `--admin-token-file` (`-`: stdout) and whether stdout is a terminal.
    pub(crate) fn from_flag(flag: Option<&Path>, stdout_is_terminal: bool) -> Self {
        match flag {
            Some(p) if p == Path::new("-") => TokenOut::Stdout,
            Some(p) => TokenOut::File(p.to_owned()),
            None if stdout_is_terminal => TokenOut::Stdout,
            None => TokenOut::Nowhere,
        }
    }
}

/// How to get an admin token when `occ init` creates none.
const NEW_ADMIN_TOKEN_HOWTO: &str = "create one with `occ token create NAME --grant '*:admin'` \
     under an existing admin token, or, on this machine with access to the database, with \
     `occ init --new-admin-token --admin-token-file PATH` (PATH `-`: print it)";

/// `occ init`: the state directory, the keys, the database and, when asked, an admin token.
/// The token's secret is never kept by the coordinator (the database holds its hash only): it
/// is printed once or written to the file the operator names, never into the state directory.
/// Informational lines go to stderr when the token goes to stdout, so `--admin-token-file -`
/// prints the token alone.
pub(crate) async fn init(
    config: &Config,
    token_file: Option<&Path>,
    new_admin_token: bool,
) -> Result<()> {
    use std::io::IsTerminal;
    use std::os::unix::fs::DirBuilderExt;
    let out = &TokenOut::from_flag(token_file, std::io::stdout().is_terminal());
    let say = |line: String| {
        if *out == TokenOut::Stdout {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    for dir in [config.state_dir.clone(), config.state_dir.join("keys")] {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
    }
    if let TokenOut::File(path) = out
        && path.starts_with(&config.state_dir)
    {
        anyhow::bail!(
            "--admin-token-file {} is inside the state directory {}: name a file the \
             coordinator does not keep (the token is shown once and not stored)",
            path.display(),
            config.state_dir.display()
        );
    }
    ensure_key(&config.login_key())?;
    ensure_key(&config.signing_key())?;
    if coordinator::store::seal::Sealer::create_file(&config.encryption_key_file)? {
        say(format!(
            "created the database encryption key {} (back it up apart from the database)",
            config.encryption_key_file.display()
        ));
    }
    let store = coordinator::store::open(&config.database, &config.encryption_key_file)
        .await
        .with_context(|| format!("cannot open {}", config.database.shown()))?;
    let existing = store.token_count().await?;
    if existing > 0 && !new_admin_token {
        if token_file.is_some() {
            anyhow::bail!(
                "the database already holds {existing} token(s), so no admin token was created \
                 and no file was written: {NEW_ADMIN_TOKEN_HOWTO}"
            );
        }
        say(format!(
            "the database already holds {existing} token(s): no admin token created \
             ({NEW_ADMIN_TOKEN_HOWTO})"
        ));
    } else if *out == TokenOut::Nowhere {
        let why = if existing == 0 {
            "no API token exists yet"
        } else {
            "--new-admin-token"
        };
        eprintln!(
            "{why}: no admin token created, since its secret would be shown only once and \
             stdout is not a terminal; run `occ init --admin-token-file PATH` (PATH `-`: print \
             it) by hand"
        );
    } else {
        let (id, token) = coordinator::tokens::create(
            &*store,
            "admin",
            &[Grant {
                namespace: "*".to_owned(),
                role: Role::Admin,
            }],
        )
        .await?;
        match out {
            TokenOut::File(path) => {
                // Private from its first byte, complete or absent, and never over a file.
                if !atomic_file::create_once(path, format!("{token}\n").as_bytes(), 0o600)
                    .with_context(|| format!("cannot write {}", path.display()))?
                {
                    // The token exists in the database but its secret is lost: revoke it.
                    store.revoke_token(&id).await?;
                    anyhow::bail!(
                        "--admin-token-file {} exists already: not replaced, and the token \
                         created for it was revoked; name a new file",
                        path.display()
                    );
                }
                say(format!(
                    "created admin token {id} in {} (the coordinator keeps no copy)",
                    path.display()
                ));
            }
            _ => {
                eprintln!(
                    "created admin token {id}; it is shown once, here, and kept nowhere \
                     (use it as OCC_TOKEN or --token-file):"
                );
                println!("{token}");
            }
        }
    }
    let legacy = config.state_dir.join("admin.token");
    if legacy.exists() {
        eprintln!(
            "warning: {} holds an admin token left by an older occ init: move it where only \
             you can read it (or revoke that token) and delete it",
            legacy.display()
        );
    }
    say(format!("state directory: {}", config.state_dir.display()));
    say(format!(
        "authorise this coordinator on each host with:\n  {}",
        enrol_command(config, None)?
    ));
    Ok(())
}

/// The console's settings from the configuration: its session cookie is `Secure` whenever
/// the listener is off loopback (a TLS proxy is in front then), and a drift finding older
/// than three drift intervals no longer counts as an observation.
fn console_settings(config: &Config) -> coordinator::console::ConsoleSettings {
    coordinator::console::ConsoleSettings {
        secure_cookie: !config.listen.ip().is_loopback(),
        stale_after: config.drift.interval * 3,
        ..Default::default()
    }
}

pub(crate) async fn serve(config: Config) -> Result<()> {
    let store = coordinator::store::open(&config.database, &config.encryption_key_file)
        .await
        .with_context(|| {
            format!(
                "cannot open {} (run `occ init` first)",
                config.database.shown()
            )
        })?;
    let login = ensure_key_readonly(&config.login_key())?;
    let signing = ensure_key_readonly(&config.signing_key())?;
    let principal = issuer(&signing)?;
    let backend = Arc::new(coordinator::backends::Backends {
        ssh: Arc::new(SshBackend::new(
            login,
            signing,
            principal,
            config.ssh.clone(),
        )?),
        kube: Arc::new(clawfleet_kube::KubeBackend::new()),
    });
    // The API's requests in progress, which the worker yields to.
    let foreground = coordinator::foreground::Foreground::default();
    let worker = Arc::new(
        Worker::new(store.clone(), backend.clone(), config.worker.clone())
            .yielding_to(foreground.clone()),
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (leader_task, leadership) = coordinator::control::leader::spawn(
        store.clone(),
        worker.owner.clone(),
        config.leader.clone(),
        stop_rx.clone(),
    );
    let worker_task = tokio::spawn(
        worker
            .clone()
            .run(config.worker.parallelism, stop_rx.clone()),
    );
    let drift_task = tokio::spawn(coordinator::control::run_drift(
        store.clone(),
        backend.clone(),
        config.drift.clone(),
        leadership.clone(),
        stop_rx.clone(),
    ));
    let retention_task = tokio::spawn(coordinator::control::run_retention(
        store.clone(),
        config.retention.clone(),
        leadership.clone(),
        stop_rx.clone(),
    ));
    let service = Service::new(store);
    let rollout_task = tokio::spawn(coordinator::control::run_rollouts(
        service.clone(),
        config.rollout.interval,
        leadership,
        stop_rx,
    ));
    let state = Arc::new(AppState {
        service,
        backend,
        foreground,
    });
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(listen = %config.listen, "occ serving");
    eprintln!(
        "occ: serving the API on http://{0} and the console on http://{0}/console",
        config.listen
    );
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
        coordinator::console::with_api(state, console_settings(&config), &config.api),
        &config.api,
        shutdown,
    )
    .await?;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), worker_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), drift_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), rollout_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), retention_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), leader_task).await;
    Ok(())
}
