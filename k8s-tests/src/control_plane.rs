//! Starting, using and stopping one control plane: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kwok, all on 127.0.0.1 with ports picked per run.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::PostParams;
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::pki::Pki;
use crate::pod_logs::{self, LogStream};
use crate::run::{self, ProcessRecord, Run, RunRecord};
use crate::{signals, sys};

/// Label kwok's `--manage-nodes-with-label-selector` selects on.
pub const KWOK_NODE_LABEL: (&str, &str) = ("type", "kwok");
/// Name of the kwok Node every control plane starts with.
pub const NODE_NAME: &str = "kwok-node-0";
/// Substring of a container image that makes kwok report `ErrImagePull` for it.
pub const FAIL_PULL_MARKER: &str = "fail-pull";
/// Pods of a revision whose id contains this are never made ready (they stay Pending).
pub const NEVER_READY_MARKER: &str = "never-ready";
/// The Service CIDR (fake; nothing ever listens there, never connect to it).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The Pod CIDR kwok hands out (fake; never connect to it).
pub const POD_CIDR: &str = "10.244.0.0/16";
/// User name of the admin token (group `system:masters`).
pub const ADMIN_USER: &str = "clawfleet-admin";
/// User name of the less privileged token: authenticated, no RBAC bindings of its own.
pub const LIMITED_USER: &str = "clawfleet-limited";
/// User name of the identity clawfleet's backend uses in the tests: not in
/// `system:masters`, bound only to the shipped least-privilege ClusterRole
/// (`kube-backend/rbac/managed.yaml`), so the tests prove that role is enough.
pub const BACKEND_USER: &str = "clawfleet-backend";
/// The shipped ClusterRole for managed namespaces (its ClusterRoleBinding's subject is the
/// operator's; the harness binds the role to [`BACKEND_USER`] itself).
const MANAGED_ROLE_YAML: &str = include_str!("../../kube-backend/rbac/managed.yaml");
/// The kwok Node's InternalIP: kwok's kubelet-like server listens there, and the apiserver
/// reaches it for Pod logs. (Pod hostIPs are this too; Pod IPs stay in the fake [`POD_CIDR`].)
pub const NODE_IP: &str = "127.0.0.1";

const POD_READY_STAGE: &str = include_str!("../stages/pod-ready.yaml");
const POD_FAIL_PULL_STAGE: &str = include_str!("../stages/pod-fail-pull.yaml");
/// kwok v0.8.0's own stage files, copied into `<bin_dir>/stages` by the build script.
pub(crate) const SHIPPED_STAGES: &[&str] = &[
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-complete.yaml",
    "pod-delete.yaml",
    "pvc-provision.yaml",
    "pv-bind.yaml",
    "pvc-delete.yaml",
    "pv-delete.yaml",
];

/// How long the kwok Node's Lease lasts; kwok renews it well within that.
pub const NODE_LEASE_SECONDS: u32 = 40;

/// The default StorageClass whose PersistentVolumeClaims kwok's volume stages provision and
/// bind (as in kwok's `kustomize/stage/volume/fast/storage-class.yaml`).
pub const STORAGE_CLASS: &str = "kwok-volume";

/// The binaries the build script puts in the binary directory.
pub const BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
];

/// How long each start phase took, from the first spawn.
#[derive(Debug, Clone, Default)]
pub struct StartTimings {
    /// etcd answered `/health`.
    pub etcd: Duration,
    /// kube-apiserver answered `/readyz` with `ok`.
    pub apiserver: Duration,
    /// The kwok Node is Ready.
    pub node_ready: Duration,
    /// `serviceaccount/default` exists in `default` (the controller manager works).
    pub service_account: Duration,
}

impl std::fmt::Display for StartTimings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "etcd {:.1}s, apiserver ready {:.1}s, node Ready {:.1}s, default ServiceAccount {:.1}s",
            self.etcd.as_secs_f64(),
            self.apiserver.as_secs_f64(),
            self.node_ready.as_secs_f64(),
            self.service_account.as_secs_f64()
        )
    }
}

#[derive(Debug)]
struct Proc {
    component: &'static str,
    child: Child,
    pid: u32,
    start_ticks: Option<u64>,
    log: PathBuf,
}

/// A running control plane. Dropping it stops every process by pid and removes its files (the
/// logs stay when the test panicked or the start failed).
#[derive(Debug)]
pub struct ControlPlane {
    config: HarnessConfig,
    id: String,
    run: Run,
    run_dir: PathBuf,
    logs_dir: PathBuf,
    etcd_data_dir: PathBuf,
    pki: Pki,
    admin_token: String,
    limited_token: String,
    backend_token: String,
    api_port: u16,
    etcd_port: u16,
    etcd_peer_port: u16,
    kwok_port: u16,
    pod_logs: PathBuf,
    pod_previous_logs: PathBuf,
    kubeconfig: PathBuf,
    limited_kubeconfig: PathBuf,
    backend_kubeconfig: PathBuf,
    apiserver_args: Vec<OsString>,
    procs: Mutex<Vec<Proc>>,
    timings: StartTimings,
    keep_logs: bool,
    done: bool,
}

