//! The physical floor of a small replicated append: the same work as a
//! `twin` (or `local`) append of 128 bytes with none of twinlog's code.
//! Three processes on loopback UDP, std only (no tokio, no quinn, no
//! crypto, no framing, no allocation in the loop):
//!
//! - the client (threads of the bench process) sends 8 bytes of sequence
//!   and 128 of payload and waits for the answer;
//! - the primary `pwrite`s them into a preallocated file (as a segment is:
//!   `fallocate` mode 0), sends them to the twin *before* its own
//!   `fdatasync` (parallel durability, as twinlog does), syncs, waits for
//!   the twin's ack (`twin`; at `local` it answers after its own sync, the
//!   twin still syncing what it is shipped) and answers;
//! - the twin `pwrite`s, `fdatasync`s and acks.
//!
//! With more than one client the primary groups as the appender does:
//! what arrived while it synced is written, shipped and synced as one.
//! The processes are this bench binary started again with
//! [`FLOOR_ROLE_ENV`] set; they end when their parent closes their stdin.

#![allow(dead_code)] // each bench runs its own cases

use std::fs::File;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const FLOOR_ROLE_ENV: &str = "TWINLOG_BENCH_FLOOR_ROLE";
const FILE_ENV: &str = "TWINLOG_BENCH_FLOOR_FILE";
const TWIN_ENV: &str = "TWINLOG_BENCH_FLOOR_TWIN";
const WAIT_TWIN_ENV: &str = "TWINLOG_BENCH_FLOOR_WAIT_TWIN";

/// One request: sequence and payload.
const SLOT: usize = 8 + 128;
/// Requests grouped at most (a datagram of 64 of them is 8.5 KiB).
const GROUP: usize = 64;
/// The preallocated file each box writes round and round.
const FILE_LEN: u64 = 64 << 20;

/// Run the floor's `role` (`primary` or `twin`) in this process.
pub fn floor_main(role: &str) {
    let file_path = std::env::var(FILE_ENV).expect("the floor's file");
    let file = super::common::preallocated(Path::new(&file_path), FILE_LEN);
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let stop = Arc::new(AtomicBool::new(false));
    // The parent closing stdin ends the process.
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::SeqCst);
            std::process::exit(0);
        });
    }
    println!("{}", sock.local_addr().expect("addr"));
    std::io::stdout().flush().expect("flush");
    match role {
        "twin" => twin_loop(&sock, &file),
        "primary" => {
            let twin: SocketAddr = std::env::var(TWIN_ENV)
                .expect("the twin's address")
                .parse()
                .expect("an address");
            let wait_twin = std::env::var(WAIT_TWIN_ENV).is_ok_and(|v| v == "1");
            primary_loop(&sock, &file, twin, wait_twin)
        }
        other => panic!("no floor role {other}"),
    }
}

fn twin_loop(sock: &UdpSocket, file: &File) {
    let mut buf = vec![0u8; SLOT * GROUP];
    let mut at = 0u64;
    loop {
        let (n, from) = sock.recv_from(&mut buf).expect("recv");
        at = write_round(file, &buf[..n], at);
        file.sync_data().expect("fdatasync");
        // The ack: the last sequence of the group.
        sock.send_to(&buf[n - SLOT..n - SLOT + 8], from)
            .expect("ack");
    }
}

