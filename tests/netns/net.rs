//! Hosts for tests: network namespaces on one bridge, each with its own
//! address, and a link the test can cut. Root and iproute2 only.

use std::process::Command;

use std::sync::atomic::{AtomicUsize, Ordering};

/// Nets made so far by this process: each gets its own names and subnet.
static NETS: AtomicUsize = AtomicUsize::new(0);

pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Namespaces `<prefix>-1..n` on a bridge in `<prefix>-hub`, plus a veth
/// from the test's own namespace so it can reach every node's API.
pub struct Net {
    prefix: String,
    subnet: String,
    n: usize,
}

impl Net {
    pub fn new(n: usize) -> Result<Net, String> {
        let k = NETS.fetch_add(1, Ordering::SeqCst) % 10;
        let prefix = format!("shoal{}x{k}", std::process::id() % 100_000);
        let subnet = format!("10.213.{}", 7 + k);
        let net = Net { prefix, subnet, n };
        let subnet = net.subnet.clone();
        let hub = net.hub();
        ip(&["netns", "add", &hub])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for i in 1..=n {
            let ns = net.ns(i);
            let (inside, outside) = (format!("{}v{i}", net.prefix), format!("{}h{i}", net.prefix));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &inside, "type", "veth", "peer", "name", &outside,
            ])?;
            ip(&["link", "set", &inside, "netns", &ns])?;
            ip(&["link", "set", &outside, "netns", &hub])?;
            ip(&["-n", &hub, "link", "set", &outside, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{subnet}.{i}/24"),
                "dev",
                &inside,
            ])?;
            ip(&["-n", &ns, "link", "set", &inside, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let (mine, theirs) = (format!("{}vt", net.prefix), format!("{}ht", net.prefix));
        ip(&[
            "link", "add", &mine, "type", "veth", "peer", "name", &theirs,
        ])?;
        ip(&["link", "set", &theirs, "netns", &hub])?;
        ip(&["-n", &hub, "link", "set", &theirs, "master", "br0", "up"])?;
        ip(&["addr", "add", &format!("{subnet}.254/24"), "dev", &mine])?;
        ip(&["link", "set", &mine, "up"])?;
        Ok(net)
    }

    /// The /24 every namespace's address is in, e.g. `10.213.7`.
    pub fn subnet(&self) -> &str {
        &self.subnet
    }

    /// The address of namespace `i` (`.254` is the test's own).
    pub fn addr(&self, i: usize) -> String {
        format!("{}.{i}", self.subnet)
    }

    pub fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    pub fn ns(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }

    /// Cuts (or restores) node `i`'s only link, both directions.
    pub fn set_link(&self, i: usize, up: bool) {
        let port = format!("{}h{i}", self.prefix);
        ip(&[
            "-n",
            &self.hub(),
            "link",
            "set",
            &port,
            if up { "up" } else { "down" },
        ])
        .expect("toggle link");
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &format!("{}vt", self.prefix)]);
        for i in 1..=self.n {
            let _ = ip(&["netns", "del", &self.ns(i)]);
        }
        let _ = ip(&["netns", "del", &self.hub()]);
    }
}

pub fn missing_prerequisite() -> Option<String> {
    // SAFETY: a plain getter without arguments.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` tool (iproute2) is not installed".into());
    }
    if Command::new("python3").arg("--version").output().is_err() {
        return Some("python3 is not installed (the example job is a Python script)".into());
    }
    None
}
