//! Cluster registration and replacement through the HTTP API with the real Kubernetes backend
//! (`clawfleet_kube::KubeBackend`) against a scripted HTTPS API server on loopback
//! (`clawfleet_k8s_tests::FakeApiserver`): the attacks of issue 26 and the defects of issue 27.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support;

use std::sync::Arc;

use clawfleet_k8s_tests::{FakeAnswer, FakeApiserver};
use clawfleet_kube::KubeBackend;
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::{Failure, FailureCode, Operation};
use coordinator::api::{AppState, router};
use coordinator::backend::{Backend, CallError, CallOptions, ClusterTarget, Target};
use coordinator::backends::kube_cluster;
use coordinator::client::{Client, ClientError};
use coordinator::service::Service;
use coordinator::store::SharedStore;
use serde_json::{Value, json};

/// Clusters go to the real Kubernetes backend; there are no hosts here.
struct KubeOnly {
    kube: KubeBackend,
}

impl Backend for KubeOnly {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        match target.into() {
            Target::Cluster(c) => {
                let cluster = kube_cluster(&c).map_err(CallError::Failed)?;
                self.kube
                    .call(&cluster, operation, options.deadline)
                    .await
                    .map_err(CallError::Failed)
            }
            Target::Host(_) => Err(CallError::Failed(Failure::new(
                FailureCode::InvalidInput,
                "no hosts in this test",
            ))),
        }
    }

    async fn missing_cluster_access(
        &self,
        target: &ClusterTarget,
    ) -> Result<Vec<String>, CallError> {
        let cluster = kube_cluster(target).map_err(CallError::Failed)?;
        self.kube
            .missing_access(&cluster)
            .await
            .map_err(CallError::Failed)
    }
}

struct Api {
    server: String,
    store: SharedStore,
    admin: String,
}

impl Api {
    async fn start() -> Self {
        Self::start_with(KubeOnly {
            kube: KubeBackend::new(),
        })
        .await
    }

    async fn start_with(backend: impl Backend) -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let state = Arc::new(AppState {
            foreground: Default::default(),
            service: Service::new(store.clone()),
            backend: Arc::new(backend),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        Self {
            server: format!("http://{addr}"),
            store,
            admin,
        }
    }

    /// The answer, or (status, code, message); a `Null` body sends none.
    async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Value,
    ) -> Result<Value, (u16, String, String)> {
        let c = Client::new(&self.server, Some(self.admin.clone())).unwrap();
        let (method, path) = (method.to_owned(), path.to_owned());
        let body = (!body.is_null()).then_some(body);
        tokio::task::spawn_blocking(move || c.request(&method, &path, body.as_ref()))
            .await
            .unwrap()
            .map_err(|e| match e {
                ClientError::Api {
                    status,
                    code,
                    message,
                } => (status, code, message),
                other => panic!("{other}"),
            })
    }
}

const IMAGE: &str = "r/x@sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// A kubeconfig for `server` whose user is `user` (JSON).
fn kubeconfig(server: &FakeApiserver, user: Value) -> String {
    let mut doc: Value = serde_json::from_str(&server.kubeconfig("u", "x")).unwrap();
    doc["users"][0]["user"] = user;
    doc.to_string()
}

fn register(name: &str, kubeconfig: String) -> Value {
    json!({"name": name, "kubeconfig": kubeconfig, "settings": {"gatewayImage": IMAGE}})
}