/// The shipped ClusterRole (from its YAML) and a binding of it to [`BACKEND_USER`].
fn backend_rbac() -> Result<(ClusterRole, ClusterRoleBinding)> {
    let bad = |reason: String| Error::Kubeconfig {
        path: "kube-backend/rbac/managed.yaml".into(),
        reason,
    };
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_str_multiple(MANAGED_ROLE_YAML).map_err(|e| bad(e.to_string()))?;
    let role = docs
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .ok_or_else(|| bad("no ClusterRole".into()))?;
    let role: ClusterRole = serde_json::from_value(role).map_err(|e| bad(e.to_string()))?;
    let name = role.metadata.name.clone().unwrap_or_default();
    let binding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": BACKEND_USER },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": BACKEND_USER }],
    }))
    .map_err(|e| bad(e.to_string()))?;
    Ok((role, binding))
}

/// A kubeconfig (JSON, which every kubeconfig reader accepts) for one server, CA and token.
pub fn kubeconfig_for(server: &str, ca_pem: &str, user: &str, token: &str) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "clawfleet-test",
            "cluster": {
                "server": server,
                "certificate-authority-data": sys::base64(ca_pem.as_bytes()),
            }
        }],
        "users": [{ "name": user, "user": { "token": token } }],
        "contexts": [{
            "name": "clawfleet-test",
            "context": { "cluster": "clawfleet-test", "user": user, "namespace": "default" }
        }],
        "current-context": "clawfleet-test",
    });
    format!("{doc:#}\n")
}

/// A kube client from a kubeconfig file (its current context), the way a backend would build one.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let bad = |reason: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    kube::Client::try_from(cfg).map_err(|e| bad(e.to_string()))
}

/// Waits until `serviceaccount/default` exists in `namespace` (Pods cannot be created there
/// before: the ServiceAccount admission plugin refuses them).
pub async fn wait_for_default_service_account(
    client: &kube::Client,
    namespace: &str,
    timeout: Duration,
) -> std::result::Result<(), String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + timeout;
    loop {
        let last = match api.get_opt("default").await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => "not there yet".to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "serviceaccount/default in {namespace} did not appear within {timeout:?} ({last})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn lock(procs: &Mutex<Vec<Proc>>) -> MutexGuard<'_, Vec<Proc>> {
    procs.lock().unwrap_or_else(|p| p.into_inner())
}

fn tmpfs_base() -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    let on_tmpfs = mounts.lines().any(|l| {
        let mut f = l.split(' ');
        let _dev = f.next();
        f.next() == Some("/dev/shm") && f.next() == Some("tmpfs")
    });
    on_tmpfs.then(|| shm.to_path_buf())
}

fn arg(flag: &str, value: impl AsRef<std::ffi::OsStr>) -> OsString {
    let mut s = OsString::from(flag);
    s.push("=");
    s.push(value);
    s
}

impl ControlPlane {
    /// Starts a control plane with the settings from the environment (see [`HarnessConfig`]).
    pub async fn start() -> Result<Self> {
        Self::start_with(&HarnessConfig::from_env()?).await
    }

    /// Starts a control plane and waits until the kwok Node is Ready and
    /// `serviceaccount/default` exists in `default`.
    pub async fn start_with(config: &HarnessConfig) -> Result<Self> {
        for b in BINARIES {
            let p = config.binary(b);
            if !p.is_file() {
                return Err(Error::MissingBinary { path: p });
            }
        }
        for s in SHIPPED_STAGES {
            let p = config.bin_dir.join("stages").join(s);
            if !p.is_file() {
                return Err(Error::MissingBinary { path: p });
            }
        }
        if let Err(e) = run::reclaim_stale(config) {
            eprintln!("clawfleet-k8s-tests: {e}");
        }
        let id = format!("{}-{}", std::process::id(), sys::random_hex(3)?);
        let run = Run::claim(config, &id)?;
        let run_dir = config.runs_dir().join(&id);
        let logs_dir = config.logs_dir().join(&id);
        let [api_port, etcd_port, etcd_peer_port, kwok_port] = sys::free_ports::<4>()?;
        let etcd_data_dir = match (config.etcd_on_tmpfs, tmpfs_base()) {
            (true, Some(base)) => base.join(format!("clawfleet-k8s-etcd-{id}")),
            _ => run_dir.join("etcd"),
        };
        let mut cp = ControlPlane {
            config: config.clone(),
            run,
            run_dir: run_dir.clone(),
            logs_dir: logs_dir.clone(),
            etcd_data_dir: etcd_data_dir.clone(),
            pki: Pki::generate()?,
            admin_token: sys::random_hex(24)?,
            limited_token: sys::random_hex(24)?,
            backend_token: sys::random_hex(24)?,
            api_port,
            etcd_port,
            etcd_peer_port,
            kwok_port,
            pod_logs: run_dir.join("pod-logs").join("current.log"),
            pod_previous_logs: run_dir.join("pod-logs").join("previous.log"),
            kubeconfig: run_dir.join("admin.kubeconfig"),
            limited_kubeconfig: run_dir.join("limited.kubeconfig"),
            backend_kubeconfig: run_dir.join("backend.kubeconfig"),
            apiserver_args: Vec::new(),
            procs: Mutex::new(Vec::new()),
            timings: StartTimings::default(),
            keep_logs: config.keep_logs,
            done: false,
            id,
        };
        // Recorded before anything exists, so a crash from here on is reclaimable.
        cp.write_record()?;
        signals::register(&cp.id, cp.run.record_path.clone());
        match cp.boot().await {
            Ok(()) => Ok(cp),
            Err(e) => {
                // Drop tears down; the logs stay for the failure.
                cp.keep_logs = true;
                Err(e)
            }
        }
    }

