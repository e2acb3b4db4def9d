//! `occ configuration`: native openclaw.json documents, in generations.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use coordinator::client::Client;
use coordinator::service::{ConfigurationUpdate, NewConfiguration};

use super::table::print;
use super::{Cli, read_json};

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigurationCmd {
    /// Create a Configuration from an openclaw.json document.
    Create {
        namespace: String,
        id: String,
        /// JSON file with the document.
        #[arg(long)]
        file: PathBuf,
    },
    /// Add a generation to a Configuration (Agents use it on their next deploy).
    Update {
        namespace: String,
        id: String,
        /// JSON file with the document.
        #[arg(long)]
        file: PathBuf,
    },
    /// Show a Configuration's latest generation.
    Get { namespace: String, id: String },
}

pub(crate) fn run(cli: &Cli, c: &Client, cmd: &ConfigurationCmd) -> Result<()> {
    match cmd {
        ConfigurationCmd::Create {
            namespace,
            id,
            file,
        } => {
            let v = c.send(
                "POST",
                &format!("/namespaces/{namespace}/configurations"),
                &NewConfiguration {
                    id: id.clone(),
                    document: read_json(file)?,
                },
            )?;
            print(
                cli,
                &v,
                &[("CONFIGURATION", "id"), ("GENERATION", "generation")],
            );
        }
        ConfigurationCmd::Update {
            namespace,
            id,
            file,
        } => {
            let v = c.send(
                "PUT",
                &format!("/namespaces/{namespace}/configurations/{id}"),
                &ConfigurationUpdate {
                    document: read_json(file)?,
                },
            )?;
            print(
                cli,
                &v,
                &[("CONFIGURATION", "id"), ("GENERATION", "generation")],
            );
        }
        ConfigurationCmd::Get { namespace, id } => print(
            cli,
            &c.request(
                "GET",
                &format!("/namespaces/{namespace}/configurations/{id}"),
                None,
            )?,
            &[],
        ),
    }
    Ok(())
}
