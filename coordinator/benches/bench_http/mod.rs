//! A minimal blocking HTTP/1.1 client with one keep-alive connection, for the benches that
//! load the API from OS threads (`api_load.rs`, `serve_memory.rs`): no async runtime of its
//! own on the client side, so the clients cost the machine little beside the server.
// Each bench uses the part it needs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One answer: its status, the next page's cursor if it carried one, and its body's length.
pub struct Answer {
    pub status: u16,
    pub next_cursor: Option<String>,
    pub body_bytes: usize,
}

/// One client's connection to the API.
pub struct Http {
    addr: SocketAddr,
    auth: String,
    conn: Option<BufReader<TcpStream>>,
}

impl Http {
    pub fn new(addr: SocketAddr, token: &str) -> Self {
        Self {
            addr,
            auth: format!("Bearer {token}"),
            conn: None,
        }
    }

    /// Sends one request and reads the whole answer; the status, or the transport error (the
    /// connection is then dropped and the next request opens a new one).
    pub fn request(&mut self, method: &str, path: &str) -> std::io::Result<u16> {
        self.answer(method, path).map(|a| a.status)
    }

    /// Like [`Http::request`], with the answer's cursor and size.
    pub fn answer(&mut self, method: &str, path: &str) -> std::io::Result<Answer> {
        let out = self.exchange(method, path);
        if !matches!(out, Ok((_, true))) {
            self.conn = None;
        }
        out.map(|(answer, _)| answer)
    }

    /// The answer and whether the connection stays open.
    fn exchange(&mut self, method: &str, path: &str) -> std::io::Result<(Answer, bool)> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no connection"))?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\nauthorization: {}\r\ncontent-length: 0\r\n\r\n",
            self.addr, self.auth
        );
        conn.get_mut().write_all(request.as_bytes())?;
        let bad = |what: &str| std::io::Error::other(format!("malformed answer: {what}"));
        let mut line = String::new();
        conn.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("status line"))?;
        let mut length: Option<usize> = None;
        let mut chunked = false;
        let mut keep = true;
        let mut next_cursor = None;
        loop {
            line.clear();
            if conn.read_line(&mut line)? == 0 {
                return Err(bad("headers cut off"));
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                return Err(bad("header line"));
            };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => keep = !value.eq_ignore_ascii_case("close"),
                "x-next-cursor" => next_cursor = Some(value.to_owned()),
                _ => {}
            }
        }
        let mut body_bytes = 0;
        if chunked {
            loop {
                line.clear();
                conn.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim(), 16).map_err(|_| bad("chunk size"))?;
                let mut skip = vec![0u8; size + 2];
                conn.read_exact(&mut skip)?;
                body_bytes += size;
                if size == 0 {
                    break;
                }
            }
        } else {
            let mut body = vec![0u8; length.ok_or_else(|| bad("no content-length"))?];
            conn.read_exact(&mut body)?;
            body_bytes = body.len();
        }
        Ok((
            Answer {
                status,
                next_cursor,
                body_bytes,
            },
            keep,
        ))
    }
}