    async fn boot(&mut self) -> Result<()> {
        for d in [&self.run_dir, &self.logs_dir, &self.etcd_data_dir] {
            sys::create_dir_all(d)?;
        }
        self.write_files()?;
        let t0 = Instant::now();
        let deadline = t0 + self.config.start_timeout;

        let etcd_url = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer_url = format!("http://127.0.0.1:{}", self.etcd_peer_port);
        let etcd_args = vec![
            arg("--name", "clawfleet"),
            arg("--data-dir", &self.etcd_data_dir),
            arg("--listen-client-urls", &etcd_url),
            arg("--advertise-client-urls", &etcd_url),
            arg("--listen-peer-urls", &peer_url),
            arg("--initial-advertise-peer-urls", &peer_url),
            arg("--initial-cluster", format!("clawfleet={peer_url}")),
            arg("--listen-metrics-urls", ""),
            OsString::from("--unsafe-no-fsync"),
            arg("--log-level", "warn"),
        ];
        self.spawn("etcd", &etcd_args)?;
        let port = self.etcd_port;
        self.poll_until("etcd /health", deadline, async || etcd_health(port).await)
            .await?;
        self.timings.etcd = t0.elapsed();

        let d = &self.run_dir;
        self.apiserver_args = vec![
            arg("--etcd-servers", &etcd_url),
            arg("--bind-address", "127.0.0.1"),
            arg("--advertise-address", "127.0.0.1"),
            arg("--secure-port", self.api_port.to_string()),
            arg("--tls-cert-file", d.join("apiserver.crt")),
            arg("--tls-private-key-file", d.join("apiserver.key")),
            arg("--client-ca-file", d.join("ca.crt")),
            arg("--token-auth-file", d.join("tokens.csv")),
            arg("--authorization-mode", "Node,RBAC"),
            arg(
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
            ),
            arg("--service-account-key-file", d.join("sa.pub")),
            arg("--service-account-signing-key-file", d.join("sa.key")),
            arg("--service-cluster-ip-range", SERVICE_CIDR),
            // A loopback advertise address is not a valid endpoint for the kubernetes Service.
            arg("--endpoint-reconciler-type", "none"),
            arg("--cert-dir", d.join("apiserver-certs")),
            arg("--profiling", "false"),
            // Pod logs (and any other kubelet call) go to kwok's server at the Node's
            // InternalIP, 127.0.0.1, whose certificate the run's CA signed.
            arg("--kubelet-preferred-address-types", "InternalIP"),
            arg("--kubelet-certificate-authority", d.join("ca.crt")),
        ];
        let apiserver_args = self.apiserver_args.clone();
        self.spawn("kube-apiserver", &apiserver_args)?;
        let client = self.client().await?;
        self.wait_apiserver_ready(&client, deadline).await?;
        self.timings.apiserver = t0.elapsed();

        let kcm = vec![
            arg("--kubeconfig", d.join("kcm.kubeconfig")),
            arg("--leader-elect", "false"),
            arg("--bind-address", "127.0.0.1"),
            arg("--secure-port", "0"),
            arg("--service-account-private-key-file", d.join("sa.key")),
            arg("--root-ca-file", d.join("ca.crt")),
            arg("--cluster-name", "clawfleet-test"),
            arg("--use-service-account-credentials", "false"),
        ];
        self.spawn("kube-controller-manager", &kcm)?;
        let scheduler = vec![
            arg("--kubeconfig", d.join("scheduler.kubeconfig")),
            arg("--leader-elect", "false"),
            arg("--bind-address", "127.0.0.1"),
            arg("--secure-port", "0"),
        ];
        self.spawn("kube-scheduler", &scheduler)?;
        let mut kwok = vec![
            arg("--kubeconfig", d.join("kwok.kubeconfig")),
            arg("--manage-all-nodes", "false"),
            arg(
                "--manage-nodes-with-label-selector",
                format!("{}={}", KWOK_NODE_LABEL.0, KWOK_NODE_LABEL.1),
            ),
            arg("--cidr", POD_CIDR),
            // The Node's InternalIP and kubelet port: kwok's own server (containerLogs, ...),
            // on loopback only, with a serving certificate from the run's CA.
            arg("--node-ip", NODE_IP),
            arg("--node-port", self.kwok_port.to_string()),
            arg("--server-address", format!("{NODE_IP}:{}", self.kwok_port)),
            arg("--tls-cert-file", d.join("kwok.crt")),
            arg("--tls-private-key-file", d.join("kwok.key")),
            // kwok's node-heartbeat-with-lease stage updates the Node's status only every 10 to
            // 20 minutes and relies on kwok renewing the Node's Lease. Without a lease the
            // controller-manager sees a stale heartbeat after its 50 s grace period, marks
            // every Pod on the Node NotReady for good (the pod-ready stage only acts on Pending
            // Pods), and deployments stall at "Pod Running".
            arg(
                "--node-lease-duration-seconds",
                NODE_LEASE_SECONDS.to_string(),
            ),
        ];
        for s in SHIPPED_STAGES {
            kwok.push(arg("--config", self.config.bin_dir.join("stages").join(s)));
        }
        for s in ["pod-ready.yaml", "pod-fail-pull.yaml"] {
            kwok.push(arg("--config", d.join("stages").join(s)));
        }
        kwok.push(arg("--config", d.join("kwok-pod-logs.yaml")));
        self.spawn("kwok", &kwok)?;

        let classes: Api<StorageClass> = Api::all(client.clone());
        let class = storage_class()?;
        self.poll_until(
            "creating the kwok StorageClass",
            deadline,
            async || match classes.create(&PostParams::default(), &class).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(e.to_string()),
            },
        )
        .await?;

