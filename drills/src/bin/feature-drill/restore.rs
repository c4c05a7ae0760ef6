//! `restore-interrupted`: a twin's log is filled through a real primary
//! and twin pair (small frames around three large entries, 64 to 128 MiB
//! each); the primary is stopped and a fresh box runs `primary restore`
//! from the twin, SIGKILLed N times at random moments (half once the run
//! has written a random part of what is left, by its /proc/PID/io, half
//! once `RESTORE_PARTIAL` says a random part of the entry being written is
//! down), then run to completion with
//! `--json`. The box is then served as a primary and the twin pointed at
//! it.
//!
//! Invariant: each rerun starts at or past what the killed run held (the
//! frames the box's log indexes, and the bytes of an unfinished entry that
//! `RESTORE_PARTIAL` or the salvage record names); the final report
//! starts at or past the last kill's position and its `received_bytes` is
//! exactly the blob bytes from that start to the twin's head; the box's
//! log equals the twin's frame for frame; the twin follows the box (same
//! history and head), a new `twin` append is acknowledged, and the two
//! logs are equal after it.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::node::restore::{PARTIAL_FILE, RESTORING_FILE, SALVAGE_META};
use twinlog::node::Durability;

use drills::content::bytes;
use drills::daemons::{
    self, compare_logs, fast_timers, free_tcp, free_udp, read_log, tail_head, tenths, Pair,
    PairOpts, Proc,
};
use drills::{Context, DrillError, Result};

use crate::{settle, small_blob, small_len, small_meta, Outcome, Setup, APP_KIND, BIG_KIND};

/// A position in the log a restore writes: frame `seq`, byte `byte` of its
/// blob (0: nothing of it).
type Pos = (u64, u64);

/// What `RESTORE_PARTIAL` (or the salvage record) says: seq, written, inode.
fn partial(data: &Path, file: &str) -> Option<(u64, u64, u64)> {
    let path = data.join(file);
    let ino = std::fs::metadata(&path).ok()?.ino();
    let b = std::fs::read(&path).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
    Some((v.get("seq")?.as_u64()?, v.get("written")?.as_u64()?, ino))
}

/// How far the box got, as a rerun must find it: the frames its log
/// indexes (a lower bound of what it holds), and an unfinished entry's
/// bytes as recorded.
fn held(data: &Path) -> Pos {
    let next = tail_head(&data.join(daemon::LOG_DIR)) + 1;
    let mut pos = (next, 0);
    for f in [PARTIAL_FILE, SALVAGE_META] {
        if let Some((seq, written, _)) = partial(data, f) {
            if seq == next {
                pos = pos.max((seq, written));
            }
        }
    }
    pos
}

