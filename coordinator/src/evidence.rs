//! What a failed activation leaves as evidence with its revision (`runtimeFailure`): which
//! failures an Agent's runtime explains, the bounded, redacted record of what the target
//! showed, and the values redacted from it. The worker writes it; the service shows it.

use clawfleet_protocol::FailureCode;
use clawfleet_protocol::redact::Redactor;
use clawfleet_protocol::runtime::RuntimeReport;
use serde_json::{Value, json};

use crate::codes::AnyCode;

/// Lines of evidence kept with a failed activation.
pub const EVIDENCE_LINES: u32 = 20;
/// Longest evidence line kept, in characters.
const EVIDENCE_LINE_MAX: usize = 512;

/// Whether a failure is one an Agent's runtime explains (the gateway did not come up).
pub fn is_runtime_failure(code: AnyCode) -> bool {
    [
        FailureCode::ReadinessTimeout,
        FailureCode::UnitFailed,
        FailureCode::ListenerNotOwned,
        FailureCode::RevisionIncomplete,
        FailureCode::RevisionImagePullFailed,
        FailureCode::RevisionUnschedulable,
        FailureCode::NamespacePodQuotaExceeded,
    ]
    .iter()
    .any(|c| code == *c)
}

/// The bounded, redacted `runtimeFailure` of a failed activation, from the failure and what
/// `agent-runtime` (with evidence lines) showed right after it. `secrets`: the values of the
/// Agent's bound secrets ([`secret_redaction_terms`]), replaced wherever they appear.
pub fn runtime_failure(
    code: AnyCode,
    message: &str,
    report: Option<&RuntimeReport>,
    secrets: Vec<String>,
) -> Value {
    let check = if code == FailureCode::UnitFailed {
        "unit"
    } else if code == FailureCode::ListenerNotOwned {
        "listener"
    } else if code != FailureCode::ReadinessTimeout {
        // The Kubernetes backend's rollout outcomes (incomplete, unschedulable, image pull).
        "rollout"
    } else {
        "readiness"
    };
    let mut redactor = Redactor::new(secrets);
    let lines: Vec<Value> = report
        .map(|r| r.recent_lines.as_slice())
        .unwrap_or_default()
        .iter()
        .rev()
        .take(EVIDENCE_LINES as usize)
        .rev()
        .map(|e| {
            json!({
                "at": e.at,
                "source": e.source,
                "message": clawfleet_protocol::text::clean(&redactor.line(&e.message).text, EVIDENCE_LINE_MAX),
            })
        })
        .collect();
    let workload = report.and_then(|r| r.workload.as_ref());
    json!({
        "component": "gateway",
        "check": check,
        "checkedAt": crate::clock::now_seconds(),
        "code": code,
        "message": clawfleet_protocol::text::clean(&redactor.line(message).text, EVIDENCE_LINE_MAX),
        "activeState": workload.map(|w| w.active_state.clone()),
        "subState": workload.map(|w| w.sub_state.clone()),
        "restarts": workload.map(|w| w.restarts),
        "lastExit": workload.and_then(|w| w.last_exit.clone()),
        "events": report.map(|r| r.events.iter().take(5).cloned().collect::<Vec<_>>()).unwrap_or_default(),
        "lastLines": lines,
    })
}

/// The values of every secret version that any revision of the Agent binds (old versions
/// too: the log may hold lines from before a rotation): the literal terms its log and the
/// evidence of its failures are redacted with, so a bound secret's value never leaves in a
/// log line, whatever the target redacted.
pub async fn secret_redaction_terms(
    store: &dyn crate::store::Store,
    ns: &str,
    agent: &str,
) -> Result<Vec<String>, crate::store::StoreError> {
    let mut bound: Vec<(String, u32)> = store
        .revisions(ns, agent)
        .await?
        .iter()
        .flat_map(|r| r.secrets.iter().map(|b| (b.name.to_string(), b.version)))
        .collect();
    bound.sort_unstable();
    bound.dedup();
    let mut out = Vec::with_capacity(bound.len());
    for (name, version) in bound {
        if let Some(v) = store.secret_value(ns, &name, version).await? {
            // Values are UTF-8 (checked when stored).
            out.push(String::from_utf8_lossy(&v.value).into_owned());
        }
    }
    Ok(out)
}
