//! `pgtests`: the PostgreSQL harness by hand.
//!
//! - `pgtests up [--tls]`: start a server, print its URL, pid and start time, run until Ctrl-C.
//! - `pgtests list`: every run on the machine (live or stale) with its recorded postmaster.
//! - `pgtests clean`: tear down every run whose test process is dead.

use std::process::ExitCode;

use clawfleet_pg_tests::{
    HarnessConfig, Options, SUPERUSER, TestPostgres, Tls, list_runs, reclaim_stale,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match HarnessConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pgtests: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["up"] => up(&config, Tls::Off),
        ["up", "--tls"] => up(&config, Tls::On),
        ["list"] => match list_runs(&config) {
            Ok(runs) => {
                for (rec, live) in runs {
                    let state = if live { "in use" } else { "stale" };
                    println!(
                        "{} {state} owner pid {} port {}",
                        rec.id, rec.owner_pid, rec.port
                    );
                    if let Some(p) = rec.postmaster {
                        println!("  postmaster pid {}", p.pid);
                    }
                    for l in rec.leftovers() {
                        println!("  still there: {l}");
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pgtests: {e}");
                ExitCode::FAILURE
            }
        },
        ["clean"] => match reclaim_stale(&config) {
            Ok(r) => {
                println!("reclaimed {} stale PostgreSQL run(s)", r.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pgtests: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: pgtests up [--tls] | list | clean");
            ExitCode::from(2)
        }
    }
}

fn up(config: &HarnessConfig, tls: Tls) -> ExitCode {
    match TestPostgres::start_in(config, &Options::default().tls(tls)) {
        Ok(pg) => {
            println!("run {}", pg.id());
            println!("postmaster pid {}", pg.pid().unwrap_or(0));
            println!("url {}", pg.url("postgres", SUPERUSER));
            if let Some(url) = pg.tls_url("postgres", SUPERUSER) {
                println!("tls url {url}");
            }
            println!("start {}", pg.timings());
            println!("log {}", pg.log_path().display());
            println!("Ctrl-C stops it");
            // The signal handler tears it down and exits.
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        Err(e) => {
            eprintln!("pgtests: {e}");
            ExitCode::FAILURE
        }
    }
}
