//! `promote`: clients append (two with `twin` durability, one `local`);
//! the primary is SIGKILLed at a random acknowledgement, the twin stopped
//! and promoted with `twin promote`. The old primary is restarted and its
//! clients go on appending to it; the promoted box's own twin daemon is
//! started against it by mistake. Then the promoted box is served as a
//! primary.
//!
//! Invariant: the promoted box serves every frame acknowledged as `Twin`,
//! byte for byte, through the client protocol; its twin daemon is refused
//! by epoch and writes nothing; no frame the old primary took after the
//! promotion ever reaches the promoted box's log; a new append on the
//! promoted box lands right after the head it was promoted with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use twinlog::log::Log;
use twinlog::node::Durability;

use drills::daemons::{self, free_tcp, free_udp, read_log, tail_head, Pair, PairOpts, Proc};
use drills::{Context, DrillError, Result};

use crate::{holds, small_len, Dial, Load, Outcome, Setup, APP_KIND};

pub async fn run(mut s: Setup) -> Result<Outcome> {
    let mut out = Outcome::new(
        "promote",
        "the promoted box serves every twin-acknowledged frame; the old primary is refused by epoch",
    );
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
    let load = Load::new("before", small_len);
    let mut workers = load.spawn(&dial, 2, 0, Durability::Twin, Duration::ZERO);
    workers.extend(load.spawn(
        &dial,
        1,
        1 << 40,
        Durability::Local,
        Duration::from_millis(3),
    ));
    let at = 50 + s.rng.below(400) as usize;
    if !load
        .progress(at, Durability::Twin, Duration::from_secs(30))
        .await
    {
        return Err(DrillError(format!(
            "{at} twin acknowledgements did not come in 30 s"
        )));
    }
    primary.sigkill()?;
    let killed_at = Instant::now();
    load.halt(workers).await;
    twin.stop()?;
    let acked = load.acked();
    let twin_acked: Vec<_> = acked
        .iter()
        .filter(|a| a.got == Durability::Twin)
        .copied()
        .collect();
    let local_acked = acked.len() - twin_acked.len();
    {
        let log = Log::open_with(&tlog, 1 << 20).ctx(|| "open the twin's log".into())?;
        for a in &twin_acked {
            if !holds(&log, &load, a) {
                out.fail(format!(
                    "frame {} acknowledged as Twin is not on the stopped twin's log",
                    a.seq
                ));
            }
        }
    }
    let local_lost = acked
        .iter()
        .filter(|a| a.got == Durability::Local)
        .filter(|a| {
            read_log(&tlog, a.seq, 0)
                .ok()
                .and_then(|m| m.get(&a.seq).cloned())
                .is_none_or(|f| f.meta != load.frame(a.n).0)
        })
        .count();

    // Promote with the binary.
    let (new_listen, new_metrics) = (free_udp()?, free_tcp()?);
    let said = daemons::run(
        &s.bins.twin,
        &[
            "promote",
            "--config",
            &pair.tcfg.display().to_string(),
            "--listen",
            &new_listen.to_string(),
            "--metrics",
            &new_metrics.to_string(),
        ],
    )?;
    let promoted_head = tail_head(&tlog);
    let epoch_line = said
        .lines()
        .find(|l| l.starts_with("promoted at epoch"))
        .unwrap_or_default()
        .to_owned();
    out.line(format!(
        "primary killed after {} twin acknowledgements; {epoch_line}",
        twin_acked.len()
    ));
    if !epoch_line.contains("epoch 1") {
        out.fail(format!("promote said {said:?}; epoch 1 was due"));
    }
    let new_cfg = pair.tdir.join(twinlog::daemon::PRIMARY_CONFIG);

    // The old primary comes back and takes appends; the promoted box's
    // twin daemon is started against it by mistake.
    primary.restart()?;
    let mut mistaken = Proc::serve(
        &s.bins.twin,
        &pair.tcfg,
        &s.work.join("twin-after-promote.stderr"),
    )?;
    let old_load = Load::new("old-after-promote", small_len);
    let old_workers = old_load.spawn(&dial, 2, 0, Durability::Local, Duration::from_millis(2));
    let refused = daemons::wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
        daemons::twin_status(pair.twin_metrics)
            .ok()
            .and_then(|st| st.last_error)
            .filter(|e| e.contains("epoch"))
    })
    .await;
    match &refused {
        Some(why) => out.line(format!(
            "the box's twin daemon, pointed at the old primary: {why}"
        )),
        None => out.fail("the box's twin daemon was not refused by epoch within 20 s".into()),
    }
    // A `twin` append on the old primary must not be acknowledged as such:
    // no twin of the new epoch will take its frames.
    let old_client = daemons::connect(
        &admin,
        pair.primary_fp,
        pair.listen,
        Duration::from_secs(10),
    )
    .await?;
    let old_twin_append = tokio::time::timeout(
        Duration::from_secs(3),
        old_client.append(APP_KIND, b"old twin append", b"x", Durability::Twin),
    )
    .await;
    let old_twin_acked = matches!(old_twin_append, Ok(Ok((_, Durability::Twin))));
    if old_twin_acked {
        out.fail("the old primary acknowledged a `twin` append after the promotion".into());
    }
    if !old_load
        .progress(20, Durability::Local, Duration::from_secs(10))
        .await
    {
        out.fail("the restarted old primary took no appends".into());
    }
    let head_while_mistaken = tail_head(&tlog);
    if head_while_mistaken != promoted_head {
        out.fail(format!(
            "the box's log moved from {promoted_head} to {head_while_mistaken} while its twin daemon faced the old primary"
        ));
    }
    mistaken.stop()?;

    // The promoted box as a primary, the old one still taking appends.
    let np = twinlog::daemon::PrimaryConfig::load(&new_cfg)
        .ctx(|| "the promoted primary.toml".into())?;
    let mut promoted = Proc::serve(&s.bins.primary, &new_cfg, &s.work.join("promoted.stderr"))?;
    let new_admin = daemons::admin_identity(&pair.tdir)?;
    let listen = np
        .listen
        .resolve()
        .ctx(|| "the promoted listen address".into())?;
    let client =
        daemons::connect(&new_admin, pair.twin_fp, listen, Duration::from_secs(20)).await?;
    let mut served = 0u64;
    for a in &twin_acked {
        let (meta, blob) = load.frame(a.n);
        match client.read(a.seq).await {
            Ok(e) if e.meta == meta && e.blob == blob => served += 1,
            Ok(e) => out.fail(format!(
                "the promoted box serves another frame at {}: meta {:?}",
                a.seq,
                String::from_utf8_lossy(&e.meta)
            )),
            Err(e) => out.fail(format!(
                "the promoted box cannot serve frame {}: {e}",
                a.seq
            )),
        }
    }
    let mut new_seqs = Vec::new();
    for i in 0..20u64 {
        match client
            .append(
                APP_KIND,
                &crate::small_meta("new", i),
                &crate::small_blob(i, 100),
                Durability::Local,
            )
            .await
        {
            Ok((seq, _)) => new_seqs.push(seq),
            Err(e) => out.fail(format!("an append on the promoted box failed: {e}")),
        }
    }
    if new_seqs.first() != Some(&(promoted_head + 1)) {
        out.fail(format!(
            "the promoted box's first new frame is at {:?}, {} was due",
            new_seqs.first(),
            promoted_head + 1
        ));
    }
    old_load.halt(old_workers).await;
    let old_acked = old_load.acked().len();
    drop((client, old_client));
    promoted.stop()?;
    primary.stop()?;

    // No frame of the old primary's after the promotion on the promoted log.
    let frames = read_log(&tlog, 0, 0)?;
    let strays = frames
        .values()
        .filter(|f| f.meta.starts_with(b"old-after-promote") || f.meta == b"old twin append")
        .count();
    if strays > 0 {
        out.fail(format!(
            "{strays} frames the old primary took after the promotion are on the promoted box's log"
        ));
    }
    let after: Vec<_> = frames.range(promoted_head + 1..).collect();
    if after.len() != new_seqs.len() || after.iter().any(|(_, f)| !f.meta.starts_with(b"new ")) {
        out.fail(format!(
            "past the promoted head the box holds {} frames, {} new appends were made",
            after.len(),
            new_seqs.len()
        ));
    }
    let old_head = tail_head(&plog);
    let epoch = twinlog::node::epoch::Epochs::load(&pair.tdir, promoted_head)
        .ctx(|| "the promoted box's epoch".into())?
        .current();
    if epoch != 1 {
        out.fail(format!("the promoted box's epoch is {epoch}, 1 was due"));
    }
    out.line(format!(
        "{} frames acknowledged before the kill ({} as twin, {local_acked} as local, {local_lost} local ones not on the twin); the promoted box served {served} of the {} twin ones",
        acked.len(),
        twin_acked.len(),
        twin_acked.len()
    ));
    out.line(format!(
        "after the promotion the old primary took {old_acked} local appends (its head {old_head}); none reached the promoted box (head {promoted_head} + {} new)",
        new_seqs.len()
    ));
    out.fig("acked_twin", twin_acked.len());
    out.fig("acked_local", local_acked);
    out.fig("local_not_on_twin", local_lost);
    out.fig("served", served);
    out.fig("promoted_head", promoted_head);
    out.fig("epoch", epoch);
    out.fig("refused_by_epoch", refused.is_some());
    out.fig("old_appends_after_promotion", old_acked);
    out.fig("old_twin_append_acked", old_twin_acked);
    out.fig("strays_on_promoted_log", strays);
    out.fig("new_appends", new_seqs.len());
    out.fig(
        "kill_to_served_s",
        daemons::tenths(killed_at.elapsed().as_secs_f64()),
    );
    Ok(out)
}
