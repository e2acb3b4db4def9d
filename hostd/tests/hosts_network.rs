//! Issue 28 on a real host whose kernel offers no Landlock (the test host's seccomp filter
//! denies its three syscalls, as Debian 12's 6.1 kernel has none to offer): each Agent in its
//! own network namespace, its public port held by the host. A sibling Agent in another
//! Namespace loops on `bind()` to the victim's port on every loopback address through two
//! cutovers, and answers whatever reaches it; the victim's clients must only ever reach the
//! victim, and its password must never reach the sibling.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::OperationResult;
use clawfleet_vm_tests::{HostOptions, TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::json;

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

fn port(r: &OperationResult) -> u16 {
    match r {
        OperationResult::PrepareRevision(p) => p.observation.port.unwrap(),
        other => panic!("{other:?}"),
    }
}

/// The sibling's attack: for `secs` seconds, bind and listen on `port` at 127.0.0.1, ::1,
/// 127.0.0.2 and 0.0.0.0 (again and again until it holds each), and answer every connection
/// that reaches one of them as `{"label":"evil"}`, logging what the client sent.
const SQUAT: &str = r#"use strict; use warnings; use Socket qw(:all); use IO::Handle;
my ($port, $secs, $log) = @ARGV;
open(my $l, '>>', $log) or die "cannot open $log: $!"; $l->autoflush(1);
print $l "start\n";
my @addrs = (['127.0.0.1', AF_INET], ['::1', AF_INET6], ['127.0.0.2', AF_INET], ['0.0.0.0', AF_INET]);
my %held; my $tries = 0; my $end = time + $secs;
while (time < $end) {
  for my $a (@addrs) {
    my ($ip, $fam) = @$a; next if $held{$ip};
    socket(my $s, $fam, SOCK_STREAM, 0) or next;
    setsockopt($s, SOL_SOCKET, SO_REUSEADDR, 1);
    my $sa = $fam == AF_INET ? pack_sockaddr_in($port, inet_aton($ip))
                             : pack_sockaddr_in6($port, inet_pton(AF_INET6, $ip));
    $tries++;
    if (bind($s, $sa) && listen($s, 16)) { print $l "BOUND $ip\n"; $held{$ip} = $s; }
  }
  if (%held) {
    my $rin = ''; vec($rin, fileno($_), 1) = 1 for values %held;
    my $rout = $rin; select($rout, undef, undef, 0.01);
    for my $ip (keys %held) {
      my $s = $held{$ip}; next unless vec($rout, fileno($s), 1);
      accept(my $c, $s) or next;
      my $buf = ''; sysread($c, $buf, 4096); $buf =~ s/\r?\n/ | /g;
      print $l "REQ $ip $buf\n";
      syswrite($c, "HTTP/1.1 200 OK\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{\"label\":\"evil\"}\n");
      close $c;
    }
  } else { select(undef, undef, undef, 0.005); }
}
print $l "end tries=$tries\n";
"#;

/// The victim's clients: for `secs` seconds, `GET /info` with the victim's password on
/// 127.0.0.1, [::1] and localhost in turn; one line per request: address, HTTP status (000:
/// no answer), the label that answered.
const CLIENTS: &str = r#"port=$1; secs=$2; pw=$3; out=$4
: > "$out"; end=$(( $(date +%s) + secs ))
while [ "$(date +%s)" -lt "$end" ]; do
  for u in 127.0.0.1 '[::1]' localhost; do
    code=$(curl -s -g --max-time 10 -o /tmp/cf-client-body -w '%{http_code}' -H "Authorization: Bearer $pw" "http://$u:$port/info")
    label=$(grep -o '"label":"[^"]*"' /tmp/cf-client-body 2>/dev/null | head -1)
    echo "$u $code $label" >> "$out"
    rm -f /tmp/cf-client-body
  done
done
echo done >> "$out"
"#;

fn activate(occ: &Coordinator, host: &TestHost, n: &str, a: &str, rev: &RevisionSpec) {
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        occ.ok(
            host,
            Operation::ActivateRevision(ActivateArgs::from(rargs(n, a, rev))),
        )
    }));
    if let Err(e) = done {
        let journal = host
            .run("journalctl -b --no-pager -o short-monotonic | tail -60")
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        println!("the host's journal:\n{journal}");
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_sibling_cannot_take_or_answer_an_agents_port_on_a_host_without_landlock() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd_options(
        &occ,
        "",
        &HostOptions {
            no_landlock: true,
            ..Default::default()
        },
    );
    // The host really offers no Landlock (as Debian 12's kernel).
    let landlock = host
        .run("perl -e 'exit(syscall(444, 0, 0, 1) < 0 ? 0 : 1)'")
        .unwrap();
    assert!(
        landlock.status.success(),
        "landlock_create_ruleset must fail on this host"
    );
    occ.ok(&host, ensure("ns1"));
    occ.ok(&host, ensure("ns2"));

    // The victim.
    let v1 = spec("rev-1", 1, json!({"label": "victim-1"}));
    let pv = port(&occ.ok(&host, prepare("ns1", "a1", &v1)));
    activate(&occ, &host, "ns1", "a1", &v1);
    let va = layout().agent(&id("ns1"), &id("a1"));
    let password = host
        .run_ok(&format!("cat {}", va.password_file.display()))
        .unwrap()
        .trim()
        .strip_prefix("OPENCLAW_GATEWAY_PASSWORD=")
        .unwrap()
        .to_owned();
    assert!(password.len() >= 32, "{password}");
    let journal = host
        .run_ok(&format!("journalctl -u {} --no-pager -o cat", va.unit_name))
        .unwrap();
    assert!(
        journal.contains("binds are not confined"),
        "the launcher found no Landlock: {journal}"
    );

    // The sibling, in another Namespace, starts its attack from inside its unit.
    host.write_file("/usr/local/lib/cf-squat.pl", SQUAT.as_bytes(), 0o755)
        .unwrap();
    let sa = layout().agent(&id("ns2"), &id("b1"));
    let squat_log = sa.state.join("squat.log");
    let b1 = spec(
        "rev-1",
        1,
        json!({"label": "sibling", "probe": {"commands": {
            "squat": format!("nohup perl /usr/local/lib/cf-squat.pl {pv} 45 \"$OPENCLAW_STATE_DIR/squat.log\" </dev/null >/dev/null 2>&1 & echo started"),
        }}}),
    );
    let pb = port(&occ.ok(&host, prepare("ns2", "b1", &b1)));
    activate(&occ, &host, "ns2", "b1", &b1);
    // The probe commands run when /info is first asked.
    assert_eq!(curl(&host, pb, "/info").0, 200);
    host.run_ok(&format!(
        "for i in $(seq 100); do grep -q start {} 2>/dev/null && exit 0; sleep 0.1; done; exit 1",
        squat_log.display()
    ))
    .unwrap();

    // The victim's clients, through two restart-class cutovers.
    host.write_file("/root/cf-clients.sh", CLIENTS.as_bytes(), 0o700)
        .unwrap();
    host.run_ok(&format!(
        "systemd-run --unit cf-clients sh /root/cf-clients.sh {pv} 25 {password} /root/cf-clients.log"
    ))
    .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(4));
    let v2 = spec("rev-2", 2, json!({"label": "victim-2"}));
    occ.ok(&host, prepare("ns1", "a1", &v2));
    activate(&occ, &host, "ns1", "a1", &v2);
    std::thread::sleep(std::time::Duration::from_secs(4));
    let v3 = spec("rev-3", 3, json!({"label": "victim-3"}));
    occ.ok(&host, prepare("ns1", "a1", &v3));
    activate(&occ, &host, "ns1", "a1", &v3);
    host.run_ok(
        "for i in $(seq 400); do tail -1 /root/cf-clients.log | grep -qx done && exit 0; sleep 0.1; done; exit 1",
    )
    .unwrap();
    let clients = host.run_ok("cat /root/cf-clients.log").unwrap();
    let squat = host
        .run_ok(&format!("cat {}", squat_log.display()))
        .unwrap();
    println!("sibling's log:\n{squat}");

    let lines: Vec<&str> = clients.lines().filter(|l| *l != "done").collect();
    let answered = |l: &&&str| l.contains("\"label\":\"victim-");
    let ok = lines.iter().filter(answered).count();
    let foreign: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("\"label\":") && !answered(l))
        .collect();
    let failed: Vec<&&str> = lines.iter().filter(|l| !l.contains("\"label\":")).collect();
    println!(
        "victim's clients: {} requests, {ok} answered by the victim, {} by someone else, {} failed",
        lines.len(),
        foreign.len(),
        failed.len()
    );
    assert!(
        foreign.is_empty(),
        "someone else answered on the victim's port: {foreign:?}"
    );
    assert!(
        !squat.contains(&password),
        "the victim's password reached the sibling:\n{squat}"
    );
    assert!(
        !squat.lines().any(|l| l.starts_with("REQ ")),
        "a connection reached the sibling:\n{squat}"
    );
    assert!(ok >= 30, "the victim served too little: {clients}");
    assert!(
        failed.is_empty(),
        "requests to the victim's port failed across the cutovers: {failed:?}"
    );
    for addr in ["127.0.0.1", "[::1]", "localhost"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(addr) && l.contains("victim-3")),
            "{addr} reaches the new revision: {clients}"
        );
    }
}

