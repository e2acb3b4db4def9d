//! `occ cluster`: registered Kubernetes clusters (credentials are never shown).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use clawfleet_api::types::{Cluster, ClusterUpdate, NewCluster};
use clawfleet_kube::ClusterProbeReport;
use coordinator::client::{Api, Client, all_pages};
use serde_json::json;

use super::out::note;
use super::table::{CLUSTER_COLUMNS, print_one, print_rows};
use super::{Cli, read_json};

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterCmd {
    /// Register a cluster: its kubeconfig is read and validated here (files it names are read
    /// on this machine and sent inline), then the coordinator probes the cluster, checks the
    /// identity's permissions, and stores it.
    Add {
        name: String,
        /// The kubeconfig file (HTTPS with a CA; a token or a client certificate).
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The context to use (default: the kubeconfig's current-context).
        #[arg(long)]
        context: Option<String>,
        /// The gateway image, pinned by digest (`repo@sha256:…`).
        #[arg(long)]
        gateway_image: Option<String>,
        /// A JSON file with the cluster's other settings (camelCase keys).
        #[arg(long)]
        settings: Option<PathBuf>,
    },
    /// Replace a cluster's credentials (`--kubeconfig`) and/or settings; validated, probed and
    /// checked like `add`. Settings not given stay as they are.
    Update {
        name: String,
        /// The new kubeconfig file (read here, as for `add`).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The context to use (default: the kubeconfig's current-context).
        #[arg(long, requires = "kubeconfig")]
        context: Option<String>,
        /// The gateway image, pinned by digest (`repo@sha256:…`).
        #[arg(long)]
        gateway_image: Option<String>,
        /// A JSON file with the cluster's settings, replacing the stored ones (camelCase keys).
        #[arg(long)]
        settings: Option<PathBuf>,
    },
    /// List registered clusters.
    List,
    /// Show one cluster (never its credentials).
    Get { name: String },
    /// Forget a cluster no Namespace uses.
    Remove { name: String },
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Add {
            name,
            kubeconfig,
            context,
            gateway_image,
            settings,
        } => {
            let text = inline(kubeconfig, context.as_deref())?;
            let mut settings = match settings {
                Some(p) => read_json(p)?,
                None => json!({}),
            };
            if let Some(image) = gateway_image {
                settings["gatewayImage"] = json!(image);
            }
            let v = c.add_cluster(
                [],
                &NewCluster {
                    name: name.clone(),
                    kubeconfig: text,
                    context: context.clone(),
                    settings,
                },
            )?;
            print_one(cli, &v, CLUSTER_COLUMNS);
            warn_probe(name, &v);
        }
        ClusterCmd::Update {
            name,
            kubeconfig,
            context,
            gateway_image,
            settings,
        } => {
            let text = kubeconfig
                .as_ref()
                .map(|k| inline(k, context.as_deref()))
                .transpose()?;
            let mut settings = match settings {
                Some(p) => read_json(p)?,
                None => c.get_cluster([name])?.settings,
            };
            if let Some(image) = gateway_image {
                settings["gatewayImage"] = json!(image);
            }
            let v = c.update_cluster(
                [name],
                &ClusterUpdate {
                    kubeconfig: text,
                    context: context.clone(),
                    settings,
                },
            )?;
            print_one(cli, &v, CLUSTER_COLUMNS);
            warn_probe(name, &v);
        }
        ClusterCmd::List => print_rows(
            cli,
            &all_pages(None, |q| c.list_clusters([], q))?,
            CLUSTER_COLUMNS,
        ),
        ClusterCmd::Get { name } => print_one(cli, &c.get_cluster([name])?, CLUSTER_COLUMNS),
        ClusterCmd::Remove { name } => {
            c.delete_cluster([name])?;
            println!("{name}: removed");
        }
    }
    Ok(())
}

/// The kubeconfig as sent: read and validated on this machine, every file it names (CA,
/// certificate, key, token; relative to its directory) read here, size-bounded, and inlined.
/// The coordinator never reads a path from a request.
fn inline(path: &std::path::Path, context: Option<&str>) -> Result<String> {
    clawfleet_kube::inline_kubeconfig_file(path, context)
        .with_context(|| format!("kubeconfig {}", path.display()))
}

/// The probe's warnings (e.g. KUBERNETES_VERSION_BELOW_MINIMUM, in the cluster's last probe,
/// a [`ClusterProbeReport`] in a cluster's words) are not refusals; say them, sanitised (the
/// message comes from the API server's answer).
fn warn_probe(name: &str, v: &Cluster) {
    let Some(probe) = &v.last_probe else {
        return;
    };
    let report = match serde_json::from_value::<ClusterProbeReport>(probe.clone()) {
        Ok(r) => r,
        Err(e) => {
            note(&format!(
                "warning: cluster {name}: its probe is unreadable: {e}"
            ));
            return;
        }
    };
    for w in &report.warnings {
        note(&format!(
            "warning: cluster {name}: {}: {}",
            w.code, w.message
        ));
    }
}