        let (role, binding) = backend_rbac()?;
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
        self.poll_until(
            "binding the shipped ClusterRole to the backend's identity",
            deadline,
            async || {
                for r in [
                    roles.create(&PostParams::default(), &role).await.map(drop),
                    bindings
                        .create(&PostParams::default(), &binding)
                        .await
                        .map(drop),
                ] {
                    match r {
                        Ok(()) => {}
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => return Err(e.to_string()),
                    }
                }
                Ok(())
            },
        )
        .await?;

        let nodes: Api<Node> = Api::all(client.clone());
        let node = kwok_node(NODE_NAME)?;
        self.poll_until("creating the kwok Node", deadline, async || {
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
        self.poll_until("the kwok Node to be Ready", deadline, async || match nodes
            .get(NODE_NAME)
            .await
        {
            Ok(n) if node_ready(&n) => Ok(()),
            Ok(_) => Err("Ready is not True".into()),
            Err(e) => Err(e.to_string()),
        })
        .await?;
        let kwok_port = self.kwok_port;
        self.poll_until(
            "the kwok Node to advertise kwok's server on 127.0.0.1",
            deadline,
            async || match nodes.get(NODE_NAME).await {
                Ok(n) => node_points_at(&n, kwok_port),
                Err(e) => Err(e.to_string()),
            },
        )
        .await?;
        self.poll_until(
            "kwok's server to listen on 127.0.0.1",
            deadline,
            async || {
                tokio::net::TcpStream::connect((NODE_IP, kwok_port))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        self.poll_until(
            "kwok renewing the Node's Lease",
            deadline,
            async || match leases.get_opt(NODE_NAME).await {
                Ok(Some(l))
                    if l.spec
                        .as_ref()
                        .and_then(|s| s.renew_time.as_ref())
                        .is_some() =>
                {
                    Ok(())
                }
                Ok(_) => Err("no renewed Lease in kube-node-lease yet".into()),
                Err(e) => Err(e.to_string()),
            },
        )
        .await?;
        self.timings.node_ready = t0.elapsed();
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        self.poll_until(
            "serviceaccount/default in namespace default",
            deadline,
            async || match sas.get_opt("default").await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("not there yet".into()),
                Err(e) => Err(e.to_string()),
            },
        )
        .await?;
        self.timings.service_account = t0.elapsed();
        Ok(())
    }

    fn write_files(&self) -> Result<()> {
        let d = &self.run_dir;
        sys::write_file(&d.join("ca.crt"), self.pki.ca.cert_pem.as_bytes(), 0o644)?;
        sys::write_file(
            &d.join("apiserver.crt"),
            self.pki.apiserver.cert_pem.as_bytes(),
            0o644,
        )?;
        sys::write_file(
            &d.join("apiserver.key"),
            self.pki.apiserver.key_pem.as_bytes(),
            0o600,
        )?;
        let kwok_cert = self.pki.serving_cert("kwok", &["localhost"])?;
        sys::write_file(&d.join("kwok.crt"), kwok_cert.cert_pem.as_bytes(), 0o644)?;
        sys::write_file(&d.join("kwok.key"), kwok_cert.key_pem.as_bytes(), 0o600)?;
        if let Some(dir) = self.pod_logs.parent() {
            sys::create_dir_all(dir)?;
        }
        // kwok answers a log request for a missing file with an error: both exist from the
        // start, empty.
        sys::write_file(&self.pod_logs, b"", 0o644)?;
        sys::write_file(&self.pod_previous_logs, b"", 0o644)?;
        sys::write_file(
            &d.join("kwok-pod-logs.yaml"),
            pod_logs::cluster_logs_config(&self.pod_logs, &self.pod_previous_logs).as_bytes(),
            0o644,
        )?;
        sys::write_file(
            &d.join("sa.key"),
            self.pki.service_account_key_pem.as_bytes(),
            0o600,
        )?;
        sys::write_file(
            &d.join("sa.pub"),
            self.pki.service_account_pub_pem.as_bytes(),
            0o644,
        )?;
        let mut tokens = format!(
            "{},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n{},{LIMITED_USER},{LIMITED_USER}\n{},{BACKEND_USER},{BACKEND_USER}\n",
            self.admin_token, self.limited_token, self.backend_token
        );
        let server = self.api_url();
        for (file, user) in [
            ("kcm.kubeconfig", "system:kube-controller-manager"),
            ("scheduler.kubeconfig", "system:kube-scheduler"),
            ("kwok.kubeconfig", "kwok"),
        ] {
            // Each component its own token, all in system:masters (a throwaway cluster).
            let token = sys::random_hex(24)?;
            tokens.push_str(&format!("{token},{user},{user},\"system:masters\"\n"));
            let kc = kubeconfig_for(&server, &self.pki.ca.cert_pem, user, &token);
            sys::write_file(&d.join(file), kc.as_bytes(), 0o600)?;
        }
        // The real node's kubelet (node.rs): a Node identity, so the Node authorizer applies.
        let node_user = format!("system:node:{}", crate::node::REAL_NODE_NAME);
        let node_token = sys::random_hex(24)?;
        tokens.push_str(&format!(
            "{node_token},{node_user},{node_user},\"system:nodes\"\n"
        ));
        let kc = kubeconfig_for(&server, &self.pki.ca.cert_pem, &node_user, &node_token);
        sys::write_file(&d.join("node.kubeconfig"), kc.as_bytes(), 0o600)?;
        sys::write_file(&d.join("tokens.csv"), tokens.as_bytes(), 0o600)?;
        let admin = kubeconfig_for(
            &server,
            &self.pki.ca.cert_pem,
            ADMIN_USER,
            &self.admin_token,
        );
        sys::write_file(&self.kubeconfig, admin.as_bytes(), 0o600)?;
        let limited = kubeconfig_for(
            &server,
            &self.pki.ca.cert_pem,
            LIMITED_USER,
            &self.limited_token,
        );
        sys::write_file(&self.limited_kubeconfig, limited.as_bytes(), 0o600)?;
        let backend = kubeconfig_for(
            &server,
            &self.pki.ca.cert_pem,
            BACKEND_USER,
            &self.backend_token,
        );
        sys::write_file(&self.backend_kubeconfig, backend.as_bytes(), 0o600)?;
        let stages = d.join("stages");
        sys::create_dir_all(&stages)?;
        sys::write_file(
            &stages.join("pod-ready.yaml"),
            POD_READY_STAGE.as_bytes(),
            0o644,
        )?;
        sys::write_file(
            &stages.join("pod-fail-pull.yaml"),
            POD_FAIL_PULL_STAGE.as_bytes(),
            0o644,
        )?;
        Ok(())
    }

    fn write_record(&self) -> Result<()> {
        let processes = lock(&self.procs)
            .iter()
            .map(|p| ProcessRecord {
                component: p.component.to_string(),
                pid: p.pid,
                start_ticks: p.start_ticks,
            })
            .collect();
        run::write_record(
            &self.run.record_path,
            &RunRecord {
                schema: run::RECORD_SCHEMA,
                id: self.id.clone(),
                owner_pid: std::process::id(),
                run_dir: self.run_dir.clone(),
                etcd_data_dir: self.etcd_data_dir.clone(),
                logs_dir: self.logs_dir.clone(),
                processes,
            },
        )
    }

    fn spawn(&self, component: &'static str, args: &[OsString]) -> Result<()> {
        let path = self.config.binary(component);
        let log = self.logs_dir.join(format!("{component}.log"));
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Error::io("open log", &log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("open log", &log, e))?;
        // Children stay in the test's process group: a terminal's Ctrl-C or nextest's signal to
        // the group reaches them too, and the handler / next start cleans up the rest.
        let child = Command::new(&path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Spawn {
                component: component.to_string(),
                path: path.clone(),
                source,
            })?;
        let pid = child.id();
        let start_ticks = sys::proc_stat(pid).map(|s| s.1);
        lock(&self.procs).push(Proc {
            component,
            child,
            pid,
            start_ticks,
            log,
        });
        self.write_record()
    }

    /// An error if any started component has exited.
    fn check_alive(&self) -> Result<()> {
        let mut procs = lock(&self.procs);
        for p in procs.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(Error::Exited {
                    component: p.component.to_string(),
                    pid: p.pid,
                    status: status.to_string(),
                    log: p.log.clone(),
                    tail: sys::file_tail(&p.log, 30),
                });
            }
        }
        Ok(())
    }

