//! An Agent's own egress settings (issue 28): a narrowing of what its target allows it to
//! reach. A host's ceiling is its pool's `hostd.toml` (`[network] egress_ports`, TCP to public
//! addresses, and `egress_allow`, CIDRs on any port); a cluster's is its default policy.
//! Deployers are tenants: they may take ports and ranges away, never add one, so the host's
//! private ranges and the cloud metadata address stay closed unless the operator opened them.
//!
//! Decoding checks the shape ([`Egress::check`]); the target checks the narrowing
//! ([`Egress::within`]) against its own ceiling and refuses with `EGRESS_NOT_ALLOWED`.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// At most this many ports, and this many CIDRs.
pub const MAX_ENTRIES: usize = 32;

/// What an Agent may reach; each list left out is its target's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, try_from = "RawEgress")]
pub struct Egress {
    /// TCP ports to public addresses (empty: none); `None`: the target's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
    /// IPv4 CIDRs reachable on any port, each inside one the target allows (empty: none);
    /// `None`: the target's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
}

/// How people read the settings (`occ agent get`, the console): `ports 443,8443; allow
/// target's`, `none` for an empty list.
impl std::fmt::Display for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn list<T: ToString>(v: Option<&Vec<T>>) -> String {
            match v {
                None => "target's".to_owned(),
                Some(v) if v.is_empty() => "none".to_owned(),
                Some(v) => v.iter().map(T::to_string).collect::<Vec<_>>().join(","),
            }
        }
        write!(
            f,
            "ports {}; allow {}",
            list(self.ports.as_ref()),
            list(self.allow.as_ref())
        )
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawEgress {
    #[serde(default)]
    ports: Option<Vec<u16>>,
    #[serde(default)]
    allow: Option<Vec<String>>,
}

impl TryFrom<RawEgress> for Egress {
    type Error = EgressError;
    fn try_from(raw: RawEgress) -> Result<Self, Self::Error> {
        let e = Egress {
            ports: raw.ports,
            allow: raw.allow,
        };
        e.check()?;
        Ok(e)
    }
}

/// Why egress settings are refused; each names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EgressError {
    #[error("egress.{field} has {count} entries; at most {MAX_ENTRIES} are allowed")]
    TooMany { field: &'static str, count: usize },
    #[error("egress.ports[{index}] is 0; ports are 1 to 65535")]
    PortZero { index: usize },
    #[error("egress.{field}[{index}] repeats {value}")]
    Repeated {
        field: &'static str,
        index: usize,
        value: String,
    },
    #[error(
        "egress.allow[{index}] is {value:?}, not an IPv4 CIDR written as a.b.c.d/n with no bits set past n (for example 10.1.2.0/24)"
    )]
    NotCidr { index: usize, value: String },
    #[error(
        "egress.ports[{index}] is {port}, which this target does not allow (it allows {allowed}); an Agent's egress may only narrow its target's"
    )]
    PortNotAllowed {
        index: usize,
        port: u16,
        allowed: String,
    },
    #[error(
        "egress.allow[{index}] is {cidr}, which is not inside a range this target allows (it allows {allowed}); an Agent's egress may only narrow its target's"
    )]
    CidrNotAllowed {
        index: usize,
        cidr: String,
        allowed: String,
    },
}

/// An IPv4 CIDR: its network address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` (n ≤ 32, decimal, no sign) with no bits set past the prefix.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, len) = Self::shape(s)?;
        (u32::from(addr) & !Self::mask(len) == 0).then_some(Cidr { addr, len })
    }

    /// The address and prefix length of `a.b.c.d/n` (n ≤ 32, decimal, no sign), whatever
    /// bits the address has past the prefix.
    fn shape(s: &str) -> Option<(Ipv4Addr, u8)> {
        let (addr, len) = s.split_once('/')?;
        if len.is_empty() || len.len() > 2 || !len.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let len: u8 = len.parse().ok()?;
        let addr: Ipv4Addr = addr.parse().ok()?;
        (len <= 32).then_some((addr, len))
    }

    fn mask(len: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
    }

    /// Whether every address of `self` is inside `outer`.
    pub fn inside(&self, outer: &Cidr) -> bool {
        self.len >= outer.len
            && u32::from(self.addr) & Self::mask(outer.len) == u32::from(outer.addr)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    /// As [`Cidr::parse`], with an error that says what is wrong.
    fn from_str(s: &str) -> Result<Cidr, String> {
        if let Some(c) = Cidr::parse(s) {
            return Ok(c);
        }
        Err(match Cidr::shape(s) {
            Some((addr, len)) => format!(
                "{s:?} has address bits set past its /{len} prefix: the network is \"{}/{len}\"",
                Ipv4Addr::from(u32::from(addr) & Cidr::mask(len))
            ),
            None => format!("{s:?} is not an IPv4 CIDR such as \"10.1.2.0/24\""),
        })
    }
}

