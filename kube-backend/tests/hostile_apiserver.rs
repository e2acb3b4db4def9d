//! A hostile or broken API server cannot take the coordinator down (issue 26 N3): every
//! response body is capped, and a larger one fails that cluster's request with a code,
//! quickly, without holding more than the cap. The server is a scripted HTTPS server on
//! loopback (`clawfleet_k8s_tests::FakeApiserver`); no control plane needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use clawfleet_k8s_tests::{FakeAnswer, FakeApiserver};
use clawfleet_kube::{Cluster, ClusterSettings, KubeBackend, parse_kubeconfig};
use clawfleet_protocol::failure::FailureCode;

fn cluster(server: &FakeApiserver) -> Cluster {
    Cluster {
        name: "hostile".to_owned(),
        credentials: parse_kubeconfig(&server.kubeconfig("u", "t0ken"), None).unwrap(),
        settings: ClusterSettings::new(format!("r/x@sha256:{}", "1".repeat(64))),
    }
}

const LIMIT: u64 = 1024 * 1024;

/// A body that never ends: the call fails once the cap is passed, long before the request
/// timeout, with `KUBERNETES_API_REJECTED` naming the limit, and is not retried.
#[tokio::test]
async fn an_endless_response_fails_at_the_cap() {
    let server = FakeApiserver::start(FakeAnswer::Endless).await.unwrap();
    let backend = KubeBackend::with_max_response_bytes(LIMIT);
    let started = Instant::now();
    let err = backend.probe_cluster(&cluster(&server)).await.unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(err.code, FailureCode::KubernetesApiRejected, "{err:?}");
    assert!(
        err.message
            .contains(&format!("exceeds the response limit of {LIMIT} bytes")),
        "{}",
        err.message
    );
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert_eq!(
        server.requests().len(),
        1,
        "a refused answer is not retried"
    );
    // What the server managed to push is the cap plus what the sockets buffer, not more.
    let sent = server.bytes_sent();
    assert!(
        sent < LIMIT + 64 * 1024 * 1024,
        "the server sent {sent} bytes"
    );
}

/// A declared length over the cap (2.5 GB, as in the issue) fails before the body is read,
/// with the default cap.
#[tokio::test]
async fn a_declared_huge_length_fails_at_once() {
    let server = FakeApiserver::start(FakeAnswer::DeclaredLength(2_500_000_000))
        .await
        .unwrap();
    let backend = KubeBackend::new();
    let started = Instant::now();
    let err = backend.probe_cluster(&cluster(&server)).await.unwrap_err();
    assert_eq!(err.code, FailureCode::KubernetesApiRejected, "{err:?}");
    assert!(
        err.message.contains(&format!(
            "exceeds the response limit of {} bytes",
            clawfleet_kube::MAX_RESPONSE_BYTES
        )),
        "{}",
        err.message
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The same backend still serves a well-behaved cluster afterwards.
#[tokio::test]
async fn other_clusters_are_unaffected() {
    let hostile = FakeApiserver::start(FakeAnswer::Endless).await.unwrap();
    let fine = FakeApiserver::start(FakeAnswer::Json {
        status: 200,
        body: r#"{"major":"1","minor":"37","gitVersion":"v1.37.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":"linux/amd64"}"#.to_owned(),
    })
    .await
    .unwrap();
    let backend = KubeBackend::with_max_response_bytes(LIMIT);
    backend.probe_cluster(&cluster(&hostile)).await.unwrap_err();
    let mut other = cluster(&fine);
    other.name = "fine".to_owned();
    let probe = backend.probe_cluster(&other).await.unwrap();
    assert_eq!(probe.server_version, "v1.37.0");
}