fn network_isolation(occ: &Coordinator, host: &TestHost) -> String {
    match occ.ok(host, Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => p
            .network_isolation
            .expect("hostd reports its network isolation"),
        other => panic!("{other:?}"),
    }
}

/// A host that refuses hostd network namespaces (no CAP_NET_ADMIN) and Landlock: the probe
/// and `hostd status` say exactly what is missing, and a single Namespace still deploys
/// there, in the host's network as before (the coordinator places no second one there).
#[test]
fn a_host_without_namespaces_says_what_is_missing_and_still_serves_one_namespace() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd_options(
        &occ,
        "",
        &HostOptions {
            no_landlock: true,
            no_net_admin: true,
            ..Default::default()
        },
    );
    let isolation = network_isolation(&occ, &host);
    println!("networkIsolation: {isolation}");
    assert!(isolation.starts_with("unavailable: "), "{isolation}");
    assert!(isolation.contains("CAP_NET_ADMIN"), "{isolation}");
    assert!(isolation.contains("binds not confined"), "{isolation}");
    let status = host.run_ok("hostd status").unwrap();
    assert!(
        status.contains(&format!("network isolation: {isolation}")),
        "{status}"
    );

    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "alone"}));
    let p = port(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    activate(&occ, &host, "ns1", "a1", &r1);
    let (code, body) = curl(&host, p, "/info");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"label\":\"alone\""), "{body}");
    let a = layout().agent(&id("ns1"), &id("a1"));
    let unit = host
        .run_ok(&format!("cat {}", a.unit_file.display()))
        .unwrap();
    assert!(!unit.contains("JoinsNamespaceOf="), "{unit}");
    let units = host
        .run_ok("ls /etc/systemd/system | grep -c '^clawfleet-' || true")
        .unwrap();
    assert_eq!(units.trim(), "1", "only the gateway's unit: {units}");
}

