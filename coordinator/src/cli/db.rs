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
        /// from [postgres] password_file in occ.toml or PGPASSWORD.
        #[arg(long)]
        to: String,
        /// The SQLite file to copy (default: occ.db in the configured state directory).
        #[arg(long)]
        from: Option<PathBuf>,
    },
}

pub(crate) async fn run(cli: &Cli, cmd: &DbCmd) -> Result<()> {
    let DbCmd::Migrate { to, from } = cmd;
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