pub async fn run(mut s: Setup) -> Result<Outcome> {
    let mut out = Outcome::new(
        "restore-interrupted",
        "each rerun resumes at or past what the killed run held; the box ends equal to the twin and serves it",
    );
    let kills = if s.rounds == 0 { 8 } else { s.rounds };
    let (min_mib, max_mib) = (s.args.num("min-mib", 64)?, s.args.num("max-mib", 128)?);
    // The fresh box first: the twin pins it for restores.
    let bdir = s.work.join("box");
    let (box_listen, box_metrics, restore_addr) = (free_udp()?, free_tcp()?, free_udp()?);
    let (bcfg, box_fp) =
        daemon::init_primary(&bdir, box_listen, box_metrics, None).ctx(|| "init the box".into())?;
    let mut b = PrimaryConfig::load(&bcfg).ctx(|| "load the box's primary.toml".into())?;
    b.timers = fast_timers();
    b.segment_bytes = 1 << 20;
    std::fs::write(&bcfg, b.render()).ctx(|| "write the box's primary.toml".into())?;
    let blog = bdir.join(daemon::LOG_DIR);
    let pair = Pair::init(
        &s.work,
        &PairOpts {
            restore: Some((restore_addr, box_fp)),
            ..PairOpts::default()
        },
    )?;
    let tlog = pair.tlog();
    let mut primary = Proc::serve(&s.bins.primary, &pair.pcfg, &s.work.join("primary.stderr"))?;
    let mut twin = Proc::serve(&s.bins.twin, &pair.tcfg, &s.work.join("twin.stderr"))?;

    // Fill the twin through the pair: small frames around large entries.
    let fill_started = Instant::now();
    let admin = pair.admin()?;
    let c = daemons::connect(
        &admin,
        pair.primary_fp,
        pair.listen,
        Duration::from_secs(10),
    )
    .await?;
    let mut n = 0u64;
    let mut big_mib = Vec::new();
    for part in 0..4u64 {
        for _ in 0..(20 + s.rng.below(30)) {
            let (meta, blob) = (small_meta("fill", n), small_blob(n, small_len(n)));
            c.append(APP_KIND, &meta, &blob, Durability::Twin)
                .await
                .ctx(|| format!("fill: append {n}"))?;
            n += 1;
        }
        if part < 3 {
            let mib = min_mib + s.rng.below(max_mib - min_mib + 1);
            let len = (mib << 20) as usize + s.rng.below(1 << 16) as usize;
            let blob = bytes(0xF111 + part, len);
            c.append(
                BIG_KIND,
                format!("big {part}").as_bytes(),
                &blob,
                Durability::Twin,
            )
            .await
            .ctx(|| format!("fill: large entry {part}"))?;
            big_mib.push(mib);
        }
    }
    drop(c);
    primary.stop()?;
    let fill_s = fill_started.elapsed().as_secs_f64();
    let frames = read_log(&tlog, 0, 0)?;
    let twin_head = frames.keys().last().copied().unwrap_or(0);
    let total: u64 = frames.values().map(|f| f.blob_len).sum();
    let after = |p: Pos| -> u64 {
        frames
            .range(p.0..)
            .map(|(_, f)| f.blob_len)
            .sum::<u64>()
            .saturating_sub(p.1)
    };
    out.line(format!(
        "the twin holds {} frames, {:.1} MiB of blobs (large entries of {big_mib:?} MiB), filled in {fill_s:.1} s",
        frames.len(),
        total as f64 / 1048576.0
    ));

    // Restore, killed again and again.
    let args: Vec<String> = [
        "restore",
        "--config",
        &bcfg.display().to_string(),
        "--from",
        &restore_addr.to_string(),
        "--twin-fingerprint",
        &pair.twin_fp.to_string(),
        "--json",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let stderr = s.work.join("restore.stderr");
    let mut held_pos: Pos = (1, 0);
    let mut held_ino = None;
    let (mut killed, mut by_moment, mut by_bytes) = (0u64, 0u64, 0u64);
    let mut resumes = Vec::new();
    let mut finished: Option<String> = None;
    for k in 0..kills {
        let mut run = Proc::start(&s.bins.primary, &args, &stderr)?;
        let started = Instant::now();
        // A random moment: once the run has written a random 2 to 30% of
        // what is left (by its /proc/PID/io, salvage copies included), so
        // kills spread over the whole log whatever the machine's speed.
        let by_bytes_written = k % 2 == 0;
        let left = after(held_pos).max(1);
        // A rerun first copies the held bytes of an unfinished entry aside
        // and back into the log: past that, so each kill makes progress.
        let target = 2 * held_pos.1
            + (left as f64 * (0.02 + 0.28 * (s.rng.below(1000) as f64 / 1000.0))) as u64;
        let frac = 0.05 + 0.85 * (s.rng.below(1000) as f64 / 1000.0);
        let mut first_seen: Option<Pos> = None;
        let mut point: Option<Pos> = None;
        loop {
            if let Some((status, stdout)) = run.try_finished()? {
                if status.success() {
                    finished = Some(stdout);
                    break;
                }
                return Err(DrillError(format!(
                    "restore run {k} failed ({status}); see {}",
                    stderr.display()
                )));
            }
            let p = partial(&bdir, PARTIAL_FILE);
            if let Some((seq, written, ino)) = p {
                // The killed run's record lingers until this run salvages it.
                if Some(ino) != held_ino {
                    first_seen.get_or_insert((seq, written));
                    // Inside an entry: a random point of what is left of the
                    // first one this run is still writing.
                    let len = frames.get(&seq).map_or(0, |f| f.blob_len);
                    if point.is_none() && written < len {
                        point = Some((seq, written + (frac * (len - written) as f64) as u64));
                    }
                }
            }
            let due = if by_bytes_written {
                run.written().is_some_and(|w| w >= target)
            } else {
                matches!((p, point), (Some((seq, w, _)), Some(pt)) if (seq, w) >= pt)
            };
            if due {
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(DrillError(format!(
                    "restore run {k}: no kill point in 60 s"
                )));
            }
            settle(2).await;
        }
        if finished.is_some() {
            out.line(format!("run {k} finished before its kill point"));
            break;
        }
        run.sigkill()?;
        killed += 1;
        if by_bytes_written {
            by_moment += 1;
        } else {
            by_bytes += 1;
        }
        if let Some(first) = first_seen {
            resumes.push(first);
            if first < held_pos {
                out.fail(format!(
                    "run {k} wrote frame {} from byte {}, the box held frame {} byte {}",
                    first.0, first.1, held_pos.0, held_pos.1
                ));
            }
        }
        let now = held(&bdir);
        if now < held_pos {
            out.fail(format!(
                "after kill {k} the box holds less ({now:?}) than before it ({held_pos:?})"
            ));
        }
        held_pos = now;
        held_ino = partial(&bdir, PARTIAL_FILE).map(|p| p.2);
        out.line(format!(
            "kill {k} after {:.2} s ({}): the box holds frames to {} and {:.1} MiB of frame {}",
            started.elapsed().as_secs_f64(),
            if by_bytes_written {
                "at a random moment"
            } else {
                "inside an entry"
            },
            held_pos.0 - 1,
            held_pos.1 as f64 / 1048576.0,
            held_pos.0
        ));
    }
    let final_started = Instant::now();
    let stdout = match finished {
        Some(s) => s,
        None => {
            let mut run = Proc::start(&s.bins.primary, &args, &stderr)?;
            loop {
                if let Some((status, stdout)) = run.try_finished()? {
                    if !status.success() {
                        return Err(DrillError(format!(
                            "the final restore failed ({status}); see {}",
                            stderr.display()
                        )));
                    }
                    break stdout;
                }
                if final_started.elapsed() > Duration::from_secs(300) {
                    return Err(DrillError("the final restore took over 300 s".into()));
                }
                settle(20).await;
            }
        }
    };
    let final_s = final_started.elapsed().as_secs_f64();
    let report: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| DrillError(format!("no JSON report in {stdout:?}")))?;
    let num = |k: &str| report.get(k).and_then(serde_json::Value::as_u64);
    let (Some(seq0), Some(byte0), Some(received), Some(head)) = (
        num("started_at_seq"),
        num("started_at_byte"),
        num("received_bytes"),
        num("head"),
    ) else {
        return Err(DrillError(format!("the report lacks a field: {report}")));
    };
    let missing = after((seq0, byte0));
    if (seq0, byte0) < held_pos {
        out.fail(format!(
            "the final run started at frame {seq0} byte {byte0}, the box held frame {} byte {}",
            held_pos.0, held_pos.1
        ));
    }
    if received != missing {
        out.fail(format!(
            "the final run received {received} bytes; {missing} were missing from frame {seq0} byte {byte0}"
        ));
    }
    if head != twin_head {
        out.fail(format!(
            "the report's head is {head}, the twin's {twin_head}"
        ));
    }
    for f in [RESTORING_FILE, PARTIAL_FILE] {
        if bdir.join(f).exists() {
            out.fail(format!("{f} is left in the box after the restore"));
        }
    }
    let (equal, differ, named) = compare_logs(&blog, &tlog, 0)?;
    for n in named {
        out.fail(format!("box and twin differ: {n}"));
    }
    if equal != frames.len() as u64 || differ > 0 {
        out.fail(format!(
            "{equal} frames of the box equal the twin's, {} expected, {differ} differ",
            frames.len()
        ));
    }
    out.line(format!(
        "final run: started at frame {seq0} byte {byte0}, received {:.1} MiB (missing: {:.1} MiB) in {final_s:.1} s",
        received as f64 / 1048576.0,
        missing as f64 / 1048576.0
    ));

    // Serve the box; point the twin at it.
    twin.stop()?;
    daemons::run(
        &s.bins.primary,
        &[
            "pin-twin",
            "--config",
            &bcfg.display().to_string(),
            &pair.twin_fp.to_string(),
        ],
    )?;
    daemons::run(
        &s.bins.twin,
        &[
            "pin",
            "--config",
            &pair.tcfg.display().to_string(),
            &box_fp.to_string(),
        ],
    )?;
    let mut t = TwinConfig::load(&pair.tcfg).ctx(|| "load twin.toml".into())?;
    t.primary = box_listen.into();
    std::fs::write(&pair.tcfg, t.render()).ctx(|| "write twin.toml".into())?;
    let mut boxd = Proc::serve(&s.bins.primary, &bcfg, &s.work.join("box.stderr"))?;
    twin.restart()?;
    let following = daemons::wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
        daemons::twin_status(pair.twin_metrics)
            .ok()
            .filter(|st| st.connected && st.head == twin_head && st.primary_head == twin_head)
    })
    .await;
    if following.is_none() {
        out.fail(format!(
            "the twin does not follow the restored box within 20 s: {:?}",
            daemons::twin_status(pair.twin_metrics).ok()
        ));
    }
    let badmin = daemons::admin_identity(&bdir)?;
    let c = daemons::connect(&badmin, box_fp, box_listen, Duration::from_secs(10)).await?;
    let mut new_acked = 0u64;
    for i in 0..5u64 {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            c.append(
                APP_KIND,
                &small_meta("after-restore", i),
                &small_blob(i, 500),
                Durability::Twin,
            ),
        )
        .await;
        match r {
            Ok(Ok((seq, Durability::Twin))) if seq == twin_head + 1 + i => new_acked += 1,
            other => out.fail(format!("a twin append on the restored box: {other:?}")),
        }
    }
    drop(c);
    let converged = daemons::wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
        (tail_head(&tlog) == twin_head + 5).then_some(())
    })
    .await
    .is_some();
    boxd.stop()?;
    twin.stop()?;
    let (equal_after, differ_after, named) = compare_logs(&blog, &tlog, 0)?;
    for n in named {
        out.fail(format!("after following, box and twin differ: {n}"));
    }
    if !converged || differ_after > 0 || equal_after != twin_head + 5 {
        out.fail(format!(
            "after following: {equal_after} frames equal, {differ_after} differ, {} expected",
            twin_head + 5
        ));
    }
    out.line(format!(
        "the twin followed the box: {new_acked} new twin appends acknowledged; {equal_after} frames equal on both"
    ));
    out.fig("kills", killed);
    out.fig("kills_at_random_bytes", by_moment);
    out.fig("kills_inside_entry", by_bytes);
    out.fig("frames", frames.len());
    out.fig("mib", tenths(total as f64 / 1048576.0));
    out.fig("large_entries_mib", big_mib);
    out.fig(
        "resumed_at",
        resumes
            .iter()
            .map(|(s, b)| format!("{s}:{b}"))
            .collect::<Vec<_>>(),
    );
    out.fig("final_started_at_seq", seq0);
    out.fig("final_started_at_byte", byte0);
    out.fig("final_received_bytes", received);
    out.fig("final_missing_bytes", missing);
    out.fig("frames_equal", equal);
    out.fig("twin_follows", following.is_some());
    out.fig("new_twin_acks", new_acked);
    out.fig("fill_s", tenths(fill_s));
    out.fig("final_run_s", tenths(final_s));
    Ok(out)
}
