//! `promote`: clients append (two with `twin` durability, one `local`);
//! the primary is SIGKILLed at a random acknowledgement, the twin stopped
//! and promoted with `twin promote` as a careful operator does it: refused
//! at once (the twin heard its primary a moment ago), accepted once the
//! twin's `promote_quiet_ms` has passed. The promoted box is served as a
//! primary; the old primary comes back and its clients go on appending to
//! it, until the promoted box's call reaches it.
//!
//! Invariant: the stopped twin's log holds every frame acknowledged as
//! `Twin`, and the promoted box serves each of them byte for byte; once
//! the promoted box's status says its predecessor heard (the predecessor
//! call), the old primary is fenced by the promoted box's epoch, its log
//! does not grow and it acknowledges no write, `local` or `twin`; no frame
//! the old primary took ever reaches the promoted box's log; new appends
//! on the promoted box land right after the head it was promoted with; the
//! box's own twin daemon, pointed at the old primary by mistake, is
//! refused by epoch and writes nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use twinlog::daemon::TwinConfig;
use twinlog::log::Log;
use twinlog::node::Durability;
use twinlog::repl::epochs::EpochName;

use drills::daemons::{self, free_tcp, free_udp, read_log, tail_head, Pair, PairOpts, Proc};
use drills::{Context, DrillError, Result};

use crate::{holds, small_len, Dial, Load, Outcome, Setup, APP_KIND};

/// The twin's quiet window in this drill: two of the intervals at which a
/// twin records that it heard its primary (1 s), forty heartbeats.
pub const QUIET_MS: u64 = 2000;

/// The promoted box's epoch: the first of term 1.
const PROMOTED: u64 = 1 << 32;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

