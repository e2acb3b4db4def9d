//! `occ cluster`: registered Kubernetes clusters (credentials are never shown).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use coordinator::client::Client;
use coordinator::service::NewCluster;
use serde_json::json;

use super::out::sanitise;
use super::table::{CLUSTER_COLUMNS, print};
use super::{Cli, read_json};

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterCmd {
    /// Register a cluster: its kubeconfig is validated, the cluster probed, then stored.
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
            let text = std::fs::read_to_string(kubeconfig)
                .with_context(|| format!("cannot read {}", kubeconfig.display()))?;
            let mut settings = match settings {
                Some(p) => read_json(p)?,
                None => json!({}),
            };
            if let Some(image) = gateway_image {
                settings["gatewayImage"] = json!(image);
            }
            let v = c.send(
                "POST",
                "/clusters",
                &NewCluster {
                    name: name.clone(),
                    kubeconfig: text,
                    context: context.clone(),
                    settings,
                },
            )?;
            print(cli, &v, CLUSTER_COLUMNS);
            // The probe's warnings (e.g. KUBERNETES_VERSION_BELOW_MINIMUM) are not
            // refusals; say them.
            for w in v["lastProbe"]["warnings"].as_array().into_iter().flatten() {
                eprintln!(
                    "warning: cluster {name}: {}: {}",
                    sanitise(w["code"].as_str().unwrap_or_default()),
                    sanitise(w["message"].as_str().unwrap_or_default())
                );
            }
        }
        ClusterCmd::List => print(cli, &c.request("GET", "/clusters", None)?, CLUSTER_COLUMNS),
        ClusterCmd::Get { name } => print(
            cli,
            &c.request("GET", &format!("/clusters/{name}"), None)?,
            CLUSTER_COLUMNS,
        ),
        ClusterCmd::Remove { name } => {
            c.request("DELETE", &format!("/clusters/{name}"), None)?;
            println!("{name}: removed");
        }
    }
    Ok(())
}
