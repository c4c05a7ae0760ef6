//! QUIC endpoints with mutual TLS, pinned peers and bounded messages.
//!
//! - [`tls`]: identities, fingerprints, pins and roles;
//! - [`reset`]: stateless-reset keys derived from the box's identity, so a
//!   restarted process ends its predecessor's connections at once;
//! - endpoints: a server that accepts pinned peers, a client that dials
//!   one, both with UDP buffers large enough not to drop packets at full
//!   speed, and each with the [`Liveness`] its use needs;
//! - [`read_msg`]/[`write_msg`]: length-prefixed control messages, every
//!   length checked before anything is allocated.

pub mod pumped;
pub mod reset;
pub mod tls;

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{RecvStream, SendStream};
use rustls::pki_types::CertificateDer;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::repl::msg::{self, DecodeError, MAX_CONTROL_LEN};
pub use tls::{Fingerprint, Identity, Pins, Refused, Role, TlsError};

/// UDP socket buffers: the default 208 KiB overflows at full speed and
/// loses packets. Measured on loopback with 1 GiB transfers: 2 MiB still
/// dropped a few hundred datagrams per GiB, 16 MiB none.
pub const UDP_BUFFER_BYTES: usize = 16 << 20;

/// The application close code of a twin connection the primary closed
/// because a newer one from the same certificate replaced it.
pub const CLOSE_REPLACED: u32 = 4;

/// The application close code of a client connection past the primary's
/// cap on client connections.
pub const CLOSE_TOO_MANY: u32 = 5;

/// What the network layer fails at.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("stream write: {source}{}", lost_why_write(.source))]
    Write {
        #[from]
        source: quinn::WriteError,
    },
    #[error("stream read: {source}{}", lost_why_read(.source))]
    Read {
        #[from]
        source: quinn::ReadExactError,
    },
    #[error("message: {0}")]
    Message(#[from] DecodeError),
    #[error("the peer is not pinned")]
    Unpinned,
    /// The peer took none of what was written to it within the deadline:
    /// the stream was reset.
    #[error("the peer took nothing for {after_ms} ms: the stream was reset")]
    SendStalled { after_ms: u64 },
}

/// Why a lost connection was lost, for the messages that only say it was.
fn lost_why(c: &quinn::ConnectionError) -> String {
    format!(" ({c})")
}

fn lost_why_read(e: &quinn::ReadExactError) -> String {
    match e {
        quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(c)) => lost_why(c),
        _ => String::new(),
    }
}

fn lost_why_write(e: &quinn::WriteError) -> String {
    match e {
        quinn::WriteError::ConnectionLost(c) => lost_why(c),
        _ => String::new(),
    }
}

/// Whether `e` says the peer refused this box's certificate in the TLS
/// handshake (a TLS alert closing the connection): it is not pinned there.
pub fn refused_by_peer(e: &NetError) -> bool {
    let conn = match e {
        NetError::Connection(c) => c,
        NetError::Read {
            source: quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(c)),
        } => c,
        NetError::Write {
            source: quinn::WriteError::ConnectionLost(c),
        } => c,
        _ => return false,
    };
    match conn {
        // A TLS alert travels as a QUIC crypto error, 0x100 plus the alert.
        quinn::ConnectionError::ConnectionClosed(close) => {
            (0x100..0x200).contains(&u64::from(close.error_code))
        }
        _ => false,
    }
}

/// How quickly a connection notices a peer that went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Silence after which a QUIC PING goes out, so an idle connection
    /// does not time out (once after the peer's last packet: a PING does
    /// not come back to a peer that went silent).
    pub keep_alive: Duration,
    /// Silence from the peer after which QUIC gives the connection up (the
    /// smaller of both sides' applies).
    pub idle_timeout: Duration,
}

impl Liveness {
    /// Daemons' endpoints: what they accept, restores.
    pub const PEER: Liveness = Liveness {
        keep_alive: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(10),
    };

    /// A client whose calls have `deadline`: a primary that went silent is
    /// given up after the deadline, whatever the call is doing, and the
    /// keep-alives (a third of it, at most a second) keep an idle
    /// connection, or a tail waiting for frames, from timing out.
    pub fn client(deadline: Duration) -> Liveness {
        let deadline = deadline.max(Duration::from_millis(30));
        Liveness {
            keep_alive: (deadline / 3).min(Duration::from_secs(1)),
            idle_timeout: deadline,
        }
    }
}