pub async fn run(mut s: Setup) -> Result<Outcome> {
    let mut out = Outcome::new(
        "promote",
        "the promoted box serves every twin-acknowledged frame; once it told its predecessor, the old primary takes no write",
    );
    let pair = Pair::init(&s.work, &PairOpts::default())?;
    {
        let mut t = TwinConfig::load(&pair.tcfg).ctx(|| "load twin.toml".into())?;
        t.promote_quiet_ms = QUIET_MS;
        std::fs::write(&pair.tcfg, t.render()).ctx(|| "write twin.toml".into())?;
    }
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
    // An append in flight at the kill was not acknowledged: stop at once.
    for w in workers {
        w.abort();
    }
    twin.stop()?;
    let t_stopped = Instant::now();
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

    // Promote with the binary, without --force: refused while the twin's
    // quiet window runs, then accepted. `--force-promote` forces it at
    // once, as the failover bench does, to compare the two.
    let forced = s.args.flag("force-promote");
    let (new_listen, new_metrics) = (free_udp()?, free_tcp()?);
    let tcfg = pair.tcfg.display().to_string();
    let (new_listen_s, new_metrics_s) = (new_listen.to_string(), new_metrics.to_string());
    let promote_args = [
        "promote",
        "--config",
        &tcfg,
        "--listen",
        &new_listen_s,
        "--metrics",
        &new_metrics_s,
        "--twin-fingerprint",
        &pair.primary_fp.to_string(),
        "--force",
    ]
    .map(str::to_owned);
    let promote = || {
        let n = promote_args.len() - usize::from(!forced);
        let args: Vec<&str> = promote_args[..n].iter().map(String::as_str).collect();
        daemons::run(&s.bins.twin, &args)
    };
    let first_refusal = match forced {
        true => None,
        false => match promote() {
            Ok(said) => {
                out.fail(format!(
                    "`twin promote` right after the kill was accepted: {said:?}"
                ));
                None
            }
            Err(e) if e.0.contains("heard its primary") => Some(e.0),
            Err(e) => return Err(e),
        },
    };
    let mut refusals = u64::from(first_refusal.is_some());
    let mut said = String::new();
    let mut t_promote_started = Instant::now();
    let deadline = Instant::now() + Duration::from_millis(QUIET_MS) + Duration::from_secs(20);
    while said.is_empty() {
        t_promote_started = Instant::now();
        match promote() {
            Ok(text) => said = text,
            Err(e) if e.0.contains("heard its primary") && Instant::now() < deadline => {
                refusals += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
    let t_promoted = Instant::now();
    let promoted_head = tail_head(&tlog);
    let epoch_line = said
        .lines()
        .find(|l| l.starts_with("promoted at epoch"))
        .unwrap_or_default()
        .to_owned();
    out.line(format!(
        "primary killed after {} twin acknowledgements; `twin promote` refused {refusals} times within the {QUIET_MS} ms quiet window, then {epoch_line}",
        twin_acked.len()
    ));
    if let Some(why) = &first_refusal {
        let said = why
            .find("this twin heard")
            .map_or(why.as_str(), |at| &why[at..]);
        out.line(format!("the first refusal: {said}"));
    }
    if !epoch_line.contains(&format!("epoch {}", EpochName(PROMOTED))) {
        out.fail(format!(
            "promote said {said:?}; epoch {} was due",
            EpochName(PROMOTED)
        ));
    }
    let new_cfg = pair.tdir.join(twinlog::daemon::PRIMARY_CONFIG);
    let np = twinlog::daemon::PrimaryConfig::load(&new_cfg)
        .ctx(|| "the promoted primary.toml".into())?;
    let mut promoted = Proc::serve(&s.bins.primary, &new_cfg, &s.work.join("promoted.stderr"))?;
    daemons::wait_for(Duration::from_secs(20), Duration::from_millis(2), || {
        daemons::primary_status(new_metrics).ok()
    })
    .await
    .ok_or_else(|| DrillError("the promoted box did not serve its status in 20 s".into()))?;
    let t_served = Instant::now();

    // The old primary comes back as it was and its clients go on: it may
    // take `local` writes until the promoted box's call reaches it.
    primary.restart()?;
    let old_load = Load::new("old-after-promote", small_len);
    let old_workers = old_load.spawn(&dial, 2, 0, Durability::Local, Duration::from_millis(2));
    let told = daemons::wait_for(Duration::from_secs(30), Duration::from_millis(5), || {
        daemons::primary_status(new_metrics)
            .ok()
            .and_then(|st| st.predecessor)
            .filter(|p| p.told)
    })
    .await;
    let t_told = Instant::now();
    let (old_head_told, old_fence) = match &told {
        None => {
            out.fail("the promoted box's status never said its predecessor heard (30 s)".into());
            (u64::MAX, None)
        }
        Some(p) => {
            let st = daemons::primary_status(pair.primary_metrics)?;
            out.line(format!(
                "the promoted box told its predecessor at {} (epoch {}) after {} calls; the old primary's status: {}",
                p.addr,
                EpochName(p.epoch),
                p.attempts,
                st.fenced.as_ref().map_or("not fenced".to_owned(), |f| format!(
                    "fenced by epoch {}{} ({})",
                    EpochName(f.epoch),
                    if f.held { ", held" } else { "" },
                    f.by
                ))
            ));
            (st.head, st.fenced)
        }
    };
    match &old_fence {
        Some(f) if f.epoch == PROMOTED && !f.held => {}
        other => out.fail(format!(
            "once told, the old primary is fenced by {other:?}; epoch {} (proven, not a hold) was due",
            EpochName(PROMOTED)
        )),
    }
    let old_before_told = old_load.acked().len();
    let old_errors_at_told = old_load.errors.load(Ordering::SeqCst);
    // Told: from here on it acknowledges nothing, `local` or `twin`.
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
    let old_twin_acked = matches!(old_twin_append, Ok(Ok(_)));
    if old_twin_acked {
        out.fail(format!(
            "the told old primary acknowledged an append: {old_twin_append:?}"
        ));
    }
    // Its clients keep trying while the promoted box is checked.
    let mut served = 0u64;
    let new_admin = daemons::admin_identity(&pair.tdir)?;
    let listen = np
        .listen
        .resolve()
        .ctx(|| "the promoted listen address".into())?;
    let client =
        daemons::connect(&new_admin, pair.twin_fp, listen, Duration::from_secs(20)).await?;
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
    // A second of the old clients' tries after the call was heard.
    let tried_until = t_told + Duration::from_secs(1);
    tokio::time::sleep(tried_until.saturating_duration_since(Instant::now())).await;
    old_load.halt(old_workers).await;
    let old_acked = old_load.acked();
    let old_errors = old_load.errors.load(Ordering::SeqCst) - old_errors_at_told;
    let past_told: Vec<u64> = old_acked
        .iter()
        .filter(|a| a.seq > old_head_told)
        .map(|a| a.seq)
        .collect();
    if !past_told.is_empty() {
        out.fail(format!(
            "the old primary acknowledged {} appends past its head {old_head_told} when it was told (first {:?})",
            past_told.len(),
            &past_told[..past_told.len().min(5)]
        ));
    }
    drop((client, old_client));
    promoted.stop()?;
    primary.stop()?;
    let old_head = tail_head(&plog);
    if told.is_some() && old_head != old_head_told {
        out.fail(format!(
            "the old primary's log grew from {old_head_told} (told) to {old_head}"
        ));
    }

    // The promoted box's own twin daemon, pointed at the old primary by
    // mistake: refused by epoch, its log untouched.
    let head_before_mistake = tail_head(&tlog);
    primary.restart()?;
    let mut mistaken = Proc::serve(
        &s.bins.twin,
        &pair.tcfg,
        &s.work.join("twin-after-promote.stderr"),
    )?;
    let refused = daemons::wait_for(Duration::from_secs(20), Duration::from_millis(20), || {
        daemons::twin_status(pair.twin_metrics)
            .ok()
            .and_then(|st| st.last_error)
            .filter(|e| e.contains("epoch"))
    })
    .await;
    mistaken.stop()?;
    primary.stop()?;
    match &refused {
        Some(why) => out.line(format!(
            "the box's twin daemon, pointed at the old primary: {why}"
        )),
        None => out.fail("the box's twin daemon was not refused by epoch within 20 s".into()),
    }
    let head_after_mistake = tail_head(&tlog);
    if head_after_mistake != head_before_mistake {
        out.fail(format!(
            "the box's log moved from {head_before_mistake} to {head_after_mistake} while its twin daemon faced the old primary"
        ));
    }

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
    let epoch = twinlog::node::epoch::Epochs::load(&pair.tdir, promoted_head)
        .ctx(|| "the promoted box's epoch".into())?
        .current();
    if epoch != PROMOTED {
        out.fail(format!(
            "the promoted box's epoch is {}, {} was due",
            EpochName(epoch),
            EpochName(PROMOTED)
        ));
    }
    let kill_to_served = t_served - killed_at;
    out.line(format!(
        "{} frames acknowledged before the kill ({} as twin, {local_acked} as local, {local_lost} local ones not on the twin); the promoted box served {served} of the {} twin ones",
        acked.len(),
        twin_acked.len(),
        twin_acked.len()
    ));
    out.line(format!(
        "kill to served {} ms: twin stopped {} ms, quiet window waited out {} ms, promote {} ms, serve to its status {} ms; told {} ms after the old primary's restart",
        ms(kill_to_served),
        ms(t_stopped - killed_at),
        ms(t_promote_started - t_stopped),
        ms(t_promoted - t_promote_started),
        ms(t_served - t_promoted),
        ms(t_told - t_served),
    ));
    out.line(format!(
        "the old primary took {old_before_told} local appends before it was told (its head then {old_head_told}), none after ({} refused); none reached the promoted box (head {promoted_head} + {} new)",
        old_errors,
        new_seqs.len()
    ));
    out.fig("acked_twin", twin_acked.len());
    out.fig("acked_local", local_acked);
    out.fig("local_not_on_twin", local_lost);
    out.fig("served", served);
    out.fig("promoted_head", promoted_head);
    out.fig("epoch", EpochName(epoch).to_string());
    out.fig("promote_refusals", refusals);
    out.fig("forced", forced);
    out.fig("predecessor_told", told.is_some());
    out.fig("old_acks_before_told", old_before_told);
    out.fig("old_acks_after_told", past_told.len());
    out.fig("old_refused_after_told", old_errors);
    out.fig("old_twin_append_acked", old_twin_acked);
    out.fig("refused_by_epoch", refused.is_some());
    out.fig("strays_on_promoted_log", strays);
    out.fig("new_appends", new_seqs.len());
    out.fig("kill_to_served_ms", ms(kill_to_served));
    out.fig("stop_twin_ms", ms(t_stopped - killed_at));
    out.fig("quiet_wait_ms", ms(t_promote_started - t_stopped));
    out.fig("promote_ms", ms(t_promoted - t_promote_started));
    out.fig("serve_ms", ms(t_served - t_promoted));
    out.fig("restart_to_told_ms", ms(t_told - t_served));
    Ok(out)
}