    /// Polls `probe` every 200 ms until it succeeds or `deadline` passes, failing early when a
    /// component exits; the error carries the last lines of every component's log.
    async fn poll_until<T>(
        &self,
        what: &str,
        deadline: Instant,
        mut probe: impl AsyncFnMut() -> std::result::Result<T, String>,
    ) -> Result<T> {
        loop {
            self.check_alive()?;
            let last = match tokio::time::timeout(Duration::from_secs(10), probe()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => e,
                Err(_) => "no answer within 10 s".to_string(),
            };
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    waiting_for: what.to_string(),
                    timeout: self.config.start_timeout,
                    last,
                    logs: self.logs_dir.clone(),
                    tails: self.log_tails(15),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_apiserver_ready(&self, client: &kube::Client, deadline: Instant) -> Result<()> {
        self.poll_until("kube-apiserver /readyz", deadline, async || {
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => Ok(()),
                Ok(body) => Err(body),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }

    /// The last `n` lines of every component's log, one block per component.
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for c in BINARIES {
            let log = self.logs_dir.join(format!("{c}.log"));
            if log.exists() {
                out.push_str(&format!(
                    "--- {c} ({}) ---\n{}\n",
                    log.display(),
                    sys::file_tail(&log, n)
                ));
            }
        }
        out
    }

    /// The kubeconfig of the real node's kubelet (user `system:node:clawfleet-node`, group
    /// `system:nodes`), for [`crate::Node`].
    pub fn node_kubeconfig_path(&self) -> PathBuf {
        self.run_dir.join("node.kubeconfig")
    }

    /// The settings this control plane was started with.
    pub fn harness_config(&self) -> &HarnessConfig {
        &self.config
    }

    /// `https://127.0.0.1:<port>`.
    pub fn api_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The apiserver's port on 127.0.0.1.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`), for tests that look at storage directly.
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// The CA that signed the apiserver's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca.cert_pem
    }

    /// The run's PKI (to sign more serving certificates, e.g. a proxy's).
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// Bearer token of [`ADMIN_USER`] (`system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Bearer token of [`LIMITED_USER`], which RBAC grants nothing beyond discovery until a
    /// test binds roles to it.
    pub fn limited_token(&self) -> &str {
        &self.limited_token
    }

    /// kubeconfig (HTTPS, `certificate-authority-data`, the admin token), context
    /// `clawfleet-test`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The same for [`LIMITED_USER`].
    pub fn limited_kubeconfig_path(&self) -> &Path {
        &self.limited_kubeconfig
    }

    /// Name of the Ready kwok Node.
    pub fn node_name(&self) -> &str {
        NODE_NAME
    }

    /// The port of kwok's kubelet-like server on [`NODE_IP`] (HTTPS, certificate from the run's
    /// CA); the kwok Node advertises it as its kubelet endpoint.
    pub fn kwok_server_port(&self) -> u16 {
        self.kwok_port
    }

    /// The file kwok serves as the current log of every container of every Pod, in every
    /// namespace (`GET .../pods/{pod}/log`). It holds CRI log lines (see
    /// [`cri_log_line`](crate::cri_log_line)) and starts empty; tests append to it (or replace
    /// it) at any time, and each log request reads it afresh. It is removed at teardown.
    pub fn pod_logs_file(&self) -> &Path {
        &self.pod_logs
    }

    /// The file kwok serves for `previous=true`, like [`pod_logs_file`](Self::pod_logs_file).
    pub fn pod_previous_logs_file(&self) -> &Path {
        &self.pod_previous_logs
    }

    /// Appends `lines` to [`pod_logs_file`](Self::pod_logs_file), on stdout, stamped now, in
    /// one write.
    pub fn append_pod_log(&self, lines: &[&str]) -> Result<()> {
        pod_logs::append(&self.pod_logs, SystemTime::now(), LogStream::Stdout, lines)
    }

    /// Appends `lines` to [`pod_previous_logs_file`](Self::pod_previous_logs_file) the same way.
    pub fn append_previous_pod_log(&self, lines: &[&str]) -> Result<()> {
        pod_logs::append(
            &self.pod_previous_logs,
            SystemTime::now(),
            LogStream::Stdout,
            lines,
        )
    }

    /// Where the component logs are (kept after a failure).
    pub fn logs_dir(&self) -> &Path {
        &self.logs_dir
    }

    /// Run id (`<pid>-<hex>`), as in the record and directory names.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How long the start took, per phase.
    pub fn timings(&self) -> &StartTimings {
        &self.timings
    }

    /// Keeps the logs after a clean teardown too.
    pub fn keep_logs(&mut self) {
        self.keep_logs = true;
    }

    /// kubeconfig of [`BACKEND_USER`] (bound to the shipped ClusterRole only): what tests
    /// give clawfleet's backend.
    pub fn backend_kubeconfig_path(&self) -> &Path {
        &self.backend_kubeconfig
    }

    /// Bearer token of [`BACKEND_USER`].
    pub fn backend_token(&self) -> &str {
        &self.backend_token
    }

    /// A client from the admin kubeconfig.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// A client from the limited kubeconfig.
    pub async fn limited_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.limited_kubeconfig).await
    }