/// An Agent deployed before issue 28 (in the host's network: its gateway binds the port
/// itself) on a host that then gains network namespaces (nftables installed): it keeps
/// serving as it is until its next revision, whose activation moves it into a namespace of
/// its own behind a port the host holds, on the same port; clients polling throughout see
/// only the old or the new revision answer (the cutover's own restart aside).
#[test]
fn a_running_agent_from_before_namespaces_moves_into_one_at_its_next_revision() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    // No nftables: hostd makes no namespaces (as before issue 28).
    host.run_ok("mv /usr/sbin/nft /usr/sbin/nft.hidden")
        .unwrap();
    let isolation = network_isolation(&occ, &host);
    assert!(isolation.starts_with("unavailable: "), "{isolation}");
    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "before"}));
    let p = port(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    activate(&occ, &host, "ns1", "a1", &r1);
    let a = layout().agent(&id("ns1"), &id("a1"));
    let unit = host
        .run_ok(&format!("cat {}", a.unit_file.display()))
        .unwrap();
    assert!(!unit.contains("JoinsNamespaceOf="), "{unit}");
    let pid_before = host
        .run_ok(&format!(
            "systemctl show -p MainPID --value {}",
            a.unit_name
        ))
        .unwrap();

    // The host gains namespaces; the running Agent is left as it is.
    host.run_ok("mv /usr/sbin/nft.hidden /usr/sbin/nft")
        .unwrap();
    assert_eq!(network_isolation(&occ, &host), hostd::engine::NAMESPACES);
    let (code, body) = curl(&host, p, "/info");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"label\":\"before\""), "{body}");
    // A verify of the running revision changes nothing.
    occ.ok(&host, Operation::VerifyRevision(rargs("ns1", "a1", &r1)));
    assert_eq!(
        host.run_ok(&format!(
            "systemctl show -p MainPID --value {}",
            a.unit_name
        ))
        .unwrap(),
        pid_before
    );

    // Clients poll the port through the next cutover.
    host.run_ok(&format!(
        "cat > /root/cf-poll.sh <<'SH'\nend=$(( $(date +%s) + 25 ))\nwhile [ \"$(date +%s)\" -lt \"$end\" ]; do\n  code=$(curl -s --max-time 5 -o /tmp/cf-poll-body -w '%{{http_code}}' http://127.0.0.1:{p}/info); label=$(grep -o '\"label\":\"[^\"]*\"' /tmp/cf-poll-body 2>/dev/null | head -1); rm -f /tmp/cf-poll-body; echo \"$code $label\"\n  sleep 0.05\ndone > /root/cf-poll.out\necho done >> /root/cf-poll.out\nSH\nsystemd-run --unit cf-poll bash /root/cf-poll.sh"
    ))
    .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let r2 = spec("rev-2", 2, json!({"label": "after"}));
    let p2 = port(&occ.ok(&host, prepare("ns1", "a1", &r2)));
    assert_eq!(p2, p, "the Agent keeps its port");
    activate(&occ, &host, "ns1", "a1", &r2);
    let unit = host
        .run_ok(&format!("cat {}", a.unit_file.display()))
        .unwrap();
    assert!(unit.contains("JoinsNamespaceOf="), "{unit}");
    let (code, body) = curl(&host, p, "/info");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"label\":\"after\""), "{body}");
    // The port is the host's now: PID 1 listens on it, not the gateway.
    let listeners = host.run_ok(&format!("ss -Hltnp 'sport = :{p}'")).unwrap();
    println!("listeners on {p}: {listeners}");
    assert!(listeners.contains("systemd"), "{listeners}");
    assert!(!listeners.contains("clawfleet-test"), "{listeners}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let polled = loop {
        let out = host
            .run_ok("cat /root/cf-poll.out 2>/dev/null || true")
            .unwrap();
        if out.contains("done") {
            break out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the poller never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let lines: Vec<&str> = polled.lines().filter(|l| *l != "done").collect();
    let ok_before = lines.iter().filter(|l| l.contains("\"before\"")).count();
    let ok_after = lines.iter().filter(|l| l.contains("\"after\"")).count();
    let failed = lines.len() - ok_before - ok_after;
    let mut by_code = std::collections::BTreeMap::<String, usize>::new();
    for l in &lines {
        *by_code
            .entry(l.split_whitespace().next().unwrap_or("").to_owned())
            .or_default() += 1;
    }
    println!(
        "migration: {} requests, {ok_before} answered by rev-1, {ok_after} by rev-2, {failed} not answered; by status: {by_code:?}",
        lines.len()
    );
    assert!(ok_before > 0 && ok_after > 0, "{polled}");
    // Nothing but the Agent ever answered, and every answer was a 200.
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("label") || l.starts_with("200 ")),
        "{polled}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l.contains("\"before\"") || l.contains("\"after\"") || !l.contains("label")),
        "{polled}"
    );
}

