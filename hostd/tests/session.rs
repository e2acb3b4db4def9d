//! `hostd serve`'s session loop over the fake privileged layer: framing, verification, replay
//! protection, many operations per session, and what happens at end of input.
#![allow(clippy::unwrap_used)] // test helpers fail loudly by design

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::framing::{FrameDecoder, write_frame};
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::{OperationResult, OperationState, Outcome, ResultMessage};
use clawfleet_protocol::ssh_key::{Algorithm, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr};
use clawfleet_protocol::{
    Configuration, Envelope, Fingerprint, HostName, Ident, Limits, Message, OperationId,
    PROTOCOL_VERSION, Principal, SignedEnvelope, Target,
};
use hostd::config::Config;
use hostd::engine::Engine;
use hostd::fake::FakeSystem;
use hostd::session::{Responder, now_unix, serve};
use serde_json::json;

struct Fixture {
    _dir: tempfile::TempDir,
    config: Config,
    fake: FakeSystem,
    key: PrivateKey,
    host_key: Fingerprint,
}

impl Fixture {
    fn new() -> Self {
        Self::with_config("")
    }

    /// A fixture whose hostd.toml also has `extra` (top-level keys).
    fn with_config(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap();
        let signers = dir.path().join("allowed_signers");
        std::fs::write(
            &signers,
            format!(
                "occ@test namespaces=\"clawfleet-operation\" {}\n",
                key.public_key().to_openssh().unwrap()
            ),
        )
        .unwrap();
        let text = format!(
            "host_name = \"h1\"\n{extra}\n[limits]\nlock_timeout_ms = 300\nreadiness_timeout_ms = 300\n"
        );
        let mut config = hostd::fake::test_config(dir.path(), &text, &[]).unwrap();
        config.allowed_signers = signers;
        Self {
            fake: FakeSystem::new(&config.unit_dir),
            _dir: dir,
            config,
            key,
            host_key: Fingerprint::new(format!("SHA256:{}", "Q".repeat(43))).unwrap(),
        }
    }

    fn envelope(&self, id: &str, operation: Operation) -> Envelope {
        self.envelope_at(id, operation, now_unix())
    }

    /// An envelope issued at `now` by the coordinator's clock, valid for 300 s.
    fn envelope_at(&self, id: &str, operation: Operation, now: u64) -> Envelope {
        Envelope {
            version: PROTOCOL_VERSION,
            operation_id: OperationId::new(id).unwrap(),
            target: Target {
                host: HostName::new("h1").unwrap(),
                host_key: self.host_key.clone(),
            },
            issuer: Principal::new("occ@test").unwrap(),
            issued_at: now,
            expires_at: now + 300,
            deadline_seconds: 60,
            fence: None,
            operation,
        }
    }

    fn signed(&self, id: &str, operation: Operation) -> SignedEnvelope {
        self.signed_envelope(&self.envelope(id, operation))
    }

    fn signed_envelope(&self, envelope: &Envelope) -> SignedEnvelope {
        SignedEnvelope::sign(envelope, &self.key).unwrap()
    }

    /// Runs one session over `input` and returns every message hostd wrote.
    fn session(&self, input: Vec<u8>) -> Vec<Message> {
        self.keyed_session(None, input)
    }

    /// A session started as `hostd serve --key <key>`.
    fn keyed_session(&self, key: Option<&str>, input: Vec<u8>) -> Vec<Message> {
        let engine = Engine::new(&self.config, &self.fake, self.host_key.clone());
        let mut responder = Responder::new(&engine, &self.config).unwrap();
        responder.set_login_key(key.map(|k| hostd::session::LoginKeyId::new(k).unwrap()));
        let mut output = Vec::new();
        let _ = serve(
            &responder,
            std::io::Cursor::new(input),
            &mut output,
            Arc::new(AtomicBool::new(false)),
        );
        let mut dec = FrameDecoder::new(1 << 20);
        dec.push(&output);
        let mut out = Vec::new();
        while let Some(frame) = dec.next_frame().unwrap() {
            out.push(Message::from_frame(&frame, &Limits::default()).unwrap());
        }
        out
    }
}

