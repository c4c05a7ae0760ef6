//! `retention-hole`: a pair with 1 MiB segments and `[retention]
//! max_bytes` of 8 MiB on the primary. Clients append with `twin`
//! durability and push to a repository; the twin is SIGKILLed; clients go
//! on (with `local` durability, 8 to 32 KiB frames, and pushes) until
//! four times the cap has been appended; the twin comes back.
//!
//! Invariant: the primary reports `twin_below_floor` (in `status --json`)
//! and its log never holds more than the cap plus one segment (the open
//! one, preallocated) plus what half a second of appends adds between two
//! retention passes (at the rate measured) and 64 KiB; the twin installs a snapshot (`snapshots_installed` >= 1 in
//! `twin status --json`) and converges: same head, every frame after the
//! snapshot equal to the primary's byte for byte (or, where the primary
//! has dropped it since, to what the client appended), the same store
//! (refs and objects); every frame acknowledged as `Twin` before the twin
//! stopped is on the twin's log or covered by its snapshot (seq <=
//! snapshot_at).

use std::sync::Arc;
use std::time::{Duration, Instant};

use twinlog::log::Log;
use twinlog::node::{Durability, Status, TwinStatus};

use drills::daemons::{
    self, compare_logs, dir_bytes, read_log, tail_head, tenths, Pair, PairOpts, Proc,
};
use drills::{Context, DrillError, Result};

use crate::{holds, push_blob, small_len, store_view, Dial, Load, Outcome, Setup};

/// 8 to 32 KiB: the cap is passed in seconds, not minutes.
fn away_len(n: u64) -> usize {
    (8 << 10) + (n as usize * 7919) % (24 << 10)
}

