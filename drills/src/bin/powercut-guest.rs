//! The power-cut drill's workload, run inside a guest whose disk sits
//! behind QEMU's `blklogwrites`: appends, group commits from several
//! threads, staged batches, streaming appends of large entries, segment
//! rolls and an erase on a `Log`. A supervisor thread writes every
//! acknowledgement, after the call that made it returned, to a raw marker
//! region of the same disk with O_DIRECT|O_DSYNC, so the disk's write order
//! says what was acknowledged before each moment.
//!
//! Parameters come from the kernel command line (`drill.KEY=VALUE`), or
//! from `--cmdline FILE` for a run on a host.

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Instant;

use drills::content::{Frame, ERASED_REPO};
use drills::marker::{Ack, MarkerWriter};
use drills::{Context, DrillError, GuestParams, Result, Rng};
use twinlog::log::Log;

struct Params {
    dev: String,
    marker_at: u64,
    marker_slots: u64,
    dir: String,
    segment: u64,
    threads: u64,
    scale: u64,
    big: u64,
    seed: u64,
    /// The negative control: acknowledge appends once staged, before any
    /// fsync. The drill must fail.
    broken: bool,
}

fn params() -> Result<Params> {
    let g = GuestParams::read()?;
    Ok(Params {
        dev: g.text("dev", "/dev/vda"),
        marker_at: g.num("marker", 0)?,
        marker_slots: g.num("slots", 8192)?,
        dir: g.text("dir", "/mnt/log"),
        segment: g.num("segment", 64 << 10)?,
        threads: g.num("threads", 4)?.max(1),
        scale: g.num("scale", 1)?.max(1),
        big: g.num("big", 3 << 19)?,
        seed: g.num("seed", 1)?,
        broken: g.num("broken", 0)? != 0,
    })
}

/// Acknowledge a frame: its marker is queued only now, after the call that
/// made it durable returned.
fn ack(tx: &mpsc::Sender<Ack>, seq: u64, f: &Frame) -> Result<()> {
    tx.send(Ack::Frame {
        seq,
        kind: f.kind.as_u16(),
        crc: f.payload_crc()?,
        name: f.name.clone(),
    })
    .map_err(|_| DrillError("marker writer is gone".into()))
}

fn append(log: &Log, tx: &mpsc::Sender<Ack>, f: &Frame, broken: bool) -> Result<u64> {
    let seq = if broken {
        log.stage_raw(f.kind.as_u16(), &f.meta, &f.blob()?)
    } else {
        log.append_raw(f.kind.as_u16(), &f.meta, &f.blob()?)
    }
    .ctx(|| format!("append {}", f.name))?;
    ack(tx, seq, f)?;
    Ok(seq)
}

/// A batch staged without waiting, made durable by one `sync_through` of
/// its last frame; every frame of it is acknowledged only then.
fn batch(log: &Log, tx: &mpsc::Sender<Ack>, frames: &[Frame]) -> Result<()> {
    let mut seqs = Vec::with_capacity(frames.len());
    for f in frames {
        seqs.push(
            log.stage_raw(f.kind.as_u16(), &f.meta, &f.blob()?)
                .ctx(|| format!("stage {}", f.name))?,
        );
    }
    if let Some(&last) = seqs.last() {
        log.sync_through(last)
            .ctx(|| format!("sync_through {last}"))?;
    }
    for (seq, f) in seqs.iter().zip(frames) {
        ack(tx, *seq, f)?;
    }
    Ok(())
}

/// A large entry streamed in chunks: `commit`, or `commit_unsynced` and a
/// `sync`.
fn stream(log: &Log, tx: &mpsc::Sender<Ack>, f: &Frame, unsynced: bool) -> Result<()> {
    let blob = f.blob()?;
    let mut p = log
        .begin(None, f.kind.as_u16(), &f.meta, f.blob_len)
        .ctx(|| format!("begin {}", f.name))?;
    for chunk in blob.chunks(64 << 10) {
        p.write(chunk).ctx(|| format!("stream {}", f.name))?;
    }
    let seq = if unsynced {
        let seq = p
            .commit_unsynced()
            .ctx(|| format!("commit_unsynced {}", f.name))?;
        let head = log.sync().ctx(|| format!("sync after {}", f.name))?;
        if head < seq {
            return Err(DrillError(format!("sync answered head {head} below {seq}")));
        }
        seq
    } else {
        p.commit().ctx(|| format!("commit {}", f.name))?
    };
    ack(tx, seq, f)
}

