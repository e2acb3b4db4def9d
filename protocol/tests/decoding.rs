//! Round trips of every operation and result, and every class of invalid input.

#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

mod common;

use clawfleet_protocol::envelope::DecodeError;
use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::*;
use clawfleet_protocol::{Envelope, Failure, Limits, OperationId};
use common::*;
use serde_json::{Value, json};

/// A change that breaks an envelope on purpose.
type Mutation = Box<dyn Fn(&mut Value)>;

fn decode(value: &Value) -> Result<Envelope, DecodeError> {
    Envelope::decode(&serde_json::to_vec(value).unwrap(), &Limits::default())
}

fn invalid_at(value: &Value) -> (String, String) {
    match decode(value) {
        Err(DecodeError::Invalid { path, message, .. }) => (path, message),
        other => panic!("expected an invalid-input error, got {other:?}"),
    }
}

/// Where and why an envelope is refused, invalid or unsupported, with the code it is answered.
fn refused_at(value: &Value) -> (String, String, FailureCode) {
    match decode(value) {
        Err(e) => {
            let code = e.to_failure().code;
            match e {
                DecodeError::Invalid { path, message, .. }
                | DecodeError::Unsupported { path, message, .. } => (path, message, code),
                other => panic!("expected an invalid or unsupported input, got {other:?}"),
            }
        }
        Ok(e) => panic!("decoded: {e:?}"),
    }
}

#[test]
fn every_operation_round_trips_through_the_envelope() {
    for op in every_operation() {
        let env = envelope(op.clone());
        let bytes = env.to_bytes().unwrap();
        let back = Envelope::decode(&bytes, &Limits::default()).unwrap();
        assert_eq!(back, env, "{}", op.kind());
        // Re-encoding is byte-stable, so a signature over it stays valid.
        assert_eq!(back.to_bytes().unwrap(), bytes);
    }
}

#[test]
fn operations_use_their_wire_names() {
    for op in every_operation() {
        let v = serde_json::to_value(&op).unwrap();
        assert_eq!(v["op"], op.kind().as_str());
    }
}