/// Issue 26 N1, the attack as reported: a kubeconfig whose server is a listener of the
/// attacker's and whose `tokenFile` names a secret file on the coordinator (its first admin
/// token). Before the fix the coordinator read the file and sent it to the listener as a
/// bearer token. Now every path field is refused, naming the field, and the listener
/// receives nothing: not a connection, not a request.
#[tokio::test]
async fn a_kubeconfig_naming_coordinator_files_is_refused_and_nothing_is_sent() {
    let api = Api::start().await;
    let listener = FakeApiserver::start(FakeAnswer::Apiserver { deny: vec![] })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secret_path = dir.path().join("admin.token");
    std::fs::write(&secret_path, "occ-admin-secret-of-the-coordinator\n").unwrap();
    let pem = dir.path().join("some.pem");
    std::fs::write(&pem, listener.ca_pem()).unwrap();
    let s = secret_path.display().to_string();
    let p = pem.display().to_string();
    let cases = [
        (json!({ "tokenFile": s }), "users[name=u].user.tokenFile"),
        (
            json!({ "client-certificate": p, "client-key": s }),
            "users[name=u].user.client-certificate",
        ),
        (
            json!({ "tokenFile": "/dev/zero" }),
            "users[name=u].user.tokenFile",
        ),
    ];
    for (user, field) in cases {
        let got = api
            .admin(
                "POST",
                "/clusters",
                register("evil", kubeconfig(&listener, user)),
            )
            .await;
        assert!(
            listener.requests().is_empty(),
            "the coordinator sent requests to the kubeconfig's server: {:?}",
            listener.requests()
        );
        let (status, code, message) = got.expect_err("registered");
        assert_eq!(
            (status, code.as_str()),
            (400, "KUBECONFIG_INVALID"),
            "{message}"
        );
        assert!(message.contains(field), "{message}");
        assert!(
            !message.contains(&s) && !message.contains("/dev/zero"),
            "{message}"
        );
    }
    // The CA as a path, too.
    let mut doc: Value =
        serde_json::from_str(&kubeconfig(&listener, json!({ "token": "t" }))).unwrap();
    doc["clusters"][0]["cluster"] = json!({ "server": listener.url(), "certificate-authority": p });
    let (status, code, message) = api
        .admin("POST", "/clusters", register("evil", doc.to_string()))
        .await
        .expect_err("registered");
    assert_eq!((status, code.as_str()), (400, "KUBECONFIG_INVALID"));
    assert!(message.contains("certificate-authority"), "{message}");
    assert_eq!(listener.connections(), 0, "the listener was contacted");
    assert!(api.store.clusters().await.unwrap().is_empty());
}

/// Issue 27 N2: a token holding a newline used to panic inside the client cache's lock,
/// failing every cluster afterwards with "lock is poisoned". It is refused at registration
/// naming the field, and registration of another cluster works afterwards.
#[tokio::test]
async fn a_token_with_a_newline_is_refused_and_other_clusters_register() {
    let api = Api::start().await;
    let server = FakeApiserver::start(FakeAnswer::Apiserver { deny: vec![] })
        .await
        .unwrap();
    let (status, code, message) = api
        .admin(
            "POST",
            "/clusters",
            register("bad", kubeconfig(&server, json!({ "token": "abc\ndef" }))),
        )
        .await
        .expect_err("registered");
    assert_eq!(
        (status, code.as_str()),
        (400, "KUBECONFIG_INVALID"),
        "{message}"
    );
    assert!(message.contains("users[name=u].user.token"), "{message}");
    assert!(server.requests().is_empty());
    let good = api
        .admin(
            "POST",
            "/clusters",
            register(
                "good",
                kubeconfig(&server, json!({ "token": "good-token" })),
            ),
        )
        .await
        .unwrap();
    assert_eq!(good["name"], "good");
}

/// The same API server under a second name is refused, naming the first (two names for one
/// cluster made drift report each other's Agents as unknown).
#[tokio::test]
async fn one_api_server_is_registered_once() {
    let api = Api::start().await;
    let server = FakeApiserver::start(FakeAnswer::Apiserver { deny: vec![] })
        .await
        .unwrap();
    let other = FakeApiserver::start(FakeAnswer::Apiserver { deny: vec![] })
        .await
        .unwrap();
    api.admin(
        "POST",
        "/clusters",
        register("first", kubeconfig(&server, json!({ "token": "a" }))),
    )
    .await
    .unwrap();
    // Another identity on the same server is still the same cluster.
    let (status, code, message) = api
        .admin(
            "POST",
            "/clusters",
            register("second", kubeconfig(&server, json!({ "token": "b" }))),
        )
        .await
        .expect_err("registered twice");
    assert_eq!(
        (status, code.as_str()),
        (409, "CLUSTER_DUPLICATE"),
        "{message}"
    );
    assert!(message.contains("cluster first"), "{message}");
    // A different server registers; it cannot then be pointed at the first one.
    api.admin(
        "POST",
        "/clusters",
        register("second", kubeconfig(&other, json!({ "token": "b" }))),
    )
    .await
    .unwrap();
    let (status, code, _) = api
        .admin(
            "PUT",
            "/clusters/second",
            json!({"kubeconfig": kubeconfig(&server, json!({ "token": "b" })), "settings": {"gatewayImage": IMAGE}}),
        )
        .await
        .expect_err("updated onto a registered server");
    assert_eq!((status, code.as_str()), (409, "CLUSTER_DUPLICATE"));
}

