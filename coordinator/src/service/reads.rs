//! What the API reads: each query checks that the resources it names exist, so a missing
//! Namespace or Agent is a 404 naming it rather than an empty answer.

use super::{Result, Service, ServiceError};
use crate::model::{Agent, Cluster, Configuration, Host, Namespace, Revision};
use crate::store::TokenRow;

/// The figures `/metrics` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// (kind, state, count) of work items.
    pub work: Vec<(String, String, i64)>,
    pub hosts: usize,
    pub agents: usize,
}

impl Service {
    /// Every Namespace for which `visible` holds.
    pub fn namespaces(&self, visible: impl Fn(&Namespace) -> bool) -> Result<Vec<Namespace>> {
        Ok(self
            .store
            .namespaces()?
            .into_iter()
            .filter(|n| visible(n))
            .collect())
    }

    /// A Namespace's Agents.
    pub fn agents(&self, ns: &str) -> Result<Vec<Agent>> {
        self.namespace(ns)?;
        Ok(self.store.agents(ns)?)
    }

    /// A Configuration's latest generation.
    pub fn configuration(&self, ns: &str, id: &str) -> Result<Configuration> {
        self.namespace(ns)?;
        self.store
            .configuration(ns, id)?
            .ok_or_else(|| ServiceError::not_found("Configuration", id))
    }

    /// An Agent's revisions, oldest first.
    pub fn revisions(&self, ns: &str, agent: &str) -> Result<Vec<Revision>> {
        self.agent(ns, agent)?;
        Ok(self.store.revisions(ns, agent)?)
    }

    /// One revision of an Agent.
    pub fn revision(&self, ns: &str, agent: &str, id: &str) -> Result<Revision> {
        self.agent(ns, agent)?;
        self.store
            .revision(ns, agent, id)?
            .ok_or_else(|| ServiceError::not_found("revision", id))
    }

    /// Every enrolled host.
    pub fn hosts(&self) -> Result<Vec<Host>> {
        Ok(self.store.hosts()?)
    }

    /// One enrolled host.
    pub fn host(&self, name: &str) -> Result<Host> {
        self.store
            .host(name)?
            .ok_or_else(|| ServiceError::not_found("host", name))
    }

    /// Every registered cluster, without credentials.
    pub fn clusters(&self) -> Result<Vec<Cluster>> {
        Ok(self.store.clusters()?)
    }

    /// The live token a secret's hash names, if any (expiry is the caller's to judge).
    pub fn token(&self, secret_hash: &str) -> Result<Option<TokenRow>> {
        Ok(self.store.token_by_hash(secret_hash)?)
    }

    /// Counts for `/metrics`.
    pub fn metrics(&self) -> Result<Metrics> {
        let mut agents = 0;
        for ns in self.store.namespaces()? {
            agents += self.store.agents(&ns.id)?.len();
        }
        Ok(Metrics {
            work: self.store.work_counts()?,
            hosts: self.store.hosts()?.len(),
            agents,
        })
    }
}
