//! Many network namespaces on one bridge, for tests and benchmarks of
//! protocols between peers (gossip, federation): every member reaches every
//! other one over a real kernel network, and a member's link can be cut
//! without telling anyone, as when a site's uplink drops.
//!
//! The layout: a bridge in the root namespace, one veth pair per member with
//! its root end enslaved to the bridge and its other end, `eth0`, in the
//! member's namespace. The root namespace holds an address on the bridge too,
//! so test code and CLIs run outside the namespaces reach every member.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::{run_ip, NetNs};

/// One member: its namespace and the root end of its veth pair.
struct Member {
    ns: String,
    host_if: String,
    ip: Ipv4Addr,
}

/// A bridge with `len()` network namespaces on it, each with one IPv4
/// address in a subnet of its own to this fabric. Dropping it deletes the
/// namespaces, their veth pairs and the bridge (best effort: a process still
/// running in a namespace keeps that namespace alive, nameless, until it ends).
pub struct Fabric {
    bridge: String,
    members: Vec<Member>,
    host_ip: Ipv4Addr,
}

/// The largest fabric: a /16 less the network, broadcast and root addresses.
const MAX_MEMBERS: usize = 65_000;

impl Fabric {
    /// Creates a bridge in the root namespace and `members` namespaces, each
    /// joined to it by a veth pair, with loopback up and one address per
    /// namespace: in a /24 for up to 250 members, in a /16 beyond. The subnet
    /// is one no interface of the root namespace overlaps when the fabric is
    /// made, so parallel tests and benchmarks (and the machine's own networks)
    /// do not clash. The root namespace gets the subnet's first address
    /// ([`Fabric::host_ip`]); members get the following ones in order.
    ///
    /// Needs root and iproute2 ([`Fabric::available`]). Returns an error, with
    /// whatever was made so far removed again, when a step fails.
    pub fn create(members: usize) -> anyhow::Result<Fabric> {
        if members == 0 || members > MAX_MEMBERS {
            bail!("a fabric has 1 to {MAX_MEMBERS} members, not {members}");
        }
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        // Interface names are limited to 15 bytes: the process id and the
        // fabric's number, in hex, keep them short and unique on this host.
        let tag = format!("{:x}{:02x}", std::process::id() % 0x10_0000, n % 0x100);
        let prefix = if members > 250 { 16 } else { 24 };
        let network = free_subnet(prefix, std::process::id().wrapping_mul(31).wrapping_add(n))?;
        let mut fabric = Fabric {
            bridge: format!("sfb{tag}"),
            members: Vec::with_capacity(members),
            host_ip: nth_host(network, 0),
        };
        // A stale bridge of a crashed process with the same id goes first.
        let _ = run_ip(&["link", "del", &fabric.bridge]);
        allow_bridged_forwarding();
        make_room_for_neighbours(members);
        ip(&[
            "link",
            "add",
            &fabric.bridge,
            "type",
            "bridge",
            "forward_delay",
            "0",
        ])?;
        // No IPv6 link-local addresses on the fabric: neighbour discovery and
        // MLD chatter would otherwise show in the byte counters.
        ip(&["link", "set", &fabric.bridge, "addrgenmode", "none"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/{prefix}", fabric.host_ip),
            "dev",
            &fabric.bridge,
        ])?;
        ip(&["link", "set", &fabric.bridge, "up"])?;
        for i in 0..members {
            let member = Member {
                ns: format!("sf{tag}m{i}"),
                host_if: format!("sf{tag}.{i:x}"),
                ip: nth_host(network, i as u32 + 1),
            };
            let _ = run_ip(&["netns", "del", &member.ns]);
            ip(&["netns", "add", &member.ns])?;
            let (ns, host_if) = (member.ns.clone(), member.host_if.clone());
            let address = format!("{}/{prefix}", member.ip);
            // Pushed before the links exist, so Drop removes a half-made member.
            fabric.members.push(member);
            ip(&[
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            ip(&["link", "set", &host_if, "addrgenmode", "none"])?;
            ip(&["link", "set", &host_if, "master", &fabric.bridge])?;
            ip(&["link", "set", &host_if, "up"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "addrgenmode", "none"])?;
            ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        for i in 0..members {
            fabric.wait_forwarding(i)?;
        }
        Ok(fabric)
    }

    /// Waits until the bridge forwards member `i`'s frames: a veth's carrier
    /// comes up through the kernel's link watch, up to a second after `ip
    /// link set up` returns, and only then does the bridge port forward.
    fn wait_forwarding(&self, i: usize) -> anyhow::Result<()> {
        let path = format!("/sys/class/net/{}/brport/state", self.members[i].host_if);
        let start = Instant::now();
        // 3 is BR_STATE_FORWARDING.
        while std::fs::read_to_string(&path)
            .map(|s| s.trim() != "3")
            .unwrap_or(true)
        {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("member {i}'s bridge port does not forward after 10 s ({path})");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Whether this machine can make the fabric's namespaces (root and iproute2).
    pub fn available() -> bool {
        NetNs::available()
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the fabric has no members (never, once made: here for clippy's
    /// sake beside [`Fabric::len`]).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s namespace name, for `ip netns exec`.
    pub fn ns(&self, i: usize) -> &str {
        &self.members[i].ns
    }

    /// Member `i`'s address.
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        self.members[i].ip
    }

    /// The root namespace's address on the bridge, reachable from every member.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// `ip netns exec <member i's namespace> program`: add the program's
    /// arguments, stdio and environment as with any [`Command`].
    pub fn command(&self, i: usize, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", self.ns(i)]).arg(program);
        command
    }

    /// Cuts member `i`'s link: no packet passes either way, and nobody is
    /// told (no FIN, no RST, no ICMP), as when a site's uplink drops. The
    /// member's own interface loses its carrier, which its processes do not
    /// see: their sends succeed and go nowhere.
    ///
    /// # Panics
    /// When `ip` fails: a test that thinks a link is cut when it is not
    /// measures nothing.
    pub fn cut(&self, i: usize) {
        if let Err(e) = run_ip(&["link", "set", &self.members[i].host_if, "down"]) {
            panic!("cut member {i}: {e}");
        }
    }

    /// Restores member `i`'s link, and returns once the bridge forwards its
    /// frames again (up to a second later), so that a time measured from the
    /// return is the protocol's alone.
    ///
    /// # Panics
    /// When `ip` fails, as [`Fabric::cut`], or the port does not forward
    /// within 10 s.
    pub fn restore(&self, i: usize) {
        if let Err(e) = run_ip(&["link", "set", &self.members[i].host_if, "up"]) {
            panic!("restore member {i}: {e}");
        }
        if let Err(e) = self.wait_forwarding(i) {
            panic!("restore member {i}: {e}");
        }
    }

    /// Bytes member `i` has sent and received so far, as Ethernet frames
    /// (headers included), from the counters of the root end of its veth
    /// pair: what the root end received the member sent, and the other way
    /// round. Frames sent while the link is cut are not counted.
    ///
    /// # Panics
    /// When the counters cannot be read (the fabric is gone).
    pub fn bytes(&self, i: usize) -> (u64, u64) {
        let counter = |name: &str| -> u64 {
            let path = format!(
                "/sys/class/net/{}/statistics/{name}",
                self.members[i].host_if
            );
            match std::fs::read_to_string(&path) {
                Ok(text) => text
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{path}: {e}")),
                Err(e) => panic!("{path}: {e}"),
            }
        };
        (counter("rx_bytes"), counter("tx_bytes"))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it
        // the pair; the explicit `link del` covers a pair whose namespace
        // was kept alive by a process still running there.
        for member in &self.members {
            let _ = run_ip(&["netns", "del", &member.ns]);
            let _ = run_ip(&["link", "del", &member.host_if]);
        }
        let _ = run_ip(&["link", "del", &self.bridge]);
    }
}

/// `ip args`, with the error as an [`anyhow::Error`].
fn ip(args: &[&str]) -> anyhow::Result<()> {
    run_ip(args).map_err(anyhow::Error::msg)
}

/// The `n`th address after the network address (0 is the first host).
fn nth_host(network: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(network) + 1 + n)
}

/// A subnet of the given prefix length that no address of the root
/// namespace overlaps: /24s from 10.232.0.0/13, /16s from 10.240.0.0/12,
/// starting at a slot that `seed` picks so that processes start apart. Two
/// fabrics made at the same instant may still pick the same one; the
/// window is that of one `ip addr` call.
fn free_subnet(prefix: u8, seed: u32) -> anyhow::Result<Ipv4Addr> {
    let (base, slots): (u32, u32) = match prefix {
        24 => (u32::from(Ipv4Addr::new(10, 232, 0, 0)), 8 * 256),
        _ => (u32::from(Ipv4Addr::new(10, 240, 0, 0)), 16),
    };
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .context("run ip -o -4 addr show")?;
    let taken: Vec<(u32, u8)> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|word| {
            let (addr, len) = word.split_once('/')?;
            Some((u32::from(addr.parse::<Ipv4Addr>().ok()?), len.parse().ok()?))
        })
        .collect();
    let size = 1u32 << (32 - u32::from(prefix));
    for k in 0..slots {
        let candidate = base + ((seed.wrapping_add(k)) % slots) * size;
        // Two prefixes overlap when they agree on the shorter one's bits.
        let overlaps = taken.iter().any(|&(addr, len)| {
            let shorter = len.min(prefix);
            let mask = if shorter == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(shorter))
            };
            addr & mask == candidate & mask
        });
        if !overlaps {
            return Ok(Ipv4Addr::from(candidate));
        }
    }
    bail!("no free /{prefix} left for a fabric")
}

/// The kernel keeps one ARP table for all namespaces, and by default
/// refuses new entries beyond 1024 (`gc_thresh3`), logging "neighbor table
/// overflow" and dropping the packets that needed them. Members that all talk
/// to each other hold about `members²` entries together: a 50-member fabric
/// needs 2500, and without room its members lose packets to each other at
/// random. The limits are raised (never lowered) with room for the host and
/// other fabrics, and that is said on stderr, because they are host-wide and
/// outlive the fabric.
fn make_room_for_neighbours(members: usize) {
    let needed = (members + 1) * (members + 1) + 1024;
    for (name, want) in [("gc_thresh2", needed), ("gc_thresh3", 2 * needed)] {
        let path = format!("/proc/sys/net/ipv4/neigh/default/{name}");
        let now: usize = std::fs::read_to_string(&path)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(usize::MAX);
        if now < want && std::fs::write(&path, want.to_string()).is_ok() {
            eprintln!("fabric: raised net.ipv4.neigh.default.{name} from {now} to {want} for {members} members");
        }
    }
}

/// With `br_netfilter` loaded and `bridge-nf-call-iptables` on (Debian's
/// default once Docker or a firewall loads it), frames crossing the bridge
/// go through iptables' FORWARD chain, whose policy may drop them: members
/// would not reach each other. Without any iptables, arptables or nftables
/// table loaded nothing can filter them, and the host's setting is left
/// alone; otherwise it is turned off, and that is said on stderr, because it
/// is host-wide and outlives the fabric.
fn allow_bridged_forwarding() {
    let on = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/bridge/{name}"))
            .map(|v| v.trim() == "1")
            .unwrap_or(false)
    };
    let any_table = |path: &str| {
        std::fs::read_to_string(path)
            .map(|v| !v.trim().is_empty())
            .unwrap_or(false)
    };
    let filters = any_table("/proc/net/ip_tables_names")
        || any_table("/proc/net/arp_tables_names")
        || std::path::Path::new("/sys/module/nf_tables").exists();
    if !filters {
        return;
    }
    for name in ["bridge-nf-call-iptables", "bridge-nf-call-arptables"] {
        if on(name) && std::fs::write(format!("/proc/sys/net/bridge/{name}"), "0").is_ok() {
            eprintln!("fabric: set net.bridge.{name}=0 so that bridged frames skip the firewall");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fabric;

    fn ping(fabric: &Fabric, from: usize, to: usize) -> bool {
        fabric
            .command(from, "ping")
            .args(["-c1", "-W1", &fabric.ip(to).to_string()])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    #[test]
    fn members_reach_each_other_until_cut() {
        if !Fabric::available() {
            eprintln!("skipped: network namespaces need root and iproute2");
            return;
        }
        if std::process::Command::new("ping")
            .arg("-V")
            .output()
            .is_err()
        {
            eprintln!("skipped: ping is not installed (Debian: iputils-ping)");
            return;
        }
        let fabric = Fabric::create(3).unwrap();
        assert_eq!(fabric.len(), 3);
        assert!(ping(&fabric, 0, 2), "member 0 reaches member 2");
        let host = std::process::Command::new("ping")
            .args(["-c1", "-W1", &fabric.ip(1).to_string()])
            .output()
            .unwrap();
        assert!(host.status.success(), "the root namespace reaches member 1");
        let (sent, received) = fabric.bytes(2);
        assert!(sent > 0 && received > 0, "member 2 answered the ping");

        fabric.cut(2);
        assert!(!ping(&fabric, 0, 2), "member 2 is cut off");
        assert!(ping(&fabric, 0, 1), "the others still reach each other");
        fabric.restore(2);
        assert!(ping(&fabric, 0, 2), "member 2 is back");
    }
}