/// A host that allows them reports `namespaces`, and its mount table does not grow with its
/// Agents: systemd holds each Agent's namespace, where a namespace bound under `/run/netns` was
/// one or two entries, and systemd reads the whole table at every gateway start
/// (hostd/src/netns.rs).
#[test]
fn a_host_with_namespaces_reports_them() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    assert_eq!(network_isolation(&occ, &host), hostd::engine::NAMESPACES);
    let status = host.run_ok("hostd status").unwrap();
    assert!(status.contains("network isolation: namespaces"), "{status}");

    let before = host.run_ok("wc -l < /proc/self/mountinfo").unwrap();
    occ.ok(&host, ensure("ns1"));
    for agent in ["a1", "a2", "a3"] {
        let rev = spec("rev-1", 1, json!({ "label": agent }));
        occ.ok(&host, prepare("ns1", agent, &rev));
        activate(&occ, &host, "ns1", agent, &rev);
    }
    let table = host.run_ok("cat /proc/self/mountinfo").unwrap();
    let under = |dir: &str| {
        table
            .lines()
            .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(dir)))
            .count()
    };
    assert_eq!(under("/run/netns"), 0, "no namespace bound:\n{table}");
    assert_eq!(
        table.lines().count().to_string(),
        before.trim(),
        "three Agents added no mount:\n{table}"
    );
    // Each serves in a namespace of its own, not the host's.
    let host_ns = host.run_ok("readlink /proc/1/ns/net").unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for agent in ["a1", "a2", "a3"] {
        let unit = layout().agent(&id("ns1"), &id(agent)).unit_name;
        let ns = host
            .run_ok(&format!(
                "readlink /proc/$(systemctl show -P MainPID {unit})/ns/net"
            ))
            .unwrap();
        assert_ne!(ns, host_ns, "{agent} runs in the host's namespace");
        seen.insert(ns);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// Shell that makes the test's own network namespace `ns` on the test host, reached from the
/// host over the veth `<ns>h` at `<net>.1`, the namespace's end at `<net>.2` (a /30), its
/// default route back through the host; then `serve` runs.
fn standin(ns: &str, net: &str, serve: &str) -> String {
    format!(
        "set -e\nip netns add {ns}\nip link add {ns}h type veth peer name eth0 netns {ns}\n\
         ip addr add {net}.1/30 dev {ns}h\nip link set {ns}h up\nip -n {ns} link set lo up\n\
         ip -n {ns} addr add {net}.2/30 dev eth0\nip -n {ns} link set eth0 up\n\
         ip -n {ns} route add default via {net}.1\n{serve}"
    )
}

/// What the test gateway's probe command `name` printed, from its `/info` answer.
fn probe_output(info: &serde_json::Value, name: &str) -> String {
    info["probe"]["commands"][name]["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The `/info` answer of the gateway on `port`.
fn info_of(host: &TestHost, port: u16) -> serde_json::Value {
    let (code, body) = curl(host, port, "/info");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// A stand-in for a public service, in a network namespace of the test's own on the test
/// host (TEST-NET-2, 198.51.100.2, routed from the host): it answers `public-ok` on 443 and
/// on 8080.
const PUBLIC_STANDIN: &str = r#"cat > /root/cf-public.pl <<'PL'
use Socket; socket(S, PF_INET, SOCK_STREAM, 0) or die; setsockopt(S, SOL_SOCKET, SO_REUSEADDR, 1);
bind(S, sockaddr_in($ARGV[0], INADDR_ANY)) or die "bind: $!"; listen(S, 16) or die;
while (accept(C, S)) { syswrite(C, "public-ok\n"); close C; }
PL
for p in 443 8080; do systemd-run --unit cf-public-$p ip netns exec cfpub perl /root/cf-public.pl $p; done
sleep 0.5
"#;

/// Issue 28's egress policy: from inside its unit an Agent reaches a public address on 443
/// only; not the same address on another port, not the cloud metadata address, not an RFC
/// 1918 address, not the host, and not its sibling (either end of the sibling's veth pair).
#[test]
fn an_agent_reaches_public_https_only() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    assert_eq!(network_isolation(&occ, &host), hostd::engine::NAMESPACES);
    host.run_ok(&standin("cfpub", "198.51.100", PUBLIC_STANDIN))
        .unwrap();
    occ.ok(&host, ensure("ns1"));
    occ.ok(&host, ensure("ns2"));
    let b1 = spec("rev-1", 1, json!({"label": "sibling"}));
    let pb = port(&occ.ok(&host, prepare("ns2", "b1", &b1)));
    activate(&occ, &host, "ns2", "b1", &b1);
    let sibling = hostd::netns::Egress {
        port: pb,
        ports: vec![443],
        allow: vec![],
        resolvers: vec![],
    };
    let (sibling_host_side, sibling_agent_side) = sibling.addresses();
    let host_address = host.address();
    let try_connect = |addr: String, port: u16| {
        format!(
            "timeout 3 bash -c 'exec 3<>/dev/tcp/{addr}/{port} && head -c 9 <&3' 2>&1; echo \" rc=$?\""
        )
    };
    let probes = json!({
        "public_443": try_connect("198.51.100.2".into(), 443),
        "public_8080": try_connect("198.51.100.2".into(), 8080),
        "metadata": try_connect("169.254.169.254".into(), 80),
        "rfc1918": try_connect("10.0.0.1".into(), 443),
        "host": try_connect(host_address.to_string(), 22),
        "sibling_agent": try_connect(sibling_agent_side.to_string(), pb),
        "sibling_host_side": try_connect(sibling_host_side.to_string(), pb),
        "sibling_loopback": try_connect("127.0.0.1".into(), pb),
    });
    let a1 = spec(
        "rev-1",
        1,
        json!({"label": "a", "probe": {"commands": probes}}),
    );
    let pa = port(&occ.ok(&host, prepare("ns1", "a1", &a1)));
    activate(&occ, &host, "ns1", "a1", &a1);
    let info = info_of(&host, pa);
    let out = |name: &str| probe_output(&info, name);
    for name in [
        "public_443",
        "public_8080",
        "metadata",
        "rfc1918",
        "host",
        "sibling_agent",
        "sibling_host_side",
        "sibling_loopback",
    ] {
        println!("{name}: {}", out(name).trim());
    }
    assert!(
        out("public_443").starts_with("public-ok"),
        "{}",
        out("public_443")
    );
    for name in [
        "public_8080",
        "metadata",
        "rfc1918",
        "host",
        "sibling_agent",
        "sibling_host_side",
        "sibling_loopback",
    ] {
        let o = out(name);
        assert!(
            !o.contains("public-ok") && !o.contains(" rc=0"),
            "{name} was reached: {o}"
        );
    }
    // The sibling still serves its own clients.
    assert_eq!(curl(&host, pb, "/readyz").0, 200);
    host.run_ok("systemctl stop cf-public-443 cf-public-8080; ip netns delete cfpub")
        .unwrap();
}

/// Issue 28's per-Agent egress: on a pool that allows 443 and 8080, an Agent narrowed to 8080
/// reaches the public stand-in there only; asking for a port the pool does not allow is
/// refused with EGRESS_NOT_ALLOWED; its next revision without settings gets the pool's again,
/// applied to the running namespace by reloading its network unit.
#[test]
fn an_agents_own_egress_narrows_the_pools() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "[network]\negress_ports = [443, 8080]\n");
    assert_eq!(network_isolation(&occ, &host), hostd::engine::NAMESPACES);
    host.run_ok(&standin("cfpub", "198.51.100", PUBLIC_STANDIN))
        .unwrap();
    occ.ok(&host, ensure("ns1"));
    let try_connect = |port: u16| {
        format!(
            "timeout 3 bash -c 'exec 3<>/dev/tcp/198.51.100.2/{port} && head -c 9 <&3' 2>&1; echo \" rc=$?\""
        )
    };
    let probes = json!({ "p443": try_connect(443), "p8080": try_connect(8080) });
    let with =
        |rev: &RevisionSpec, egress: Option<clawfleet_protocol::egress::Egress>| match prepare(
            "ns1", "a1", rev,
        ) {
            Operation::PrepareRevision(args) => {
                Operation::PrepareRevision(PrepareArgs { egress, ..args })
            }
            other => other,
        };
    let r1 = spec(
        "rev-1",
        1,
        json!({"label": "a", "probe": {"commands": probes}}),
    );
    let f = occ.fails(
        &host,
        with(
            &r1,
            Some(clawfleet_protocol::egress::Egress {
                ports: Some(vec![22]),
                allow: None,
            }),
        ),
    );
    assert_eq!(
        f.code,
        clawfleet_protocol::failure::FailureCode::EgressNotAllowed,
        "{f}"
    );
    assert!(f.message.contains("egress.ports[0] is 22"), "{f}");

    let pa = port(&occ.ok(
        &host,
        with(
            &r1,
            Some(clawfleet_protocol::egress::Egress {
                ports: Some(vec![8080]),
                allow: None,
            }),
        ),
    ));
    activate(&occ, &host, "ns1", "a1", &r1);
    let info = info_of(&host, pa);
    let (p443, p8080) = (probe_output(&info, "p443"), probe_output(&info, "p8080"));
    println!("narrowed: 443: {} / 8080: {}", p443.trim(), p8080.trim());
    assert!(p8080.starts_with("public-ok"), "{p8080}");
    assert!(
        !p443.contains("public-ok") && !p443.contains(" rc=0"),
        "{p443}"
    );

    let r2 = spec(
        "rev-2",
        2,
        json!({"label": "b", "probe": {"commands": probes}}),
    );
    occ.ok(&host, with(&r2, None));
    activate(&occ, &host, "ns1", "a1", &r2);
    let info = info_of(&host, pa);
    let (p443, p8080) = (probe_output(&info, "p443"), probe_output(&info, "p8080"));
    println!("the pool's: 443: {} / 8080: {}", p443.trim(), p8080.trim());
    assert!(
        p443.starts_with("public-ok") && p8080.starts_with("public-ok"),
        "{p443} / {p8080}"
    );
    host.run_ok("systemctl stop cf-public-443 cf-public-8080; ip netns delete cfpub")
        .unwrap();
}

/// A stand-in for a cloud network's resolver on a private address (10.77.0.2, in a network
/// namespace of the test's own on the test host): it answers every A query with 198.51.100.2
/// and every other query with no answer.
const RESOLVER_STANDIN: &str = r#"cat > /root/cf-dns.pl <<'PL'
use Socket; socket(S, PF_INET, SOCK_DGRAM, 0) or die "socket: $!";
bind(S, sockaddr_in(53, INADDR_ANY)) or die "bind: $!";
while (1) {
  my $from = recv(S, my $q, 512, 0); next unless defined $from && length($q) > 12;
  my $i = 12; while ($i < length($q) && (my $l = ord(substr($q, $i, 1))) != 0) { $i += $l + 1 }
  my ($qtype) = unpack("n", substr($q, $i + 1, 2)); my $n = $qtype == 1 ? 1 : 0;
  my $r = substr($q, 0, 2) . pack("nnnnn", 0x8180, 1, $n, 0, 0) . substr($q, 12, $i + 5 - 12);
  $r .= pack("nnnNn", 0xc00c, 1, 1, 60, 4) . inet_aton("198.51.100.2") if $n;
  send(S, $r, 0, $from);
}
PL
systemd-run --unit cf-dns ip netns exec cfdns perl /root/cf-dns.pl
sleep 0.5
"#;

/// DNS from an Agent's namespace (issue 28): the host's `/etc/resolv.conf` names
/// systemd-resolved's stub on its loopback (`127.0.0.53`, out of the Agent's reach) and the
/// stub's upstream is a resolver on a private address (which the egress policy denies to
/// everything else). The Agent's own `resolv.conf` names that upstream, keeps the host's
/// `search` line, and its lookups are answered; it still cannot reach the resolver on another
/// port. Before, the Agent saw the host's file and resolved nothing.
#[test]
fn an_agent_resolves_names_through_the_hosts_upstream_resolver() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    assert_eq!(network_isolation(&occ, &host), hostd::engine::NAMESPACES);
    host.run_ok(&standin("cfdns", "10.77.0", RESOLVER_STANDIN))
        .unwrap();
    // The host's own files, as systemd-resolved leaves them (a bind mount of nspawn's first
    // goes, so the test host's file is its own).
    host.run_ok(
        "umount /etc/resolv.conf 2>/dev/null || true; rm -f /etc/resolv.conf; \
         printf 'nameserver 127.0.0.53\\noptions edns0 trust-ad\\nsearch example.test\\n' > /etc/resolv.conf; \
         mkdir -p /run/systemd/resolve; printf 'nameserver 10.77.0.2\\n' > /run/systemd/resolve/resolv.conf",
    )
    .unwrap();
    occ.ok(&host, ensure("ns1"));
    let probes = json!({
        "resolv": "cat /etc/resolv.conf",
        "lookup": "getent ahostsv4 api.example.test | head -1; echo \" rc=$?\"",
        "short": "getent ahostsv4 api | head -1",
        "resolver_other_port": "timeout 3 bash -c 'exec 3<>/dev/tcp/10.77.0.2/22' 2>&1; echo \" rc=$?\"",
    });
    let a1 = spec(
        "rev-1",
        1,
        json!({"label": "a", "probe": {"commands": probes}}),
    );
    let pa = port(&occ.ok(&host, prepare("ns1", "a1", &a1)));
    activate(&occ, &host, "ns1", "a1", &a1);
    let info = info_of(&host, pa);
    let out = |name: &str| probe_output(&info, name);
    for name in ["resolv", "lookup", "short", "resolver_other_port"] {
        println!("{name}: {}", out(name).trim());
    }
    let resolv = out("resolv");
    assert!(resolv.contains("nameserver 10.77.0.2\n"), "{resolv}");
    assert!(!resolv.contains("127.0.0.53"), "{resolv}");
    assert!(resolv.contains("search example.test\n"), "{resolv}");
    assert!(
        out("lookup").starts_with("198.51.100.2"),
        "the Agent resolved nothing: {}",
        out("lookup")
    );
    assert!(
        out("short").starts_with("198.51.100.2"),
        "the search line is not used: {}",
        out("short")
    );
    assert!(
        !out("resolver_other_port").contains(" rc=0"),
        "the resolver was reached on another port: {}",
        out("resolver_other_port")
    );
    // The host's own file is untouched.
    let host_file = host.run_ok("cat /etc/resolv.conf").unwrap();
    assert!(host_file.contains("nameserver 127.0.0.53"), "{host_file}");
    host.run_ok("systemctl stop cf-dns; ip netns delete cfdns")
        .unwrap();
}