impl Egress {
    /// The shape: at most [`MAX_ENTRIES`] of each, no port 0, no repeats, CIDRs canonical.
    pub fn check(&self) -> Result<(), EgressError> {
        if let Some(ports) = &self.ports {
            if ports.len() > MAX_ENTRIES {
                return Err(EgressError::TooMany {
                    field: "ports",
                    count: ports.len(),
                });
            }
            for (index, p) in ports.iter().enumerate() {
                if *p == 0 {
                    return Err(EgressError::PortZero { index });
                }
                if ports[..index].contains(p) {
                    return Err(EgressError::Repeated {
                        field: "ports",
                        index,
                        value: p.to_string(),
                    });
                }
            }
        }
        if let Some(allow) = &self.allow {
            if allow.len() > MAX_ENTRIES {
                return Err(EgressError::TooMany {
                    field: "allow",
                    count: allow.len(),
                });
            }
            for (index, c) in allow.iter().enumerate() {
                if Cidr::parse(c).is_none() {
                    return Err(EgressError::NotCidr {
                        index,
                        value: c.chars().take(64).collect(),
                    });
                }
                if allow[..index].contains(c) {
                    return Err(EgressError::Repeated {
                        field: "allow",
                        index,
                        value: c.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// What the Agent gets under a target that allows `ports` and `allow`: its own lists
    /// where it set them, each entry within the target's, else the target's. Refused (naming
    /// the entry) when it asks for a port or range the target does not allow.
    pub fn within(
        &self,
        ports: &[u16],
        allow: &[String],
    ) -> Result<(Vec<u16>, Vec<String>), EgressError> {
        self.check()?;
        let shown = |v: Vec<String>| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        // Allowed is what the clip keeps: the first own entry it dropped is refused.
        let (own_ports, own_allow) = self.clipped(ports, allow);
        if let Some(own) = &self.ports
            && let Some(index) = first_dropped(own, &own_ports)
        {
            return Err(EgressError::PortNotAllowed {
                index,
                port: own[index],
                allowed: shown(ports.iter().map(u16::to_string).collect()),
            });
        }
        if let Some(own) = &self.allow
            && let Some(index) = first_dropped(own, &own_allow)
        {
            return Err(EgressError::CidrNotAllowed {
                index,
                cidr: own[index].clone(),
                allowed: shown(allow.to_vec()),
            });
        }
        Ok((own_ports, own_allow))
    }
}

/// The index of the first of `own` that `kept` (what a clip kept of it) lacks.
fn first_dropped<T: PartialEq>(own: &[T], kept: &[T]) -> Option<usize> {
    own.iter().position(|e| !kept.contains(e))
}

impl Egress {
    /// What the Agent gets under a ceiling that may have shrunk since [`Egress::within`]
    /// passed (an operator narrowed the pool): its own entries that the ceiling still allows,
    /// never more. Unset lists are the ceiling's.
    pub fn clipped(&self, ports: &[u16], allow: &[String]) -> (Vec<u16>, Vec<String>) {
        let own_ports = match &self.ports {
            None => ports.to_vec(),
            Some(own) => own.iter().copied().filter(|p| ports.contains(p)).collect(),
        };
        let own_allow = match &self.allow {
            None => allow.to_vec(),
            Some(own) => {
                let outer: Vec<Cidr> = allow.iter().filter_map(|c| Cidr::parse(c)).collect();
                own.iter()
                    .filter(|c| Cidr::parse(c).is_some_and(|i| outer.iter().any(|o| i.inside(o))))
                    .cloned()
                    .collect()
            }
        };
        (own_ports, own_allow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(v: serde_json::Value) -> Result<Egress, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn shape_is_checked_on_decode_and_names_the_entry() {
        assert_eq!(decode(serde_json::json!({})).unwrap(), Egress::default());
        let e =
            decode(serde_json::json!({"ports": [443, 8443], "allow": ["10.1.2.0/24"]})).unwrap();
        assert_eq!(e.ports.as_deref(), Some(&[443, 8443][..]));
        for (bad, says) in [
            (serde_json::json!({"ports": [0]}), "egress.ports[0] is 0"),
            (
                serde_json::json!({"ports": [443, 443]}),
                "egress.ports[1] repeats 443",
            ),
            (serde_json::json!({"ports": [70000]}), "70000"),
            (
                serde_json::json!({"allow": ["10.1.2.3/24"]}),
                "egress.allow[0]",
            ),
            (
                serde_json::json!({"allow": ["10.1.2.0/33"]}),
                "egress.allow[0]",
            ),
            (
                serde_json::json!({"allow": ["10.1.2.0"]}),
                "egress.allow[0]",
            ),
            (
                serde_json::json!({"allow": ["fd00::/8"]}),
                "egress.allow[0]",
            ),
            (
                serde_json::json!({"allow": ["10.0.0.0/8", "10.0.0.0/8"]}),
                "egress.allow[1] repeats",
            ),
            (serde_json::json!({"hosts": []}), "unknown field `hosts`"),
        ] {
            let e = decode(bad.clone()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let many: Vec<u16> = (1..=33).collect();
        assert!(
            decode(serde_json::json!({ "ports": many }))
                .unwrap_err()
                .contains("at most 32")
        );
    }

    #[test]
    fn an_agent_only_narrows_its_target() {
        let pool_ports = [443, 8443];
        let pool_allow = ["10.1.0.0/16".to_owned()];
        let unset = Egress::default();
        assert_eq!(
            unset.within(&pool_ports, &pool_allow).unwrap(),
            (vec![443, 8443], vec!["10.1.0.0/16".to_owned()])
        );
        let narrow = Egress {
            ports: Some(vec![8443]),
            allow: Some(vec!["10.1.2.0/24".into(), "10.1.0.7/32".into()]),
        };
        assert_eq!(
            narrow.within(&pool_ports, &pool_allow).unwrap(),
            (
                vec![8443],
                vec!["10.1.2.0/24".to_owned(), "10.1.0.7/32".to_owned()]
            )
        );
        let none = Egress {
            ports: Some(vec![]),
            allow: Some(vec![]),
        };
        assert_eq!(
            none.within(&pool_ports, &pool_allow).unwrap(),
            (vec![], vec![])
        );
        let wider = Egress {
            ports: Some(vec![443, 22]),
            allow: None,
        };
        let e = wider
            .within(&pool_ports, &pool_allow)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("egress.ports[1] is 22") && e.contains("443, 8443"),
            "{e}"
        );
        for cidr in [
            "169.254.169.254/32",
            "10.0.0.0/8",
            "10.2.0.0/24",
            "0.0.0.0/0",
        ] {
            let e = Egress {
                ports: None,
                allow: Some(vec![cidr.into()]),
            }
            .within(&pool_ports, &pool_allow)
            .unwrap_err()
            .to_string();
            assert!(e.contains(&format!("egress.allow[0] is {cidr}")), "{e}");
        }
        let e = Egress {
            ports: None,
            allow: Some(vec!["10.1.2.0/24".into()]),
        }
        .within(&pool_ports, &[])
        .unwrap_err()
        .to_string();
        assert!(e.contains("it allows none"), "{e}");
    }

    #[test]
    fn a_shrunk_ceiling_clips_what_was_allowed() {
        let e = Egress {
            ports: Some(vec![443, 8443]),
            allow: Some(vec!["10.1.2.0/24".into(), "192.168.1.0/24".into()]),
        };
        assert_eq!(
            e.clipped(&[443], &["192.168.0.0/16".to_owned()]),
            (vec![443], vec!["192.168.1.0/24".to_owned()])
        );
        assert_eq!(e.clipped(&[], &[]), (vec![], vec![]));
        assert_eq!(
            Egress::default().clipped(&[443], &["10.0.0.0/8".to_owned()]),
            (vec![443], vec!["10.0.0.0/8".to_owned()])
        );
    }

    #[test]
    fn settings_read_as_text() {
        let e = Egress {
            ports: Some(vec![443, 8443]),
            allow: None,
        };
        assert_eq!(e.to_string(), "ports 443,8443; allow target's");
        let e = Egress {
            ports: Some(vec![]),
            allow: Some(vec!["10.1.2.0/24".into()]),
        };
        assert_eq!(e.to_string(), "ports none; allow 10.1.2.0/24");
    }

    #[test]
    fn cidrs_nest() {
        let c = |s| Cidr::parse(s).unwrap();
        assert!(c("10.1.2.0/24").inside(&c("10.0.0.0/8")));
        assert!(c("10.0.0.0/8").inside(&c("10.0.0.0/8")));
        assert!(!c("10.0.0.0/8").inside(&c("10.1.0.0/16")));
        assert!(c("1.2.3.4/32").inside(&c("0.0.0.0/0")));
        assert!(Cidr::parse("0.0.0.0/0").is_some());
        assert!(Cidr::parse("1.2.3.4/+8").is_none());
        // Parsed from text with a reason, shown back canonical.
        assert_eq!(
            "10.1.2.0/24".parse::<Cidr>().map(|c| c.to_string()),
            Ok("10.1.2.0/24".to_owned())
        );
        let e = "10.1.2.5/24".parse::<Cidr>().unwrap_err();
        assert!(
            e.contains("past its /24 prefix") && e.contains("\"10.1.2.0/24\""),
            "{e}"
        );
        for bad in [
            "10.1.2.0",
            "10.1.2.0/33",
            "10.1.2/24",
            "10.1.2.0/+8",
            "x/8",
            "",
        ] {
            let e = bad.parse::<Cidr>().unwrap_err();
            assert!(e.contains("is not an IPv4 CIDR"), "{bad}: {e}");
        }
    }
}
