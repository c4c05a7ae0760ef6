//! Real kills: a writer process (`twinlog-test-child log-writer`) appends
//! to a log from several threads and reports every acknowledged frame on
//! stdout; the parent kills it with SIGKILL at a random moment,
//! reopens the log and checks every acknowledged frame, then starts the next
//! writer on the same directory.
//!
//! Every frame's meta is its name (`r{round}w{writer}n{count}`), and its kind
//! and blob follow from the name, so the parent can check any frame in the
//! log, acknowledged or not.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use twinlog::log::Log;

#[path = "support/kill_frames.rs"]
mod kill_frames;

use kill_frames::{bytes, content, SEGMENT};

/// Replays a run: the seed of the kill delays.
const SEED_ENV: &str = "TWINLOG_KILL_SEED";

const ROUNDS: u64 = 20;

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
    let child = Command::new(env!("CARGO_BIN_EXE_twinlog-test-child"))
        .arg("log-writer")
        .arg(dir)
        .arg(round.to_string())
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
    // The kill's moment is the test's input (seeded, replayable), not a
    // wait for anything: it must land anywhere in the writer's run.
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
    // The environment only chooses the seed, to replay a failure: the
    // test kills its writer twenty times whatever it says. The writer is
    // the `twinlog-test-child` binary.
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
