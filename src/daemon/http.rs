//! A tiny local HTTP server for `/metrics` (Prometheus text) and `/status`
//! (JSON), and the client `status` commands use. Requests are bounded: a
//! request head over 8 KiB is refused.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Answers a path with a content type and a body, or None for 404.
pub type Handler = Arc<dyn Fn(&str) -> Option<(&'static str, String)> + Send + Sync>;

const MAX_HEAD: usize = 8 * 1024;

/// Serve until `shutdown` turns true.
pub async fn serve(listener: TcpListener, handler: Handler, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let handler = handler.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, handler).await {
                        tracing::debug!(error = %e, "metrics request failed");
                    }
                });
            }
            _ = shutdown.changed() => return,
        }
    }
}

async fn answer(mut stream: tokio::net::TcpStream, handler: Handler) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
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
        Some((ctype, body)) => format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
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
