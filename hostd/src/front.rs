//! `hostd front --port P --hold-ms MS`: an Agent's public port, held by the host (issue 28).
//!
//! systemd (PID 1, as root) listens on `127.0.0.1:<port>` and `[::1]:<port>` in the host's
//! network namespace (the Agent's `clawfleet-front-<hash>.socket`) and hands the listening
//! sockets to this process, which runs in the Agent's own namespace (`JoinsNamespaceOf=` its
//! network unit) as a dynamic user with nothing else. Each accepted connection is
//! joined to the gateway's loopback listener there, `127.0.0.1:<port>`; while the gateway
//! restarts (a cutover) the connect is retried for up to the hold time, so clients wait
//! instead of being refused, and after it the client gets a `503` naming the wait. Bytes are
//! copied both ways unchanged (HTTP, WebSockets): a gateway that closes its WebSockets with
//! 1012 on shutdown is seen so by its clients, which can reconnect at once.
//!
//! The port stays held by PID 1 across gateway and front restarts: no other process on the
//! host can bind it, and the gateway itself binds nothing the host can see.
#![allow(unsafe_code)]

use std::convert::Infallible;
use std::io::Write;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;
/// More passed descriptors than this is not our socket unit.
const MAX_LISTEN_FDS: usize = 16;
/// The first pause between two connects to a gateway that is not listening, doubling up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(2);
const MAX_PAUSE: Duration = Duration::from_millis(50);
/// One connect attempt on the loopback never takes long; this bounds a stuck one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of a request kept to send again to the next gateway (see [`first_exchange`]).
const REPLAY_MAX: usize = 1 << 20;

/// Why the front cannot run.
#[derive(Debug, Error)]
pub enum FrontError {
    #[error(
        "no listening sockets were passed (LISTEN_PID/LISTEN_FDS unset or not for this process): run by the Agent's socket unit only"
    )]
    NoSockets,
    #[error("LISTEN_FDS={0:?} is not a count between 1 and {MAX_LISTEN_FDS}")]
    BadCount(String),
    #[error("passed descriptor {fd} is not usable: {source}")]
    Descriptor { fd: RawFd, source: std::io::Error },
}

/// The front's settings.
#[derive(Debug, Clone, Copy)]
pub struct Front {
    /// The gateway's port on the loopback of the Agent's namespace.
    pub port: u16,
    /// How long a connection waits for the gateway to listen before the client gets a 503.
    pub hold: Duration,
    /// At most this many connections at once; more are answered 503 at once.
    pub max_connections: usize,
}

/// The listening sockets systemd passed to this process.
fn passed_listeners() -> Result<Vec<TcpListener>, FrontError> {
    let for_us = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let count = std::env::var("LISTEN_FDS").ok();
    let (true, Some(count)) = (for_us, count) else {
        return Err(FrontError::NoSockets);
    };
    let n: usize = count
        .parse()
        .ok()
        .filter(|n| (1..=MAX_LISTEN_FDS).contains(n))
        .ok_or_else(|| FrontError::BadCount(count.clone()))?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let fd = LISTEN_FDS_START + i as RawFd;
        // The descriptor must be an open socket: fstat through the listener's local address.
        // SAFETY: systemd passed descriptors 3..3+n to this process (LISTEN_PID checked) and
        // nothing else in hostd owns them; each becomes owned by exactly one listener here.
        let listener = unsafe { TcpListener::from_raw_fd(fd) };
        listener
            .local_addr()
            .map_err(|source| FrontError::Descriptor { fd, source })?;
        out.push(listener);
    }
    // The variables are for this process only, not for anything it might start.
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        // SAFETY: single-threaded at this point (no thread started yet).
        unsafe { std::env::remove_var(var) };
    }
    Ok(out)
}

/// Serves forever on the sockets systemd passed. Returns only when there are none.
pub fn run(front: Front) -> Result<Infallible, FrontError> {
    let listeners = passed_listeners()?;
    let active = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for listener in listeners {
        let active = Arc::clone(&active);
        threads.push(std::thread::spawn(move || {
            accept_loop(&listener, front, &active)
        }));
    }
    for t in threads {
        // accept_loop never returns; a panicked one ends the front, which systemd restarts.
        if t.join().is_err() {
            eprintln!("hostd front: an accept thread panicked");
            std::process::exit(1);
        }
    }
    std::process::exit(1)
}

