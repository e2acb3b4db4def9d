//! What the API reads: each query checks that the resources it names exist, so a missing
//! Namespace or Agent is a 404 naming it rather than an empty answer.

use super::page::{self, List, Page, PageQuery, PageQueryExt, PageRequest};
use super::{Result, Service, ServiceError};
use crate::model::{Agent, Cluster, Configuration, Host, Namespace, Revision};
use crate::store::TokenRow;

pub use clawfleet_api::requests::{AuditQuery, DriftQuery};

/// The figures `/metrics` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// (kind, state, count) of work items.
    pub work: Vec<(String, String, i64)>,
    pub hosts: usize,
    pub agents: usize,
    /// Work queued or running, and the age of the oldest such item in seconds.
    pub work_pending: i64,
    pub oldest_pending_seconds: i64,
    /// Hosts and clusters the last drift sweep reached, and those it did not.
    pub targets_reachable: usize,
    pub targets_unreachable: usize,
    /// Agents by the last drift sweep's state (every state listed, zeros included).
    pub agents_by_sync: Vec<(&'static str, usize)>,
    /// Rollouts by state (every state listed, zeros included).
    pub rollouts_by_state: Vec<(&'static str, i64)>,
}

impl Service {
    /// Every Namespace for which `visible` holds.
    pub async fn namespaces(&self, visible: impl Fn(&Namespace) -> bool) -> Result<Vec<Namespace>> {
        Ok(self
            .store
            .namespaces()
            .await?
            .into_iter()
            .filter(|n| visible(n))
            .collect())
    }

    /// The newest audit events (at most `limit`, 1 to 1000), optionally of one action.
    pub async fn audit_events(&self, query: &AuditQuery) -> Result<Vec<crate::model::AuditEvent>> {
        let limit = query.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(ServiceError::invalid(
                crate::codes::Code::InvalidQuery,
                format!("limit: must be between 1 and 1000, got {limit}"),
            ));
        }
        if let Some(a) = &query.action
            && (a.is_empty() || a.len() > 64)
        {
            return Err(ServiceError::invalid(
                crate::codes::Code::InvalidQuery,
                format!("action: must be 1 to 64 characters, got {}", a.len()),
            ));
        }
        Ok(self
            .store
            .audit_events_of(limit, query.action.as_deref())
            .await?)
    }

    /// The drift sweep's newest findings, optionally of one state.
    pub async fn drift(&self, query: &DriftQuery) -> Result<Vec<crate::model::DriftRow>> {
        let state = match &query.state {
            Some(s) => Some(crate::model::DriftState::parse(s).ok_or_else(|| {
                ServiceError::invalid(
                    crate::codes::Code::InvalidQuery,
                    format!(
                        "state: {s:?} is not one of {}",
                        crate::model::DriftState::ALL
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?),
            None => None,
        };
        Ok(self
            .store
            .drift()
            .await?
            .into_iter()
            .filter(|r| state.is_none_or(|s| r.state == s))
            .collect())
    }

    /// A Namespace's Agents.
    /// One page of a Namespace's Agents, by id.
    pub async fn agents_page(&self, ns: &str, q: &PageQuery) -> Result<Page<Agent>> {
        let req = q.request(List::Agents)?;
        self.namespace(ns).await?;
        let items = self
            .store
            .agents_after(ns, req.after.as_deref(), req.limit + 1)
            .await?;
        Ok(page::from_ordered(items, List::Agents, &req, |a| {
            a.id.to_string()
        }))
    }

    /// One page of the Namespaces the caller may read, by id.
    pub async fn namespaces_page(
        &self,
        visible: impl Fn(&Namespace) -> bool,
        q: &PageQuery,
    ) -> Result<Page<Namespace>> {
        let req = q.request(List::Namespaces)?;
        let all = self.namespaces(visible).await?;
        by_name(all, List::Namespaces, &req, |n| n.id.to_string())
    }

    /// One page of an Agent's revisions, by number.
    pub async fn revisions_page(
        &self,
        ns: &str,
        agent: &str,
        q: &PageQuery,
    ) -> Result<Page<Revision>> {
        let req = q.request(List::Revisions)?;
        let all = self.revisions(ns, agent).await?;
        page::page_of(
            all,
            List::Revisions,
            &req,
            |r| r.number,
            |s| s.parse().ok(),
            |r| r.number.to_string(),
        )
    }

    /// One page of the enrolled hosts, by name.
    pub async fn hosts_page(&self, q: &PageQuery) -> Result<Page<Host>> {
        let req = q.request(List::Hosts)?;
        by_name(self.hosts().await?, List::Hosts, &req, |h| {
            h.name.to_string()
        })
    }

    /// One page of the registered clusters, by name.
    pub async fn clusters_page(&self, q: &PageQuery) -> Result<Page<Cluster>> {
        let req = q.request(List::Clusters)?;
        by_name(self.clusters().await?, List::Clusters, &req, |c| {
            c.name.clone()
        })
    }

    pub async fn agents(&self, ns: &str) -> Result<Vec<Agent>> {
        self.namespace(ns).await?;
        Ok(self.store.agents(ns).await?)
    }

    /// A Configuration's latest generation.
    pub async fn configuration(&self, ns: &str, id: &str) -> Result<Configuration> {
        let namespace = self.namespace(ns).await?;
        let typed = super::lookup_id("Configuration", id)?;
        self.store
            .configuration(&namespace.id, &typed)
            .await?
            .ok_or_else(|| ServiceError::not_found("Configuration", id))
    }

    /// An Agent's revisions, oldest first.
    pub async fn revisions(&self, ns: &str, agent: &str) -> Result<Vec<Revision>> {
        self.agent(ns, agent).await?;
        Ok(self.store.revisions(ns, agent).await?)
    }

    /// One revision of an Agent.
    pub async fn revision(&self, ns: &str, agent: &str, id: &str) -> Result<Revision> {
        self.agent(ns, agent).await?;
        self.store
            .revision(ns, agent, id)
            .await?
            .ok_or_else(|| ServiceError::not_found("revision", id))
    }

    /// Every enrolled host.
    pub async fn hosts(&self) -> Result<Vec<Host>> {
        Ok(self.store.hosts().await?)
    }

    /// One enrolled host.
    pub async fn host(&self, name: &str) -> Result<Host> {
        self.store
            .host(name)
            .await?
            .ok_or_else(|| ServiceError::not_found("host", name))
    }

    /// Every registered cluster, without credentials.
    pub async fn clusters(&self) -> Result<Vec<Cluster>> {
        Ok(self
            .store
            .clusters()
            .await?
            .into_iter()
            .map(crate::model::shown_cluster)
            .collect())
    }

    /// The live token a secret's hash names, if any (expiry is the caller's to judge).
    pub async fn token(&self, secret_hash: &str) -> Result<Option<TokenRow>> {
        Ok(self.store.token_by_hash(secret_hash).await?)
    }

    /// Whether the database answers a cheap query (its schema version) within `within`:
    /// `/healthz`.
    pub async fn database_answers(&self, within: std::time::Duration) -> Result<()> {
        match tokio::time::timeout(within, self.store.schema_version()).await {
            Ok(r) => r.map(|_| ()).map_err(ServiceError::from),
            Err(_) => Err(ServiceError::Store(crate::store::StoreError::Unavailable(
                format!("no answer within {} ms", within.as_millis()),
            ))),
        }
    }

    /// Counts for `/metrics`.
    pub async fn metrics(&self) -> Result<Metrics> {
        let mut agents = 0;
        for ns in self.store.namespaces().await? {
            agents += self.store.agents(&ns.id).await?.len();
        }
        let drift = self.store.drift().await?;
        let mut unreachable = std::collections::BTreeSet::new();
        let mut all = std::collections::BTreeSet::new();
        for r in &drift {
            all.insert(r.target.as_str());
            if r.state == crate::model::DriftState::Unreachable {
                unreachable.insert(r.target.as_str());
            }
        }
        let agents_by_sync = crate::model::DriftState::ALL
            .iter()
            .map(|s| {
                let n = drift
                    .iter()
                    .filter(|r| r.state == *s && !r.namespace_id.is_empty())
                    .count();
                (s.as_str(), n)
            })
            .collect();
        let (work_pending, oldest_ms) = self.store.pending_work_age().await?;
        let rollouts = self.store.rollout_counts().await?;
        let rollouts_by_state = crate::model::RolloutState::ALL
            .iter()
            .map(|s| {
                let n = rollouts
                    .iter()
                    .find(|(state, _)| state == s.as_str())
                    .map_or(0, |(_, n)| *n);
                (s.as_str(), n)
            })
            .collect();
        Ok(Metrics {
            work: self.store.work_counts().await?,
            hosts: self.store.hosts().await?.len(),
            agents,
            work_pending,
            oldest_pending_seconds: oldest_ms
                .map(|t| ((crate::clock::now_ms() - t) / 1000).max(0))
                .unwrap_or(0),
            targets_reachable: all.len() - unreachable.len(),
            targets_unreachable: unreachable.len(),
            agents_by_sync,
            rollouts_by_state,
        })
    }
}

/// A page of a list held whole, ordered by a text key.
fn by_name<T>(
    items: Vec<T>,
    list: List,
    req: &PageRequest,
    key: impl Fn(&T) -> String,
) -> Result<Page<T>> {
    page::page_of(items, list, req, &key, |s| Some(s.to_owned()), &key)
}
