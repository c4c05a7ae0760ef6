//! `twin-crash-mid-entry`: small frames from two clients and, each round,
//! one large entry (64 to 128 MiB by default) appended with `twin`
//! durability; the twin is SIGKILLed once or twice while it writes that
//! entry (once it has written a random fraction of it, by its
//! /proc/PID/io), its log opened (recovered) and checked, and restarted.
//!
//! Invariant: after every kill, every frame acknowledged as `Twin` is on
//! the twin's recovered log byte for byte (the large entries of earlier
//! rounds too) and the log verifies; every large entry is acknowledged
//! once the twin is back; at the end the twin converges to the primary's
//! head, every twin frame equals the primary's byte for byte, and every
//! large entry is whole (its blob, and so its crc) on both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use twinlog::log::Log;
use twinlog::node::Durability;

use drills::content::bytes;
use drills::daemons::{self, compare_logs, tail_head, tenths, Pair, PairOpts, Proc};
use drills::{Context, DrillError, Result};

use crate::{holds, settle, small_len, Dial, Load, Outcome, Setup, BIG_KIND};

/// A large entry of the drill: its round, length and seq once acknowledged.
struct Big {
    round: u64,
    len: usize,
    seq: u64,
}

fn big_meta(round: u64) -> Vec<u8> {
    format!("big {round}").into_bytes()
}

fn big_blob(round: u64, len: usize) -> Vec<u8> {
    bytes(0xB16_0000 + round, len)
}

/// Whether `log` holds the large entry whole, byte for byte.
fn holds_big(log: &Log, b: &Big) -> bool {
    log.read(b.seq).is_ok_and(|e| {
        e.kind == BIG_KIND && e.meta == big_meta(b.round) && e.blob == big_blob(b.round, b.len)
    })
}

