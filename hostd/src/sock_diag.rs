//! Who listens on a port, asked of the kernel over netlink (`NETLINK_SOCK_DIAG`, as `ss`
//! does) for listening TCP sockets only.
//!
//! `/proc/net/tcp` walks the kernel's whole TCP hash table, every namespace's sockets, and
//! took 4 to 18 ms a read on the test hosts: most of a readiness wait. A dump of listening
//! sockets reads only the listening table (about 0.06 ms). [`crate::real`] falls back to
//! `/proc/net/tcp*` when the kernel answers this with an error.

use std::os::fd::AsRawFd;

use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType};

use crate::listener::Listener;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HEADER: usize = 16;
const IPPROTO_TCP: u8 = 6;
/// `1 << TCP_LISTEN`: the kernel then reads its listening table and nothing else.
const TCPF_LISTEN: u32 = 1 << 10;
/// `struct inet_diag_msg`: family, state, timer, retrans (4), `inet_diag_sockid` (48: sport
/// at 0, big-endian), expires, rqueue, wqueue, uid, inode (5 × u32).
const MSG_LEN: usize = 72;
const SPORT_AT: usize = 4;
const UID_AT: usize = 64;
const INODE_AT: usize = 68;

/// Why the kernel could not be asked.
#[derive(Debug, thiserror::Error)]
#[error("sock_diag {family}: {detail}")]
pub struct DiagError {
    family: &'static str,
    detail: String,
}

/// The listening TCP sockets on `port`, IPv4 and IPv6, in this network namespace.
pub fn listeners(port: u16) -> Result<Vec<Listener>, DiagError> {
    let mut out = dump(AddressFamily::Inet, "IPv4", port)?;
    out.extend(dump(AddressFamily::Inet6, "IPv6", port)?);
    Ok(out)
}

fn dump(family: AddressFamily, name: &'static str, port: u16) -> Result<Vec<Listener>, DiagError> {
    let fail = |detail: String| DiagError {
        family: name,
        detail,
    };
    let fd = nix::sys::socket::socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )
    .map_err(|e| fail(format!("cannot open a netlink socket: {e}")))?;
    let request = request(family as u8);
    nix::sys::socket::send(fd.as_raw_fd(), &request, MsgFlags::empty())
        .map_err(|e| fail(format!("cannot send the request: {e}")))?;
    let mut found = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = nix::sys::socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())
            .map_err(|e| fail(format!("cannot read the answer: {e}")))?;
        match parse(buf.get(..n).unwrap_or_default(), port, &mut found) {
            Parsed::More => {}
            Parsed::Done => return Ok(found),
            Parsed::Error(detail) => return Err(fail(detail)),
        }
        if n == 0 {
            return Err(fail("the kernel closed the answer early".to_owned()));
        }
    }
}

/// `nlmsghdr` + `inet_diag_req_v2` asking for every listening TCP socket of `family`.
fn request(family: u8) -> Vec<u8> {
    let mut req = Vec::with_capacity(NLMSG_HEADER + 56);
    let len = u32::try_from(NLMSG_HEADER + 56).unwrap_or(u32::MAX);
    req.extend_from_slice(&len.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    req.extend_from_slice(&[family, IPPROTO_TCP, 0, 0]);
    req.extend_from_slice(&TCPF_LISTEN.to_ne_bytes());
    req.extend_from_slice(&[0u8; 48]); // any socket id
    req
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    More,
    Done,
    Error(String),
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Adds the listeners on `port` in one datagram of the answer to `out`.
fn parse(mut b: &[u8], port: u16, out: &mut Vec<Listener>) -> Parsed {
    while b.len() >= NLMSG_HEADER {
        let (Some(len), Some(kind)) = (
            u32_at(b, 0).and_then(|l| usize::try_from(l).ok()),
            b.get(4..6).map(|k| u16::from_ne_bytes([k[0], k[1]])),
        ) else {
            return Parsed::Error("a message header is cut short".to_owned());
        };
        if len < NLMSG_HEADER || len > b.len() {
            return Parsed::Error(format!("a message claims {len} bytes of {}", b.len()));
        }
        match kind {
            NLMSG_DONE => return Parsed::Done,
            NLMSG_ERROR => {
                let errno = u32_at(b, NLMSG_HEADER).map_or(0, |e| e as i32);
                return Parsed::Error(format!(
                    "the kernel refused the request: {}",
                    nix::errno::Errno::from_raw(-errno)
                ));
            }
            SOCK_DIAG_BY_FAMILY => {
                let msg = &b[NLMSG_HEADER..len];
                if msg.len() >= MSG_LEN {
                    let sport = u16::from_be_bytes([msg[SPORT_AT], msg[SPORT_AT + 1]]);
                    if let (true, Some(uid), Some(inode)) =
                        (sport == port, u32_at(msg, UID_AT), u32_at(msg, INODE_AT))
                    {
                        out.push(Listener {
                            uid,
                            inode: u64::from(inode),
                        });
                    }
                }
            }
            _ => {}
        }
        b = b.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    Parsed::More
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        let len = u32::try_from(NLMSG_HEADER + body.len()).unwrap();
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(body);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    fn socket(port: u16, uid: u32, inode: u32) -> Vec<u8> {
        let mut b = vec![0u8; MSG_LEN];
        b[SPORT_AT..SPORT_AT + 2].copy_from_slice(&port.to_be_bytes());
        b[UID_AT..UID_AT + 4].copy_from_slice(&uid.to_ne_bytes());
        b[INODE_AT..INODE_AT + 4].copy_from_slice(&inode.to_ne_bytes());
        b
    }

    #[test]
    fn listeners_on_the_port_are_kept_and_the_rest_skipped() {
        let mut d = message(SOCK_DIAG_BY_FAMILY, &socket(18789, 1001, 77));
        d.extend(message(SOCK_DIAG_BY_FAMILY, &socket(22, 0, 5)));
        d.extend(message(SOCK_DIAG_BY_FAMILY, &socket(18789, 0, 78)));
        let mut out = Vec::new();
        assert_eq!(parse(&d, 18789, &mut out), Parsed::More);
        assert_eq!(
            out,
            vec![
                Listener {
                    uid: 1001,
                    inode: 77
                },
                Listener { uid: 0, inode: 78 }
            ]
        );
        assert_eq!(
            parse(&message(NLMSG_DONE, &[0; 4]), 1, &mut out),
            Parsed::Done
        );
    }

    #[test]
    fn errors_and_cut_messages_are_reported() {
        let err = message(NLMSG_ERROR, &(-22i32).to_ne_bytes());
        let mut out = Vec::new();
        assert!(matches!(parse(&err, 1, &mut out), Parsed::Error(m) if m.contains("EINVAL")));
        let mut cut = message(SOCK_DIAG_BY_FAMILY, &socket(1, 0, 1));
        cut[0] = 200;
        assert!(matches!(parse(&cut, 1, &mut out), Parsed::Error(_)));
        assert!(out.is_empty());
    }

    #[test]
    fn the_kernel_answers_for_a_socket_we_open() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let found = listeners(port).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].uid, nix::unistd::getuid().as_raw());
    }
}