fn accept_loop(listener: &TcpListener, front: Front, active: &Arc<AtomicUsize>) {
    loop {
        let client = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) => {
                // EMFILE and the like: pause instead of spinning.
                eprintln!("hostd front: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= front.max_connections {
            active.fetch_sub(1, Ordering::SeqCst);
            refuse(client, "the Agent's front has too many connections open");
            continue;
        }
        let active = Arc::clone(active);
        let spawned = std::thread::Builder::new().spawn(move || {
            serve(client, front);
            active.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            eprintln!("hostd front: cannot start a connection thread: {e}");
        }
    }
}

/// Connects to the gateway, waiting until `deadline` for it to listen.
fn connect(port: u16, deadline: Instant) -> Option<TcpStream> {
    let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut pause = FIRST_PAUSE;
    loop {
        match TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) {
            Ok(s) => {
                // Small writes (WebSocket frames) go out at once.
                let _ = s.set_nodelay(true);
                return Some(s);
            }
            Err(_) if Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(_) => return None,
        }
    }
}

/// How the first exchange of a connection ended.
enum First {
    /// The gateway answered (its first bytes are passed on): join the two from here.
    Joined(TcpStream),
    /// No gateway took the connection within the hold time: the client gets a 503.
    NoGateway,
    /// The client went away, or a gateway dropped a request too large to send again.
    Over,
}

/// Joins the client to a gateway until the gateway's first bytes of answer. A gateway that
/// accepts the connection and then goes away without a byte (the old one, stopping in a
/// cutover, with connections still in its backlog) is replaced by the next one, which gets
/// what the client sent so far (up to [`REPLAY_MAX`]): such a request was never answered.
fn first_exchange(client: &TcpStream, front: Front) -> First {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::io::Read;
    use std::os::fd::AsFd;
    let deadline = Instant::now() + front.hold;
    let Some(mut gateway) = connect(front.port, deadline) else {
        return First::NoGateway;
    };
    let mut sent: Vec<u8> = Vec::new();
    let mut replayable = true;
    let mut client_done = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let (client_ready, gateway_ready) = {
            let mut fds = vec![PollFd::new(gateway.as_fd(), PollFlags::POLLIN)];
            if !client_done {
                fds.push(PollFd::new(client.as_fd(), PollFlags::POLLIN));
            }
            if poll(&mut fds, PollTimeout::NONE).is_err() {
                return First::Over;
            }
            let ready = |f: &PollFd<'_>| {
                f.revents().is_some_and(|r| {
                    r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
                })
            };
            (fds.get(1).is_some_and(ready), ready(&fds[0]))
        };
        if gateway_ready {
            match (&gateway).read(&mut buf) {
                Ok(n) if n > 0 => {
                    return match (&*client).write_all(&buf[..n]) {
                        Ok(()) => First::Joined(gateway),
                        Err(_) => First::Over,
                    };
                }
                // Gone without a byte of answer.
                _ if !replayable => return First::Over,
                _ => {
                    let Some(next) = connect(front.port, deadline) else {
                        return First::NoGateway;
                    };
                    gateway = next;
                    // A write that fails is the same again: seen as the next read's end.
                    if !sent.is_empty() {
                        let _ = (&gateway).write_all(&sent);
                    }
                    if client_done {
                        let _ = gateway.shutdown(Shutdown::Write);
                    }
                    continue;
                }
            }
        }
        if client_ready {
            match (&*client).read(&mut buf) {
                Ok(0) | Err(_) => {
                    client_done = true;
                    let _ = gateway.shutdown(Shutdown::Write);
                }
                Ok(n) => {
                    if replayable && sent.len() + n <= REPLAY_MAX {
                        sent.extend_from_slice(&buf[..n]);
                    } else {
                        replayable = false;
                        sent = Vec::new();
                    }
                    let _ = (&gateway).write_all(&buf[..n]);
                }
            }
        }
    }
}

fn refuse(mut client: TcpStream, why: &str) {
    let body = format!("{why}\n");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // The client may be gone already; nothing else to tell it.
    if client.write_all(response.as_bytes()).is_ok() {
        let _ = client.shutdown(Shutdown::Write);
    }
}

