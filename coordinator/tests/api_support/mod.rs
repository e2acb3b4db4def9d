//! What the API tests share: an in-memory store with one global admin token, and the API
//! served on loopback with a worker the test drives.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use coordinator::api::{AppState, router_with};
use coordinator::backend::Backend;
use coordinator::client::Client;
use coordinator::config::{ApiSettings, WorkerSettings};
use coordinator::model::{Grant, Role};
use coordinator::service::Service;
use coordinator::store::SharedStore;
use coordinator::store::sqlite::SqliteStore;
use coordinator::worker::Worker;
use serde_json::{Value, json};

/// An in-memory store and the secret of its `*:admin` token.
pub async fn store_with_admin() -> (SharedStore, String) {
    let store: SharedStore = Arc::new(SqliteStore::in_memory().unwrap());
    let admin = admin_token(&store).await;
    (store, admin)
}

/// A new `*:admin` token in `store`: its secret.
pub async fn admin_token(store: &SharedStore) -> String {
    let (_, admin) = coordinator::tokens::create(
        &**store,
        "admin",
        &[Grant {
            namespace: "*".into(),
            role: Role::Admin,
        }],
    )
    .await
    .unwrap();
    admin
}

/// The API served on loopback as `occ serve` serves it (`api::serve`, with `api`'s limits),
/// over `store` and `backend`, and a worker on the same backend that backs off 1 to 5 ms.
/// Nothing runs the worker on its own: a test calls [`Served::settle`].
pub struct Served<B: Backend> {
    /// `http://127.0.0.1:<port>`.
    pub server: String,
    /// `127.0.0.1:<port>`.
    pub addr: String,
    pub store: SharedStore,
    /// The secret of a `*:admin` token.
    pub admin: String,
    pub worker: Arc<Worker<B>>,
    pub backend: Arc<B>,
}

impl<B: Backend + 'static> Served<B> {
    pub async fn start(
        store: SharedStore,
        admin: String,
        backend: Arc<B>,
        api: ApiSettings,
    ) -> Self {
        let settings = WorkerSettings {
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(5),
            ..WorkerSettings::default()
        };
        let worker = Arc::new(Worker::new(store.clone(), backend.clone(), settings));
        let state = Arc::new(AppState {
            foreground: Default::default(),
            service: Service::new(store.clone()),
            backend: backend.clone(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = router_with(state, &api);
        tokio::spawn(async move {
            coordinator::api::serve(listener, router, &api, std::future::pending()).await
        });
        Self {
            server: format!("http://{addr}"),
            addr: addr.to_string(),
            store,
            admin,
            worker,
            backend,
        }
    }

    /// A client of this API with `token`.
    pub fn client(&self, token: &str) -> Client {
        Client::new(&self.server, Some(token.to_owned())).unwrap()
    }

    /// A call as the admin (`Value::Null`: no body); a refusal panics with its message.
    pub async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let c = self.client(&self.admin);
        let (method, path) = (method.to_owned(), path.to_owned());
        let body = (!body.is_null()).then_some(body);
        tokio::task::spawn_blocking(move || c.request(&method, &path, body.as_ref()))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs the worker until the queue is empty (at most 200 items).
    pub async fn settle(&self) {
        for _ in 0..200 {
            if self.worker.run_once().await.is_none()
                && self.store.pending_work().await.unwrap() == 0
            {
                return;
            }
        }
    }

    /// Host `h1` at 127.0.0.1 with `host_key`.
    pub async fn add_host(&self, host_key: &str) {
        self.call(
            "POST",
            "/hosts",
            json!({"name": "h1", "address": "127.0.0.1", "hostKey": host_key}),
        )
        .await;
    }

    /// Namespaces `namespaces` on h1, Configuration `cfg` (an empty document) in the first,
    /// and its Agent `a1` on it, deployed.
    pub async fn deploy_agent(&self, namespaces: &[&str]) {
        for ns in namespaces {
            self.call("POST", "/namespaces", json!({"id": ns, "hosts": ["h1"]}))
                .await;
        }
        let ns = namespaces[0];
        self.call(
            "POST",
            &format!("/namespaces/{ns}/configurations"),
            json!({"id": "cfg", "document": {}}),
        )
        .await;
        self.call(
            "POST",
            &format!("/namespaces/{ns}/agents"),
            json!({"id": "a1", "configurationId": "cfg"}),
        )
        .await;
        self.call(
            "POST",
            &format!("/namespaces/{ns}/agents/a1/deploy"),
            Value::Null,
        )
        .await;
        self.settle().await;
    }
}