fn frames(envelopes: &[SignedEnvelope]) -> Vec<u8> {
    let mut wire = Vec::new();
    for e in envelopes {
        write_frame(
            &mut wire,
            &Message::Envelope(e.clone()).to_frame().unwrap(),
            1 << 20,
        )
        .unwrap();
    }
    wire
}

fn results(messages: &[Message]) -> Vec<ResultMessage> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Result(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn code(r: &ResultMessage) -> Option<FailureCode> {
    r.outcome.failure().map(|f| f.code)
}

fn ns() -> NamespaceRef {
    NamespaceRef {
        id: Ident::new("ns1").unwrap(),
        name: Ident::new("team").unwrap(),
    }
}

fn prepare() -> Operation {
    let configuration = Configuration::new(json!({"gateway": {"mode": "local"}})).unwrap();
    Operation::PrepareRevision(PrepareArgs {
        workspace: None,
        namespace: ns(),
        agent: AgentRef {
            id: Ident::new("a1").unwrap(),
            service_principal_id: Ident::new("sp1").unwrap(),
        },
        revision: RevisionSpec {
            id: Ident::new("r1").unwrap(),
            number: RevisionNumber::new(1).unwrap(),
            harness: Harness {
                id: HarnessId::Openclaw,
                version: HarnessVersion::new("2026.9.6").unwrap(),
                mode: HarnessMode::Embedded,
            },
            configuration_hash: configuration.hash(),
            configuration,
        },
        egress: None,
    })
}

#[test]
fn hello_then_many_operations_in_one_session_even_after_end_of_input() {
    let f = Fixture::new();
    let input = frames(&[
        f.signed("op-1", Operation::Probe(ProbeArgs {})),
        f.signed(
            "op-2",
            Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
        ),
        f.signed("op-3", prepare()),
        f.signed(
            "op-4",
            Operation::OperationStatus(OperationStatusArgs {
                operation_id: OperationId::new("op-3").unwrap(),
            }),
        ),
    ]);
    let out = f.session(input);
    match &out[0] {
        Message::Hello(h) => {
            assert_eq!(
                h.protocol_versions,
                clawfleet_protocol::SUPPORTED_VERSIONS.to_vec()
            );
            assert_eq!(h.host_key, f.host_key);
        }
        other => panic!("first message must be hello, got {other:?}"),
    }
    let rs = results(&out);
    assert_eq!(
        rs.len(),
        4,
        "every request read before end of input is answered"
    );
    for r in &rs {
        assert!(code(r).is_none(), "{r:?}");
    }
    assert!(
        out.iter()
            .any(|m| matches!(m, Message::Progress(p) if p.operation_id.as_str() == "op-3"))
    );
    match &rs[3].outcome {
        Outcome::Succeeded {
            result: OperationResult::OperationStatus(s),
        } => assert!(matches!(s.state, OperationState::Succeeded { .. })),
        other => panic!("{other:?}"),
    }
}

#[test]
fn replays_return_the_record_and_reused_ids_with_other_bodies_are_refused() {
    let f = Fixture::new();
    let ensure = f.signed(
        "op-1",
        Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
    );
    let first = f.session(frames(std::slice::from_ref(&ensure)));
    let again = f.session(frames(std::slice::from_ref(&ensure)));
    assert_eq!(results(&first)[0].outcome, results(&again)[0].outcome);
    // The replay did no work: no progress events.
    assert!(!again.iter().any(|m| matches!(m, Message::Progress(_))));
    let other = f.signed(
        "op-1",
        Operation::DeleteNamespace(NamespaceArgs { namespace: ns() }),
    );
    let out = f.session(frames(&[other]));
    assert_eq!(code(&results(&out)[0]), Some(FailureCode::ReplayMismatch));
    assert!(
        f.config.state_root.join("namespaces").exists(),
        "nothing was deleted"
    );
}

#[test]
fn a_read_only_operation_reusing_a_recorded_id_is_refused_and_operation_status_keeps_the_record() {
    let f = Fixture::new();
    let ensure = f.signed(
        "op-1",
        Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
    );
    let recorded = results(&f.session(frames(std::slice::from_ref(&ensure))))[0].clone();
    assert!(code(&recorded).is_none(), "{recorded:?}");
    let status_of = |asked: &str| {
        Operation::OperationStatus(OperationStatusArgs {
            operation_id: OperationId::new(asked).unwrap(),
        })
    };
    // Every read-only operation under the recorded id: refused, nothing run.
    let out = f.session(frames(&[
        f.signed("op-1", Operation::Probe(ProbeArgs {})),
        f.signed("op-1", Operation::Status(StatusArgs::default())),
        f.signed("op-1", status_of("op-1")),
    ]));
    for r in results(&out) {
        assert_eq!(code(&r), Some(FailureCode::ReplayMismatch), "{r:?}");
        let message = &r.outcome.failure().unwrap().message;
        assert!(message.contains("ensure-namespace"), "{message}");
    }
    // operation-status under its own id still reports the recorded operation, and the
    // recorded result replays unchanged.
    let out = f.session(frames(&[f.signed("op-2", status_of("op-1")), ensure]));
    let rs = results(&out);
    match &rs[0].outcome {
        Outcome::Succeeded {
            result: OperationResult::OperationStatus(s),
        } => match &s.state {
            OperationState::Succeeded { kind, result } => {
                assert_eq!(*kind, OperationKind::EnsureNamespace);
                assert!(matches!(**result, OperationResult::EnsureNamespace(_)));
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    assert_eq!(rs[1].outcome, recorded.outcome);

    // Read-only operations are not recorded (documented exemption): reusing one's id for
    // another read-only body runs it, and operation-status never reports a read-only one as
    // if it had been recorded.
    let out = f.session(frames(&[
        f.signed("op-3", Operation::Probe(ProbeArgs {})),
        f.signed("op-3", Operation::Status(StatusArgs::default())),
        f.signed("op-4", status_of("op-3")),
    ]));
    let rs = results(&out);
    assert!(rs.iter().all(|r| code(r).is_none()), "{rs:?}");
    match &rs[2].outcome {
        Outcome::Succeeded {
            result: OperationResult::OperationStatus(s),
        } => assert_eq!(s.state, OperationState::Unknown),
        other => panic!("{other:?}"),
    }
    // And a changing operation may then take that id.
    let out = f.session(frames(&[f.signed("op-3", prepare())]));
    assert!(code(&results(&out)[0]).is_none(), "{out:?}");
}

#[test]
fn refused_envelopes_change_nothing_and_carry_their_codes() {
    let f = Fixture::new();
    let good = f.signed(
        "op-1",
        Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
    );
    let mut tampered = good.clone();
    let i = tampered.body.iter().position(|b| *b == b'1').unwrap();
    tampered.body[i] = b'2';
    let stranger_key = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap();
    let stranger = SignedEnvelope::sign(
        &f.envelope(
            "op-2",
            Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
        ),
        &stranger_key,
    )
    .unwrap();
    let mut expired_env = f.envelope(
        "op-3",
        Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
    );
    expired_env.issued_at -= 1000;
    expired_env.expires_at = expired_env.issued_at + 10;
    let expired = SignedEnvelope::sign(&expired_env, &f.key).unwrap();
    let mut future_env = f.envelope(
        "op-4",
        Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
    );
    future_env.issued_at += 1000;
    future_env.expires_at += 1000;
    let future = SignedEnvelope::sign(&future_env, &f.key).unwrap();
    let mut wrong_env = f.envelope(
        "op-5",
        Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
    );
    wrong_env.target.host = HostName::new("h2").unwrap();
    let wrong = SignedEnvelope::sign(&wrong_env, &f.key).unwrap();
    let out = f.session(frames(&[tampered, stranger, expired, future, wrong]));
    let codes: Vec<_> = results(&out).iter().map(code).collect();
    assert_eq!(
        codes,
        vec![
            Some(FailureCode::SignatureInvalid),
            Some(FailureCode::UnknownSigner),
            Some(FailureCode::EnvelopeExpired),
            Some(FailureCode::EnvelopeNotYetValid),
            Some(FailureCode::WrongHost),
        ]
    );
    assert!(results(&out)[0].operation_id.is_none());
    assert!(!f.config.state_root.join("namespaces").exists());
    assert!(f.fake.calls().is_empty());
}

#[test]
fn a_garbage_stream_gets_one_clear_error_and_the_session_ends() {
    let f = Fixture::new();
    let out = f.session(b"GET / HTTP/1.1\r\n\r\n".to_vec());
    let rs = results(&out);
    assert_eq!(rs.len(), 1);
    assert_eq!(code(&rs[0]), Some(FailureCode::InvalidInput));
    assert!(rs[0].outcome.failure().unwrap().message.contains("frame"));
}

#[test]
fn an_invalid_allowed_signers_file_refuses_everything() {
    let f = Fixture::new();
    std::fs::write(
        &f.config.allowed_signers,
        "occ@test cert-authority ssh-ed25519 AAAA\n",
    )
    .unwrap();
    let out = f.session(frames(&[f.signed("op-1", Operation::Probe(ProbeArgs {}))]));
    assert_eq!(
        code(&results(&out)[0]),
        Some(FailureCode::SignersFileInvalid)
    );
}

/// Issue 11's replay scenario: the host clock runs ahead long enough for pruning to remove the
/// entry of a delete-namespace whose envelope has not expired by real time, the clock is
/// stepped back, the Namespace is created again, and the recorded delete-namespace envelope
/// comes again. It is refused with REPLAY_UNVERIFIABLE and the Namespace stays.
#[test]
fn a_replay_after_its_entry_was_pruned_under_a_clock_ahead_is_refused() {
    let mut f = Fixture::new();
    f.config.journal_max_entries = 2;
    let engine = Engine::new(&f.config, &f.fake, f.host_key.clone());
    let clock = std::rc::Rc::new(std::cell::Cell::new(now_unix()));
    let mut responder = Responder::new(&engine, &f.config).unwrap();
    let c = clock.clone();
    responder.set_clock(move || c.get());
    let run = |signed: &SignedEnvelope| responder.respond(signed, &|| false, &mut |_| {});
    let real = clock.get();
    let ns_dir = f
        .config
        .state_root
        .join("namespaces")
        .join(hostd::layout::dir_name(&ns().id));
    let ensure = |id: &str, at: u64| {
        f.signed_envelope(&f.envelope_at(
            id,
            Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
            at,
        ))
    };
    assert_eq!(code(&run(&ensure("ens-1", real))), None);
    let delete = f.signed_envelope(&f.envelope_at(
        "del-1",
        Operation::DeleteNamespace(NamespaceArgs { namespace: ns() }),
        real,
    ));
    assert_eq!(code(&run(&delete)), None);
    assert!(!ns_dir.exists());

    // An hour ahead: envelopes signed then are valid by this clock; after the third, pruning
    // removes ens-1 and del-1 (expired by the host's clock, not by real time).
    let ahead = real + 3_600;
    clock.set(ahead);
    for i in 0..3 {
        assert_eq!(code(&run(&ensure(&format!("ahead-{i}"), ahead))), None);
    }
    assert!(
        !f.config.state_root.join("journal/del-1.json").exists(),
        "del-1 pruned"
    );

    // Back to real time: the Namespace is deleted and created again, then del-1 is replayed.
    clock.set(real + 1);
    let delete2 = f.signed_envelope(&f.envelope_at(
        "del-2",
        Operation::DeleteNamespace(NamespaceArgs { namespace: ns() }),
        real + 1,
    ));
    assert_eq!(code(&run(&delete2)), None);
    assert_eq!(code(&run(&ensure("ens-2", real + 1))), None);
    assert!(ns_dir.exists());
    let replay = run(&delete);
    println!("replayed delete-namespace: {:?}", replay.outcome);
    assert_eq!(code(&replay), Some(FailureCode::ReplayUnverifiable));
    assert!(
        ns_dir.exists(),
        "the re-created Namespace was deleted by a replay"
    );
}

/// An envelope of `version` with `fence`, signed.
fn versioned(
    f: &Fixture,
    id: &str,
    op: Operation,
    version: u32,
    fence: Option<u64>,
) -> SignedEnvelope {
    let mut e = f.envelope(id, op);
    e.version = version;
    e.fence = fence;
    f.signed_envelope(&e)
}

#[test]
fn a_host_configured_for_version_1_only_behaves_like_a_hostd_that_predates_fencing() {
    let f = Fixture::with_config("protocol_versions = [1]");
    let ensure = || Operation::EnsureNamespace(NamespaceArgs { namespace: ns() });
    let out = f.session(frames(&[
        versioned(&f, "op-1", Operation::Probe(ProbeArgs {}), 1, None),
        versioned(&f, "op-2", ensure(), PROTOCOL_VERSION, None),
        versioned(&f, "op-3", prepare(), PROTOCOL_VERSION, Some(5)),
        versioned(&f, "op-4", ensure(), 1, None),
    ]));
    match &out[0] {
        Message::Hello(h) => assert_eq!(h.protocol_versions, vec![1]),
        other => panic!("first message must be hello, got {other:?}"),
    }
    let rs = results(&out);
    assert_eq!(rs.len(), 4);
    match &rs[0].outcome {
        Outcome::Succeeded {
            result: OperationResult::Probe(p),
        } => assert_eq!(p.protocol_versions, vec![1]),
        other => panic!("{other:?}"),
    }
    for r in &rs[1..3] {
        assert_eq!(code(r), Some(FailureCode::UnsupportedVersion), "{r:?}");
        let message = &r.outcome.failure().unwrap().message;
        assert!(
            message.contains(&format!("version {PROTOCOL_VERSION}")) && message.contains("[1]"),
            "{message}"
        );
    }
    // The refused ones were not recorded (their ids stay free) and changed nothing; the
    // version 1 envelope after them ran.
    assert!(code(&rs[3]).is_none(), "{:?}", rs[3]);
    let status = f.session(frames(&[versioned(
        &f,
        "op-5",
        Operation::OperationStatus(OperationStatusArgs {
            operation_id: OperationId::new("op-3").unwrap(),
        }),
        1,
        None,
    )]));
    match &results(&status)[0].outcome {
        Outcome::Succeeded {
            result: OperationResult::OperationStatus(s),
        } => assert_eq!(s.state, OperationState::Unknown),
        other => panic!("{other:?}"),
    }
    assert!(!f.config.state_root.join("fences").exists());
    for namespace in std::fs::read_dir(f.config.state_root.join("namespaces")).unwrap() {
        let agents = namespace.unwrap().path().join("agents");
        if agents.exists() {
            assert_eq!(
                std::fs::read_dir(&agents).unwrap().count(),
                0,
                "no Agent prepared"
            );
        }
    }
}

#[test]
fn the_envelope_fence_reaches_the_engine_and_a_lower_one_is_refused() {
    let f = Fixture::new();
    let stale = versioned(&f, "op-3", prepare(), PROTOCOL_VERSION, Some(4));
    let ensure = Operation::EnsureNamespace(NamespaceArgs { namespace: ns() });
    let out = f.session(frames(&[
        versioned(&f, "op-1", ensure, PROTOCOL_VERSION, None),
        versioned(&f, "op-2", prepare(), PROTOCOL_VERSION, Some(5)),
        stale.clone(),
        versioned(&f, "op-4", prepare(), 1, None),
        versioned(&f, "op-5", prepare(), PROTOCOL_VERSION, Some(6)),
    ]));
    let rs = results(&out);
    assert_eq!(rs.len(), 5);
    for (i, expected) in [
        None,
        None,
        Some(FailureCode::FenceStale),
        Some(FailureCode::FenceStale),
        None,
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(code(&rs[i]), expected, "op-{}: {:?}", i + 1, rs[i]);
    }
    let message = &rs[2].outcome.failure().unwrap().message;
    assert!(
        message.contains("fence 4 ") && message.contains("fence 5,"),
        "{message}"
    );
    // A stale operation's refusal is recorded like any outcome: a retry of it gets the same.
    let again = f.session(frames(&[stale]));
    assert_eq!(results(&again)[0].outcome, rs[2].outcome);
}

/// Issue 17: a no-op (an idempotent prepare) is recorded cheaply but as surely as a change: its
/// replay returns the recorded outcome and runs nothing, even after the Agent it names was
/// deleted (a rerun would create it again), its id with another body is refused, and
/// operation-status reports it.
#[test]
fn a_no_op_is_recorded_and_its_replay_never_runs_again() {
    let f = Fixture::new();
    let noop = f.signed("op-3", prepare());
    let out = f.session(frames(&[
        f.signed(
            "op-1",
            Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
        ),
        f.signed("op-2", prepare()),
        noop.clone(),
    ]));
    let first = results(&out);
    assert!(first.iter().all(|r| code(r).is_none()), "{first:?}");
    match &first[2].outcome {
        Outcome::Succeeded {
            result: OperationResult::PrepareRevision(p),
        } => assert!(p.ready && !p.created, "{p:?}"),
        other => panic!("{other:?}"),
    }
    let agent_dir = f.config.state_root.join("namespaces");
    let delete = f.signed(
        "op-4",
        Operation::DeleteAgent(AgentArgs {
            namespace: ns(),
            agent: AgentRef {
                id: Ident::new("a1").unwrap(),
                service_principal_id: Ident::new("sp1").unwrap(),
            },
        }),
    );
    let out = f.session(frames(&[delete, noop.clone()]));
    let second = results(&out);
    assert!(code(&second[0]).is_none(), "{second:?}");
    assert_eq!(
        second[1].outcome, first[2].outcome,
        "the replay is the record"
    );
    let status = f.session(frames(&[f.signed(
        "op-5",
        Operation::OperationStatus(OperationStatusArgs {
            operation_id: OperationId::new("op-3").unwrap(),
        }),
    )]));
    match &results(&status)[0].outcome {
        Outcome::Succeeded {
            result: OperationResult::OperationStatus(s),
        } => assert!(matches!(s.state, OperationState::Succeeded { .. }), "{s:?}"),
        other => panic!("{other:?}"),
    }
    let other_body = f.signed(
        "op-3",
        Operation::EnsureNamespace(NamespaceArgs { namespace: ns() }),
    );
    let out = f.session(frames(&[other_body]));
    assert_eq!(code(&results(&out)[0]), Some(FailureCode::ReplayMismatch));
    // Nothing of the Agent came back.
    let accounts = f.config.state_root.join("accounts");
    let leftovers: Vec<_> = std::fs::read_dir(&accounts)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(agent_dir.exists());
}

/// Issue 27: `hostd apply` answered an oversized envelope in plain text. It answers the
/// typed failure, as a session answers an oversized frame, before reading any configuration.
#[test]
fn hostd_apply_answers_an_oversized_envelope_with_input_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("op.json");
    std::fs::write(&body, vec![b' '; Limits::default().max_envelope + 1]).unwrap();
    std::fs::write(dir.path().join("op.json.sig"), b"sig").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hostd"))
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .arg("apply")
        .arg(&body)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let reply: ResultMessage = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not a result: {e}: {out:?}"));
    match reply.outcome {
        Outcome::Failed { failure } => {
            assert_eq!(failure.code, FailureCode::InputTooLarge, "{failure}");
            assert!(failure.message.contains("op.json"), "{failure}");
        }
        other => panic!("{other:?}"),
    }
}

/// Issue 26, N12: a stolen login key could open any number of idle root sessions. At most
/// `[limits] max_sessions` run at once per login key (one more answers `SESSION_LIMIT` and
/// ends), another key's sessions still run, and a session that receives nothing for
/// `[limits] session_idle_timeout_seconds` ends itself.
#[test]
fn sessions_beyond_a_keys_limit_are_refused_and_idle_ones_end() {
    let mut f = Fixture::new();
    f.config.limits.max_sessions = 2;
    let key_a = hostd::session::LoginKeyId::new("key-a").unwrap();
    let slots_a =
        hostd::session::LoginKeyId::slots_dir(Some(&key_a), &f.config.state_root.join("sessions"));
    std::fs::create_dir_all(&f.config.state_root).unwrap();
    let held_a: Vec<_> = (0..2)
        .map(|_| hostd::session::take_slot(&slots_a, 2).unwrap().unwrap())
        .collect();
    let out = f.keyed_session(
        Some("key-a"),
        frames(&[f.signed("op-a", Operation::Probe(ProbeArgs {}))]),
    );
    let r = results(&out);
    assert_eq!(code(&r[0]), Some(FailureCode::SessionLimit), "{r:?}");
    assert!(
        r[0].outcome.failure().unwrap().message.contains("key-a"),
        "{r:?}"
    );
    // Key A holds all of its slots; key B's sessions are served.
    let out = f.keyed_session(
        Some("key-b"),
        frames(&[f.signed("op-b", Operation::Probe(ProbeArgs {}))]),
    );
    assert_eq!(code(&results(&out)[0]), None, "{out:?}");
    drop(held_a);

    let slots = hostd::session::LoginKeyId::slots_dir(None, &f.config.state_root.join("sessions"));
    std::fs::create_dir_all(&f.config.state_root).unwrap();
    let held: Vec<_> = (0..2)
        .map(|_| hostd::session::take_slot(&slots, 2).unwrap().unwrap())
        .collect();
    let out = f.session(frames(&[f.signed("op-1", Operation::Probe(ProbeArgs {}))]));
    let r = results(&out);
    assert_eq!(r.len(), 1, "{out:?}");
    assert_eq!(code(&r[0]), Some(FailureCode::SessionLimit), "{r:?}");
    assert!(r[0].outcome.failure().unwrap().is_retryable());
    drop(held);
    let out = f.session(frames(&[f.signed("op-2", Operation::Probe(ProbeArgs {}))]));
    assert_eq!(code(&results(&out)[0]), None, "a free slot serves again");

    // A client that connects and sends nothing: the session ends at its idle limit.
    f.config.limits.session_idle_timeout = std::time::Duration::from_millis(600);
    let (reader, writer) = std::io::pipe().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let engine = Engine::new(&f.config, &f.fake, f.host_key.clone());
            let responder = Responder::new(&engine, &f.config).unwrap();
            let started = std::time::Instant::now();
            let _ = serve(
                &responder,
                reader,
                std::io::sink(),
                Arc::new(AtomicBool::new(false)),
            );
            let _ = done_tx.send(started.elapsed());
        });
        let ended = done_rx.recv_timeout(std::time::Duration::from_secs(10));
        // Ends the session either way (end of input), so the scope can finish.
        drop(writer);
        let elapsed = ended.expect("an idle session did not end within 10 s");
        assert!(
            elapsed >= std::time::Duration::from_millis(600),
            "{elapsed:?}"
        );
    });
}