pub async fn run(mut s: Setup) -> Result<Outcome> {
    let mut out = Outcome::new(
        "twin-crash-mid-entry",
        "acknowledged => on the twin's recovered log byte for byte; large entries whole on both",
    );
    let rounds = if s.rounds == 0 { 4 } else { s.rounds };
    let (min_mib, max_mib) = (s.args.num("min-mib", 64)?, s.args.num("max-mib", 128)?);
    let pair = Pair::init(&s.work, &PairOpts::default())?;
    let (plog, tlog) = (pair.plog(), pair.tlog());
    let mut primary = Proc::serve(&s.bins.primary, &pair.pcfg, &s.work.join("primary.stderr"))?;
    let mut twin = Proc::serve(&s.bins.twin, &pair.tcfg, &s.work.join("twin.stderr"))?;
    let admin = Arc::new(pair.admin()?);
    let dial = Dial {
        admin: admin.clone(),
        fp: pair.primary_fp,
        addr: pair.listen,
    };
    let load = Load::new("small", small_len);
    let workers = load.spawn(&dial, 2, 0, Durability::Twin, Duration::from_millis(2));
    if !load
        .progress(20, Durability::Twin, Duration::from_secs(20))
        .await
    {
        return Err(DrillError(
            "no acknowledgement in 20 s: the pair never came up".into(),
        ));
    }
    let big_client = daemons::connect(
        &admin,
        pair.primary_fp,
        pair.listen,
        Duration::from_secs(10),
    )
    .await?;
    let big_client = Arc::new(big_client);
    let mut bigs: Vec<Big> = Vec::new();
    let (mut kills, mut missed, mut mid_entry) = (0u64, 0u64, 0u64);
    let mut big_bytes = 0u64;
    let mut recovered_heads = Vec::new();
    let mut checks = 0u64;
    for round in 0..rounds {
        let mib = min_mib + s.rng.below(max_mib - min_mib + 1);
        let len = (mib << 20) as usize + s.rng.below(4096) as usize;
        let blob = Arc::new(big_blob(round, len));
        let c = big_client.clone();
        let b2 = blob.clone();
        let appending = tokio::spawn(async move {
            c.append(BIG_KIND, &big_meta(round), &b2, Durability::Twin)
                .await
        });
        let kills_now = 1 + s.rng.below(2);
        let mut this_round = Vec::new();
        for _ in 0..kills_now {
            // Kill once the twin has written this fraction of the entry
            // since it started (or since the round began).
            let frac = 0.1 + 0.8 * (s.rng.below(1000) as f64 / 1000.0);
            let base = twin.written().unwrap_or(0);
            let point = base + (frac * len as f64) as u64;
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut done_first = false;
            loop {
                if appending.is_finished() {
                    done_first = true;
                    break;
                }
                if twin.written().is_some_and(|w| w >= point) {
                    break;
                }
                if Instant::now() > deadline {
                    out.fail(format!(
                        "round {round}: the twin did not write {point} bytes in 60 s"
                    ));
                    break;
                }
                settle(2).await;
            }
            if done_first {
                missed += 1;
                break;
            }
            let wrote = twin.written().unwrap_or(0).saturating_sub(base);
            twin.sigkill()?;
            kills += 1;
            let log = Log::open_with(&tlog, 1 << 20)
                .ctx(|| format!("open the twin's log after kill {kills}"))?;
            let head = log.head_seq();
            this_round.push(head);
            if let Err(e) = log.verify() {
                out.fail(format!(
                    "kill {kills}: the twin's recovered log does not verify: {e}"
                ));
            }
            for a in load.acked().iter().filter(|a| a.got == Durability::Twin) {
                checks += 1;
                if !holds(&log, &load, a) {
                    out.fail(format!(
                        "kill {kills}: frame {} acknowledged as Twin is not whole on the twin's recovered log",
                        a.seq
                    ));
                }
            }
            for b in &bigs {
                checks += 1;
                if !holds_big(&log, b) {
                    out.fail(format!(
                        "kill {kills}: large entry {} (round {}) is not whole on the twin",
                        b.seq, b.round
                    ));
                }
            }
            drop(log);
            out.line(format!(
                "round {round}: {} MiB entry, twin killed after writing {:.1} MiB ({:.0}%), recovered head {head}",
                len >> 20,
                wrote as f64 / 1048576.0,
                frac * 100.0
            ));
            settle(100 + s.rng.below(400)).await;
            twin.restart()?;
        }
        let res = tokio::time::timeout(Duration::from_secs(120), appending).await;
        match res {
            Ok(Ok(Ok((seq, Durability::Twin)))) => {
                // A kill landed inside the entry when the recovered log
                // ended before it.
                mid_entry += this_round.iter().filter(|&&h| h < seq).count() as u64;
                recovered_heads.extend(this_round);
                big_bytes += len as u64;
                bigs.push(Big { round, len, seq });
            }
            Ok(Ok(Ok((seq, d)))) => out.fail(format!(
                "round {round}: the large entry at {seq} was acknowledged as {d:?}"
            )),
            Ok(Ok(Err(e))) => out.fail(format!("round {round}: the large append failed: {e}")),
            Ok(Err(e)) => out.fail(format!("round {round}: the large append task: {e}")),
            Err(_) => out.fail(format!(
                "round {round}: the large entry was not acknowledged within 120 s"
            )),
        }
    }
    if !load
        .progress(20, Durability::Twin, Duration::from_secs(20))
        .await
    {
        out.fail("no progress after the last round".into());
    }
    load.halt(workers).await;
    drop(big_client);
    let converge_started = Instant::now();
    let converged = daemons::wait_for(Duration::from_secs(60), Duration::from_millis(100), || {
        let (p, t) = (tail_head(&plog), tail_head(&tlog));
        (p == t && p > 0).then_some(p)
    })
    .await;
    if converged.is_none() {
        out.fail(format!(
            "the twin did not converge in 60 s: head {}, the primary's {}",
            tail_head(&tlog),
            tail_head(&plog)
        ));
    }
    let converge_s = converge_started.elapsed().as_secs_f64();
    primary.stop()?;
    twin.stop()?;
    let (pl, tl) = (
        Log::open_with(&plog, 1 << 20).ctx(|| "open the primary's log".into())?,
        Log::open_with(&tlog, 1 << 20).ctx(|| "open the twin's log".into())?,
    );
    let acked = load.acked();
    for a in &acked {
        checks += 2;
        if !holds(&pl, &load, a) {
            out.fail(format!(
                "frame {} is not whole on the primary at the end",
                a.seq
            ));
        }
        if a.got == Durability::Twin && !holds(&tl, &load, a) {
            out.fail(format!(
                "frame {} is not whole on the twin at the end",
                a.seq
            ));
        }
    }
    for b in &bigs {
        checks += 2;
        for (side, log) in [("primary", &pl), ("twin", &tl)] {
            if !holds_big(log, b) {
                out.fail(format!(
                    "large entry {} (round {}) is not whole on the {side} at the end",
                    b.seq, b.round
                ));
            }
        }
    }
    let (head, first) = (pl.head_seq(), tl.first_seq());
    drop((pl, tl));
    let (equal, differ, named) = compare_logs(&plog, &tlog, first)?;
    for n in named {
        out.fail(format!("the logs differ: {n}"));
    }
    if differ > 0 || equal != head {
        out.fail(format!(
            "{equal} frames equal of {head}, {differ} differing or on one side only"
        ));
    }
    if kills == 0 {
        out.fail("no kill landed: nothing was drilled".into());
    }
    let twin_acked = acked.iter().filter(|a| a.got == Durability::Twin).count();
    out.line(format!(
        "{rounds} rounds, {kills} kills ({mid_entry} inside the large entry, {missed} rounds where the entry was acknowledged before the kill point)"
    ));
    out.line(format!(
        "{} small frames acknowledged as twin, {} large entries ({:.0} MiB) acknowledged; {checks} checks of acknowledged frames",
        twin_acked,
        bigs.len(),
        big_bytes as f64 / 1048576.0
    ));
    out.line(format!(
        "converged to head {head} in {converge_s:.1} s; {equal} twin frames equal to the primary's byte for byte"
    ));
    out.fig("rounds", rounds);
    out.fig("kills", kills);
    out.fig("kills_mid_entry", mid_entry);
    out.fig("missed_rounds", missed);
    out.fig("acked_small", twin_acked);
    out.fig("acked_large", bigs.len());
    out.fig("large_mib", big_bytes >> 20);
    out.fig("checks", checks);
    out.fig("head", head);
    out.fig("frames_equal", equal);
    out.fig("converge_s", tenths(converge_s));
    out.fig(
        "append_errors",
        load.errors.load(std::sync::atomic::Ordering::SeqCst),
    );
    Ok(out)
}
