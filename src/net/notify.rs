//! The service manager's readiness protocol (`sd_notify`): when systemd starts Sluice
//! with `Type=notify` it sets `NOTIFY_SOCKET`, and waits for `READY=1` on that datagram
//! socket before it takes the service as started.

use std::os::unix::net::UnixDatagram;

use tracing::{debug, warn};

/// Sends `state` (`READY=1`, `STOPPING=1`) to the socket named by `NOTIFY_SOCKET`, if
/// set: a path, or a name in Linux's abstract namespace when it starts with `@`.
pub fn service_manager(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    match send(&target, state) {
        Ok(()) => debug!("told the service manager {state}"),
        Err(e) => warn!("cannot tell the service manager {state} on NOTIFY_SOCKET {target}: {e}"),
    }
}

fn send(target: &str, state: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    match target.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            socket.send_to(state.as_bytes(), target)?;
        }
    }
    Ok(())
}