    /// Resident memory of each running component, KiB.
    pub fn memory_kib(&self) -> Vec<(&'static str, u64)> {
        lock(&self.procs)
            .iter()
            .filter_map(|p| Some((p.component, sys::rss_kib(p.pid)?)))
            .collect()
    }

    /// Pid of a running component.
    pub fn pid(&self, component: &str) -> Option<u32> {
        lock(&self.procs)
            .iter()
            .find(|p| p.component == component)
            .map(|p| p.pid)
    }

    /// The apiserver's pid while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.pid("kube-apiserver")
    }

    /// Kills the apiserver with SIGKILL (by its pid) and reaps it; the port then refuses
    /// connections until [`start_apiserver`](Self::start_apiserver).
    pub fn kill_apiserver(&self) -> Result<()> {
        self.stop_component("kube-apiserver", Signal::SIGKILL)
    }

    fn stop_component(&self, component: &'static str, sig: Signal) -> Result<()> {
        let mut procs = lock(&self.procs);
        let Some(i) = procs.iter().position(|p| p.component == component) else {
            return Err(Error::NotRunning { component });
        };
        let mut p = procs.remove(i);
        drop(procs);
        sys::signal(p.pid, p.start_ticks, sig);
        let _ = p.child.wait();
        self.write_record()
    }

    /// Starts the apiserver again (same port, flags and etcd) and waits for `/readyz`.
    pub async fn start_apiserver(&self) -> Result<()> {
        if self.apiserver_pid().is_some() {
            return Ok(());
        }
        let args = self.apiserver_args.clone();
        self.spawn("kube-apiserver", &args)?;
        let client = self.client().await?;
        self.wait_apiserver_ready(&client, Instant::now() + self.config.start_timeout)
            .await
    }

    /// [`kill_apiserver`](Self::kill_apiserver) then [`start_apiserver`](Self::start_apiserver).
    pub async fn restart_apiserver(&self) -> Result<()> {
        self.kill_apiserver()?;
        self.start_apiserver().await
    }

    /// Stops everything and removes the run's files, reporting what could not be removed.
    pub fn shutdown(mut self) -> Result<()> {
        self.teardown()
    }

    pub(crate) fn teardown(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let mut procs = std::mem::take(&mut *lock(&self.procs));
        let records: Vec<ProcessRecord> = procs
            .iter()
            .map(|p| ProcessRecord {
                component: p.component.to_string(),
                pid: p.pid,
                start_ticks: p.start_ticks,
            })
            .collect();
        let mut problems = run::stop_processes(&records, self.config.stop_timeout);
        for p in procs.iter_mut() {
            let _ = p.child.wait();
        }
        for d in [&self.run_dir, &self.etcd_data_dir] {
            if d.exists()
                && let Err(e) = fs::remove_dir_all(d)
            {
                problems.push(format!("could not remove {}: {e}", d.display()));
            }
        }
        if self.keep_logs || std::thread::panicking() {
            eprintln!(
                "clawfleet-k8s-tests: control plane {} stopped; logs kept in {}",
                self.id,
                self.logs_dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.logs_dir);
        }
        signals::unregister(&self.id);
        if problems.is_empty() {
            self.run.forget();
            Ok(())
        } else {
            // The record stays, so the next start (or `k8scp clean`) retries.
            Err(Error::Teardown {
                id: self.id.clone(),
                detail: problems.join("; "),
            })
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("clawfleet-k8s-tests: {e}");
        }
    }
}

