//! The README's main job, end to end and for real: boot a local Linux test host (systemd +
//! sshd, in its own network namespace), install hostd, run `occ init` and `occ serve` on the
//! embedded SQLite default, enrol the host, deploy an Agent running the test gateway, deploy a
//! second revision, show the deployment status and the revision the host serves, and stop the
//! Agent. Every step goes through the HTTP API → worker → SSH → hostd → systemd.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clawfleet_vm_tests::{Artifact, TestHost};

mod setup;

/// Builds a workspace binary with the demo's own profile and returns its path.
fn build(package: &str, bin: &str) -> Result<PathBuf> {
    Ok(clawfleet_vm_tests::cargo_build(
        package,
        Artifact::Bin,
        bin,
    )?)
}

struct Occ {
    bin: PathBuf,
    config: PathBuf,
    /// The admin token `occ init` wrote (`--admin-token-file`), for client commands.
    token_file: PathBuf,
}

impl Occ {
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--config").arg(&self.config);
        c.arg("--token-file").arg(&self.token_file);
        c
    }

    /// Runs `occ <args>`, echoing the command and its output.
    fn run(&self, args: &[&str]) -> Result<String> {
        println!("\n$ occ {}", args.join(" "));
        let out = self.cmd().args(args).stderr(Stdio::inherit()).output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{stdout}");
        if !out.status.success() {
            bail!("occ {} failed ({})", args.join(" "), out.status);
        }
        Ok(stdout)
    }
}

/// Stops `occ serve` when the demo ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_healthy(port: u16, server: &mut Child) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Some(status) = server.try_wait()? {
            bail!("occ serve exited early ({status})");
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("occ serve did not start listening within 20 s")
}

fn step(title: &str) {
    println!("\n=== {title}");
}