#[test]
fn every_result_round_trips() {
    let observation = AgentObservation {
        current: Some(ident("rev-2")),
        served: Some(ident("rev-1")),
        port: Some(18700),
        unit: Some(UnitObservation {
            name: "clawfleet-agent-0123.service".into(),
            active_state: "active".into(),
            sub_state: "running".into(),
            n_restarts: 0,
            enabled: true,
        }),
    };
    let results = vec![
        OperationResult::Probe(ProbeResult {
            hostd_version: "0.1.0".into(),
            protocol_versions: vec![1],
            system_host_name: "h1".into(),
            host_key: host_key_fingerprint(),
            systemd_version: Some("252".into()),
            missing_tools: vec![],
            port_range: PortRange {
                start: 18700,
                end: 18999,
            },
            max_agents: 100,
            agents: 2,
            quotas: Some("enforced".into()),
            network_isolation: Some("namespaces".into()),
        }),
        OperationResult::EnsureNamespace(EnsureNamespaceResult {
            namespace_id: ident("ns-1"),
            created: true,
        }),
        OperationResult::DeleteNamespace(DeleteNamespaceResult {
            namespace_id: ident("ns-1"),
            removed: true,
            agents_removed: 2,
        }),
        OperationResult::PrepareRevision(PrepareResult {
            workspace: None,
            ready: true,
            created: true,
            observation: observation.clone(),
        }),
        OperationResult::ActivateRevision(ActivateResult {
            restarted: true,
            unit_changed: false,
            observation: observation.clone(),
            restored: None,
            secrets_reload: None,
            config_reload: None,
        }),
        OperationResult::ActivateRevision(ActivateResult {
            restarted: false,
            unit_changed: false,
            observation: observation.clone(),
            restored: None,
            secrets_reload: Some(SecretsReload::Unverified),
            config_reload: None,
        }),
        OperationResult::ActivateRevision(ActivateResult {
            restarted: true,
            unit_changed: false,
            observation: observation.clone(),
            restored: Some(Restored {
                revision: clawfleet_protocol::Ident::new("rev-1").unwrap(),
                candidate_failure: Failure::new(FailureCode::ReadinessTimeout, "not ready"),
            }),
            secrets_reload: None,
            config_reload: None,
        }),
        OperationResult::VerifyRevision(VerifyResult {
            observation: observation.clone(),
        }),
        OperationResult::StopRevision(StopResult {
            stopped: true,
            observation: observation.clone(),
        }),
        OperationResult::RetireRevision(RetireResult {
            stopped: false,
            removed: true,
            observation: observation.clone(),
        }),
        OperationResult::DeleteAgent(DeleteAgentResult { removed: true }),
        OperationResult::Status(Inventory {
            namespaces: vec![NamespaceInventory {
                id: ident("ns-1"),
                name: ident("team-a"),
                agents: vec![AgentInventory {
                    id: ident("agent-1"),
                    service_principal_id: ident("sp-1"),
                    account: "cfa-0123".into(),
                    revisions: vec![RevisionInventory {
                        id: ident("rev-1"),
                        number: RevisionNumber::new(1).unwrap(),
                    }],
                    observation,
                    unit_drift: Some("MemoryMax=8G is not what hostd writes".into()),
                    secrets: Some(Vec::new()),
                }],
            }],
            problems: vec![InventoryProblem {
                path: "/var/lib/clawfleet/namespaces/x".into(),
                message: "marker has an unknown schema".into(),
            }],
        }),
    ];
    let mut states = vec![
        OperationState::Unknown,
        OperationState::Running {
            kind: OperationKind::ActivateRevision,
            step: Some(Step::Readiness),
        },
        OperationState::Failed {
            kind: OperationKind::ActivateRevision,
            failure: Failure::new(FailureCode::SessionClosed, "session closed"),
            after_step: Some(Step::PointerFlip),
        },
    ];
    for r in &results {
        states.push(OperationState::Succeeded {
            kind: r.kind(),
            result: Box::new(r.clone()),
        });
    }
    let mut all = results;
    for state in states {
        all.push(OperationResult::OperationStatus(OperationStatusResult {
            operation_id: OperationId::new("op-1").unwrap(),
            state,
        }));
    }
    for r in all {
        for outcome in [
            Outcome::Succeeded { result: r.clone() },
            Outcome::Failed {
                failure: Failure::new(FailureCode::LockTimeout, "lock busy"),
            },
        ] {
            let msg = ResultMessage {
                operation_id: Some(OperationId::new("op-1").unwrap()),
                outcome,
            };
            let bytes = serde_json::to_vec(&msg).unwrap();
            let back: ResultMessage =
                clawfleet_protocol::envelope::decode_json("result", &bytes).unwrap();
            assert_eq!(back, msg);
            assert_camel_case(&serde_json::from_slice(&bytes).unwrap(), "result");
            results_from_a_newer_hostd_with_extra_fields_decode(&msg);
        }
    }
}

/// A newer hostd adds a field to every object of an answer (hosts are upgraded first): the
/// answer still decodes, and to what it said without the new field.
fn results_from_a_newer_hostd_with_extra_fields_decode(msg: &ResultMessage) {
    fn add(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.values_mut().for_each(add);
                m.insert("fieldFromTheFuture".into(), json!({"x": 1}));
            }
            Value::Array(a) => a.iter_mut().for_each(add),
            _ => {}
        }
    }
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("fieldFromTheFuture");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let original = serde_json::to_value(msg).unwrap();
    let mut newer = original.clone();
    add(&mut newer);
    let bytes = serde_json::to_vec(&newer).unwrap();
    let back: ResultMessage = clawfleet_protocol::envelope::decode_json("result", &bytes)
        .unwrap_or_else(|e| panic!("a newer hostd's answer is refused: {e}\n{newer}"));
    let mut again = serde_json::to_value(&back).unwrap();
    strip(&mut again);
    assert_eq!(again, original);
}

