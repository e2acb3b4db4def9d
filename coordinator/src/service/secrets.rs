//! Secrets of a Namespace: write-only values (a new version on every write), their metadata
//! and which Agents' revisions use which version; binding them into revisions; and rolling a
//! new version out to the Agents that use the secret.
//!
//! A value is never returned, logged or audited: it goes from the request into the store's
//! sealed column, and from there only to the worker that delivers it
//! ([`crate::store::SecretStore::secret_value`]).

use std::collections::BTreeMap;

use clawfleet_protocol::secret::{self, SecretName};
use serde_json::Value;
use zeroize::Zeroizing;

use super::{Result, Service, ServiceError, now};
use crate::codes::Code;
use crate::model::{DesiredState, SecretBinding, SecretVersion};
use crate::render;

pub use clawfleet_api::requests::NewSecret;
pub use clawfleet_api::responses::{SecretDeploy, SecretInfo, SecretUse};

fn check_name(name: &str) -> Result<SecretName> {
    SecretName::new(name)
        .map_err(|e| ServiceError::invalid(Code::InvalidSecretName, format!("name {name:?} {e}")))
}

impl Service {
    /// Stores a new version of a secret (`value` is wiped from memory when dropped).
    pub async fn put_secret(
        &self,
        actor: &str,
        ns: &str,
        name: &str,
        value: Zeroizing<Vec<u8>>,
    ) -> Result<SecretVersion> {
        let namespace = self.namespace(ns).await?;
        if namespace.deleting {
            return Err(ServiceError::conflict(
                Code::NamespaceDeleting,
                format!("Namespace {ns} is being deleted"),
            ));
        }
        let name = check_name(name)?;
        secret::check_value(&value)
            .map_err(|e| ServiceError::invalid(Code::InvalidSecretValue, format!("value {e}")))?;
        self.store
            .put_secret(ns, &name, &value, actor, now())
            .await?
            .ok_or_else(|| ServiceError::not_found("namespace", ns))
    }

    /// Every secret of a Namespace with its versions and users, by name.
    pub async fn secrets(&self, ns: &str) -> Result<Vec<SecretInfo>> {
        self.namespace(ns).await?;
        let versions = self.store.secrets(ns).await?;
        let uses = self.secret_uses(ns).await?;
        Ok(group(versions, &uses))
    }

    /// One secret with its versions and users.
    pub async fn secret(&self, ns: &str, name: &str) -> Result<SecretInfo> {
        self.namespace(ns).await?;
        let versions = self.store.secret_versions(ns, name).await?;
        if versions.is_empty() {
            return Err(ServiceError::not_found("secret", name));
        }
        let uses = self.secret_uses(ns).await?;
        group(versions, &uses)
            .pop()
            .ok_or_else(|| ServiceError::not_found("secret", name))
    }

    /// Deletes every version of a secret, unless an Agent's current revision (active or
    /// newest) binds it: 409 naming the Agents.
    pub async fn delete_secret(&self, actor: &str, ns: &str, name: &str) -> Result<()> {
        self.namespace(ns).await?;
        let uses = self.secret_uses(ns).await?;
        if let Some(users) = uses.get(name) {
            let mut agents: Vec<&str> = users.iter().map(|u| u.agent_id.as_str()).collect();
            agents.dedup();
            return Err(ServiceError::conflict(
                Code::SecretInUse,
                format!(
                    "secret {name} is bound by the current revisions of Agents {}; change \
                     their configurations and deploy them first",
                    agents.join(", ")
                ),
            ));
        }
        if !self.store.delete_secret(ns, name, actor, now()).await? {
            return Err(ServiceError::not_found("secret", name));
        }
        Ok(())
    }

    /// Deploys a new revision (binding the newest version) to every Agent whose current
    /// revision binds an older version of the secret, through the ordinary deploy path: each
    /// is audited, queued and applied like any deploy. An Agent that cannot take one now (in
    /// an open rollout, stopped, being deleted) is listed with the reason.
    pub async fn deploy_secret(
        &self,
        actor: &str,
        ns: &str,
        name: &str,
    ) -> Result<Vec<SecretDeploy>> {
        let info = self.secret(ns, name).await?;
        let agents = behind(&info);
        let mut out = Vec::new();
        for agent in agents {
            let a = self.agent(ns, agent).await?;
            if a.desired_state != DesiredState::Running {
                out.push(SecretDeploy {
                    agent_id: agent.to_owned(),
                    revision_id: None,
                    work_id: None,
                    code: None,
                    message: Some(format!(
                        "the Agent is {}; its next deploy binds version {}",
                        a.desired_state.as_str(),
                        info.version
                    )),
                });
                continue;
            }
            match self.deploy(actor, ns, agent).await {
                Ok((rev, work)) => out.push(SecretDeploy {
                    agent_id: agent.to_owned(),
                    revision_id: Some(rev.id.to_string()),
                    work_id: Some(work),
                    code: None,
                    message: None,
                }),
                Err(ServiceError::Store(e)) => return Err(ServiceError::Store(e)),
                Err(e) => out.push(SecretDeploy {
                    agent_id: agent.to_owned(),
                    revision_id: None,
                    work_id: None,
                    code: Some(error_code(&e).to_owned()),
                    message: Some(e.to_string()),
                }),
            }
        }
        Ok(out)
    }

