//! A tiny local HTTP server for `/metrics` (Prometheus text), `/status`
//! (JSON), `/healthz` and `/readyz`, and the client `status` commands use.
//! Whatever a client does, it costs the daemon little: at most
//! [`MAX_CONNECTIONS`] at once (the rest wait in the kernel's backlog), a
//! whole request within [`REQUEST_DEADLINE`], a request head of at most
//! 8 KiB, and a failed accept (out of descriptors) backs off instead of
//! spinning.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// An answer: HTTP status code, content type, body.
pub type Answer = (u16, &'static str, String);

/// Answers a path, or None for 404.
pub type Handler = Arc<dyn Fn(&str) -> Option<Answer> + Send + Sync>;

const MAX_HEAD: usize = 8 * 1024;
/// Requests served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;
/// The most a request's head may take to arrive: a scraper sends it at
/// once, and a connection that says nothing frees its place soon.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(1);
/// The most a whole request may take, from accept to the last byte sent.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Serve until `shutdown` turns true.
pub async fn serve(listener: TcpListener, handler: Handler, mut shutdown: watch::Receiver<bool>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = Duration::from_millis(10);
    loop {
        // A permit first: past the cap, connections wait in the backlog
        // and cost nothing here.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = Duration::from_millis(10);
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let answered =
                            tokio::time::timeout(REQUEST_DEADLINE, answer(stream, handler)).await;
                        match answered {
                            Ok(Err(e)) => tracing::debug!(error = %e, "status request failed"),
                            Err(_) => tracing::debug!("status request past its deadline"),
                            Ok(Ok(())) => {}
                        }
                        drop(permit);
                    });
                }
                Err(e) => {
                    // Out of descriptors, most likely: an accept loop that
                    // retried at once would spin a core and starve the rest.
                    tracing::warn!(error = %e, retry_in = ?backoff, "status server: accept failed");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

async fn answer(mut stream: tokio::net::TcpStream, handler: Handler) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let head_by = crate::node::clock::instant() + HEAD_DEADLINE;
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout_at(head_by, stream.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return stream.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
        }
    }
    let line = String::from_utf8_lossy(&head);
    let path = line
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("GET "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("");
    let reply = match handler(path) {
        Some((code, ctype, body)) => format!(
            "HTTP/1.1 {code} {}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            match code {
                200 => "OK",
                503 => "Service Unavailable",
                _ => "",
            },
            body.len()
        ),
        None => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
    };
    stream.write_all(reply.as_bytes()).await
}

/// GET `path` from a local daemon; the body of a 200 answer.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("a malformed HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(
            head.lines().next().unwrap_or("no status line").to_string(),
        ));
    }
    Ok(body.to_string())
}
