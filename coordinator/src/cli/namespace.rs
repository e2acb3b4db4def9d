//! `occ namespace`: Namespaces on a host pool or a cluster.

use anyhow::Result;
use clap::Subcommand;
use coordinator::client::Client;
use coordinator::service::NewNamespace;

use super::Cli;
use super::table::print;

#[derive(Subcommand, Debug)]
pub(crate) enum NamespaceCmd {
    /// Create a Namespace on a host pool (--hosts) or on a cluster (--cluster).
    Create {
        id: String,
        /// Comma-separated host pool.
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "cluster",
            conflicts_with = "cluster"
        )]
        hosts: Vec<String>,
        /// A registered Kubernetes cluster.
        #[arg(long)]
        cluster: Option<String>,
        /// A display name (default: the id).
        #[arg(long)]
        name: Option<String>,
        /// The pool's hosts run this Namespace's Agents only (needed for trusted-proxy auth).
        #[arg(long, conflicts_with = "cluster")]
        single_tenant: bool,
    },
    /// List the Namespaces the token may read.
    List,
    /// Show a Namespace: its pool or cluster and whether it is ready.
    Get { id: String },
    /// Show a Namespace with its newest ensure or delete work: state, attempts, and the last
    /// code and message (why it is not ready on its cluster or pool, and whether it is retried).
    Status { id: String },
    /// Delete an empty Namespace (refused while it has Agents).
    Delete { id: String },
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &NamespaceCmd) -> Result<()> {
    match cmd {
        NamespaceCmd::Create {
            id,
            hosts,
            cluster,
            name,
            single_tenant,
        } => {
            let v = c.send(
                "POST",
                "/namespaces",
                &NewNamespace {
                    id: id.clone(),
                    name: name.clone(),
                    hosts: hosts.clone(),
                    cluster: cluster.clone(),
                    single_tenant: *single_tenant,
                },
            )?;
            print(
                cli,
                &v,
                &[
                    ("NAMESPACE", "id"),
                    ("HOSTS", "hosts"),
                    ("CLUSTER", "cluster"),
                    ("READY", "ready"),
                ],
            );
        }
        NamespaceCmd::List => print(
            cli,
            &c.list_all("/namespaces", None)?,
            &[
                ("NAMESPACE", "id"),
                ("NAME", "name"),
                ("HOSTS", "hosts"),
                ("READY", "ready"),
                ("DELETING", "deleting"),
            ],
        ),
        NamespaceCmd::Get { id } => print(
            cli,
            &c.request("GET", &format!("/namespaces/{id}"), None)?,
            &[
                ("NAMESPACE", "id"),
                ("HOSTS", "hosts"),
                ("READY HOSTS", "readyHosts"),
                ("READY", "ready"),
            ],
        ),
        NamespaceCmd::Status { id } => print(
            cli,
            &c.request("GET", &format!("/namespaces/{id}"), None)?,
            &[],
        ),
        NamespaceCmd::Delete { id } => print(
            cli,
            &c.request("DELETE", &format!("/namespaces/{id}"), None)?,
            &[],
        ),
    }
    Ok(())
}
