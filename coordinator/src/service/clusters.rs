//! Registered Kubernetes clusters: registration, replacement of credentials and settings, and
//! removal. A kubeconfig is validated by `clawfleet_kube` (file references refused: nothing a
//! request names is ever read on the coordinator) before anything is stored; credentials are
//! never returned. The API probes a cluster (and checks its access) between validation and
//! storing.

use clawfleet_kube::{ClusterCredentials, ClusterSettings};
use serde_json::{Value, json};

use super::{NewCluster, Result, Service, ServiceError, check_id, now};
use crate::codes::Code;
use crate::model::{Cluster, ClusterRecord};

pub use clawfleet_api::requests::ClusterUpdate;

fn parse_credentials(kubeconfig: &str, context: Option<&str>) -> Result<ClusterCredentials> {
    clawfleet_kube::kubeconfig::parse_kubeconfig(kubeconfig, context)
        .map_err(|e| ServiceError::invalid(Code::KubeconfigInvalid, format!("kubeconfig {e}")))
}

fn parse_settings(value: Value) -> Result<ClusterSettings> {
    ClusterSettings::from_json(value).map_err(|e| {
        ServiceError::invalid(
            Code::ClusterSettingsInvalid,
            format!("settings.{}: {}", e.field, e.reason),
        )
    })
}

/// The stored credentials of a record, if they still validate.
fn stored_credentials(record: &ClusterRecord) -> Option<ClusterCredentials> {
    serde_json::from_value(record.credentials.clone()).ok()
}

/// One API server: the same URL (scheme and host case-insensitive, a trailing slash ignored)
/// verified by the same CA.
fn same_apiserver(a: &ClusterCredentials, b: &ClusterCredentials) -> bool {
    let url = |c: &ClusterCredentials| c.server().trim_end_matches('/').to_ascii_lowercase();
    url(a) == url(b) && a.ca_fingerprint() == b.ca_fingerprint()
}

fn record(
    name: &str,
    credentials: &ClusterCredentials,
    settings: &ClusterSettings,
    created_at: i64,
) -> Result<ClusterRecord> {
    let to_value = |v: std::result::Result<Value, serde_json::Error>| {
        v.map_err(|e| ServiceError::invalid(Code::ClusterSettingsInvalid, e.to_string()))
    };
    Ok(ClusterRecord {
        cluster: Cluster {
            name: name.to_owned(),
            server: credentials.server().to_owned(),
            settings: to_value(serde_json::to_value(settings))?,
            created_at,
            last_probe: None,
        },
        credentials: to_value(serde_json::to_value(credentials))?,
    })
}

impl Service {
    /// Validates a cluster registration (kubeconfig and settings) without storing anything;
    /// the API probes the cluster with the result before [`Service::store_cluster`].
    pub async fn validate_cluster(&self, c: &NewCluster) -> Result<ClusterRecord> {
        check_id("name", &c.name)?;
        if self.store.cluster(&c.name).await?.is_some() {
            return Err(ServiceError::conflict(
                Code::ClusterExists,
                format!("cluster {} is already registered", c.name),
            ));
        }
        let credentials = parse_credentials(&c.kubeconfig, c.context.as_deref())?;
        let settings = parse_settings(c.settings.clone())?;
        self.refuse_duplicate(&c.name, &credentials).await?;
        record(&c.name, &credentials, &settings, now())
    }

