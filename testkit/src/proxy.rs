//! Relays on loopback that cut a link on demand, as a partition does:
//! while cut, nothing passes either way and nothing is closed, so each
//! side learns of it only by its own timeouts. A UDP relay drops the
//! datagrams; a TCP relay holds the bytes back, as TCP's retransmissions
//! would, and delivers them once the link mends (or the peer gave up).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// A relay: connect to `addr` instead of the upstream.
#[derive(Debug, Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
}

impl Proxy {
    /// Cut the link (`true`) or mend it (`false`).
    pub fn cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

/// A UDP relay to `upstream` (a QUIC link): each peer that writes to it
/// gets a socket of its own toward the upstream, as a NAT would, so
/// several peers share one relay.
pub async fn udp(upstream: SocketAddr) -> std::io::Result<Proxy> {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
    let addr = front.local_addr()?;
    let cut = Arc::new(AtomicBool::new(false));
    let relay_cut = cut.clone();
    tokio::spawn(async move {
        let mut backs: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = front.recv_from(&mut buf).await {
            let back = match backs.get(&from) {
                Some(b) => b.clone(),
                None => {
                    let Ok(b) = UdpSocket::bind("127.0.0.1:0").await else {
                        continue;
                    };
                    let b = Arc::new(b);
                    backs.insert(from, b.clone());
                    tokio::spawn(answers(b.clone(), front.clone(), from, relay_cut.clone()));
                    b
                }
            };
            if !relay_cut.load(Ordering::SeqCst) {
                let _ = back.send_to(&buf[..n], upstream).await;
            }
        }
    });
    Ok(Proxy { addr, cut })
}

/// The upstream's answers to one peer, sent back to it.
async fn answers(
    back: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    to: SocketAddr,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 65536];
    while let Ok((n, _)) = back.recv_from(&mut buf).await {
        if !cut.load(Ordering::SeqCst) {
            let _ = front.send_to(&buf[..n], to).await;
        }
    }
}

/// A TCP relay to `upstream` (etcd's gRPC): each connection relayed both
/// ways; while cut, no byte moves either way (they wait) and new
/// connections are held open and silent.
pub async fn tcp(upstream: SocketAddr) -> std::io::Result<Proxy> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let cut = Arc::new(AtomicBool::new(false));
    let relay_cut = cut.clone();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let cut = relay_cut.clone();
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pump(dr, uw, cut.clone()));
                pump(ur, dw, cut).await;
            });
        }
    });
    Ok(Proxy { addr, cut })
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 65536];
    loop {
        hold_while_cut(&cut).await;
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        hold_while_cut(&cut).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn hold_while_cut(cut: &AtomicBool) {
    while cut.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
