//! Gateway streams (issue 30): where an Agent's gateway is, whether a stream may still run,
//! and its audit record.

use clawfleet_protocol::Ident;
use serde_json::json;

use super::{Result, Service, ServiceError};
use crate::backend::Target;
use crate::codes::Code;
use crate::model::DesiredState;

/// Where one Agent's gateway is served, as a stream is opened to it.
#[derive(Debug, Clone)]
pub struct GatewayPlace {
    pub target: Target,
    pub namespace: Ident,
    pub agent: Ident,
    /// The active revision the stream was opened on: a new one closes the stream.
    pub revision: Ident,
}

impl Service {
    /// The Agent's target and active revision, refused unless it is meant to run.
    pub async fn gateway_place(&self, ns: &str, id: &str) -> Result<GatewayPlace> {
        let namespace = self.namespace(ns).await?;
        let agent = self.agent(ns, id).await?;
        let not_serving = |why: &str| {
            ServiceError::conflict(
                Code::GatewayNotServing,
                format!("Agent {ns}/{id} {why}, so its gateway cannot be reached"),
            )
        };
        if agent.desired_state != DesiredState::Running {
            return Err(not_serving(&format!("is {}", agent.desired_state.as_str())));
        }
        let Some(revision) = agent.active_revision_id.clone() else {
            return Err(not_serving("has no active revision"));
        };
        let target = crate::targets::agent(&*self.store, &namespace, &agent)
            .await?
            .ok_or_else(|| not_serving("was never placed on a host"))?;
        Ok(GatewayPlace {
            target,
            namespace: namespace.id.clone(),
            agent: agent.id.clone(),
            revision,
        })
    }

    /// [`Service::gateway_place`] for the Control UI route: refused unless the active
    /// revision serves the Control UI at the coordinator's path for it (its
    /// `gateway.controlUi.basePath`, set when the revision was built, and not turned off).
    /// A revision from before the coordinator set the path would answer a page whose links
    /// all miss; the refusal says to deploy instead.
    pub async fn control_ui_place(&self, ns: &str, id: &str) -> Result<GatewayPlace> {
        let place = self.gateway_place(ns, id).await?;
        let revision = self
            .store
            .revision(ns, id, place.revision.as_str())
            .await?
            .ok_or_else(|| ServiceError::not_found("revision", place.revision.as_str()))?;
        let path = clawfleet_api::routes::control_ui_path(ns, id);
        if let Some(why) = control_ui_refusal(&revision.rendered, &path) {
            return Err(ServiceError::conflict(
                Code::ControlUiNotDeployed,
                format!("Agent {ns}/{id}'s active revision {} {why}", place.revision),
            ));
        }
        Ok(place)
    }

    /// Why an open stream must close now, `None` while it may go on: the token was revoked
    /// or expired, or the Agent was stopped, deleted or moved to another active revision.
    /// A store that cannot answer keeps the stream (the next check decides).
    pub async fn gateway_stream_ends(
        &self,
        token_hash: &str,
        place: &GatewayPlace,
        now: i64,
    ) -> Option<&'static str> {
        match self.store.token_by_hash(token_hash).await {
            Ok(None) => return Some("token revoked"),
            Ok(Some(t)) if t.expires_at.is_some_and(|at| now >= at) => {
                return Some("token expired");
            }
            Ok(Some(_)) | Err(_) => {}
        }
        match self
            .store
            .agent(place.namespace.as_str(), place.agent.as_str())
            .await
        {
            Ok(None) => Some("agent deleted"),
            Ok(Some(a)) if a.desired_state != DesiredState::Running => Some("agent stopped"),
            Ok(Some(a)) if a.active_revision_id.as_ref() != Some(&place.revision) => {
                Some("active revision changed")
            }
            Ok(Some(_)) | Err(_) => None,
        }
    }

    /// The audit record of one stream as it opens (`via`: `tunnel` for `occ agent connect`,
    /// `websocket` for the gateway route).
    pub async fn audit_gateway_connect(
        &self,
        actor: &str,
        place: &GatewayPlace,
        via: &str,
    ) -> Result<()> {
        self.audit(
            actor,
            "agent.gateway-connect",
            &format!("{}/{}", place.namespace, place.agent),
            json!({
                "target": place.target.name(),
                "revision": place.revision.as_str(),
                "via": via,
            }),
        )
        .await
    }

    /// The audit record of one request through the gateway route that may change something
    /// (any method but GET, HEAD and OPTIONS): its method, path (no query) and the gateway's
    /// status.
    pub async fn audit_gateway_request(
        &self,
        actor: &str,
        place: &GatewayPlace,
        method: &str,
        path: &str,
        status: u16,
    ) -> Result<()> {
        self.audit(
            actor,
            "agent.gateway-request",
            &format!("{}/{}", place.namespace, place.agent),
            json!({
                "target": place.target.name(),
                "revision": place.revision.as_str(),
                "method": method,
                "path": path.chars().take(512).collect::<String>(),
                "status": status,
            }),
        )
        .await
    }

    /// The audit record of one closed stream.
    #[allow(clippy::too_many_arguments)]
    pub async fn audit_gateway_stream(
        &self,
        actor: &str,
        place: &GatewayPlace,
        via: &str,
        bytes_to_gateway: u64,
        bytes_from_gateway: u64,
        duration_ms: u64,
        close_reason: &str,
    ) -> Result<()> {
        self.audit(
            actor,
            "agent.gateway-stream",
            &format!("{}/{}", place.namespace, place.agent),
            json!({
                "target": place.target.name(),
                "revision": place.revision.as_str(),
                "via": via,
                "bytesToGateway": bytes_to_gateway,
                "bytesFromGateway": bytes_from_gateway,
                "durationMs": duration_ms,
                "closeReason": close_reason,
            }),
        )
        .await
    }
}

/// Why a revision's rendered document does not serve the Control UI at `path`, or `None`
/// when it does: turned off, or built without that basePath (before the coordinator set it).
fn control_ui_refusal(rendered: &serde_json::Value, path: &str) -> Option<String> {
    let ui = &rendered["gateway"]["controlUi"];
    if ui["enabled"] == serde_json::Value::Bool(false) {
        return Some("turns its Control UI off (gateway.controlUi.enabled: false)".to_owned());
    }
    if ui["basePath"].as_str() != Some(path) {
        return Some(format!(
            "does not serve its Control UI at {path}/ (it was built before the coordinator \
             set gateway.controlUi.basePath); deploy a new revision to open it here"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_revision_serves_the_control_ui_only_at_its_own_path_and_when_on() {
        let path = "/namespaces/ns1/agents/a1/ui";
        let at = |ui: serde_json::Value| json!({"gateway": {"mode": "local", "controlUi": ui}});
        assert_eq!(
            control_ui_refusal(&at(json!({"basePath": path})), path),
            None
        );
        // Rendered before the coordinator set the path: no controlUi, or another path.
        let old = control_ui_refusal(&json!({"gateway": {"mode": "local"}}), path);
        assert!(old.is_some_and(|w| w.contains("deploy a new revision")));
        let other = control_ui_refusal(
            &at(json!({"basePath": "/namespaces/ns1/agents/a2/ui"})),
            path,
        );
        assert!(other.is_some_and(|w| w.contains(path)));
        let off = control_ui_refusal(&at(json!({"basePath": path, "enabled": false})), path);
        assert!(off.is_some_and(|w| w.contains("enabled: false")));
    }
}