fn revision_of(rev: &str, number: u64, document: serde_json::Value) -> RevisionSpec {
    let configuration = clawfleet_protocol::configuration::Configuration::new(document).unwrap();
    RevisionSpec {
        id: id(rev),
        number: RevisionNumber::new(number).unwrap(),
        harness: Harness {
            id: HarnessId::Openclaw,
            version: HarnessVersion::new("2026.9.6").unwrap(),
            mode: HarnessMode::Embedded,
        },
        configuration_hash: configuration.hash(),
        configuration,
    }
}

fn plan(
    occ: &Coordinator,
    host: &TestHost,
    rev: &RevisionSpec,
) -> clawfleet_protocol::plan::PlanResult {
    match occ.ok(
        host,
        Operation::PlanRevision(clawfleet_protocol::plan::PlanArgs {
            namespace: ns("ns1"),
            agent: agent("a1"),
            revision: rev.clone(),
            restore: None,
            egress: None,
        }),
    ) {
        OperationResult::PlanRevision(p) => *p,
        other => panic!("{other:?}"),
    }
}

/// Issue 28: a revision that changes only configuration the gateway applies live (here
/// `logging.level`) is applied by the running gateway: no restart, no WebSocket through the
/// Agent's port disconnected, and the plan says so beforehand. A restart-class revision then
/// closes those WebSockets with 1012, and they are back at once through the held port.
#[test]
fn a_config_only_revision_applies_live_and_a_restart_closes_websockets_with_1012() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    let gateway = json!({"mode": "local", "bind": "loopback",
        "auth": {"mode": "password", "password": {"source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD"}}});
    let document = |level: &str, label: &str| json!({"gateway": gateway, "logging": {"level": level}, "x-clawfleet-test": {"label": label}});
    occ.ok(&host, ensure("ns1"));
    let r1 = revision_of("rev-1", 1, document("info", "one"));
    let port = port(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    activate(&occ, &host, "ns1", "a1", &r1);
    let info = |host: &TestHost| -> serde_json::Value {
        serde_json::from_str(curl(host, port, "/info").1.trim()).unwrap()
    };
    let pid1 = info(&host)["pid"].clone();
    let paths = layout().agent(&id("ns1"), &id("a1"));
    host.run_ok(&format!(
        "systemd-run --unit cf-hold /usr/local/bin/clawfleet-test-gateway hold {port} {} 2 /tmp/cf-hold-stop 300 /tmp/cf-hold-details.json; sleep 1",
        paths.password_file.display()
    ))
    .unwrap();

    // Live: planned as such, applied without a restart.
    let r2 = revision_of("rev-2", 2, document("debug", "one"));
    let p = plan(&occ, &host, &r2);
    assert!(p.refusal.is_none(), "{p:?}");
    assert_eq!(
        (p.restart, p.config_live.clone()),
        (false, Some(vec!["logging.level".to_owned()])),
        "{p:?}"
    );
    occ.ok(&host, prepare("ns1", "a1", &r2));
    let act = match occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
    ) {
        OperationResult::ActivateRevision(a) => a,
        other => panic!("{other:?}"),
    };
    assert!(!act.restarted, "{act:?}");
    assert_eq!(
        act.config_reload.as_ref().map(|c| c.changed.clone()),
        Some(vec!["logging.level".to_owned()])
    );
    assert_eq!(act.observation.served, Some(id("rev-2")));
    let now = info(&host);
    assert_eq!(now["pid"], pid1, "the gateway was restarted");
    assert_eq!(now["liveReloads"], 1, "{now}");
    assert_eq!(
        now["configSha256"].as_str(),
        Some(r2.configuration_hash.as_str()),
        "{now}"
    );
    let copy = host
        .run_ok(&format!("cat {}", paths.live_config.display()))
        .unwrap();
    assert_eq!(
        copy.as_bytes(),
        r2.configuration.canonical_bytes(),
        "the gateway's file"
    );

    // Restart-class: the switches changed.
    let r3 = revision_of("rev-3", 3, document("debug", "three"));
    let p = plan(&occ, &host, &r3);
    assert_eq!((p.restart, p.config_live), (true, None));
    occ.ok(&host, prepare("ns1", "a1", &r3));
    let act = match occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r3))),
    ) {
        OperationResult::ActivateRevision(a) => a,
        other => panic!("{other:?}"),
    };
    assert!(act.restarted && act.config_reload.is_none(), "{act:?}");
    assert_ne!(info(&host)["pid"], pid1);
    std::thread::sleep(std::time::Duration::from_secs(1));
    host.run_ok("touch /tmp/cf-hold-stop; sleep 1").unwrap();
    let summary = host
        .run_ok("journalctl -u cf-hold -o cat --no-pager | grep '^{' | tail -1")
        .unwrap();
    let summary: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
    // Two clients, one restart: two disconnects, both 1012, both back. The live change
    // disconnected nobody.
    assert_eq!(summary["disconnected"], 2, "{summary}");
    assert_eq!(summary["closeCodes"], json!({"1012": 2}), "{summary}");
    assert_eq!(summary["reconnected"], 2, "{summary}");
}
