//! `clawfleet-test-gateway hold PORT PASSWORD_FILE CLIENTS STOP_FILE MAX_SECONDS`: benchmark
//! clients, not the gateway. Opens CLIENTS WebSocket connections to the gateway on
//! `127.0.0.1:PORT`, completes the gateway protocol's `connect` on each with the password of
//! PASSWORD_FILE (the `OPENCLAW_GATEWAY_PASSWORD=` line hostd writes), then holds them until
//! STOP_FILE exists or MAX_SECONDS pass, and prints one JSON line: how many connected, how many
//! the gateway closed or dropped meanwhile, and their close codes. A connection that ends before
//! the stop is a disconnect a client would have seen; the client then reconnects at once (as a
//! client told 1012 "service restart" does) and the summary says how long that took (from the
//! drop to `hello-ok` again, p50/p95/max) and how many never got back. With a sixth argument,
//! DETAILS_FILE, the time of every reconnection (Unix ms) is written there as a JSON array, for
//! a benchmark to set against its cutovers.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::ws;

/// How often a held connection looks at the stop flag.
const POLL: Duration = Duration::from_millis(200);
/// Longest frame a held client reads (the gateway sends small frames only).
const MAX_FRAME: u64 = 1024 * 1024;

/// The arguments after `hold`.
#[derive(Debug)]
pub struct Args {
    port: u16,
    password_file: PathBuf,
    clients: usize,
    stop_file: PathBuf,
    max: Duration,
    details_file: Option<PathBuf>,
}

impl Args {
    pub fn parse(args: &[String]) -> Result<Args, String> {
        let (port, password_file, clients, stop_file, max, details_file) = match args {
            [port, password_file, clients, stop_file, max] => {
                (port, password_file, clients, stop_file, max, None)
            }
            [port, password_file, clients, stop_file, max, details] => (
                port,
                password_file,
                clients,
                stop_file,
                max,
                Some(PathBuf::from(details)),
            ),
            _ => {
                return Err("usage: clawfleet-test-gateway hold PORT PASSWORD_FILE CLIENTS STOP_FILE MAX_SECONDS [DETAILS_FILE]"
                    .to_owned());
            }
        };
        let number = |name: &str, v: &str| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("{name} must be a whole number, not {v:?}"))
        };
        Ok(Args {
            port: u16::try_from(number("PORT", port)?)
                .map_err(|_| format!("PORT {port} is out of range"))?,
            password_file: PathBuf::from(password_file),
            clients: usize::try_from(number("CLIENTS", clients)?)
                .map_err(|_| format!("CLIENTS {clients} is out of range"))?,
            stop_file: PathBuf::from(stop_file),
            max: Duration::from_secs(number("MAX_SECONDS", max)?),
            details_file,
        })
    }
}

/// How one held connection ended.
enum Ending {
    /// Held until the stop.
    Held,
    /// The gateway closed it (close code) or the connection dropped (none).
    Dropped(Option<u16>),
}

/// One disconnect a held client saw.
struct Disconnect {
    /// The gateway's close code, or none for a connection that just ended.
    code: Option<u16>,
    /// How long until `hello-ok` on a new connection; none if the client never got back.
    reconnect: Option<Duration>,
    reconnected_unix_ms: Option<u64>,
}

