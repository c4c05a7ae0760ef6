//! Loopback addresses for a test's daemons: the kernel picks a free port,
//! and the socket that held it is closed before the daemon binds it. One
//! copy for every test and bench that starts daemons.

use std::net::SocketAddr;

/// A free UDP port on loopback: a QUIC endpoint's.
pub fn free_udp() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
}

/// A free TCP port on loopback: a status and metrics server's.
pub fn free_tcp() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
}
