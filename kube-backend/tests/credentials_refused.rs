//! Expired or revoked credentials (issue 27): a 401 or 403 while removing things (delete an
//! Agent or a Namespace) is retryable, so the removal succeeds once `occ cluster update`
//! replaced the credentials; so is a Namespace's ensure (it is retried until the rights or
//! credentials are fixed); an Agent's prepare outside the auth window stays permanent. Against a scripted HTTPS server
//! answering every request 401 (`clawfleet_k8s_tests::FakeApiserver`); no control plane.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use clawfleet_k8s_tests::{FakeAnswer, FakeApiserver};
use clawfleet_kube::{Cluster, KubeBackend, parse_kubeconfig};
use clawfleet_protocol::FailureCode;
use support::*;

async fn refusing(status: u16) -> FakeApiserver {
    let reason = if status == 401 {
        "Unauthorized"
    } else {
        "Forbidden"
    };
    FakeApiserver::start(FakeAnswer::Json {
        status,
        body: format!(
            r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{reason}","reason":"{reason}","code":{status}}}"#
        ),
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn removals_refused_for_credentials_are_retryable() {
    for status in [401, 403] {
        let server = refusing(status).await;
        let cluster = Cluster {
            name: "expired".to_owned(),
            credentials: parse_kubeconfig(&server.kubeconfig("u", "expired"), None).unwrap(),
            settings: settings(),
        };
        let backend = KubeBackend::new();
        for op in [delete_agent_op("ns-1", "a1"), delete_ns_op("ns-1")] {
            let kind = op.kind();
            let f = backend.call(&cluster, op, DEADLINE).await.unwrap_err();
            assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{kind}: {f}");
            assert!(f.is_retryable(), "{status} {kind}: {f}");
            assert!(f.message.contains("occ cluster update"), "{f}");
        }
        let f = backend
            .call(&cluster, ensure_op("ns-1"), DEADLINE)
            .await
            .unwrap_err();
        assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{f}");
        assert!(f.is_retryable(), "{status} ensure-namespace: {f}");
        let words = if status == 401 {
            "occ cluster update"
        } else {
            "lacks the rights"
        };
        assert!(f.message.contains(words), "{status} ensure-namespace: {f}");
        let f = backend
            .call(&cluster, prepare_op("ns-1", "a1", "r1", 1), DEADLINE)
            .await
            .unwrap_err();
        assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{f}");
        assert!(!f.is_retryable(), "{status} prepare-revision: {f}");
    }
}
