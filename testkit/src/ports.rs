//! Loopback addresses for daemons: the kernel picks a free port, and the
//! socket that held it is closed before the daemon binds it.

use std::net::SocketAddr;

/// A free UDP port on loopback: a QUIC endpoint's.
pub fn free_udp() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap_or_else(|e| panic!("a free UDP port on loopback: {e}"))
}

/// A free TCP port on loopback: a status and metrics server's.
pub fn free_tcp() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap_or_else(|e| panic!("a free TCP port on loopback: {e}"))
}
