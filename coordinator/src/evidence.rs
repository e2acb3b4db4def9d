//! What a failed activation leaves as evidence with its revision (`runtimeFailure`): which
//! failures an Agent's runtime explains, the bounded, redacted record of what the target
//! showed, and the values redacted from it. The worker writes it; the service shows it.

use clawfleet_protocol::FailureCode;
use clawfleet_protocol::redact::Redactor;
use clawfleet_protocol::runtime::RuntimeReport;

use crate::codes::AnyCode;
use crate::model::{EvidenceLine, RuntimeFailure};

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
) -> RuntimeFailure {
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
    let last_lines: Vec<EvidenceLine> = report
        .map(|r| r.recent_lines.as_slice())
        .unwrap_or_default()
        .iter()
        .rev()
        .take(EVIDENCE_LINES as usize)
        .rev()
        .map(|e| EvidenceLine {
            at: e.at.clone(),
            source: e.source,
            message: clawfleet_protocol::text::clean(
                &redactor.line(&e.message).text,
                EVIDENCE_LINE_MAX,
            ),
        })
        .collect();
    let workload = report.and_then(|r| r.workload.as_ref());
    RuntimeFailure {
        component: "gateway".to_owned(),
        check: check.to_owned(),
        checked_at: crate::clock::now_seconds(),
        code: code.as_str().to_owned(),
        message: clawfleet_protocol::text::clean(&redactor.line(message).text, EVIDENCE_LINE_MAX),
        active_state: workload.map(|w| w.active_state.clone()),
        sub_state: workload.map(|w| w.sub_state.clone()),
        restarts: workload.map(|w| w.restarts),
        last_exit: workload.and_then(|w| w.last_exit.clone()),
        events: report
            .map(|r| r.events.iter().take(5).cloned().collect())
            .unwrap_or_default(),
        last_lines,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The evidence keeps the shape the API has always shown (scripts and the end-to-end
    /// tests read these fields by name), and evidence stored with fewer fields still reads.
    #[test]
    fn the_evidence_has_every_field_and_older_evidence_still_reads() {
        let e = runtime_failure(
            FailureCode::UnitFailed.into(),
            "the unit failed",
            None,
            Vec::new(),
        );
        assert_eq!(
            (e.check.as_str(), e.code.as_str()),
            ("unit", FailureCode::UnitFailed.as_str())
        );
        let v = serde_json::to_value(&e).unwrap_or_default();
        let keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            [
                "activeState",
                "check",
                "checkedAt",
                "code",
                "component",
                "events",
                "lastExit",
                "lastLines",
                "message",
                "restarts",
                "subState"
            ]
        );
        let older: RuntimeFailure = serde_json::from_value(
            serde_json::json!({"code": FailureCode::ReadinessTimeout.as_str(), "message": "m"}),
        )
        .unwrap_or_default();
        assert_eq!(older.code, FailureCode::ReadinessTimeout.as_str());
        assert!(older.last_lines.is_empty());
    }
}
