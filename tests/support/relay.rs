//! A UDP relay between a twin and its primary, with each direction
//! switchable off: a link that drops one way, as a test needs it.
//! Included by path by the tests that use it.

#![allow(dead_code)] // each test uses its own part

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::UdpSocket;

/// Datagrams from the dialer (the twin) to `target` and back; the dialer
/// dials [`Relay::addr`].
pub struct Relay {
    pub addr: SocketAddr,
    /// Datagrams toward the target pass while true.
    pub forward: Arc<AtomicBool>,
    /// Datagrams back toward the dialer pass while true.
    pub back: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    /// A relay on `addr` (a free loopback port) to `target`.
    pub async fn start(addr: SocketAddr, target: SocketAddr) -> Relay {
        let outside = UdpSocket::bind(addr).await.expect("relay bind");
        let inside = UdpSocket::bind(("127.0.0.1", 0)).await.expect("relay bind");
        inside.connect(target).await.expect("relay connect");
        let (forward, back) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(true)),
        );
        let (f, b) = (forward.clone(), back.clone());
        let task = tokio::spawn(async move {
            let mut dialer: Option<SocketAddr> = None;
            let (mut up, mut down) = (vec![0u8; 65_536], vec![0u8; 65_536]);
            loop {
                tokio::select! {
                    got = outside.recv_from(&mut up) => {
                        // An ICMP error (the target not listening yet)
                        // surfaces as a failed receive: go on.
                        let Ok((n, from)) = got else { continue };
                        dialer = Some(from);
                        if f.load(Ordering::SeqCst) {
                            let _ = inside.send(&up[..n]).await;
                        }
                    }
                    got = inside.recv(&mut down) => {
                        let Ok(n) = got else { continue };
                        if let (Some(to), true) = (dialer, b.load(Ordering::SeqCst)) {
                            let _ = outside.send_to(&down[..n], to).await;
                        }
                    }
                }
            }
        });
        Relay {
            addr,
            forward,
            back,
            task,
        }
    }
}
