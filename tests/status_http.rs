//! The daemons' local HTTP server: `/healthz` and `/readyz` for load
//! balancers, and a flood of idle connections that costs the daemon
//! neither its CPU nor its answers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use twinlog::daemon::http;

fn cpu_secs() -> f64 {
    testkit::procfs::cpu_secs(std::process::id()).expect("this process's /proc/PID/stat")
}

/// GET `path`: the status line and the body.
fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("an answer");
    (
        head.lines().next().expect("status line").to_string(),
        body.to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_answer_for_load_balancers_and_a_flood_costs_little() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handler: http::Handler = Arc::new(|path: &str| match path {
        "/healthz" => Some((200, "text/plain", "ok\n".to_string())),
        "/readyz" => Some((503, "text/plain", "not ready: the log is poisoned\n".into())),
        _ => None,
    });
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(http::serve(listener, handler, stopped));

    let (line, body) = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
        .await
        .expect("join");
    assert_eq!((line.as_str(), body.as_str()), ("HTTP/1.1 200 OK", "ok\n"));
    let (line, body) = tokio::task::spawn_blocking(move || get(addr, "/readyz"))
        .await
        .expect("join");
    assert_eq!(line, "HTTP/1.1 503 Service Unavailable");
    assert!(body.contains("poisoned"), "{body}");
    let (line, _) = tokio::task::spawn_blocking(move || get(addr, "/nothing"))
        .await
        .expect("join");
    assert_eq!(line, "HTTP/1.1 404 Not Found");

    // 300 connections that say nothing, held open: the server takes at
    // most its cap of them at a time and spends next to no CPU on them.
    let before = cpu_secs();
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    // A window that measures CPU: the sleep is the measurement.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let spent = cpu_secs() - before;
    assert!(spent < 0.5, "{spent:.2} s of CPU for idle connections");
    // While they are held, an honest request waits at most for the ones
    // ahead of it to pass their head deadline, a few seconds; once they
    // go, it is answered at once.
    let started = std::time::Instant::now();
    let (line, _) = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
        .await
        .expect("join");
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
    let (line, _) = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
        .await
        .expect("join");
    assert_eq!(line, "HTTP/1.1 200 OK");
    let _ = stop.send(true);
}