fn serve(client: TcpStream, front: Front) {
    let _ = client.set_nodelay(true);
    let gateway = match first_exchange(&client, front) {
        First::Joined(g) => g,
        First::NoGateway => {
            refuse(
                client,
                &format!(
                    "the Agent's gateway did not accept the connection within {} ms (restarting or stopped)",
                    front.hold.as_millis()
                ),
            );
            return;
        }
        First::Over => return,
    };
    let (Ok(client2), Ok(gateway2)) = (client.try_clone(), gateway.try_clone()) else {
        return;
    };
    let upstream = std::thread::Builder::new().spawn(move || pipe(&client2, &gateway2));
    pipe(&gateway, &client);
    // The gateway ended its side (it answered, or went away in a restart): the client gets
    // that end, and a client that keeps its side open no longer holds this connection's
    // threads.
    let _ = client.shutdown(Shutdown::Both);
    if let Ok(t) = upstream {
        let _ = t.join();
    }
}

/// Copies until `from` ends, then passes the end on to `to`.
fn pipe(mut from: &TcpStream, mut to: &TcpStream) {
    // An error is either side going away; either way the end is passed on.
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_connection_waits_for_the_gateway_then_is_joined() {
        // A port that is free now; the "gateway" listens on it only after a while.
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let front = Front {
            port,
            hold: Duration::from_secs(5),
            max_connections: 8,
        };
        let outside = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let outside_addr = outside.local_addr().unwrap();
        let accepted = std::thread::spawn(move || {
            let (c, _) = outside.accept().unwrap();
            serve(c, front);
        });
        let mut client = TcpStream::connect(outside_addr).unwrap();
        client.write_all(b"ping").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let gateway = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        let (mut g, _) = gateway.accept().unwrap();
        let mut buf = [0u8; 4];
        g.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        g.write_all(b"pong").unwrap();
        drop(g);
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"pong");
        accepted.join().unwrap();
    }

    #[test]
    fn a_gateway_that_never_listens_gets_a_503_after_the_hold() {
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let front = Front {
            port,
            hold: Duration::from_millis(200),
            max_connections: 8,
        };
        let outside = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let outside_addr = outside.local_addr().unwrap();
        let t0 = Instant::now();
        let accepted = std::thread::spawn(move || {
            let (c, _) = outside.accept().unwrap();
            serve(c, front);
        });
        let mut client = TcpStream::connect(outside_addr).unwrap();
        let mut back = String::new();
        client.read_to_string(&mut back).unwrap();
        assert!(back.starts_with("HTTP/1.1 503 "), "{back}");
        assert!(back.contains("within 200 ms"), "{back}");
        assert!(t0.elapsed() >= Duration::from_millis(150));
        accepted.join().unwrap();
    }

    #[test]
    fn without_passed_sockets_the_front_refuses_to_run() {
        assert!(matches!(passed_listeners(), Err(FrontError::NoSockets)));
    }

    /// A gateway that takes the connection and goes away without answering (the old one,
    /// stopping): the request goes to the next one, and the client sees only its answer.
    #[test]
    fn a_request_a_stopping_gateway_dropped_goes_to_the_next_one() {
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let front = Front {
            port,
            hold: Duration::from_secs(5),
            max_connections: 8,
        };
        let gateway = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        let outside = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let outside_addr = outside.local_addr().unwrap();
        let accepted = std::thread::spawn(move || {
            let (c, _) = outside.accept().unwrap();
            serve(c, front);
        });
        let mut client = TcpStream::connect(outside_addr).unwrap();
        client.write_all(b"GET /x HTTP/1.1\r\n\r\n").unwrap();
        // The old gateway reads the request and closes without a byte, then stops listening.
        let (mut old, _) = gateway.accept().unwrap();
        let mut got = [0u8; 19];
        old.read_exact(&mut got).unwrap();
        drop(old);
        drop(gateway);
        std::thread::sleep(Duration::from_millis(100));
        let gateway = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        let (mut new, _) = gateway.accept().unwrap();
        let mut again = [0u8; 19];
        new.read_exact(&mut again).unwrap();
        assert_eq!(&again, b"GET /x HTTP/1.1\r\n\r\n");
        new.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        drop(new);
        let mut back = String::new();
        client.read_to_string(&mut back).unwrap();
        assert_eq!(back, "HTTP/1.1 200 OK\r\n\r\n");
        accepted.join().unwrap();
    }
}