pub async fn run(mut s: Setup) -> Result<Outcome> {
    let mut out = Outcome::new(
        "retention-hole",
        "the cap holds; the twin comes back through a snapshot and converges; twin-acknowledged frames on its log or in its snapshot",
    );
    let segment: u64 = 1 << 20;
    let cap = s.args.num("cap-mib", 8)? << 20;
    let pair = Pair::init(
        &s.work,
        &PairOpts {
            segment_bytes: segment,
            max_bytes: cap,
            restore: None,
        },
    )?;
    let (plog, tlog) = (pair.plog(), pair.tlog());
    let mut primary = Proc::serve(&s.bins.primary, &pair.pcfg, &s.work.join("primary.stderr"))?;
    let mut twin = Proc::serve(&s.bins.twin, &pair.tcfg, &s.work.join("twin.stderr"))?;
    let admin = Arc::new(pair.admin()?);
    let dial = Dial {
        admin: admin.clone(),
        fp: pair.primary_fp,
        addr: pair.listen,
    };
    let c = daemons::connect(
        &admin,
        pair.primary_fp,
        pair.listen,
        Duration::from_secs(10),
    )
    .await?;
    c.create_repo("r", Durability::Twin)
        .await
        .ctx(|| "create repository r".into())?;
    let mut tip = None;
    let mut pushes = 0u64;
    for i in 0..5u64 {
        tip = Some(
            push_blob(
                &c,
                "r",
                format!("before {i}").as_bytes(),
                tip,
                Durability::Twin,
            )
            .await?,
        );
        pushes += 1;
    }

    // With the twin.
    let before = Load::new("before", small_len);
    let workers = before.spawn(&dial, 2, 0, Durability::Twin, Duration::from_millis(2));
    if !before
        .progress(100, Durability::Twin, Duration::from_secs(30))
        .await
    {
        return Err(DrillError(
            "100 twin acknowledgements did not come in 30 s".into(),
        ));
    }
    before.halt(workers).await;
    twin.sigkill()?;
    let acked_before: Vec<_> = before
        .acked()
        .into_iter()
        .filter(|a| a.got == Durability::Twin)
        .collect();
    {
        let log = Log::open_with(&tlog, segment).ctx(|| "open the killed twin's log".into())?;
        for a in &acked_before {
            if !holds(&log, &before, a) {
                out.fail(format!(
                    "frame {} acknowledged as Twin is not on the killed twin's log",
                    a.seq
                ));
            }
        }
    }

    // Without it, well past the cap.
    let away_started = Instant::now();
    let away = Load::new("away", away_len);
    let workers = away.spawn(&dial, 3, 0, Durability::Local, Duration::from_millis(20));
    let (mut max_status, mut max_dir, mut appended) = (0u64, 0u64, 0u64);
    let mut below_seen = false;
    let goal = 4 * cap;
    while appended < goal || !below_seen {
        if away_started.elapsed() > Duration::from_secs(90) {
            out.fail(format!(
                "after 90 s: {appended} bytes appended, below the floor: {below_seen}"
            ));
            break;
        }
        if let Ok(st) = daemons::primary_status(pair.primary_metrics) {
            max_status = max_status.max(st.log_bytes);
            below_seen |= st.twin_below_floor;
        }
        max_dir = max_dir.max(dir_bytes(&plog));
        appended = away.acked().iter().map(|a| away_len(a.n) as u64).sum();
        if s.rng.below(10) == 0 {
            // A push now and then, so the snapshot carries a store.
            tip = Some(
                push_blob(
                    &c,
                    "r",
                    format!("away {pushes}").as_bytes(),
                    tip,
                    Durability::Local,
                )
                .await?,
            );
            pushes += 1;
        }
        crate::settle(50).await;
    }
    away.halt(workers).await;
    let away_s = away_started.elapsed().as_secs_f64();
    let said = daemons::run(
        &s.bins.primary,
        &[
            "status",
            "--config",
            &pair.pcfg.display().to_string(),
            "--json",
        ],
    )?;
    let pst: Status =
        serde_json::from_str(said.trim()).ctx(|| format!("primary status --json: {said:?}"))?;
    if !pst.twin_below_floor {
        out.fail(format!(
            "`primary status --json` does not report twin_below_floor: {said}"
        ));
    }
    max_status = max_status.max(pst.log_bytes);
    // Retention passes run twice a second: between two, the open segment
    // (preallocated whole) and half a second of appends may sit past the cap.
    let rate = appended as f64 / away_s.max(1e-3);
    let bound = cap + segment + (rate * 0.5) as u64 + (64 << 10);
    if max_status > bound || max_dir > bound {
        out.fail(format!(
            "the primary's log held {max_status} bytes (status) and {max_dir} (files), past the cap {cap} + a segment + half a second of appends ({bound})"
        ));
    }
    out.line(format!(
        "twin away {away_s:.1} s: {:.1} MiB appended ({} frames) against a cap of {} MiB; the log held at most {:.2} MiB (status) / {:.2} MiB (files); primary first {} head {}, twin_below_floor {}",
        appended as f64 / 1048576.0,
        away.acked().len(),
        cap >> 20,
        max_status as f64 / 1048576.0,
        max_dir as f64 / 1048576.0,
        pst.first,
        pst.head,
        pst.twin_below_floor
    ));

    // The twin comes back.
    let back_started = Instant::now();
    twin.restart()?;
    let back = Load::new("back", small_len);
    // --late-clients: no `twin` append while the twin is below the floor
    // (the rest of the invariant, apart from appends the snapshot swallows).
    let late = s.args.flag("late-clients");
    let mut workers = Vec::new();
    if !late {
        workers = back.spawn(&dial, 2, 0, Durability::Twin, Duration::from_millis(2));
    }
    let installed = daemons::wait_for(Duration::from_secs(60), Duration::from_millis(50), || {
        daemons::twin_status(pair.twin_metrics)
            .ok()
            .filter(|st| st.snapshots_installed >= 1)
    })
    .await;
    if installed.is_none() {
        out.fail("the twin installed no snapshot within 60 s".into());
    }
    if late {
        workers = back.spawn(&dial, 2, 0, Durability::Twin, Duration::from_millis(2));
    }
    if !back
        .progress(50, Durability::Twin, Duration::from_secs(30))
        .await
    {
        out.fail("no twin acknowledgements after the twin came back".into());
    }
    push_blob(&c, "r", b"back", tip, Durability::Twin).await?;
    pushes += 1;
    back.halt(workers).await;
    drop(c);
    let converged = daemons::wait_for(Duration::from_secs(60), Duration::from_millis(100), || {
        let (p, t) = (tail_head(&plog), tail_head(&tlog));
        (p == t && p > 0).then_some(p)
    })
    .await;
    let back_s = back_started.elapsed().as_secs_f64();
    if converged.is_none() {
        out.fail(format!(
            "the twin did not converge in 60 s: head {}, the primary's {}",
            tail_head(&tlog),
            tail_head(&plog)
        ));
    }
    let said = daemons::run(
        &s.bins.twin,
        &[
            "status",
            "--config",
            &pair.tcfg.display().to_string(),
            "--json",
        ],
    )?;
    let tst: TwinStatus =
        serde_json::from_str(said.trim()).ctx(|| format!("twin status --json: {said:?}"))?;
    if tst.snapshots_installed < 1 {
        out.fail(format!(
            "`twin status --json` shows no snapshot installed: {said}"
        ));
    }
    let at = tst.snapshot_at;
    primary.stop()?;
    twin.stop()?;

    // The twin's log after the snapshot: the primary's, byte for byte.
    let (pfirst, tfirst, head) = {
        let (pl, tl) = (
            Log::open_with(&plog, segment).ctx(|| "open the primary's log".into())?,
            Log::open_with(&tlog, segment).ctx(|| "open the twin's log".into())?,
        );
        (pl.first_seq(), tl.first_seq(), tl.head_seq())
    };
    let from = pfirst.max(tfirst);
    let (equal, differ, named) = compare_logs(&plog, &tlog, from)?;
    for n in named {
        out.fail(format!("twin and primary differ: {n}"));
    }
    if differ > 0 {
        out.fail(format!("{differ} frames differ from {from} on"));
    }
    // Twin frames the primary has dropped since: each what a client appended.
    let mut by_content = 0u64;
    if tfirst < pfirst {
        for (seq, f) in read_log(&tlog, tfirst, usize::MAX)?.range(..pfirst) {
            let text = String::from_utf8_lossy(&f.meta).into_owned();
            let (tag, n) = text.split_once(' ').unwrap_or(("", ""));
            let load = match tag {
                "before" => &before,
                "away" => &away,
                "back" => &back,
                _ => {
                    out.fail(format!(
                        "twin frame {seq} (kind {}) is gone from the primary and cannot be checked",
                        f.kind
                    ));
                    continue;
                }
            };
            let expect = n.parse().ok().map(|n| load.frame(n));
            if expect.is_some_and(|(m, b)| m == f.meta && Some(b) == f.blob) {
                by_content += 1;
            } else {
                out.fail(format!("twin frame {seq} is not what the client appended"));
            }
        }
    }
    if tfirst > at + 1 {
        out.fail(format!(
            "the twin's log starts at {tfirst}, after its snapshot at {at}: frames between are nowhere"
        ));
    }
    // Acknowledged before the twin stopped: on its log or in the snapshot.
    let tl = Log::open_with(&tlog, segment).ctx(|| "open the twin's log".into())?;
    let (mut covered, mut on_log) = (0u64, 0u64);
    for a in &acked_before {
        if a.seq <= at {
            covered += 1;
        } else if holds(&tl, &before, a) {
            on_log += 1;
        } else {
            out.fail(format!(
                "frame {} acknowledged as Twin is neither on the twin's log nor under its snapshot at {at}",
                a.seq
            ));
        }
    }
    // Appended after the twin came back and acknowledged as `Twin`: the
    // twin must hold the bytes. A snapshot carries the store, not the
    // application frames, so one under `snapshot_at` is on the primary only.
    let mut only_on_primary = 0u64;
    for a in back.acked().iter().filter(|a| a.got == Durability::Twin) {
        if holds(&tl, &back, a) {
            continue;
        }
        if a.seq <= at {
            only_on_primary += 1;
            out.fail(format!(
                "frame {} (an application frame appended with `twin` durability after the twin came back) was acknowledged as Twin, but it is under the snapshot at {at} and the twin's log starts at {tfirst}: its bytes are on the primary only",
                a.seq
            ));
        } else {
            out.fail(format!(
                "frame {} acknowledged as Twin after the return is not on the twin",
                a.seq
            ));
        }
    }
    drop(tl);
    let (pv, tv) = (store_view(&pair.pdir)?, store_view(&pair.tdir)?);
    let same_store = pv == tv;
    if !same_store {
        out.fail("the twin's store (refs, objects) is not the primary's".into());
    }
    let objects: usize = pv.iter().map(|(_, _, o)| o.len()).sum();
    out.line(format!(
        "the twin came back below the floor, installed a snapshot at {at} and converged to head {head} in {back_s:.1} s"
    ));
    out.line(format!(
        "twin log {tfirst}..={head}, primary's from {pfirst}: {equal} frames equal byte for byte, {by_content} more checked against what was appended"
    ));
    out.line(format!(
        "{} frames acknowledged as twin before the stop: {covered} under the snapshot, {on_log} on the twin's log; stores equal: {same_store} ({pushes} pushes, {objects} objects)",
        acked_before.len()
    ));
    out.fig("cap_mib", cap >> 20);
    out.fig("segment_mib", segment >> 20);
    out.fig("appended_away_mib", tenths(appended as f64 / 1048576.0));
    out.fig("max_log_bytes_status", max_status);
    out.fig("max_log_bytes_files", max_dir);
    out.fig(
        "max_over_cap_mib",
        tenths(max_status.max(max_dir).saturating_sub(cap) as f64 / 1048576.0),
    );
    out.fig("twin_below_floor", pst.twin_below_floor);
    out.fig("snapshots_installed", tst.snapshots_installed);
    out.fig("snapshot_at", at);
    out.fig("head", head);
    out.fig("frames_equal", equal);
    out.fig("frames_checked_by_content", by_content);
    out.fig("acked_twin_before", acked_before.len());
    out.fig("covered_by_snapshot", covered);
    out.fig("on_twin_log", on_log);
    out.fig("stores_equal", same_store);
    out.fig("twin_acked_only_on_primary", only_on_primary);
    out.fig("late_clients", late);
    out.fig("away_s", tenths(away_s));
    out.fig("return_to_converged_s", tenths(back_s));
    Ok(out)
}
