//! Real kills: this test binary re-executes itself as a writer process that
//! appends to a log from several threads and reports every acknowledged
//! frame on stdout; the parent kills it with SIGKILL at a random moment,
//! reopens the log and checks every acknowledged frame, then starts the next
//! writer on the same directory.
//!
//! Every frame's meta is its name (`r{round}w{writer}n{count}`), and its kind
//! and blob follow from the name, so the parent can check any frame in the
//! log, acknowledged or not.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use twinlog::log::Log;

/// Set in the child: the log directory to append to.
const CHILD_DIR_ENV: &str = "TWINLOG_KILL_CHILD_DIR";
/// Set in the child: the round, part of every frame name.
const CHILD_ROUND_ENV: &str = "TWINLOG_KILL_CHILD_ROUND";
/// Replays a run: the seed of the kill delays.
const SEED_ENV: &str = "TWINLOG_KILL_SEED";

/// Small segments, so that rolls happen while the writer is killed.
const SEGMENT: u64 = 64 << 10;
const ROUNDS: u64 = 20;
/// Writer 0 streams large blobs through `begin`; the others append small ones.
const WRITERS: u64 = 4;
const CHUNK: usize = 16 << 10;
/// A writer whose parent failed to kill it stops by itself.
const CHILD_LIFETIME: Duration = Duration::from_secs(10);

/// Deterministic bytes: a xorshift stream seeded by `seed`.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// FNV-1a: a frame name's seed.
fn hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The kind and blob of the frame called `name`. Writer 0's frames are large
/// (up to twice a segment, so some get a segment sized for them), the
/// others' small, some empty.
fn content(name: &str) -> (u16, Vec<u8>) {
    let h = hash(name);
    let len = if name.contains("w0n") {
        16_000 + (h % 120_000) as usize
    } else {
        (h % 2_500) as usize
    };
    (0x8000 + (h % 7) as u16, bytes(h, len))
}

/// The writer: appends until killed (or its lifetime ends), printing
/// `ACK {seq} {name}` once each append has returned.
#[test]
fn child_writer() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let round = std::env::var(CHILD_ROUND_ENV).expect("child: round");
    let log = Log::open_with(&dir, SEGMENT).expect("child: open");
    let deadline = Instant::now() + CHILD_LIFETIME;
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (log, round) = (&log, &round);
            s.spawn(move || {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let name = format!("r{round}w{w}n{n}");
                    let (kind, blob) = content(&name);
                    let seq = if w == 0 {
                        let mut p = log
                            .begin(None, kind, name.as_bytes(), blob.len() as u64)
                            .expect("child: begin");
                        for chunk in blob.chunks(CHUNK) {
                            p.write(chunk).expect("child: write");
                        }
                        p.commit().expect("child: commit")
                    } else {
                        log.append_raw(kind, name.as_bytes(), &blob)
                            .expect("child: append")
                    };
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ACK {seq} {name}").expect("child: stdout");
                    out.flush().expect("child: flush");
                    n += 1;
                }
            });
        }
    });
}

/// A child process killed when dropped, should the parent fail first.
struct Writer(Child);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run one writer on `dir` for `delay`, SIGKILL it, and answer what it
/// acknowledged: `(seq, name)` from every whole line it printed.
fn run_writer(dir: &Path, round: u64, delay: Duration) -> Vec<(u64, String)> {
    let exe = std::env::current_exe().expect("test binary");
    let child = Command::new(exe)
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_ROUND_ENV, round.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn writer");
    let mut writer = Writer(child);
    let mut stdout = writer.0.stdout.take().expect("piped stdout");
    // Drain the pipe while the writer runs, so that it never blocks on it.
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).expect("read writer's stdout");
        out
    });
    std::thread::sleep(delay);
    writer.0.kill().expect("SIGKILL the writer");
    writer.0.wait().expect("reap the writer");
    let out = reader.join().expect("stdout reader");
    // A line cut by the kill is not an acknowledgement the parent saw.
    let whole = out
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(&[][..], |i| &out[..=i]);
    String::from_utf8_lossy(whole)
        .lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .map(|l| {
            let (seq, name) = l.split_once(' ').expect("ACK seq name");
            (seq.parse().expect("seq"), name.to_owned())
        })
        .collect()
}

/// Reopen after a kill: every acknowledged frame is at its number and
/// intact, and every frame in the log is one a writer wrote whole.
fn check(dir: &Path, acked: &BTreeMap<u64, String>, what: &str) -> u64 {
    let log = Log::open_with(dir, SEGMENT).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let head = log.head_seq();
    let last = acked.keys().next_back().copied().unwrap_or(0);
    assert!(head >= last, "{what}: head {head}, {last} acknowledged");
    assert_eq!(log.first_seq(), 1, "{what}");
    let mut from = 1;
    while from <= head {
        let to = (from + 255).min(head);
        let frames = log
            .range(from, to)
            .unwrap_or_else(|e| panic!("{what}: read {from}..={to}: {e}"));
        assert_eq!(frames.len() as u64, to + 1 - from, "{what}");
        for e in frames {
            let name = std::str::from_utf8(&e.meta)
                .unwrap_or_else(|_| panic!("{what}: frame {} has no name", e.seq));
            let (kind, blob) = content(name);
            assert_eq!(e.kind, kind, "{what}: frame {} ({name})", e.seq);
            assert!(e.blob == blob, "{what}: frame {} ({name}) blob", e.seq);
            if let Some(want) = acked.get(&e.seq) {
                assert_eq!(name, want, "{what}: acknowledged frame {}", e.seq);
            }
        }
        from = to + 1;
    }
    head
}

/// A writer killed with SIGKILL at any moment (in open, mid-append, mid
/// streaming append, mid-roll) loses no frame it acknowledged, leaves no
/// frame that is not whole, and the next writer goes on from there; twenty
/// times on one directory.
#[test]
fn acknowledged_frames_survive_sigkill() {
    if std::env::var_os(CHILD_DIR_ENV).is_some() {
        return;
    }
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let mut rng = bytes(seed, ROUNDS as usize * 2);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut acked: BTreeMap<u64, String> = BTreeMap::new();
    let mut head = 0;
    for round in 0..ROUNDS {
        let r = u64::from(u16::from_le_bytes([
            rng.pop().unwrap_or(0),
            rng.pop().unwrap_or(0),
        ]));
        let delay = Duration::from_millis(5 + r % 146);
        let what = format!("round {round}, killed after {delay:?} ({SEED_ENV}={seed})");
        for (seq, name) in run_writer(dir.path(), round, delay) {
            assert!(
                seq > head,
                "{what}: {seq} acknowledged again after head {head}"
            );
            if let Some(old) = acked.insert(seq, name.clone()) {
                panic!("{what}: {seq} acknowledged as {old} and as {name}");
            }
        }
        head = check(dir.path(), &acked, &what);
    }
    let big = acked.values().filter(|n| n.contains("w0n")).count();
    assert!(
        acked.len() >= 100 && big >= 5,
        "only {} frames acknowledged ({big} streamed) in {ROUNDS} rounds ({SEED_ENV}={seed})",
        acked.len()
    );
    let log = Log::open_with(dir.path(), SEGMENT).expect("reopen");
    assert!(log.layout().len() > 5, "{:?}", log.layout());
}
