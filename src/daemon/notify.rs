//! systemd's readiness protocol (`Type=notify`): a daemon started by
//! systemd with `NOTIFY_SOCKET` set sends `READY=1` once it serves, and
//! `STOPPING=1` when it begins to stop, as datagrams to that socket. Without
//! the variable, nothing is sent. A few lines of `sd_notify(3)`, so no
//! library for it.

use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// Tell systemd `state` (e.g. `READY=1\nSTATUS=serving`), if systemd
/// asked to be told. A failure is logged, never fatal: the daemon serves
/// whether or not its supervisor heard.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = notify_to(Path::new(&socket), state) {
        tracing::warn!(socket = ?socket, error = %e, "telling systemd {state:?}");
    }
}

/// Send `state` to the notification socket at `socket`: a path, or an
/// abstract name written with a leading `@`.
pub fn notify_to(socket: &Path, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let name = socket.as_os_str().as_encoded_bytes();
    if let Some(abstract_name) = name.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), socket)?;
    }
    Ok(())
}