/// A warning that anyone outside can cause, said at most once an interval
/// with the count of those it stands for, so a flood cannot fill the logs.
#[derive(Debug, Default)]
pub struct Throttle {
    /// When the next may be said, in ms since the Unix epoch.
    next_ms: std::sync::atomic::AtomicU64,
    /// Held back since the last said.
    held: std::sync::atomic::AtomicU64,
}

impl Throttle {
    /// Whether to say this one now: the number it stands for (itself and
    /// those held back since the last), or None to hold it back.
    pub fn allow(&self, every: Duration) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let now = crate::repl::unix_ms();
        let next = self.next_ms.load(Ordering::Relaxed);
        let due = now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now + every.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if due {
            Some(self.held.swap(0, Ordering::Relaxed) + 1)
        } else {
            self.held.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Requests a peer may have open at once on one connection: each is a
/// bidirectional stream, and each holds memory until it is answered.
pub const STREAMS_PER_CONNECTION: u32 = 32;

/// The largest UDP payload a connection grows its packets to, by path MTU
/// discovery. A link of 1,500 bytes stays at QUIC's usual 1,452 (the
/// probes above are lost and cost nothing else); loopback and jumbo frames
/// carry a bulk transfer in a quarter of the packets, and a packet, not a
/// byte, is what a transfer spends most of its CPU on (a restore ran 1.4
/// times as fast, a snapshot fetch 2.2 times).
///
/// Bounded by segmentation offload: quinn hands the kernel up to 10
/// packets in one `sendmsg` (`MAX_TRANSMIT_SEGMENTS`), and a UDP send is
/// at most 64 KiB, so 10 packets of 6,550 bytes is the most that fits.
/// Past it every batch fails, and the connection crawls without noticing.
pub const MAX_UDP_PAYLOAD: u16 = 6_000;
const _: () = assert!(10 * (MAX_UDP_PAYLOAD as usize) + 8 + 40 <= 65_535);

fn transport(live: Liveness) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t.max_concurrent_bidi_streams(quinn::VarInt::from_u32(STREAMS_PER_CONNECTION));
    // Windows large enough for a loopback or LAN link at full speed, small
    // enough that what a connection buffers (unacknowledged on the sender,
    // unread on the receiver) stays a few tens of MiB.
    t.stream_receive_window(quinn::VarInt::from_u32(8 << 20));
    t.receive_window(quinn::VarInt::from_u32(16 << 20));
    t.send_window(8 << 20);
    t.keep_alive_interval(Some(live.keep_alive));
    match quinn::IdleTimeout::try_from(live.idle_timeout) {
        Ok(idle) => t.max_idle_timeout(Some(idle)),
        // Past QUIC's range (2^62 ms): the largest there is.
        Err(_) => t.max_idle_timeout(Some(quinn::VarInt::MAX.into())),
    };
    t
}

fn set_buffer(sock: &UdpSocket, force: libc::c_int, plain: libc::c_int) {
    let size = UDP_BUFFER_BYTES as libc::c_int;
    for opt in [force, plain] {
        // SAFETY: the pointer is to a live c_int of the length passed; the
        // descriptor is owned by `sock` for the duration of the call.
        let ret = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if ret == 0 {
            return;
        }
    }
    tracing::warn!(
        "could not raise a UDP buffer to {UDP_BUFFER_BYTES} bytes: {}",
        std::io::Error::last_os_error()
    );
}

fn socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let sock = UdpSocket::bind(addr)?;
    set_buffer(&sock, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF);
    set_buffer(&sock, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF);
    Ok(sock)
}

/// An endpoint that accepts pinned peers on `addr` and can dial them. A
/// process started after another of the same box on `addr` resets the
/// connections peers still hold to the dead one ([`reset`]).
pub fn server(
    addr: SocketAddr,
    identity: &Identity,
    pins: Arc<Pins>,
) -> Result<quinn::Endpoint, NetError> {
    let cfg = server_config(identity, pins.clone())?;
    let mut endpoint = quinn::Endpoint::new(
        reset::ResetKeys::of(identity)?.endpoint_config(),
        Some(cfg),
        socket(addr)?,
        Arc::new(quinn::TokioRuntime),
    )?;
    endpoint.set_default_client_config(client_config(identity, pins, Liveness::PEER)?);
    Ok(endpoint)
}

/// What an endpoint accepting `pins` as `identity` serves with: set anew
/// on a running endpoint (`set_server_config`) to change whom it admits.
pub fn server_config(
    identity: &Identity,
    pins: Arc<Pins>,
) -> Result<quinn::ServerConfig, NetError> {
    let tls = QuicServerConfig::try_from(tls::server_tls(identity, pins)?)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(tls));
    cfg.transport_config(Arc::new(transport(Liveness::PEER)));
    Ok(cfg)
}

