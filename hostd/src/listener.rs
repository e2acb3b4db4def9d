//! Who listens on a port: the listening TCP sockets, from the kernel over netlink
//! (`sock_diag.rs`) or from `/proc/net/tcp` and `/proc/net/tcp6`.
//!
//! Readiness only counts when the listener on the Agent's port belongs to the Agent's account:
//! otherwise another local user who bound the port first (while the Agent was stopped or
//! restarting) would answer `/readyz`, be recorded as served, and receive the Agent's clients
//! and their gateway password.

/// One listening socket on a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub uid: u32,
    pub inode: u64,
}

/// `st` of a listening socket in `/proc/net/tcp*`.
const TCP_LISTEN: &str = "0A";

/// The listening sockets on `port` in the text of `/proc/net/tcp` or `/proc/net/tcp6`. Lines
/// that do not parse are skipped (the header, or a format this kernel does not have).
pub fn parse(text: &str, port: u16) -> Vec<Listener> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st queues timer retrnsmt uid timeout inode ...
            if f.len() < 10 || f[3] != TCP_LISTEN {
                return None;
            }
            let (_, local_port) = f[1].rsplit_once(':')?;
            if u16::from_str_radix(local_port, 16).ok()? != port {
                return None;
            }
            Some(Listener {
                uid: f[7].parse().ok()?,
                inode: f[9].parse().ok()?,
            })
        })
        .collect()
}

/// What the listeners on an Agent's port say about readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Every listener belongs to the Agent's account.
    Owned,
    /// Nobody listens (yet).
    NoListener,
    /// A listener of another uid; its uid and socket inode.
    Foreign(Listener),
}

/// Decides ownership of `port`'s listeners for the account `uid`.
pub fn ownership(listeners: &[Listener], uid: u32) -> Ownership {
    match listeners.iter().find(|l| l.uid != uid) {
        Some(l) => Ownership::Foreign(*l),
        None if listeners.is_empty() => Ownership::NoListener,
        None => Ownership::Owned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:490C 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 41234 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0
   2: 0100007F:490C 0100007F:9C40 01 00000000:00000000 00:00000000 00000000   998        0 51234 1 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:490C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 777 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn finds_the_listeners_of_a_port_only() {
        // 0x490C = 18700.
        assert_eq!(
            parse(TCP, 18700),
            vec![Listener {
                uid: 998,
                inode: 41234
            }],
            "the established connection (st 01) is not a listener"
        );
        assert_eq!(parse(TCP, 22)[0].uid, 0);
        assert!(parse(TCP, 18701).is_empty());
        assert_eq!(
            parse(TCP6, 18700),
            vec![Listener {
                uid: 1001,
                inode: 777
            }]
        );
        assert!(parse("garbage\n\n1: x y 0A", 18700).is_empty());
    }

    #[test]
    fn every_listener_must_be_the_agents() {
        let mine = Listener { uid: 998, inode: 1 };
        let other = Listener {
            uid: 1001,
            inode: 2,
        };
        assert_eq!(ownership(&[mine], 998), Ownership::Owned);
        assert_eq!(ownership(&[], 998), Ownership::NoListener);
        assert_eq!(ownership(&[mine, other], 998), Ownership::Foreign(other));
        assert_eq!(ownership(&[other], 998), Ownership::Foreign(other));
    }
}
