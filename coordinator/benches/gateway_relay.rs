//! Gateway relay benchmark (not a timed test; issue 30): gateway streams over the SSH
//! backend's relay channel (`hostd relay` behind a `restrict` key on a private OpenSSH sshd on
//! loopback, the real hostd) side by side with OpenSSH `ssh -L` over a second sshd on the same
//! loopback in the same run, and a direct TCP connection as the floor. Prints:
//!
//! - stream open (open → first byte from the gateway) p50/p95,
//! - added round trip (64-byte ping-pong) p50/p95,
//! - MB/s of one stream (echoed, so each direction carries it),
//! - `probe` p50/p99 on the same SSH connection, idle and beside 256 relay streams (at an
//!   interactive pace, and flat out), and beside 256 flat-out direct TCP connections: the
//!   share of the flat-out figure that is the machine's two cores, not the relay.
//!
//! The gateway is a loopback stand-in that sends one byte on accept, then echoes.
//! Run: `cargo bench -p clawfleet-coordinator --bench gateway_relay` as root with
//! /usr/sbin/sshd and ssh; prints SKIP otherwise. `BENCH_OPENS` (default 200),
//! `BENCH_MIB` (default 256) tune it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/ssh_support/mod.rs"]
mod ssh_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use coordinator::backend::{Backend, CallOptions};
use ssh_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One byte on accept, then echo.
fn gateway() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                if s.write_all(b"!").is_err() {
                    return;
                }
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    port
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// An sshd that allows forwarding for the login key, and `ssh -N -L` through it.
struct Forward {
    sshd: Child,
    ssh: Child,
    _dir: tempfile::TempDir,
    local: u16,
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.ssh.kill();
        let _ = self.ssh.wait();
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}

fn forward(keys: &Keys, gateway: u16) -> Forward {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hk = d.join("host");
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&hk)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::write(
        d.join("authorized_keys"),
        format!("{}\n", keys.login_public()),
    )
    .unwrap();
    let key = d.join("login");
    keys.write_login_key(&key);
    let port = free_port();
    std::fs::write(
        d.join("sshd_config"),
        format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {hk}\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\nPasswordAuthentication no\nUsePAM no\nAllowTcpForwarding yes\n",
            hk = hk.display(),
            d = d.display()
        ),
    )
    .unwrap();
    let sshd = Command::new("/usr/sbin/sshd")
        .args(["-D", "-f"])
        .arg(d.join("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let local = free_port();
    let ssh = Command::new("ssh")
        .args([
            "-N",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
        ])
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-i",
        ])
        .arg(&key)
        .args(["-p", &port.to_string()])
        .args(["-L", &format!("127.0.0.1:{local}:127.0.0.1:{gateway}")])
        .arg("root@127.0.0.1")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", local)).is_err() {
        assert!(Instant::now() < until, "ssh -L did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Forward {
        sshd,
        ssh,
        _dir: dir,
        local,
    }
}