async fn etcd_health(port: u16) -> std::result::Result<(), String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&body);
    if text.contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(sys::tail(&text, 1))
    }
}

/// `Ok` when the Node's InternalIP is [`NODE_IP`] and its kubelet endpoint is kwok's port.
fn node_points_at(n: &Node, port: u16) -> std::result::Result<(), String> {
    let status = n.status.as_ref();
    let ips: Vec<&str> = status
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP")
                .map(|a| a.address.as_str())
                .collect()
        })
        .unwrap_or_default();
    let advertised = status
        .and_then(|s| s.daemon_endpoints.as_ref())
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map(|e| e.port);
    if ips.first() == Some(&NODE_IP) && advertised == Some(i32::from(port)) {
        Ok(())
    } else {
        Err(format!(
            "InternalIP {ips:?} and kubelet port {advertised:?}, expected {NODE_IP} and {port}"
        ))
    }
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// kwok's volume StorageClass, made the default one (PVCs without a class get it).
fn storage_class() -> Result<StorageClass> {
    let v = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": { "storageclass.kubernetes.io/is-default-class": "true" },
        },
        "provisioner": "kwok.x-k8s.io/volume",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    });
    serde_json::from_value(v).map_err(|e| Error::Manifest {
        what: "the kwok StorageClass",
        reason: e.to_string(),
    })
}

