//! systemd's readiness protocol (`Type=notify`): one datagram to
//! `$NOTIFY_SOCKET` per state change. A few lines of std, so no crate.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1\nSTATUS=…`) to the service manager;
/// false when there is none (not under systemd) or it cannot be reached.
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return false;
    };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    let sent = match bytes.strip_prefix(b"@") {
        // An abstract socket (systemd uses them in containers).
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|addr| sock.send_to_addr(state.as_bytes(), &addr))
        }
        None => sock.send_to(state.as_bytes(), &path),
    };
    sent.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reaches_the_socket_named_by_the_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).expect("bind");
        // The variable is read at the call; this test alone sets it.
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(notify("READY=1\nSTATUS=up"));
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");
        assert!(!notify("READY=1"), "without NOTIFY_SOCKET nothing is sent");
    }
}