/// Open → first byte, ping-pong round trips and MB/s over plain TCP connections to `port`.
fn tcp_figures(port: u16, opens: usize, mib: usize) -> (Vec<f64>, Vec<f64>, f64) {
    let mut open = Vec::new();
    for _ in 0..opens {
        let t = Instant::now();
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        open.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    let mut rtt = Vec::new();
    let msg = [7u8; 64];
    let mut back = [0u8; 64];
    for _ in 0..1000 {
        let t = Instant::now();
        s.write_all(&msg).unwrap();
        s.read_exact(&mut back).unwrap();
        rtt.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let total = mib << 20;
    let mut w = s.try_clone().unwrap();
    let t = Instant::now();
    let writer = std::thread::spawn(move || {
        let chunk = vec![1u8; 1 << 16];
        let mut sent = 0;
        while sent < total {
            w.write_all(&chunk).unwrap();
            sent += chunk.len();
        }
    });
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 18];
    while got < total {
        got += s.read(&mut buf).unwrap();
    }
    writer.join().unwrap();
    let mbs = total as f64 / 1e6 / t.elapsed().as_secs_f64();
    (open, rtt, mbs)
}

fn main() {
    if loopback_skip() {
        return;
    }
    let opens = env_usize("BENCH_OPENS", 200);
    let mib = env_usize("BENCH_MIB", 256);
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let gw = gateway();
    // The Agent as hostd keeps it: its marker names the gateway's port.
    let layout = hostd::layout::Layout::new(&lo.state_root, lo.state_root.join("units"));
    let paths = layout.agent(&id("team-a"), &id("bench"));
    std::fs::create_dir_all(&paths.dir).unwrap();
    let marker = hostd::markers::AgentMarker {
        schema: hostd::markers::SCHEMA,
        namespace_id: id("team-a"),
        agent_id: id("bench"),
        service_principal_id: id("sp-1"),
        account: hostd::layout::account_name(&id("team-a"), &id("bench")),
        port: gw,
    };
    std::fs::write(&paths.marker, serde_json::to_vec(&marker).unwrap()).unwrap();
    let backend = keys.backend(fast_settings());
    let target = lo.target();
    let fwd = forward(&keys, gw);

    let (d_open, d_rtt, d_mbs) = tcp_figures(gw, opens, mib);
    let (s_open, s_rtt, s_mbs) = tcp_figures(fwd.local, opens, mib);

    let rt = runtime();
    let (r_open, r_rtt, r_mbs, idle, busy) = rt.block_on(async {
        let (ns, agent) = (id("team-a"), id("bench"));
        let open_one = || backend.open_gateway_stream(&target, &ns, &agent, "bench");
        // Warm: the connection and the relay channel exist, as in steady state.
        drop(open_one().await.unwrap());
        let mut open = Vec::new();
        for _ in 0..opens {
            let t = Instant::now();
            let mut s = open_one().await.unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            open.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let mut s = open_one().await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        let mut rtt = Vec::new();
        let msg = [7u8; 64];
        let mut back = [0u8; 64];
        for _ in 0..1000 {
            let t = Instant::now();
            s.write_all(&msg).await.unwrap();
            s.read_exact(&mut back).await.unwrap();
            rtt.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let total = mib << 20;
        let (mut r, mut w) = tokio::io::split(s);
        let t = Instant::now();
        let writer = tokio::spawn(async move {
            let chunk = vec![1u8; 1 << 16];
            let mut sent = 0;
            while sent < total {
                w.write_all(&chunk).await.unwrap();
                sent += chunk.len();
            }
            w
        });
        let mut got = 0;
        let mut buf = vec![0u8; 1 << 18];
        while got < total {
            got += r.read(&mut buf).await.unwrap();
        }
        drop(writer.await.unwrap());
        let mbs = total as f64 / 1e6 / t.elapsed().as_secs_f64();

        // Control operations, idle and beside 256 busy streams.
        let probes = |n: usize| {
            let backend = backend.clone();
            let target = target.clone();
            async move {
                let mut v = Vec::new();
                for _ in 0..n {
                    let t = Instant::now();
                    backend
                        .call(&target, probe(), CallOptions::default())
                        .await
                        .unwrap();
                    v.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                v
            }
        };
        let idle = probes(200).await;
        // The same probes beside 256 streams: at an interactive pace (1 KiB each way every
        // 100 ms, a busy Control UI), flat out, and, as the floor of what two cores allow,
        // 256 flat-out direct TCP connections that never touch SSH (the same CPU contention
        // with no relay in the path).
        let mut busy = Vec::new();
        for (name, pace, relay) in [
            (
                "256 relay streams at an interactive pace",
                Some(Duration::from_millis(100)),
                true,
            ),
            ("256 relay streams flat out", None, true),
            ("256 direct TCP streams flat out (no SSH)", None, false),
        ] {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut pumps = Vec::new();
            for i in 0..256u32 {
                let stop = stop.clone();
                // Paced clients spread over the period, as independent clients are.
                let offset = pace.map(|p| p * i / 256).unwrap_or_default();
                if relay {
                    let s = open_one().await.unwrap();
                    pumps.push(tokio::spawn(pump(s, stop, pace, offset)));
                } else {
                    let s = tokio::net::TcpStream::connect(("127.0.0.1", gw))
                        .await
                        .unwrap();
                    pumps.push(tokio::spawn(pump(s, stop, pace, offset)));
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            busy.push((name, probes(200).await));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for p in pumps {
                let _ = p.await;
            }
        }
        (open, rtt, mbs, idle, busy)
    });
    drop(fwd);

    let row = |name: &str, mut open: Vec<f64>, mut rtt: Vec<f64>, mbs: f64| {
        println!(
            "{name:<18} open p50 {:>7.3} ms  p95 {:>7.3} ms   round trip p50 {:>7.3} ms  p95 {:>7.3} ms   {:>8.1} MB/s",
            pct(&mut open, 0.5),
            pct(&mut open, 0.95),
            pct(&mut rtt, 0.5),
            pct(&mut rtt, 0.95),
            mbs
        );
    };
    println!(
        "gateway streams, {opens} opens, {mib} MiB echoed per stream (loopback, one machine):"
    );
    row("direct TCP", d_open, d_rtt, d_mbs);
    row("ssh -L", s_open, s_rtt, s_mbs);
    row("hostd relay", r_open, r_rtt, r_mbs);
    let mut idle = idle;
    let (idle50, idle99) = (pct(&mut idle, 0.5), pct(&mut idle, 0.99));
    println!("probe on the relay's SSH connection (200 each):");
    println!(
        "  {:<44} p50 {idle50:>6.2} ms  p99 {idle99:>6.2} ms",
        "idle"
    );
    for (name, mut v) in busy {
        let p99 = pct(&mut v, 0.99);
        println!(
            "  {name:<44} p50 {:>6.2} ms  p99 {p99:>6.2} ms  ({:+.0}% of idle p99)",
            pct(&mut v, 0.5),
            (p99 / idle99 - 1.0) * 100.0
        );
    }
}

/// Keeps a gateway stream busy until `stop`: 16 KiB out and back without pause, or, from
/// `offset` on, 1 KiB out and back every `pace`.
async fn pump<S>(
    mut s: S,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pace: Option<Duration>,
    offset: Duration,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut b = [0u8; 1];
    if s.read_exact(&mut b).await.is_err() {
        return;
    }
    tokio::time::sleep(offset).await;
    let len = if pace.is_some() { 1024 } else { 16 * 1024 };
    let chunk = vec![3u8; len];
    let mut back = vec![0u8; len];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if s.write_all(&chunk).await.is_err() || s.read_exact(&mut back).await.is_err() {
            return;
        }
        if let Some(p) = pace {
            tokio::time::sleep(p).await;
        }
    }
}