/// A cluster's credentials and settings can be replaced (issue 27): validated and probed
/// like a registration, audited, and used from the next call on.
#[tokio::test]
async fn credentials_and_settings_are_replaced() {
    let api = Api::start().await;
    let server = FakeApiserver::start(FakeAnswer::Apiserver { deny: vec![] })
        .await
        .unwrap();
    api.admin(
        "POST",
        "/clusters",
        register(
            "c1",
            kubeconfig(&server, json!({ "token": "expired-token" })),
        ),
    )
    .await
    .unwrap();
    let other_image = format!("r/y@sha256:{}", "2".repeat(64));
    let before = server.requests().len();
    let updated = api
        .admin(
            "PUT",
            "/clusters/c1",
            json!({"kubeconfig": kubeconfig(&server, json!({ "token": "fresh-token" })), "settings": {"gatewayImage": other_image}}),
        )
        .await
        .unwrap();
    assert_eq!(updated["settings"]["gatewayImage"], json!(other_image));
    let after: Vec<_> = server.requests().into_iter().skip(before).collect();
    assert!(!after.is_empty());
    assert!(
        after
            .iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer fresh-token")),
        "{after:?}"
    );
    let audit = api
        .store
        .audit_events_of(10, Some("cluster.update"))
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    // Settings only: the credentials stay.
    let before = server.requests().len();
    api.admin(
        "PUT",
        "/clusters/c1",
        json!({"settings": {"gatewayImage": IMAGE}}),
    )
    .await
    .unwrap();
    assert!(
        server
            .requests()
            .iter()
            .skip(before)
            .all(|r| r.authorization.as_deref() == Some("Bearer fresh-token"))
    );
    // Bad input is refused naming the field, nothing changed; an unknown cluster is 404.
    let (status, code, _) = api
        .admin(
            "PUT",
            "/clusters/c1",
            json!({"kubeconfig": kubeconfig(&server, json!({ "tokenFile": "/etc/passwd" })), "settings": {"gatewayImage": IMAGE}}),
        )
        .await
        .unwrap_err();
    assert_eq!((status, code.as_str()), (400, "KUBECONFIG_INVALID"));
    let (status, _, _) = api
        .admin(
            "PUT",
            "/clusters/nope",
            json!({"settings": {"gatewayImage": IMAGE}}),
        )
        .await
        .unwrap_err();
    assert_eq!(status, 404);
}

/// Issue 27: an identity without the rights clawfleet needs is refused at registration,
/// naming the verb and resource it lacks.
#[tokio::test]
async fn an_identity_lacking_a_permission_is_refused_naming_it() {
    let api = Api::start().await;
    let server = FakeApiserver::start(FakeAnswer::Apiserver {
        deny: vec![
            "delete deployments".to_owned(),
            "create namespaces".to_owned(),
        ],
    })
    .await
    .unwrap();
    let (status, code, message) = api
        .admin(
            "POST",
            "/clusters",
            register("c1", kubeconfig(&server, json!({ "token": "t" }))),
        )
        .await
        .expect_err("registered");
    assert_eq!(
        (status, code.as_str()),
        (400, "CLUSTER_ACCESS_INSUFFICIENT"),
        "{message}"
    );
    assert!(
        message.contains("delete deployments.apps (cluster-wide)"),
        "{message}"
    );
    assert!(
        message.contains("create namespaces (cluster-wide)"),
        "{message}"
    );
    assert!(api.store.clusters().await.unwrap().is_empty());
}

