//! `occ host enrol` against the API with the real SSH backend, and the real hostd behind a
//! private OpenSSH sshd on loopback (tests/ssh_support): a name hostd does not answer to is
//! refused at enrolment, naming both names, with nothing stored.
//!
//! Needs root and /usr/sbin/sshd; prints SKIP otherwise (fails under CI=true).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support;
use crate::ssh_support;

use std::process::{Command, Stdio};
use std::sync::Arc;

use coordinator::api::{AppState, router};
use coordinator::service::Service;
use ssh_support::*;

/// hostd refuses every envelope addressed to another host name (WRONG_HOST). Enrolling a host
/// under a name hostd does not answer to used to succeed, and then every operation failed;
/// now the enrolment is refused with HOST_NAME_MISMATCH naming hostd's name, and nothing is
/// stored. Under hostd's own name the enrolment succeeds and keeps the probe.
#[test]
fn enrol_refuses_a_name_hostd_does_not_answer_to() {
    if loopback_skip() {
        return;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let rt = runtime();
    let (server, admin, store) = rt.block_on(async {
        let (store, admin) = api_support::store_with_admin().await;
        let state = Arc::new(AppState {
            foreground: Default::default(),
            service: Service::new(store.clone()),
            backend: Arc::new(keys.backend(fast_settings())),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        (format!("http://{addr}"), admin, store)
    });
    let port = lo.port.to_string();
    let enrol = |name: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_occ"))
            .args([
                "--server", &server, "--token", &admin, "host", "enrol", name,
            ])
            .args(["--address", "127.0.0.1", "--port", &port])
            .args(["--host-key", &lo.host_pub])
            .env("OCC_LOG", "error")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };

    let (code, out) = enrol("web-1");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("HOST_NAME_MISMATCH"), "{out}");
    assert!(
        out.contains(&format!("answers to the host name {}, not web-1", lo.name)),
        "{out}"
    );
    assert!(rt.block_on(store.hosts()).unwrap().is_empty());

    let (code, out) = enrol(&lo.name);
    assert_eq!(code, 0, "{out}");
    let host = rt.block_on(store.host(&lo.name)).unwrap().unwrap();
    assert!(host.last_probe.is_some(), "{host:?}");
}
