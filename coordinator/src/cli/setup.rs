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

pub(crate) async fn init(config: &Config) -> Result<()> {
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
    let store = coordinator::store::open(&config.database)
        .await
        .with_context(|| format!("cannot open {}", config.database.shown()))?;
    if store.token_count().await? == 0 {
        let (id, token) = coordinator::tokens::create(
            &*store,
            "admin",
            &[Grant {
                namespace: "*".to_owned(),
                role: Role::Admin,
            }],
        )
        .await?;
        let file = config.admin_token_file();
        // Replaced whole: a stale token file (from a deleted database) never lingers
        // half-written, and the new one is private from its first byte.
        atomic_file::write_atomic(
            &file,
            format!("{token}\n").as_bytes(),
            Attributes::mode(0o600),
        )?;
        println!("created admin token {id} in {}", file.display());
    }
    println!("state directory: {}", config.state_dir.display());
    println!(
        "authorise this coordinator on each host with:\n  {}",
        enrol_command(config, None)?
    );
    Ok(())
}

pub(crate) async fn serve(config: Config) -> Result<()> {
    let store = coordinator::store::open(&config.database)
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
    let worker = Arc::new(Worker::new(
        store.clone(),
        backend.clone(),
        config.worker.clone(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (leader_task, leadership) = coordinator::leader::spawn(
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
    let drift_task = tokio::spawn(coordinator::drift::run(
        store.clone(),
        backend.clone(),
        config.drift.clone(),
        leadership.clone(),
        stop_rx.clone(),
    ));
    let retention_task = tokio::spawn(coordinator::leader::run_retention(
        store.clone(),
        config.retention.clone(),
        leadership.clone(),
        stop_rx.clone(),
    ));
    let service = Service::new(store);
    let rollout_task = tokio::spawn(coordinator::service::run_rollouts(
        service.clone(),
        config.rollout.interval,
        leadership,
        stop_rx,
    ));
    let state = Arc::new(AppState { service, backend });
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
    let _ = tokio::time::timeout(Duration::from_secs(5), drift_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), rollout_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), retention_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), leader_task).await;
    Ok(())
}