/// Every key the protocol writes is camelCase (issue 27: `after_step` was the one
/// snake_case field). The carried configuration is the operator's document, not the
/// protocol's, and is skipped.
fn assert_camel_case(value: &Value, path: &str) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                assert!(
                    !key.contains('_'),
                    "{path}.{key} is not camelCase: {value:#}"
                );
                if key != "configuration" {
                    assert_camel_case(v, &format!("{path}.{key}"));
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                assert_camel_case(v, &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

#[test]
fn every_envelope_key_is_camel_case() {
    for op in every_operation() {
        let mut v = envelope_value(op);
        v["version"] = json!(2);
        assert_camel_case(&v, "envelope");
    }
}

/// The rename keeps the coordinator able to read what a hostd from before it answers.
#[test]
fn operation_status_reads_after_step_in_both_spellings() {
    let state = OperationState::Failed {
        kind: OperationKind::ActivateRevision,
        failure: Failure::new(FailureCode::SessionClosed, "session closed"),
        after_step: Some(Step::PointerFlip),
    };
    let v = serde_json::to_value(&state).unwrap();
    assert_eq!(v["afterStep"], "pointer-flip", "{v:#}");
    assert!(v.get("after_step").is_none(), "{v:#}");
    let mut old = v.clone();
    let step = old.as_object_mut().unwrap().remove("afterStep").unwrap();
    old["after_step"] = step;
    let back: OperationState = serde_json::from_value(old).unwrap();
    assert_eq!(back, state);
}

#[test]
fn unknown_fields_are_rejected_at_every_level_with_their_path() {
    let op = || every_operation()[3].clone(); // prepare-revision: the deepest
    let cases: Vec<(&str, Mutation)> = vec![
        ("extra", Box::new(|v| v["extra"] = json!(1))),
        ("target", Box::new(|v| v["target"]["port"] = json!(22))),
        (
            "operation",
            Box::new(|v| v["operation"]["force"] = json!(true)),
        ),
        (
            "operation.namespace",
            Box::new(|v| v["operation"]["namespace"]["owner"] = json!("x")),
        ),
        (
            "operation.agent",
            Box::new(|v| v["operation"]["agent"]["uid"] = json!(0)),
        ),
        (
            "operation.revision",
            Box::new(|v| v["operation"]["revision"]["path"] = json!("/etc")),
        ),
        (
            "operation.revision.harness",
            Box::new(|v| v["operation"]["revision"]["harness"]["image"] = json!("x")),
        ),
    ];
    for (path, mutate) in cases {
        let mut v = envelope_value(op());
        mutate(&mut v);
        let (got_path, message, code) = refused_at(&v);
        assert!(message.contains("unknown field"), "{path}: {message}");
        assert!(
            got_path.starts_with(path) || path == "operation",
            "expected path {path}, got {got_path}: {message}"
        );
        // A field of the operation this side does not know is the sender being newer; one of
        // the envelope's is invalid input (a newer envelope has a newer version).
        let expected = if path.starts_with("operation") {
            FailureCode::OperationUnsupported
        } else {
            FailureCode::InvalidInput
        };
        assert_eq!(code, expected, "{path}: {message}");
    }
    // Arguments of a no-argument operation.
    let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
    v["operation"]["x"] = json!(1);
    let (_, message, code) = refused_at(&v);
    assert!(message.contains("unknown field"), "{message}");
    assert_eq!(code, FailureCode::OperationUnsupported, "{message}");
}

#[test]
fn wrong_types_and_missing_fields_name_the_field() {
    let cases: Vec<(&str, Mutation)> = vec![
        ("operationId", Box::new(|v| v["operationId"] = json!(42))),
        ("issuedAt", Box::new(|v| v["issuedAt"] = json!("now"))),
        ("expiresAt", Box::new(|v| v["expiresAt"] = json!(-1))),
        (
            "deadlineSeconds",
            Box::new(|v| v["deadlineSeconds"] = json!(1.5)),
        ),
        (
            "target.host",
            Box::new(|v| v["target"]["host"] = json!(null)),
        ),
        (
            "operation.revision.number",
            Box::new(|v| v["operation"]["revision"]["number"] = json!("1")),
        ),
        (
            "operation.revision.configuration",
            Box::new(|v| v["operation"]["revision"]["configuration"] = json!("{}")),
        ),
        (
            "operation.namespace",
            Box::new(|v| {
                v["operation"]["namespace"]
                    .as_object_mut()
                    .unwrap()
                    .remove("name");
            }),
        ),
    ];
    for (path, mutate) in cases {
        let mut v = envelope_value(every_operation()[3].clone());
        mutate(&mut v);
        let (got_path, message) = invalid_at(&v);
        assert!(
            got_path.starts_with(path),
            "expected path {path}, got {got_path}: {message}"
        );
    }
}

#[test]
fn unknown_operations_and_out_of_scope_harnesses_are_rejected() {
    let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
    v["operation"]["op"] = json!("reboot-host");
    let (path, message, code) = refused_at(&v);
    assert!(path.starts_with("operation"), "{path}");
    assert!(message.contains("reboot-host"), "{message}");
    assert_eq!(code, FailureCode::OperationUnsupported, "{message}");

    let mut v = envelope_value(every_operation()[3].clone());
    v["operation"]["revision"]["harness"]["mode"] = json!("dedicated");
    let (path, message) = invalid_at(&v);
    assert_eq!(path, "operation.revision.harness.mode");
    assert!(message.contains("dedicated"), "{message}");
}

#[test]
fn invalid_identifiers_are_rejected_wherever_they_appear() {
    let bad_values = [
        json!(""),
        json!("x".repeat(64)),
        json!("../etc"),
        json!("a b"),
        json!("-lead"),
        json!("trail."),
        json!("ünï"),
        json!("a\nb"),
    ];
    let places: [&[&str]; 5] = [
        &["operation", "namespace", "id"],
        &["operation", "namespace", "name"],
        &["operation", "agent", "id"],
        &["operation", "agent", "servicePrincipalId"],
        &["operation", "revision", "id"],
    ];
    for place in places {
        for bad in &bad_values {
            let mut v = envelope_value(every_operation()[3].clone());
            let mut slot = &mut v;
            for key in place {
                slot = &mut slot[*key];
            }
            *slot = bad.clone();
            let (path, message) = invalid_at(&v);
            assert_eq!(path, place.join("."), "{bad}: {message}");
            assert!(message.contains("invalid Ident"), "{message}");
        }
    }
    for (field, bad) in [
        ("operationId", json!("op 1")),
        ("issuer", json!("occ*")),
        ("issuer", json!("a,b")),
    ] {
        let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
        v[field] = bad;
        let (path, _) = invalid_at(&v);
        assert_eq!(path, field);
    }
    let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
    v["target"]["hostKey"] = json!("MD5:00:11");
    assert_eq!(invalid_at(&v).0, "target.hostKey");
    let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
    v["target"]["host"] = json!("host_1");
    assert_eq!(invalid_at(&v).0, "target.host");
}

#[test]
fn semantic_limits_are_enforced() {
    let mut v = envelope_value(every_operation()[3].clone());
    v["operation"]["revision"]["number"] = json!(0);
    assert_eq!(invalid_at(&v).0, "operation.revision.number");
    v["operation"]["revision"]["number"] = json!(1u64 << 53);
    assert_eq!(invalid_at(&v).0, "operation.revision.number");

    let mut v = envelope_value(every_operation()[3].clone());
    v["operation"]["revision"]["configurationHash"] = json!("0".repeat(64));
    let (path, message) = invalid_at(&v);
    assert_eq!(path, "operation.revision.configurationHash");
    assert!(message.contains("does not match"), "{message}");

    let mut v = envelope_value(every_operation()[3].clone());
    v["operation"]["revision"]["configuration"] = json!({"gateway": {"port": 1}});
    assert_eq!(invalid_at(&v).0, "operation.revision.configurationHash");

    for bad in [0, 3601] {
        let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
        v["deadlineSeconds"] = json!(bad);
        assert_eq!(invalid_at(&v).0, "deadlineSeconds");
    }
    let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
    v["expiresAt"] = v["issuedAt"].clone();
    assert_eq!(invalid_at(&v).0, "expiresAt");
}

#[test]
fn oversized_documents_are_rejected_before_parsing() {
    let limits = Limits {
        max_envelope: 500,
        ..Limits::default()
    };
    let bytes = envelope(every_operation()[3].clone()).to_bytes().unwrap();
    assert!(bytes.len() > 500);
    assert!(matches!(
        Envelope::decode(&bytes, &limits),
        Err(DecodeError::TooLarge {
            what: "envelope",
            ..
        })
    ));
    // A configuration beyond its own limit fails even inside the envelope limit.
    let mut v = envelope_value(every_operation()[3].clone());
    v["operation"]["revision"]["configuration"] =
        json!({"big": "x".repeat(clawfleet_protocol::configuration::CONFIGURATION_MAX_BYTES)});
    let (path, message) = invalid_at(&v);
    assert_eq!(path, "operation.revision.configuration");
    assert!(message.contains("at most"), "{message}");
    // Deep nesting anywhere is refused, not a stack overflow.
    let deep = "[".repeat(100_000);
    assert!(Envelope::decode(deep.as_bytes(), &Limits::default()).is_err());
}

#[test]
fn versions_are_checked_first_with_their_own_code() {
    for bad in [
        json!(3),
        json!(0),
        json!("1"),
        json!(null),
        json!(4294967297u64),
    ] {
        let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
        v["version"] = bad.clone();
        v["somethingNewer"] = json!(true); // must not mask the version error
        match decode(&v) {
            Err(e @ DecodeError::UnsupportedVersion { .. }) => {
                assert_eq!(e.to_failure().code, FailureCode::UnsupportedVersion)
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
    v.as_object_mut().unwrap().remove("version");
    assert_eq!(invalid_at(&v).0, "version");
}

#[test]
fn malformed_json_is_invalid_input() {
    for bytes in [
        &b""[..],
        b"{",
        b"[]",
        b"null",
        b"{\"version\":1}garbage",
        b"\xff\xfe",
    ] {
        let err = Envelope::decode(bytes, &Limits::default()).unwrap_err();
        assert_eq!(
            err.to_failure().code,
            FailureCode::InvalidInput,
            "{:?}: {err}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// Version 2 carries a fence for Agent-scoped changes; version 1 (an older coordinator)
/// carries none; a fence anywhere else, or zero, is refused naming the field.
#[test]
fn fences_ride_only_on_version_2_agent_changes() {
    let stop = Operation::StopRevision(RevisionArgs {
        namespace: namespace(),
        agent: agent(),
        revision: RevisionRef {
            id: ident("rev-1"),
            number: RevisionNumber::new(1).unwrap(),
            configuration_hash: revision_spec("rev-1", 1).configuration_hash,
        },
    });
    let mut v = envelope_value(stop.clone());
    v["version"] = json!(2);
    v["fence"] = json!(7);
    assert_eq!(decode(&v).unwrap().fence, Some(7));
    v["version"] = json!(1);
    let (path, message) = invalid_at(&v);
    assert_eq!(path, "fence");
    assert!(message.contains("version 2"), "{message}");
    v.as_object_mut().unwrap().remove("fence");
    assert_eq!(decode(&v).unwrap().fence, None, "version 1 still decodes");
    let mut v = envelope_value(stop);
    v["version"] = json!(2);
    v["fence"] = json!(0);
    assert!(invalid_at(&v).1.contains("at least 1"));
    // delete-namespace removes Agents: it takes the coordinator's current fence.
    let mut v = envelope_value(Operation::DeleteNamespace(NamespaceArgs {
        namespace: namespace(),
    }));
    v["version"] = json!(2);
    v["fence"] = json!(9);
    assert_eq!(decode(&v).unwrap().fence, Some(9));
    let mut v = envelope_value(Operation::Probe(ProbeArgs {}));
    v["version"] = json!(2);
    v["fence"] = json!(3);
    let (path, message) = invalid_at(&v);
    assert_eq!(path, "fence");
    assert!(message.contains("probe"), "{message}");
    // Written without a fence, the field does not appear at all (version 1 peers refuse it).
    let e = decode(&envelope_value(Operation::Probe(ProbeArgs {}))).unwrap();
    assert!(
        !String::from_utf8(e.to_bytes().unwrap())
            .unwrap()
            .contains("fence")
    );
}