    /// Refuses credentials for an API server another registration already names: two names
    /// for one cluster would each report the other's Agents as unknown.
    async fn refuse_duplicate(&self, name: &str, credentials: &ClusterCredentials) -> Result<()> {
        for other in self.store.clusters().await? {
            if other.name == name {
                continue;
            }
            let Some(existing) = self.store.cluster(&other.name).await? else {
                continue;
            };
            if stored_credentials(&existing).is_some_and(|e| same_apiserver(&e, credentials)) {
                return Err(ServiceError::conflict(
                    Code::ClusterDuplicate,
                    format!(
                        "this API server ({}, CA {}) is already registered as cluster {}; one \
                         cluster is registered once (`occ cluster update {}` replaces its \
                         credentials)",
                        credentials.server(),
                        credentials.ca_fingerprint(),
                        other.name,
                        other.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Stores a validated and probed cluster.
    pub async fn store_cluster(&self, actor: &str, record: &ClusterRecord) -> Result<Cluster> {
        if !self.store.insert_cluster(record).await? {
            return Err(ServiceError::conflict(
                Code::ClusterExists,
                format!("cluster {} is already registered", record.cluster.name),
            ));
        }
        self.audit(
            actor,
            "cluster.add",
            &record.cluster.name,
            json!({"server": record.cluster.server}),
        )
        .await?;
        Ok(record.cluster.clone())
    }

    /// Validates new credentials and settings for a registered cluster without storing
    /// anything; the API probes the result before [`Service::store_cluster_update`].
    pub async fn validate_cluster_update(
        &self,
        name: &str,
        u: &ClusterUpdate,
    ) -> Result<ClusterRecord> {
        let Some(current) = self.store.cluster(name).await? else {
            return Err(ServiceError::not_found("cluster", name));
        };
        let credentials = match &u.kubeconfig {
            Some(text) => parse_credentials(text, u.context.as_deref())?,
            None if u.context.is_some() => {
                return Err(ServiceError::invalid(
                    Code::KubeconfigInvalid,
                    "context: applies to a kubeconfig; send the kubeconfig with it",
                ));
            }
            None => stored_credentials(&current).ok_or_else(|| {
                ServiceError::invalid(
                    Code::KubeconfigInvalid,
                    format!("kubeconfig: the stored credentials of cluster {name} are not valid; send new ones"),
                )
            })?,
        };
        let settings = parse_settings(u.settings.clone())?;
        self.refuse_duplicate(name, &credentials).await?;
        self.refuse_adoption_change(name, &current, &settings)
            .await?;
        let mut r = record(name, &credentials, &settings, current.cluster.created_at)?;
        r.cluster.last_probe = current.cluster.last_probe;
        Ok(r)
    }

    /// A Namespace already on the cluster keeps where it lives: its `adoptedNamespaces` entry
    /// (or its absence) cannot change under it.
    async fn refuse_adoption_change(
        &self,
        name: &str,
        current: &ClusterRecord,
        new: &ClusterSettings,
    ) -> Result<()> {
        let Ok(old) = ClusterSettings::from_json(current.cluster.settings.clone()) else {
            return Ok(());
        };
        for ns in self.store.namespaces().await? {
            if ns.cluster.as_deref() != Some(name) {
                continue;
            }
            let id = ns.id.as_str();
            if old.adopted_namespaces.get(id) != new.adopted_namespaces.get(id) {
                return Err(ServiceError::invalid(
                    Code::ClusterSettingsInvalid,
                    format!(
                        "settings.adoptedNamespaces.{id}: Namespace {id} is on this cluster; \
                         where it lives cannot change (delete it first)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Stores a validated and probed update; audited with what was replaced.
    pub async fn store_cluster_update(
        &self,
        actor: &str,
        record: &ClusterRecord,
        credentials_replaced: bool,
    ) -> Result<Cluster> {
        if !self.store.update_cluster(record).await? {
            return Err(ServiceError::not_found("cluster", &record.cluster.name));
        }
        self.audit(
            actor,
            "cluster.update",
            &record.cluster.name,
            json!({"server": record.cluster.server, "credentialsReplaced": credentials_replaced}),
        )
        .await?;
        Ok(record.cluster.clone())
    }

    pub async fn cluster(&self, name: &str) -> Result<Cluster> {
        self.store
            .cluster(name)
            .await?
            .map(|r| crate::model::shown_cluster(r.cluster))
            .ok_or_else(|| ServiceError::not_found("cluster", name))
    }

    /// Forgets a cluster no Namespace uses.
    pub async fn delete_cluster(&self, actor: &str, name: &str) -> Result<()> {
        match self.store.delete_cluster(name).await? {
            None => Err(ServiceError::not_found("cluster", name)),
            Some(false) => Err(ServiceError::conflict(
                Code::ClusterInUse,
                format!("cluster {name} still holds Namespaces; delete them first"),
            )),
            Some(true) => self.audit(actor, "cluster.delete", name, json!({})).await,
        }
    }
}
