//! Which address a node publishes for the addresses it binds to 0.0.0.0:
//! what other machines (peers, and clients sent to it for `cp` or `logs`)
//! can reach, never loopback while the machine has another interface.

use crate::config::Config;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The address peers should use: explicit (`--advertise`), else the bound
/// one, else the interface that routes towards the join address, else the
/// one of the default route, else the first interface that is up (an
/// isolated cluster network has no default route), else loopback.
pub fn advertise_ip(cfg: &Config, join: Option<SocketAddr>) -> IpAddr {
    if let Some(ip) = cfg.advertise {
        return ip;
    }
    if !cfg.rpc_addr.ip().is_unspecified() {
        return cfg.rpc_addr.ip();
    }
    let towards = join.unwrap_or(SocketAddr::from(DEFAULT_ROUTE_PROBE));
    route_source(towards)
        .or_else(first_interface_address)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A documentation address (TEST-NET-2): only its route is looked up.
const DEFAULT_ROUTE_PROBE: ([u8; 4], u16) = ([198, 51, 100, 1], 9);

/// The local address the kernel would send from towards `target`;
/// connect() on UDP only selects a route, nothing is sent.
fn route_source(target: SocketAddr) -> Option<IpAddr> {
    let sock = std::net::UdpSocket::bind(("0.0.0.0", 0)).ok()?;
    sock.connect(target).ok()?;
    let ip = sock.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// The first IPv4 address of an interface that is up and not loopback.
fn first_interface_address() -> Option<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates the list it stores in `list`, which is
    // read only while it lives and freed once below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        let flags = ifa.ifa_flags;
        let usable = flags & libc::IFF_UP as u32 != 0 && flags & libc::IFF_LOOPBACK as u32 == 0;
        let inet = usable
            && !ifa.ifa_addr.is_null()
            // SAFETY: a non-null ifa_addr points to a sockaddr whose
            // family says how long it is.
            && i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET;
        if inet {
            // SAFETY: AF_INET, checked above: the address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))));
            break;
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_or_bound_address_wins() {
        let mut cfg = Config {
            rpc_addr: SocketAddr::from(([10, 1, 2, 3], 7071)),
            ..Config::default()
        };
        assert_eq!(advertise_ip(&cfg, None), IpAddr::from([10, 1, 2, 3]));
        cfg.advertise = Some(IpAddr::from([10, 9, 9, 9]));
        assert_eq!(advertise_ip(&cfg, None), IpAddr::from([10, 9, 9, 9]));
    }

    #[test]
    fn a_wildcard_bind_publishes_a_reachable_interface() {
        let cfg = Config::default();
        // Towards a loopback join address, the route is loopback itself.
        let local = advertise_ip(&cfg, Some(SocketAddr::from(([127, 0, 0, 1], 7071))));
        assert!(local.is_loopback());
        // Otherwise some address of this machine that is not a wildcard.
        assert!(!advertise_ip(&cfg, None).is_unspecified());
    }
}