fn primary_loop(sock: &UdpSocket, file: &File, twin: SocketAddr, wait_twin: bool) {
    let link = UdpSocket::bind("127.0.0.1:0").expect("bind the link");
    link.connect(twin).expect("connect the link");
    // A group lost on the way (loopback drops under a full buffer) is
    // shipped again.
    link.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut buf = vec![0u8; SLOT * GROUP];
    let mut from = Vec::with_capacity(GROUP);
    let mut ack = [0u8; 8];
    let mut at = 0u64;
    loop {
        from.clear();
        let (n, f) = sock.recv_from(&mut buf[..SLOT]).expect("recv");
        assert_eq!(n, SLOT);
        from.push(f);
        // What else arrived meanwhile joins the group (none at 1 client:
        // one failed recv, as an appender's queue check).
        sock.set_nonblocking(true).expect("nonblocking");
        while from.len() < GROUP {
            let at = from.len() * SLOT;
            match sock.recv_from(&mut buf[at..at + SLOT]) {
                Ok((n, f)) if n == SLOT => from.push(f),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        sock.set_nonblocking(false).expect("blocking");
        let group = &buf[..from.len() * SLOT];
        at = write_round(file, group, at);
        link.send(group).expect("ship");
        file.sync_data().expect("fdatasync");
        if wait_twin {
            let last = &group[group.len() - SLOT..group.len() - SLOT + 8];
            loop {
                match link.recv(&mut ack) {
                    Ok(8) if ack == last => break,
                    Ok(_) => {}
                    Err(_) => {
                        link.send(group).expect("ship again");
                    }
                }
            }
        }
        for (i, f) in from.iter().enumerate() {
            sock.send_to(&group[i * SLOT..i * SLOT + 8], f)
                .expect("answer");
        }
    }
}

/// Write `bytes` at `at`, round the file: the next offset.
fn write_round(file: &File, bytes: &[u8], at: u64) -> u64 {
    let at = if at + bytes.len() as u64 > FILE_LEN {
        0
    } else {
        at
    };
    file.write_all_at(bytes, at).expect("pwrite");
    at + bytes.len() as u64
}

/// A started floor: the twin and the primary processes.
pub struct Floor {
    twin: Child,
    primary: Child,
    addr: SocketAddr,
}

impl Floor {
    /// Start the chain in `dir`: the primary answers after the twin's ack
    /// (`wait_twin`) or after its own sync.
    pub fn start(dir: &Path, wait_twin: bool) -> Floor {
        std::fs::create_dir_all(dir).expect("the floor's dir");
        let tag = if wait_twin { "twin" } else { "local" };
        let twin_file = dir.join(format!("floor-{tag}-twin.raw"));
        let primary_file = dir.join(format!("floor-{tag}-primary.raw"));
        for f in [&twin_file, &primary_file] {
            let _ = std::fs::remove_file(f);
        }
        let (twin, twin_addr) = spawn("twin", &twin_file, &[]);
        let wait = if wait_twin { "1" } else { "0" };
        let (primary, addr) = spawn(
            "primary",
            &primary_file,
            &[
                (TWIN_ENV, twin_addr.to_string()),
                (WAIT_TWIN_ENV, wait.into()),
            ],
        );
        Floor {
            twin,
            primary,
            addr,
        }
    }

    /// `clients` closed-loop clients for `run`: appends a second.
    pub fn run(&self, clients: usize, run: Duration) -> f64 {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let threads: Vec<_> = (0..clients)
            .map(|c| {
                let (stop, done, addr) = (stop.clone(), done.clone(), self.addr);
                std::thread::spawn(move || client(c as u64, addr, &stop, &done))
            })
            .collect();
        std::thread::sleep(run);
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().expect("a floor client");
        }
        done.load(Ordering::SeqCst) as f64 / started.elapsed().as_secs_f64()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        for c in [&mut self.primary, &mut self.twin] {
            drop(c.stdin.take());
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(role: &str, file: &Path, env: &[(&str, String)]) -> (Child, SocketAddr) {
    let mut cmd = Command::new(std::env::current_exe().expect("this bench"));
    cmd.env(FLOOR_ROLE_ENV, role)
        .env(FILE_ENV, file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start a floor process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("the floor's address");
    let addr = line.trim().parse().expect("an address");
    (child, addr)
}

/// One closed-loop client: a request, its answer, again.
fn client(id: u64, primary: SocketAddr, stop: &AtomicBool, done: &AtomicU64) {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind a client");
    sock.connect(primary).expect("connect");
    // A lost datagram (loopback drops under a full buffer) is sent again.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut req = super::common::pattern(SLOT);
    let mut answer = [0u8; 8];
    let mut seq = id << 48;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        req[..8].copy_from_slice(&seq.to_le_bytes());
        sock.send(&req).expect("send");
        loop {
            match sock.recv(&mut answer) {
                Ok(8) if u64::from_le_bytes(answer) == seq => break,
                Ok(_) => {}
                Err(_) if stop.load(Ordering::Relaxed) => return,
                Err(_) => {
                    sock.send(&req).expect("send again");
                }
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
}
