//! `erase-both`: two repositories created and pushed through the daemons
//! (with `twin` durability); every blob of `secret` carries a marker unique
//! to the run (one of them a 3 MiB object, an entry larger than a
//! segment), `kept` never does. The scan first finds the marker on both
//! boxes (so it can fail); then `primary repo erase --before HEAD+1
//! secret`. A fresh box is then restored from the twin (`twin
//! pin-restore`, `primary restore`).
//!
//! Invariant: once the twin has converged and both daemons stopped, no
//! file under either data directory holds the marker (every file scanned,
//! a piece at a time); every object of `kept` reads back whole through the
//! primary, and the twin's store equals the primary's; the restored box
//! holds no marker either (nor does the twin after serving it), its log
//! equals the twin's frame for frame and its store the twin's.

use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig};
use twinlog::node::Durability;

use drills::content::bytes;
use drills::daemons::{
    self, compare_logs, fast_timers, free_tcp, free_udp, scan_for, tail_head, tenths, Pair,
    PairOpts, Proc,
};
use drills::{Context, DrillError, Result};

use crate::{push_blob, small_blob, small_meta, store_view, Outcome, Setup, APP_KIND};

pub async fn run(mut s: Setup) -> Result<Outcome> {
    let mut out = Outcome::new(
        "erase-both",
        "after an erase no raw file of either box, nor of a box restored from the twin, holds the erased bytes; the other repository whole",
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let marker = format!(
        "ERASE-BOTH-MARKER-{}-{nanos:x}-{:x}",
        std::process::id(),
        s.rng.next_u64()
    );
    let mark = marker.as_bytes();
    let pair = Pair::init(&s.work, &PairOpts::default())?;
    let (plog, tlog) = (pair.plog(), pair.tlog());
    let mut primary = Proc::serve(&s.bins.primary, &pair.pcfg, &s.work.join("primary.stderr"))?;
    let mut twin = Proc::serve(&s.bins.twin, &pair.tcfg, &s.work.join("twin.stderr"))?;
    let admin = pair.admin()?;
    let c = daemons::connect(
        &admin,
        pair.primary_fp,
        pair.listen,
        Duration::from_secs(10),
    )
    .await?;
    for r in ["secret", "kept"] {
        c.create_repo(r, Durability::Twin)
            .await
            .ctx(|| format!("create {r}"))?;
    }
    let (mut stip, mut ktip) = (None, None);
    let mut kept = Vec::new();
    let mut secret_oids = Vec::new();
    let pushes = 12u64;
    for i in 0..pushes {
        // The marker at the start, in the middle and at the end of a blob.
        let len = if i == 5 {
            3 << 20
        } else {
            500 + s.rng.below(20_000) as usize
        };
        let mut data = mark.to_vec();
        data.extend(bytes(i, len));
        data.extend_from_slice(mark);
        data.extend(bytes(i + 100, len / 2));
        data.extend_from_slice(mark);
        let oid = push_blob(&c, "secret", &data, stip, Durability::Twin).await?;
        stip = Some(oid);
        secret_oids.push(oid);
        let kdata = bytes(1000 + i, 200 + s.rng.below(30_000) as usize);
        let koid = push_blob(&c, "kept", &kdata, ktip, Durability::Twin).await?;
        ktip = Some(koid);
        kept.push((koid, kdata));
        c.append(
            APP_KIND,
            &small_meta("between", i),
            &small_blob(i, 300),
            Durability::Twin,
        )
        .await
        .ctx(|| format!("append {i}"))?;
    }
    // The scan sees the marker before the erase, on both boxes.
    let (pre_p, _, _) = scan_for(&pair.pdir, mark)?;
    let (pre_t, _, _) = scan_for(&pair.tdir, mark)?;
    if pre_p.is_empty() || pre_t.is_empty() {
        out.fail(format!(
            "before the erase the scan finds the marker in {} primary and {} twin files: it could not fail",
            pre_p.len(),
            pre_t.len()
        ));
    }
    let head = daemons::primary_status(pair.primary_metrics)?.head;
    let before = head + 1;
    let erase_started = Instant::now();
    let said = daemons::run(
        &s.bins.primary,
        &[
            "repo",
            "--config",
            &pair.pcfg.display().to_string(),
            "erase",
            "--before",
            &before.to_string(),
            "secret",
        ],
    )?;
    out.line(said.trim().to_owned());
    let converged = daemons::wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        let (p, t) = (tail_head(&plog), tail_head(&tlog));
        (p == t && p > head).then_some(p)
    })
    .await;
    if converged.is_none() {
        out.fail("the twin did not take the erase within 30 s".into());
    }
    // Live: how long until neither box holds the marker, daemons running.
    let clean_live = daemons::wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let p = scan_for(&pair.pdir, mark).ok()?.0;
        let t = scan_for(&pair.tdir, mark).ok()?.0;
        (p.is_empty() && t.is_empty()).then(|| erase_started.elapsed().as_secs_f64())
    })
    .await;
    let mut kept_read = 0u64;
    for (oid, data) in &kept {
        match c.read_object("kept", *oid).await {
            Ok(Some((_, got))) if &got == data => kept_read += 1,
            other => out.fail(format!(
                "kept object {} does not read back: {:?}",
                twinlog::store::frames::hex(oid),
                other.map(|o| o.map(|(_, d)| d.len()))
            )),
        }
    }
    let mut secret_absent = 0u64;
    for oid in &secret_oids {
        if matches!(c.read_object("secret", *oid).await, Ok(None)) {
            secret_absent += 1;
        }
    }
    drop(c);
    primary.stop()?;
    twin.stop()?;
    let (after_p, files_p, bytes_p) = scan_for(&pair.pdir, mark)?;
    let (after_t, files_t, bytes_t) = scan_for(&pair.tdir, mark)?;
    for f in after_p.iter().chain(&after_t) {
        out.fail(format!("the erased marker is in {}", f.display()));
    }
    let (pv, tv) = (store_view(&pair.pdir)?, store_view(&pair.tdir)?);
    if pv != tv {
        out.fail("the twin's store (refs, objects) is not the primary's".into());
    }
    let kept_on_twin = tv
        .iter()
        .find(|(n, _, _)| n == "kept")
        .map_or(0, |(_, _, o)| {
            kept.iter().filter(|(k, _)| o.contains(&k.to_vec())).count()
        });
    if kept_on_twin != kept.len() {
        out.fail(format!(
            "the twin's store holds {kept_on_twin} of the {} kept objects",
            kept.len()
        ));
    }
    out.line(format!(
        "marker found before the erase in {} primary and {} twin files; after it, with the daemons running, gone in {}; after they stopped: {} of {files_p} primary files ({:.1} MiB) and {} of {files_t} twin files ({:.1} MiB) hold it",
        pre_p.len(),
        pre_t.len(),
        clean_live.map_or("(not within 20 s)".into(), |t| format!("{t:.2} s")),
        after_p.len(),
        bytes_p as f64 / 1048576.0,
        after_t.len(),
        bytes_t as f64 / 1048576.0
    ));
    out.line(format!(
        "{kept_read} of {} kept objects read back whole through the primary, {kept_on_twin} in the twin's store; {secret_absent} of {} secret objects absent",
        kept.len(),
        secret_oids.len()
    ));

    // A fresh box restored from the twin.
    let bdir = s.work.join("box");
    let (box_listen, box_metrics, restore_addr) = (free_udp()?, free_tcp()?, free_udp()?);
    let (bcfg, box_fp) = daemon::init_primary(&bdir, box_listen, box_metrics, Some(pair.twin_fp))
        .ctx(|| "init the box".into())?;
    let mut b = PrimaryConfig::load(&bcfg).ctx(|| "load the box's primary.toml".into())?;
    b.timers = fast_timers();
    b.segment_bytes = 1 << 20;
    std::fs::write(&bcfg, b.render()).ctx(|| "write the box's primary.toml".into())?;
    daemons::run(
        &s.bins.twin,
        &[
            "pin-restore",
            "--config",
            &pair.tcfg.display().to_string(),
            "--listen",
            &restore_addr.to_string(),
            &box_fp.to_string(),
        ],
    )?;
    twin.restart()?;
    let said = tokio::task::spawn_blocking({
        let (bin, bcfg, fp) = (
            s.bins.primary.clone(),
            bcfg.clone(),
            pair.twin_fp.to_string(),
        );
        move || {
            // The twin's restore endpoint may take a moment to come up.
            let mut last = Err(DrillError("no restore run".into()));
            for _ in 0..20 {
                last = daemons::run(
                    &bin,
                    &[
                        "restore",
                        "--config",
                        &bcfg.display().to_string(),
                        "--from",
                        &restore_addr.to_string(),
                        "--twin-fingerprint",
                        &fp,
                        "--json",
                    ],
                );
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            last
        }
    })
    .await
    .ctx(|| "the restore task".into())??;
    twin.stop()?;
    let report: serde_json::Value = said
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| DrillError(format!("no JSON report in {said:?}")))?;
    let (after_b, files_b, _) = scan_for(&bdir, mark)?;
    let (after_t2, _, _) = scan_for(&pair.tdir, mark)?;
    for f in after_b.iter().chain(&after_t2) {
        out.fail(format!("the erased marker is in {}", f.display()));
    }
    let (equal, differ, named) = compare_logs(&bdir.join(daemon::LOG_DIR), &tlog, 0)?;
    for n in named {
        out.fail(format!("the restored box and the twin differ: {n}"));
    }
    if differ > 0 {
        out.fail(format!(
            "{differ} frames of the restored box differ from the twin's"
        ));
    }
    let bv = store_view(&bdir)?;
    if bv != tv {
        out.fail("the restored box's store is not the twin's".into());
    }
    out.line(format!(
        "restored box: {equal} frames equal to the twin's, {} bytes received; the marker in {} of its {files_b} files, in {} twin files after serving it",
        report.get("received_bytes").and_then(serde_json::Value::as_u64).unwrap_or(0),
        after_b.len(),
        after_t2.len()
    ));
    out.fig("pushes", 2 * pushes);
    out.fig("erase_before", before);
    out.fig("marker_files_before", pre_p.len() + pre_t.len());
    out.fig("marker_files_after", after_p.len() + after_t.len());
    out.fig("marker_files_restored_box", after_b.len());
    out.fig("files_scanned", files_p + files_t + files_b);
    out.fig(
        "mib_scanned",
        tenths((bytes_p + bytes_t) as f64 / 1048576.0),
    );
    out.fig("clean_live_s", clean_live.map(tenths));
    out.fig("kept_read", kept_read);
    out.fig("kept_on_twin", kept_on_twin);
    out.fig("secret_absent", secret_absent);
    out.fig("restored_frames_equal", equal);
    out.fig("stores_equal", pv == tv && bv == tv);
    Ok(out)
}