/// The Node kwok manages: labelled `type=kwok`, no taints (Pods need no toleration).
fn kwok_node(name: &str) -> Result<Node> {
    let v = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                KWOK_NODE_LABEL.0: KWOK_NODE_LABEL.1,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
            "annotations": { "kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0" },
        },
    });
    serde_json::from_value(v).map_err(|e| Error::Manifest {
        what: "the kwok Node",
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our pod-ready stage is kwok's shipped one plus the selectors that keep it disjoint from
    /// pod-fail-pull and away from never-ready revisions (checked against the copy the build
    /// script put in the binary dir).
    #[test]
    fn pod_ready_stage_is_the_shipped_one_plus_the_fail_pull_exclusion() {
        let config = HarnessConfig::from_env().unwrap();
        let shipped = config.bin_dir.join("stages").join("pod-ready.yaml");
        let Ok(shipped) = fs::read_to_string(&shipped) else {
            eprintln!("SKIP: {} not built yet", shipped.display());
            return;
        };
        let ours: Vec<&str> = POD_READY_STAGE
            .lines()
            .skip_while(|l| l.starts_with('#'))
            .collect();
        let added = [
            "    # clawfleet: Pods with a container image containing \"fail-pull\" go to pod-fail-pull instead.",
            "    - key: '.spec.containers.[] | select( .image | contains(\"fail-pull\") ) | .image'",
            "      operator: 'DoesNotExist'",
            "    # clawfleet: Pods of a revision whose id contains \"never-ready\" are never made ready.",
            "    - key: '.metadata.labels[\"clawfleet.dev/revision-id\"] // \"\" | select( contains(\"never-ready\") )'",
            "      operator: 'DoesNotExist'",
        ];
        let at = ours
            .windows(added.len())
            .position(|w| w == added)
            .expect("the exclusion block is in our pod-ready.yaml");
        let mut without = ours.clone();
        without.drain(at..at + added.len());
        assert_eq!(without, shipped.lines().collect::<Vec<_>>());
    }

    /// The StorageClass made in code is the one kwok ships with its volume stages.
    #[test]
    fn storage_class_matches_the_shipped_one() {
        let config = HarnessConfig::from_env().unwrap();
        let shipped = config.bin_dir.join("stages").join("storage-class.yaml");
        let Ok(shipped) = fs::read_to_string(&shipped) else {
            eprintln!("SKIP: {} not built yet", shipped.display());
            return;
        };
        let class = storage_class().unwrap();
        assert!(shipped.contains(&format!("name: {STORAGE_CLASS}")));
        assert!(shipped.contains(&format!("provisioner: {}", class.provisioner)));
        assert!(shipped.contains("volumeBindingMode: Immediate"));
        assert!(shipped.contains("reclaimPolicy: Delete"));
        assert!(shipped.contains("storageclass.kubernetes.io/is-default-class: \"true\""));
    }

    #[test]
    fn stages_use_the_fail_pull_marker() {
        assert!(POD_FAIL_PULL_STAGE.contains(&format!("contains(\"{FAIL_PULL_MARKER}\")")));
        assert!(POD_READY_STAGE.contains(&format!("contains(\"{FAIL_PULL_MARKER}\")")));
        assert!(POD_READY_STAGE.contains(&format!("contains(\"{NEVER_READY_MARKER}\")")));
    }

    #[test]
    fn kubeconfig_is_https_with_ca_data_and_token() {
        let kc = kubeconfig_for("https://127.0.0.1:1", "PEM", "u", "t0k");
        let v: serde_json::Value = serde_json::from_str(&kc).unwrap();
        assert_eq!(v["clusters"][0]["cluster"]["server"], "https://127.0.0.1:1");
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"],
            sys::base64(b"PEM")
        );
        assert_eq!(v["users"][0]["user"]["token"], "t0k");
        assert_eq!(v["current-context"], "clawfleet-test");
    }

    #[test]
    fn the_kwok_node_manifest_parses() {
        let n = kwok_node(NODE_NAME).unwrap();
        assert_eq!(
            n.metadata
                .labels
                .unwrap()
                .get(KWOK_NODE_LABEL.0)
                .map(String::as_str),
            Some(KWOK_NODE_LABEL.1)
        );
    }
}