fn run() -> Result<()> {
    // No dpkg (not a Debian-family machine): nothing to install; the check below names
    // whatever tool is missing.
    let missing = clawfleet_vm_tests::missing_runner_packages().unwrap_or_default();
    match setup::plan(nix_is_root(), &missing) {
        setup::Plan::Ready => {}
        setup::Plan::NeedRoot(message) => bail!("{message}"),
        setup::Plan::Install(packages) => {
            step("install the runner packages (vm-tests/RUNNER-PACKAGES)");
            let names: Vec<&str> = packages.iter().map(String::as_str).collect();
            println!("$ {}", setup::apt_install_command(&names));
            setup::apt_install(&packages)?;
        }
    }
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        bail!("cannot boot a test host here: {reason}");
    }
    step("build hostd, occ and the test gateway");
    let hostd = build("clawfleet-hostd", "hostd")?;
    let occ_bin = build("clawfleet-coordinator", "occ")?;
    println!("hostd: {}\nocc:   {}", hostd.display(), occ_bin.display());

    step("boot a local test host (Debian 12, systemd PID 1, sshd)");
    let host = TestHost::start().context("cannot start the test host")?;
    println!(
        "{} at {} (host key {}), booted in {:.1} s",
        host.name(),
        host.address(),
        host.host_key_fingerprint(),
        host.boot_duration().as_secs_f64()
    );
    host.install_hostd(&hostd)?;
    let gateway = host.install_test_gateway()?;
    host.write_file(
        "/etc/clawfleet/hostd.toml",
        format!(
            "host_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n[limits]\nreadiness_timeout_ms = 30000\n",
            host.name()
        )
        .as_bytes(),
        0o644,
    )?;

    step("occ init (state dir, keys, SQLite, first admin token)");
    let dir = PathBuf::from(format!("/var/lib/clawfleet-demo/{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let config = dir.join("occ.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\n[worker]\nbackoff_initial_ms = 200\nbackoff_max_ms = 2000\n",
            dir.join("state").display()
        ),
    )?;
    // The first admin token goes to a file the operator names (occ keeps no copy).
    let token_file = dir.join("admin.token");
    let occ = Occ {
        bin: occ_bin,
        config,
        token_file: token_file.clone(),
    };
    occ.run(&[
        "init",
        "--admin-token-file",
        &token_file.display().to_string(),
    ])?;

    step("occ serve (API + worker)");
    let mut child = occ
        .cmd()
        .arg("serve")
        .env("OCC_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start occ serve")?;
    wait_healthy(port, &mut child)?;
    let _server = Server(child);

    step("enrol the host: hostd enrol on the host, occ host enrol here (pins its key)");
    let enrol = occ.cmd().arg("enrol-command").output()?;
    let enrol = String::from_utf8_lossy(&enrol.stdout).trim().to_owned();
    println!("host$ {enrol}");
    print!("{}", host.run_ok(&enrol)?);
    occ.run(&[
        "host",
        "enrol",
        host.name(),
        "--address",
        &host.address().to_string(),
        "--host-key",
        host.host_public_key().trim(),
    ])?;
    occ.run(&["host", "probe", host.name()])?;

    step("deploy an Agent");
    occ.run(&["namespace", "create", "demo", "--hosts", host.name()])?;
    let cfg = dir.join("openclaw.json");
    std::fs::write(
        &cfg,
        r#"{"logging": {"level": "info"}, "x-clawfleet-test": {"label": "first revision"}}"#,
    )?;
    occ.run(&[
        "configuration",
        "create",
        "demo",
        "gateway",
        "--file",
        &cfg.display().to_string(),
    ])?;
    occ.run(&[
        "agent",
        "create",
        "demo",
        "agent-1",
        "--configuration",
        "gateway",
    ])?;
    occ.run(&[
        "agent",
        "deploy",
        "demo",
        "agent-1",
        "--wait",
        "--timeout",
        "120",
    ])?;

    step("deploy a second revision");
    std::fs::write(
        &cfg,
        r#"{"logging": {"level": "debug"}, "x-clawfleet-test": {"label": "second revision"}}"#,
    )?;
    occ.run(&[
        "configuration",
        "update",
        "demo",
        "gateway",
        "--file",
        &cfg.display().to_string(),
    ])?;
    occ.run(&[
        "agent",
        "deploy",
        "demo",
        "agent-1",
        "--wait",
        "--timeout",
        "120",
    ])?;

    step("deployment status and the revision the host serves");
    let status = occ.run(&["agent", "status", "demo", "agent-1", "--output", "json"])?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    occ.run(&["agent", "revisions", "demo", "agent-1"])?;
    let gw_port = status["port"].as_u64().context("no port in the status")?;
    let info = host.run_ok(&format!("curl -s http://127.0.0.1:{gw_port}/info"))?;
    println!("host$ curl -s http://127.0.0.1:{gw_port}/info\n{info}");
    let info: serde_json::Value = serde_json::from_str(info.trim())?;
    let served = status["servedRevisionId"].as_str().unwrap_or_default();
    if info["label"] != "second revision" || !served.starts_with("rev-2-") {
        bail!("the host does not serve the second revision");
    }
    println!("host$ hostd status\n{}", host.run_ok("hostd status")?);

    step("stop the Agent");
    occ.run(&[
        "agent",
        "stop",
        "demo",
        "agent-1",
        "--wait",
        "--timeout",
        "60",
    ])?;
    let ready = host.run(&format!(
        "curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{gw_port}/readyz"
    ))?;
    println!(
        "gateway /readyz after stop: {}",
        String::from_utf8_lossy(&ready.stdout)
    );
    println!("host$ hostd status\n{}", host.run_ok("hostd status")?);

    step("done: tearing down the test host and occ serve");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn nix_is_root() -> bool {
    // The effective uid from /proc, without a libc binding.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("\nclawfleet demo: OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nclawfleet demo failed: {e:#}");
            ExitCode::from(1)
        }
    }
}