    /// For each secret name, the Agents' current revisions (active and newest) binding it.
    async fn secret_uses(&self, ns: &str) -> Result<BTreeMap<String, Vec<SecretUse>>> {
        let mut out: BTreeMap<String, Vec<SecretUse>> = BTreeMap::new();
        for agent in self.store.agents(ns).await? {
            let revisions = self.store.revisions(ns, &agent.id).await?;
            let newest = revisions.last().map(|r| r.id.clone());
            let current = revisions.iter().filter(|r| {
                Some(&r.id) == agent.active_revision_id.as_ref() || Some(&r.id) == newest.as_ref()
            });
            for r in current {
                for b in &r.secrets {
                    out.entry(b.name.to_string()).or_default().push(SecretUse {
                        agent_id: agent.id.to_string(),
                        revision_id: r.id.to_string(),
                        version: b.version,
                        active: Some(&r.id) == agent.active_revision_id.as_ref(),
                        newest: Some(&r.id) == newest.as_ref(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Checks that every secret a configuration refers to exists in the Namespace: the
    /// refusal names the field and the secret.
    pub(super) async fn check_secret_references(&self, ns: &str, document: &Value) -> Result<()> {
        for (path, name) in render::secret_references(document).map_err(refused)? {
            if self.store.latest_secret(ns, &name).await?.is_none() {
                return Err(unknown_secret(ns, &path, &name));
            }
        }
        Ok(())
    }

    /// Binds a rendered document's secret references to the newest version of each secret
    /// and renders their providers; the versions the revision records.
    pub(super) async fn bind_secrets(
        &self,
        ns: &str,
        rendered: &mut Value,
    ) -> Result<Vec<SecretBinding>> {
        let mut bound: BTreeMap<SecretName, SecretBinding> = BTreeMap::new();
        for (path, name) in render::secret_references(rendered).map_err(refused)? {
            if bound.contains_key(&name) {
                continue;
            }
            let latest = self
                .store
                .latest_secret(ns, &name)
                .await?
                .ok_or_else(|| unknown_secret(ns, &path, &name))?;
            bound.insert(
                name.clone(),
                SecretBinding {
                    name,
                    version: latest.version,
                    fingerprint: latest.fingerprint,
                },
            );
        }
        render::bind_secrets(rendered).map_err(refused)?;
        Ok(bound.into_values().collect())
    }
}

/// The Agents whose active or newest revision binds an older version of the secret than its
/// newest, and whose newest revision does not already bind the newest: those a rotation
/// deploys to, by id.
pub(super) fn behind(info: &SecretInfo) -> Vec<&str> {
    let mut agents: Vec<&str> = info
        .used_by
        .iter()
        .filter(|u| u.version < info.version && (u.newest || u.active))
        .map(|u| u.agent_id.as_str())
        .collect();
    let current: Vec<&str> = info
        .used_by
        .iter()
        .filter(|u| u.newest && u.version == info.version)
        .map(|u| u.agent_id.as_str())
        .collect();
    agents.retain(|a| !current.contains(a));
    agents.sort_unstable();
    agents.dedup();
    agents
}

fn refused(r: render::Refusal) -> ServiceError {
    ServiceError::invalid(Code::ConfigurationRefused, r.to_string())
}

fn unknown_secret(ns: &str, path: &str, name: &SecretName) -> ServiceError {
    ServiceError::invalid(
        Code::UnknownSecret,
        format!(
            "{path}: secret {name} does not exist in Namespace {ns}; set it first with `occ \
             secret set {ns} {name} --from-file FILE`"
        ),
    )
}

fn error_code(e: &ServiceError) -> &'static str {
    match e {
        ServiceError::Invalid { code, .. } | ServiceError::Conflict { code, .. } => code.as_str(),
        ServiceError::NotFound { .. } => Code::NotFound.as_str(),
        ServiceError::Store(_) => Code::StoreFailure.as_str(),
    }
}

/// Versions (by name, then version) grouped per secret, with their users.
fn group(versions: Vec<SecretVersion>, uses: &BTreeMap<String, Vec<SecretUse>>) -> Vec<SecretInfo> {
    let mut by_name: BTreeMap<String, Vec<SecretVersion>> = BTreeMap::new();
    for v in versions {
        by_name.entry(v.name.to_string()).or_default().push(v);
    }
    by_name
        .into_iter()
        .filter_map(|(name, versions)| {
            let newest = versions.last()?.clone();
            Some(SecretInfo {
                used_by: uses.get(&name).cloned().unwrap_or_default(),
                name,
                version: newest.version,
                fingerprint: newest.fingerprint.to_string(),
                written_by: newest.written_by,
                written_at: newest.written_at,
                versions,
            })
        })
        .collect()
}
