//! Loopback addresses for daemons: a free port, and the socket that held
//! it is closed before the daemon binds it.
//!
//! A daemon may bind its port seconds after it was chosen (a twin's
//! `listen_as_primary` only once it is promoted). A port from the
//! kernel's ephemeral range could meanwhile be handed to any client
//! socket of a test running beside it, so ports are chosen below that
//! range, where the kernel hands out nothing by itself; the kernel's own
//! choice is the fallback.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// The lowest port chosen from: above the well-known services.
const LOWEST: u16 = 10_000;

/// A free UDP port on loopback: a QUIC endpoint's.
pub fn free_udp() -> SocketAddr {
    pick(|a| std::net::UdpSocket::bind(a).and_then(|s| s.local_addr()))
        .unwrap_or_else(|e| panic!("a free UDP port on loopback: {e}"))
}

/// A free TCP port on loopback: a status and metrics server's.
pub fn free_tcp() -> SocketAddr {
    pick(|a| std::net::TcpListener::bind(a).and_then(|s| s.local_addr()))
        .unwrap_or_else(|e| panic!("a free TCP port on loopback: {e}"))
}

fn pick(bind: impl Fn(SocketAddr) -> std::io::Result<SocketAddr>) -> std::io::Result<SocketAddr> {
    let below = ephemeral_low();
    if below > LOWEST + 100 {
        for _ in 0..64 {
            let port = LOWEST + (next_random() % u64::from(below - LOWEST)) as u16;
            if let Ok(a) = bind(SocketAddr::from(([127, 0, 0, 1], port))) {
                return Ok(a);
            }
        }
    }
    bind(SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// The low end of the kernel's ephemeral port range.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32_768)
}

/// Spread over processes and calls: tests in other processes pick too.
fn next_random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // SplitMix64 over the time, the pid and the call's number.
    let mut z =
        nanos ^ (u64::from(std::process::id()) << 32) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