impl Api {
    async fn occ(&self, args: &[&str]) -> (i32, String) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_occ"));
        cmd.args(["--server", &self.server, "--token", &self.admin])
            .args(args)
            .current_dir("/")
            .env("OCC_LOG", "error");
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ),
        )
    }
}

/// `occ cluster add` and `occ cluster update` read the files a kubeconfig names on the
/// operator's machine (relative to the kubeconfig, whatever the working directory), bounded,
/// and send them inline; a file too large (`/dev/zero`) fails at once naming the field and
/// the path, with nothing sent.
#[tokio::test]
async fn occ_inlines_the_files_a_kubeconfig_names() {
    let api = Api::start().await;
    let server = FakeApiserver::start(FakeAnswer::Apiserver { deny: vec![] })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), server.ca_pem()).unwrap();
    std::fs::write(dir.path().join("token"), "token-from-a-file\n").unwrap();
    let write = |file: &str, user: Value| {
        let mut doc: Value = serde_json::from_str(&kubeconfig(&server, user)).unwrap();
        doc["clusters"][0]["cluster"] =
            json!({ "server": server.url(), "certificate-authority": "ca.crt" });
        let path = dir.path().join(file);
        std::fs::write(&path, doc.to_string()).unwrap();
        path.display().to_string()
    };
    let good = write("good.kubeconfig", json!({ "tokenFile": "token" }));
    let (code, out) = api
        .occ(&[
            "cluster",
            "add",
            "c1",
            "--kubeconfig",
            &good,
            "--gateway-image",
            IMAGE,
        ])
        .await;
    assert_eq!(code, 0, "{out}");
    let seen = server.requests();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer token-from-a-file")),
        "{seen:?}"
    );
    let huge = write("huge.kubeconfig", json!({ "tokenFile": "/dev/zero" }));
    let before = server.requests().len();
    let started = std::time::Instant::now();
    let (code, out) = api
        .occ(&["cluster", "update", "c1", "--kubeconfig", &huge])
        .await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("users[name=u].user.tokenFile"), "{out}");
    assert!(
        out.contains("/dev/zero") && out.contains("larger than"),
        "{out}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(server.requests().len(), before, "something was sent");
    // Settings alone: the stored credentials stay.
    let other = format!("r/y@sha256:{}", "2".repeat(64));
    let (code, out) = api
        .occ(&["cluster", "update", "c1", "--gateway-image", &other])
        .await;
    assert_eq!(code, 0, "{out}");
    let shown = api.admin("GET", "/clusters/c1", Value::Null).await.unwrap();
    assert_eq!(shown["settings"]["gatewayImage"], json!(other));
    assert!(
        server
            .requests()
            .iter()
            .skip(before)
            .all(|r| r.authorization.as_deref() == Some("Bearer token-from-a-file"))
    );
}

/// A backend whose every call panics (the stand-in for a bug anywhere below a handler).
struct Panicking;

impl Backend for Panicking {
    async fn call(
        &self,
        _target: impl Into<Target> + Send,
        _operation: Operation,
        _options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        panic!("a bug below the handler")
    }
}

/// Issue 27 N2: a panic while handling one request answers that request 500 INTERNAL_ERROR
/// (it used to drop the connection without an answer), and the API goes on serving.
#[tokio::test]
async fn a_panicking_request_is_a_500_with_a_code_and_the_api_goes_on() {
    let api = Api::start_with(Panicking).await;
    let server = FakeApiserver::start(FakeAnswer::Apiserver { deny: vec![] })
        .await
        .unwrap();
    for _ in 0..2 {
        let (status, code, message) = api
            .admin(
                "POST",
                "/clusters",
                register("c1", kubeconfig(&server, json!({ "token": "t" }))),
            )
            .await
            .expect_err("registered");
        assert_eq!(
            (status, code.as_str()),
            (500, "INTERNAL_ERROR"),
            "{message}"
        );
    }
    assert_eq!(
        api.admin("GET", "/clusters", Value::Null).await.unwrap(),
        json!([])
    );
}
