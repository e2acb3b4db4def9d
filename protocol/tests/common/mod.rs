//! Fixtures shared by the protocol's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use clawfleet_protocol::envelope::DEFAULT_DEADLINE_SECONDS;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::ssh_key::{Algorithm, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr};
use clawfleet_protocol::{
    Configuration, Envelope, Fingerprint, HostName, Ident, OperationId, PROTOCOL_VERSION,
    Principal, Target,
};
use serde_json::json;

pub const NOW: u64 = 1_800_000_000;

pub fn ident(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

pub fn new_key() -> PrivateKey {
    PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap()
}

pub fn host_key_fingerprint() -> Fingerprint {
    Fingerprint::new("SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s").unwrap()
}

pub fn namespace() -> NamespaceRef {
    NamespaceRef {
        id: ident("ns-1"),
        name: ident("team-a"),
    }
}

pub fn agent() -> AgentRef {
    AgentRef {
        id: ident("agent-1"),
        service_principal_id: ident("sp-1"),
    }
}

pub fn revision_spec(id: &str, number: u64) -> RevisionSpec {
    let configuration = Configuration::new(json!({
        "gateway": {"mode": "local", "bind": "loopback", "port": 18700,
                    "auth": {"mode": "password", "password": {"source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD"}}},
        "x-clawfleet-test": {"label": id}
    }))
    .unwrap();
    RevisionSpec {
        id: ident(id),
        number: RevisionNumber::new(number).unwrap(),
        harness: Harness {
            id: HarnessId::Openclaw,
            version: HarnessVersion::new("2026.9.6").unwrap(),
            mode: HarnessMode::Embedded,
        },
        configuration_hash: configuration.hash(),
        configuration,
    }
}

/// One of every operation.
pub fn every_operation() -> Vec<Operation> {
    let spec = revision_spec("rev-1", 1);
    let rref = spec.reference();
    let rargs = RevisionArgs {
        namespace: namespace(),
        agent: agent(),
        revision: rref,
    };
    vec![
        Operation::Probe(ProbeArgs {}),
        Operation::EnsureNamespace(NamespaceArgs {
            namespace: namespace(),
        }),
        Operation::DeleteNamespace(NamespaceArgs {
            namespace: namespace(),
        }),
        Operation::PrepareRevision(PrepareArgs {
            workspace: None,
            namespace: namespace(),
            agent: agent(),
            revision: spec,
            egress: None,
        }),
        Operation::ActivateRevision(ActivateArgs::from(rargs.clone())),
        Operation::VerifyRevision(rargs.clone()),
        Operation::StopRevision(rargs.clone()),
        Operation::RetireRevision(rargs),
        Operation::DeleteAgent(AgentArgs {
            namespace: namespace(),
            agent: agent(),
        }),
        Operation::Status(StatusArgs::default()),
        Operation::Status(StatusArgs {
            namespace_id: Some(ident("ns-1")),
        }),
        Operation::OperationStatus(OperationStatusArgs {
            operation_id: OperationId::new("op-0001").unwrap(),
        }),
    ]
}

pub fn envelope(operation: Operation) -> Envelope {
    Envelope {
        version: PROTOCOL_VERSION,
        operation_id: OperationId::new("op-42").unwrap(),
        target: Target {
            host: HostName::new("host-1.example").unwrap(),
            host_key: host_key_fingerprint(),
        },
        issuer: Principal::new("occ@fleet").unwrap(),
        issued_at: NOW,
        expires_at: NOW + 300,
        deadline_seconds: DEFAULT_DEADLINE_SECONDS,
        fence: None,
        operation,
    }
}

/// An envelope as a JSON value, for tests that break it on purpose.
pub fn envelope_value(operation: Operation) -> serde_json::Value {
    serde_json::to_value(envelope(operation)).unwrap()
}