/// An endpoint that only dials out.
pub fn client(identity: &Identity, pins: Arc<Pins>) -> Result<quinn::Endpoint, NetError> {
    client_with(identity, pins, Liveness::PEER)
}

/// An endpoint that only dials out, its connections as lively as `live`.
pub fn client_with(
    identity: &Identity,
    pins: Arc<Pins>,
    live: Liveness,
) -> Result<quinn::Endpoint, NetError> {
    let any: SocketAddr = ([0, 0, 0, 0], 0).into();
    let mut endpoint = quinn::Endpoint::new(
        reset::ResetKeys::of(identity)?.endpoint_config(),
        None,
        socket(any)?,
        Arc::new(quinn::TokioRuntime),
    )?;
    endpoint.set_default_client_config(client_config(identity, pins, live)?);
    Ok(endpoint)
}

fn client_config(
    identity: &Identity,
    pins: Arc<Pins>,
    live: Liveness,
) -> Result<quinn::ClientConfig, NetError> {
    let tls = QuicClientConfig::try_from(tls::client_tls(identity, pins)?)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(tls));
    cfg.transport_config(Arc::new(transport(live)));
    Ok(cfg)
}

/// Dial a pinned peer.
pub async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
) -> Result<quinn::Connection, NetError> {
    Ok(endpoint.connect(addr, tls::SERVER_NAME)?.await?)
}

/// The fingerprint and role of a connection's peer (always pinned: the
/// handshake refused anything else).
pub fn peer(conn: &quinn::Connection, pins: &Pins) -> Result<(Fingerprint, Role), NetError> {
    let certs = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or(NetError::Unpinned)?;
    let fp = Fingerprint::of(certs.first().ok_or(NetError::Unpinned)?);
    let role = pins.role(&fp).ok_or(NetError::Unpinned)?;
    Ok((fp, role))
}

/// Send one control message.
pub async fn write_msg<T: Serialize>(send: &mut SendStream, msg: &T) -> Result<(), NetError> {
    send.write_all(&msg::encode(msg)).await?;
    Ok(())
}

/// Receive one control message; None when the peer finished the stream
/// between messages. The announced length is checked against
/// [`MAX_CONTROL_LEN`] before the body is read.
pub async fn read_msg<T: DeserializeOwned>(recv: &mut RecvStream) -> Result<Option<T>, NetError> {
    let mut prefix = [0u8; 4];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = msg::announced_len(prefix)?;
    debug_assert!(len <= MAX_CONTROL_LEN);
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    let msg = postcard::from_bytes(&body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    Ok(Some(msg))
}

/// [`read_msg`], waiting for the message's first byte as long as it takes
/// and for the rest at most `rest`: a peer between messages may be quiet,
/// one that began a message must finish it. Past `rest` the error is an
/// I/O `TimedOut`.
pub async fn read_msg_within<T: DeserializeOwned>(
    recv: &mut RecvStream,
    rest: Duration,
) -> Result<Option<T>, NetError> {
    let mut prefix = [0u8; 4];
    // One read takes what has arrived of the prefix (all of it, mostly).
    let got = match recv.read(&mut prefix).await {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(None),
        Err(e) => return Err(quinn::ReadExactError::ReadError(e).into()),
    };
    let whole = async {
        recv.read_exact(&mut prefix[got..]).await?;
        let len = msg::announced_len(prefix)?;
        let mut body = vec![0u8; len];
        recv.read_exact(&mut body).await?;
        postcard::from_bytes(&body)
            .map_err(|e| NetError::from(DecodeError::Malformed(e.to_string())))
    };
    match tokio::time::timeout(rest, whole).await {
        Ok(msg) => msg.map(Some),
        Err(_) => Err(NetError::Io(std::io::ErrorKind::TimedOut.into())),
    }
}

/// Read control messages into `tx` until the stream ends or fails (the
/// failure is sent last). Reads run in their own task: a read is not
/// cancel-safe, so it never sits in a `select!`.
pub async fn forward_msgs<T: DeserializeOwned>(
    mut recv: RecvStream,
    tx: tokio::sync::mpsc::Sender<Result<T, NetError>>,
) {
    loop {
        match read_msg::<T>(&mut recv).await {
            Ok(Some(m)) => {
                if tx.send(Ok(m)).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}