/// Holds a connected client until the stop; after each disconnect it reconnects at once,
/// retrying every 50 ms (a refused or failed attempt) until the stop.
fn client(
    mut stream: TcpStream,
    port: u16,
    password: &str,
    n: usize,
    stop: &AtomicBool,
) -> Vec<Disconnect> {
    let mut seen = Vec::new();
    loop {
        let code = match hold(stream, stop) {
            Ending::Held => return seen,
            Ending::Dropped(code) => code,
        };
        let dropped = Instant::now();
        let mut back = None;
        while !stop.load(Ordering::SeqCst) {
            match connect(port, password, n) {
                Ok(s) => {
                    back = Some(s);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let reconnect = back.as_ref().map(|_| dropped.elapsed());
        seen.push(Disconnect {
            code,
            reconnect,
            reconnected_unix_ms: back.as_ref().map(|_| unix_ms()),
        });
        match back {
            Some(s) => stream = s,
            None => return seen,
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `p` quantile (0..=1) of sorted milliseconds, or null for none.
fn quantile(sorted: &[u64], p: f64) -> Value {
    if sorted.is_empty() {
        return Value::Null;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    json!(sorted[i.min(sorted.len() - 1)])
}

/// Runs the clients and prints the summary; an error means not every client connected.
pub fn run(args: &Args) -> Result<(), String> {
    let password = read_password(&args.password_file)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut connected = 0;
    for i in 0..args.clients {
        let stream = connect(args.port, &password, i)
            .map_err(|e| format!("client {i} could not connect: {e}"))?;
        connected += 1;
        let stop = stop.clone();
        let (port, password) = (args.port, password.clone());
        threads.push(std::thread::spawn(move || {
            client(stream, port, &password, i, &stop)
        }));
    }
    let deadline = Instant::now() + args.max;
    while !args.stop_file.exists() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    stop.store(true, Ordering::SeqCst);
    let mut seen = Vec::new();
    let mut lost_threads = 0;
    for t in threads {
        match t.join() {
            Ok(d) => seen.extend(d),
            Err(_) => lost_threads += 1,
        }
    }
    let codes: Vec<Value> = seen
        .iter()
        .map(|d| d.code.map_or(Value::Null, |c| json!(c)))
        .collect();
    let mut reconnect_ms: Vec<u64> = seen
        .iter()
        .filter_map(|d| d.reconnect)
        .map(|r| r.as_millis() as u64)
        .collect();
    reconnect_ms.sort_unstable();
    let unreconnected = seen.iter().filter(|d| d.reconnect.is_none()).count() + lost_threads;
    if let Some(path) = &args.details_file {
        let at: Vec<u64> = seen.iter().filter_map(|d| d.reconnected_unix_ms).collect();
        std::fs::write(path, json!(at).to_string())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    println!(
        "{}",
        json!({"clients": args.clients, "connected": connected, "disconnected": seen.len() + lost_threads,
               "closeCodes": codes, "reconnected": reconnect_ms.len(), "unreconnected": unreconnected,
               "reconnectMsP50": quantile(&reconnect_ms, 0.5), "reconnectMsP95": quantile(&reconnect_ms, 0.95),
               "reconnectMsMax": reconnect_ms.last()})
    );
    Ok(())
}

fn read_password(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("OPENCLAW_GATEWAY_PASSWORD="))
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| format!("{} has no OPENCLAW_GATEWAY_PASSWORD= line", path.display()))
}

/// The upgrade, the challenge, `connect` with the password, and `hello-ok`.
fn connect(port: u16, password: &str, n: usize) -> io::Result<TcpStream> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
    let mut stream = TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let key = <base64ct::Base64 as base64ct::Encoding>::encode_string(&{
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&(n as u64).to_be_bytes());
        k
    });
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut status = String::new();
    reader.read_line(&mut status)?;
    if !status.starts_with("HTTP/1.1 101") {
        return Err(bad(format!("the upgrade was answered {}", status.trim())));
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
    }
    let challenge = read_text(&mut reader)?;
    if !challenge.contains("connect.challenge") {
        return Err(bad(format!("no challenge: {challenge}")));
    }
    let request = json!({"type": "req", "id": "1", "method": "connect", "params": {
        "minProtocol": 4, "maxProtocol": 4,
        "client": {"id": "cli", "mode": "cli", "version": "bench", "platform": "linux"},
        "auth": {"password": password}}});
    write_masked(&mut stream, ws::OP_TEXT, request.to_string().as_bytes())?;
    let answer: Value = serde_json::from_str(&read_text(&mut reader)?)
        .map_err(|e| bad(format!("the connect answer is not JSON: {e}")))?;
    if answer["ok"] != true {
        return Err(bad(format!("connect refused: {answer}")));
    }
    if !reader.buffer().is_empty() {
        return Err(bad("the gateway sent more than hello-ok".to_owned()));
    }
    Ok(stream)
}

/// Waits on a connected client until `stop`; anything the gateway sends then ends it.
fn hold(mut stream: TcpStream, stop: &AtomicBool) -> Ending {
    if stream.set_read_timeout(Some(POLL)).is_err() {
        return Ending::Dropped(None);
    }
    let mut first = [0u8; 1];
    loop {
        if stop.load(Ordering::SeqCst) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return Ending::Held;
        }
        match stream.read(&mut first) {
            Ok(0) => return Ending::Dropped(None),
            Ok(_) => {
                // A frame: a close (its code) or anything else the held client did not ask for.
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                return match read_frame_after(first[0], &mut stream) {
                    Ok((ws::OP_CLOSE, payload)) => {
                        Ending::Dropped(payload.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])))
                    }
                    _ => Ending::Dropped(None),
                };
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Ending::Dropped(None),
        }
    }
}

/// One unmasked server frame whose first byte was already read.
fn read_frame_after(first: u8, r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    let len = match b[0] & 0x7F {
        126 => {
            let mut x = [0u8; 2];
            r.read_exact(&mut x)?;
            u64::from(u16::from_be_bytes(x))
        }
        127 => {
            let mut x = [0u8; 8];
            r.read_exact(&mut x)?;
            u64::from_be_bytes(x)
        }
        n => u64::from(n),
    };
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a frame longer than 1 MiB",
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok((first & 0x0F, payload))
}

/// The next text frame from the gateway.
fn read_text(r: &mut impl Read) -> io::Result<String> {
    let mut first = [0u8; 1];
    r.read_exact(&mut first)?;
    let (op, payload) = read_frame_after(first[0], r)?;
    if op != ws::OP_TEXT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected a text frame, got opcode {op}"),
        ));
    }
    String::from_utf8(payload)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a text frame not in UTF-8"))
}

/// One masked (client) frame with FIN set. The mask need not be secret here.
fn write_masked(w: &mut impl Write, opcode: u8, payload: &[u8]) -> io::Result<()> {
    let mask = [0x5a, 0x17, 0xc3, 0x2e];
    let mut frame = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n <= usize::from(u16::MAX) => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    w.write_all(&frame)?;
    w.flush()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_and_named() {
        let args = |v: &[&str]| Args::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(args(&["18700", "/pw", "20", "/stop", "60"]).is_ok());
        assert!(args(&["18700"]).unwrap_err().contains("usage"));
        assert!(
            args(&["x", "/pw", "20", "/stop", "60"])
                .unwrap_err()
                .contains("PORT")
        );
        assert!(
            args(&["70000", "/pw", "20", "/stop", "60"])
                .unwrap_err()
                .contains("out of range")
        );
    }

    #[test]
    fn a_masked_frame_is_what_the_server_side_reads() {
        let mut frame = Vec::new();
        write_masked(&mut frame, ws::OP_TEXT, b"hello").unwrap();
        let mut out = Vec::new();
        let got = ws::read_message(&mut frame.as_slice(), &mut out, 1024).unwrap();
        assert_eq!(got, ws::Message::Text("hello".to_owned()));
    }
}
