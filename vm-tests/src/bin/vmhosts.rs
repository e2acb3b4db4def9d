//! `vmhosts`: operate the real-host harness by hand or from CI.
//!
//! - `vmhosts build`        build (or confirm) the cached base rootfs; prints the time taken
//! - `vmhosts list`         show every slot: in use / stale (owner dead) / free, with its ids
//! - `vmhosts clean`        tear down every stale slot from its recorded ids
//! - `vmhosts fetch-openclaw` fetch Node 24 + OpenClaw into the cache (optional workload)
//! - `vmhosts up [N]`       boot N hosts (default 1), print how to reach them, keep them until
//!   Ctrl-C / SIGTERM (for demos and debugging)

use std::process::ExitCode;
use std::time::Instant;

use clawfleet_vm_tests::{HarnessConfig, SlotState, TestHosts};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match HarnessConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vmhosts: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.first().map(String::as_str) {
        Some("build") => build(&config),
        Some("list") => list(&config),
        Some("clean") => clean(&config),
        Some("fetch-openclaw") => fetch_openclaw(&config),
        Some("up") => up(&config, args.get(1).map(String::as_str)),
        _ => {
            eprintln!("usage: vmhosts build | list | clean | fetch-openclaw | up [COUNT]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vmhosts: {e}");
            ExitCode::FAILURE
        }
    }
}

fn build(config: &HarnessConfig) -> clawfleet_vm_tests::Result<()> {
    let t0 = Instant::now();
    let base = clawfleet_vm_tests::ensure_base_rootfs(config)?;
    match base.built_in {
        Some(d) => println!(
            "built base rootfs {} in {:.1}s: {}",
            base.key,
            d.as_secs_f64(),
            base.rootfs.display()
        ),
        None => println!(
            "base rootfs {} already cached ({:.2}s): {}",
            base.key,
            t0.elapsed().as_secs_f64(),
            base.rootfs.display()
        ),
    }
    Ok(())
}

fn fetch_openclaw(config: &HarnessConfig) -> clawfleet_vm_tests::Result<()> {
    let b = clawfleet_vm_tests::openclaw::ensure_cached(config)?;
    match b.fetched_in {
        Some(d) => println!("fetched in {:.1}s: {}", d.as_secs_f64(), b.dir.display()),
        None => println!("already cached: {}", b.dir.display()),
    }
    Ok(())
}

fn list(config: &HarnessConfig) -> clawfleet_vm_tests::Result<()> {
    for s in clawfleet_vm_tests::list_slots(config)? {
        let state = match s.state {
            SlotState::InUse => "in-use",
            SlotState::Stale => "stale",
            SlotState::Free => "free",
        };
        match &s.record {
            Some(r) => println!(
                "{:>2} {state:<6} {} {} owner={} nspawn={} netns={} veth={} dir={} cgroups={}",
                s.slot,
                r.name,
                r.address,
                r.owner_pid,
                r.nspawn_pid.map_or("-".into(), |p| p.to_string()),
                r.netns,
                r.veth,
                r.run_dir.display(),
                r.cgroup_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            None => println!("{:>2} {state}", s.slot),
        }
    }
    Ok(())
}

fn clean(config: &HarnessConfig) -> clawfleet_vm_tests::Result<()> {
    let t0 = Instant::now();
    let reclaimed = clawfleet_vm_tests::reclaim_stale(config)?;
    for r in &reclaimed {
        println!("reclaimed {} (dead owner pid {})", r.name, r.owner_pid);
    }
    println!(
        "{} stale slot(s) cleaned in {:.1}s",
        reclaimed.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn up(config: &HarnessConfig, count: Option<&str>) -> clawfleet_vm_tests::Result<()> {
    let n = match count.map(str::parse::<usize>) {
        None => 1,
        Some(Ok(n)) if (1..=63).contains(&n) => n,
        Some(_) => {
            eprintln!("vmhosts: COUNT must be a number from 1 to 63");
            std::process::exit(2);
        }
    };
    let hosts = TestHosts::start_with(config, n)?;
    println!("{n} host(s) up in {:.2}s", hosts.started_in().as_secs_f64());
    for h in hosts.iter() {
        println!(
            "slot={} name={} address={} boot={:.2}s fingerprint={} machine-id={}",
            h.slot(),
            h.name(),
            h.address(),
            h.boot_duration().as_secs_f64(),
            h.host_key_fingerprint(),
            h.machine_id()
        );
        println!(
            "  ssh -i {} -o UserKnownHostsFile={} -o StrictHostKeyChecking=yes root@{}",
            h.ssh_key_path().display(),
            h.known_hosts_path().display(),
            h.address()
        );
    }
    println!("READY");
    // Keep the hosts until a signal arrives; the harness's handler tears them down and exits.
    loop {
        std::thread::park();
    }
}