/// One appender: `n` frames, every fifth step a staged batch of four.
fn appender(log: &Log, tx: &mpsc::Sender<Ack>, phase: &str, t: u64, p: &Params) -> Result<()> {
    let (n, seed) = if phase == "group" {
        (20 * p.scale, p.seed)
    } else {
        (10 * p.scale, p.seed + 1)
    };
    let mut rng = Rng::new(seed ^ (t << 32));
    let mut i = 0;
    while i < n {
        if t == 0 && i % 5 == 4 {
            let frames = (0..4)
                .map(|k| Frame::small(&format!("{phase}{t}.{i}.{k}"), rng.next_u64(), 3000))
                .collect::<Result<Vec<_>>>()?;
            batch(log, tx, &frames)?;
        } else {
            let f = Frame::small(&format!("{phase}{t}.{i}"), rng.next_u64(), 3000)?;
            append(log, tx, &f, p.broken)?;
        }
        i += 1;
    }
    Ok(())
}

fn workload(log: &Log, p: &Params, tx: mpsc::Sender<Ack>) -> Result<u64> {
    let mut rng = Rng::new(p.seed);
    // Alone: one fdatasync per append.
    for i in 0..10 * p.scale {
        append(
            log,
            &tx,
            &Frame::small(&format!("solo.{i}"), rng.next_u64(), 3000)?,
            p.broken,
        )?;
    }
    // Together: group commits from several threads, while one more streams
    // two large entries (one in the erased repository, so the erase punches
    // many blocks) that do not fit a segment.
    std::thread::scope(|s| -> Result<()> {
        let mut joins = Vec::new();
        for t in 0..p.threads {
            let tx = tx.clone();
            joins.push(s.spawn(move || appender(log, &tx, "group", t, p)));
        }
        let tx2 = tx.clone();
        joins.push(s.spawn(move || -> Result<()> {
            let gone = Frame::named(&format!("{ERASED_REPO}|big.0|{}", p.big))?;
            stream(log, &tx2, &gone, false)?;
            let kept = Frame::named(&format!("keep|big.1|{}", p.big / 2 + 4097))?;
            stream(log, &tx2, &kept, true)
        }));
        for j in joins {
            j.join()
                .map_err(|_| DrillError("an appender panicked".into()))??;
        }
        Ok(())
    })?;
    // The erase, while appenders go on: frames below `before` are all
    // published, and those are what it promises to have erased.
    std::thread::scope(|s| -> Result<()> {
        let mut joins = Vec::new();
        for t in 0..p.threads {
            let tx = tx.clone();
            joins.push(s.spawn(move || appender(log, &tx, "after", t, p)));
        }
        let before = log.head_seq() + 1;
        let erased = log
            .erase(before, &[ERASED_REPO.to_owned()])
            .ctx(|| format!("erase before {before}"))?;
        tx.send(Ack::Erase {
            before,
            repo: ERASED_REPO.into(),
        })
        .map_err(|_| DrillError("marker writer is gone".into()))?;
        println!(
            "erase before {before}: {} frames, {} bytes, {} segments",
            erased.frames, erased.bytes, erased.segments
        );
        for j in joins {
            j.join()
                .map_err(|_| DrillError("an appender panicked".into()))??;
        }
        Ok(())
    })?;
    tx.send(Ack::Done)
        .map_err(|_| DrillError("marker writer is gone".into()))?;
    Ok(log.head_seq())
}

fn run() -> Result<String> {
    let started = Instant::now();
    let p = params()?;
    let mut markers = MarkerWriter::open(&p.dev, p.marker_at, p.marker_slots)?;
    let log = Log::open_with(&p.dir, p.segment).ctx(|| format!("open log {}", p.dir))?;
    let (tx, rx) = mpsc::channel::<Ack>();
    let writer = std::thread::spawn(move || -> Result<u64> {
        for ack in rx {
            markers.write(ack)?;
        }
        Ok(markers.written())
    });
    let worked = workload(&log, &p, tx);
    let written = writer
        .join()
        .map_err(|_| DrillError("the marker writer panicked".into()))?;
    let head = worked?;
    let markers = written?;
    Ok(serde_json::json!({
        "head": head,
        "markers": markers,
        "segments": log.layout().len(),
        "frame_syncs": log.frame_syncs(),
        "erase_syncs": log.erase_syncs(),
        "seconds": started.elapsed().as_secs_f64(),
    })
    .to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(json) => {
            println!("GUEST-DONE {json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("GUEST-FAILED {e}");
            ExitCode::FAILURE
        }
    }
}
