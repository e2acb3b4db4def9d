//! `occ db`: the database itself (`migrate`: SQLite into PostgreSQL).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use coordinator::store::database::{Database, PostgresOptions};
use coordinator::store::postgres::PostgresStore;

use super::{Cli, load_config};

#[derive(Subcommand, Debug)]
pub(crate) enum DbCmd {
    /// Copy the SQLite database into an empty PostgreSQL database and check the copy (stop
    /// `occ serve` first; then set `database` in occ.toml to the same URL).
    Migrate {
        /// The PostgreSQL database (postgres://USER@HOST/DB?sslmode=…); the password comes
        /// from `[postgres] password_file` in occ.toml or PGPASSWORD.
        #[arg(long)]
        to: String,
        /// The SQLite file to copy (default: occ.db in the configured state directory).
        #[arg(long)]
        from: Option<PathBuf>,
    },
    /// Replace the key-encryption key (stop every `occ serve` first): create a new key file
    /// and reseal every secret, cluster credential and workspace file content with it, in
    /// one transaction; then move the new file over `encryption_key_file` on every
    /// coordinator and start them again.
    Rekey {
        /// The new key file to create (0600; it must not exist).
        #[arg(long)]
        new_key_file: PathBuf,
    },
}

pub(crate) async fn run(cli: &Cli, cmd: &DbCmd) -> Result<()> {
    let (to, from) = match cmd {
        DbCmd::Migrate { to, from } => (to, from),
        DbCmd::Rekey { new_key_file } => return rekey(cli, new_key_file).await,
    };
    let config = load_config(cli)?;
    let source = match (from, &config.database) {
        (Some(p), _) => p.clone(),
        (None, Database::Sqlite(p)) => p.clone(),
        (None, Database::Postgres(_)) => bail!(
            "occ.toml already names a PostgreSQL database; give the SQLite file to copy with --from"
        ),
    };
    let password_file = config.postgres_password_file.clone();
    let target = Database::parse_url(
        to,
        &PostgresOptions {
            password_file,
            pool_size: Some(2),
        },
        std::env::var("PGPASSWORD").ok(),
    )
    .map_err(|m| anyhow::anyhow!("--to {m}"))?;
    let Database::Postgres(settings) = target else {
        bail!("--to must be a postgres:// URL");
    };
    let shown = settings.shown.clone();
    let sealer = coordinator::store::seal::Sealer::load(&config.encryption_key_file)?;
    let store = PostgresStore::connect_sealed(settings, std::sync::Arc::new(sealer))
        .await
        .with_context(|| format!("cannot open {shown}"))?;
    let counts = coordinator::store::copy::sqlite_to_postgres(&source, &store)
        .await
        .with_context(|| format!("{} was not copied into {shown}", source.display()))?;
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    for (table, n) in &counts {
        println!("{table:<24}{n:>10}");
    }
    println!(
        "copied {total} rows from {} into {shown}; every table counted the same on both sides",
        source.display()
    );
    println!("next: set database = \"{to}\" in occ.toml and start occ serve");
    Ok(())
}

async fn rekey(cli: &Cli, new_key_file: &std::path::Path) -> Result<()> {
    use coordinator::store::seal::Sealer;
    let config = load_config(cli)?;
    let old = Sealer::load(&config.encryption_key_file)?;
    if !Sealer::create_file(new_key_file)? {
        bail!(
            "--new-key-file {} exists; name a new file",
            new_key_file.display()
        );
    }
    let outcome = async {
        let new = Sealer::load(new_key_file)?;
        coordinator::store::rekey::rekey(&config.database, std::sync::Arc::new(old), &new).await
    }
    .await;
    match outcome {
        Ok(n) => {
            println!(
                "resealed {} secret versions, {} cluster credentials and {} workspace files with {}",
                n.secrets,
                n.cluster_credentials,
                n.workspace_files,
                new_key_file.display()
            );
            println!(
                "next: move {} over {} on every coordinator, then start them",
                new_key_file.display(),
                config.encryption_key_file.display()
            );
            Ok(())
        }
        Err(e) => {
            // Nothing was resealed: the new key seals nothing, so it goes.
            std::fs::remove_file(new_key_file)
                .with_context(|| format!("remove {}", new_key_file.display()))?;
            Err(anyhow::Error::new(e).context("nothing was resealed; the key is unchanged"))
        }
    }
}
