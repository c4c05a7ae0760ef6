//! `failover-cycle`: `--rounds` cycles (5 by default) of the whole failover
//! cycle with the real binaries, on two boxes whose roles swap back and
//! forth:
//!
//! 1. writers append to the primary X (two `twin`, one `local`); in most
//!    rounds its twin Y is frozen (SIGSTOP) for a moment so that X holds
//!    a `local` tail Y never saw, and then SIGKILLed where it stands (a
//!    thawed Y would still take what sits in its socket buffer); in the
//!    others Y keeps following and is stopped after X;
//! 2. X is SIGKILLed under the writers; Y is promoted with `twin promote
//!    --twin-fingerprint X`, without `--force`: the drill waits out Y's
//!    `promote_quiet_ms` (2 s here) as a careful operator does, since a
//!    twin that heard its primary a moment ago cannot tell a dead primary
//!    from a cut link; then `primary serve`;
//! 3. X is served again as a primary and held at once with `primary
//!    fence` (a hold, naming no epoch); Y's call to its predecessor then
//!    reaches X, which is fenced by Y's epoch from then on; writers try
//!    it; stopped; `primary rejoin` makes it Y's twin, and `twin serve`
//!    starts it;
//! 4. `primary switchover` on Y hands the role back to X under writers that
//!    follow the `Fenced` redirect; in even rounds a second switchover hands
//!    it forward to Y again, so the box killed alternates.
//!
//! Invariants, checked after every cycle: every frame acknowledged `twin`
//! in any cycle is on the current primary byte for byte; the frames the
//! rejoin saved are exactly X's frames past the fork (read from X's log
//! before the rejoin) and hold every `local` acknowledgement past it; X's
//! log is its old log cut at the fork; the rejoined twin received the
//! frames past the fork and nothing like the whole log (frame-stream bytes
//! between what it held and what the new primary had; wire bytes at most
//! 1.5 times those plus 64 KiB; no snapshot); the old primary, once
//! promoted over, acknowledges nothing, and nothing it acknowledged is
//! missing from the current primary; no append waits more than 5 s across
//! a switchover. At the end both logs are equal.
//!
//! `--broken no-fence`: the old primary is neither held nor called (the
//! promoted box's `PREDECESSOR` is deleted before it serves, and the old
//! primary's start after its crash is released by hand), and its
//! writers go on appending to it after the promotion; the checker must
//! find those acknowledgements lost. `--broken no-save`: the saved tail is deleted
//! after the rejoin; the checker must notice. Both must fail.

mod boxes;
mod checks;
mod writers;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use twinlog::daemon::TwinConfig;
use twinlog::log::Log;
use twinlog::node::Durability;
use twinlog::repl::epochs::EpochName;

use drills::daemons::{self, free_udp, read_log, Pair, PairOpts, Proc};
use drills::{Context, DrillError, Result};

use boxes::{promote, pstatus, signal, tstatus, until, Host};
use checks::{check_saved, stopped_frames, wire};
use writers::{pause, Ack, Writers};

use crate::{small_blob, Outcome, Setup, APP_KIND};

/// What the run adds up across cycles.
#[derive(Default)]
struct Totals {
    twin_acked: Vec<Ack>,
    local_acked: u64,
    saved_frames: u64,
    rejoin_received: u64,
    rejoin_due: u64,
    rejoin_ratio_max: f64,
    prefix_bytes_max: u64,
    snapshots: u64,
    switchovers: u64,
    switchover_pause_max: Duration,
    kill_to_twin_ack_max: Duration,
    /// From the kill to `twin promote` accepted: the quiet window.
    kill_to_promoted_max: Duration,
    old_acked_after_promotion: u64,
    natural_rounds: u64,
    promote_refusals: u64,
}

pub async fn run(mut s: Setup) -> Result<Outcome> {
    let mut out = Outcome::new(
        "failover-cycle",
        "every twin-acknowledged frame on the current primary; the saved tail exactly the frames past the fork; a rejoin moves only those; a fenced primary acknowledges nothing",
    );
    let broken = s.args.0.get("broken").cloned().unwrap_or_default();
    if !matches!(broken.as_str(), "" | "no-fence" | "no-save") {
        return Err(DrillError(format!(
            "--broken {broken}: no-fence or no-save"
        )));
    }
    let rounds = if s.rounds == 0 { 5 } else { s.rounds };
    let pair = Pair::init(&s.work, &PairOpts::default())?;
    let b_listen = free_udp()?;
    {
        let mut t = TwinConfig::load(&pair.tcfg).ctx(|| "B's twin.toml".into())?;
        t.listen_as_primary = b_listen.into();
        std::fs::write(&pair.tcfg, t.render()).ctx(|| "write B's twin.toml".into())?;
    }
    let mut boxes = [
        Host {
            name: "a",
            data: pair.pdir.clone(),
            fp: pair.primary_fp,
            listen: pair.listen,
            metrics: pair.primary_metrics,
            daemon: None,
        },
        Host {
            name: "b",
            data: pair.tdir.clone(),
            fp: pair.twin_fp,
            listen: b_listen,
            metrics: pair.twin_metrics,
            daemon: None,
        },
    ];
    let bins = s.bins.clone();
    let work = s.work.clone();
    boxes[0].daemon = Some(Proc::serve(
        &bins.primary,
        &pair.pcfg,
        &boxes[0].stderr(&work),
    )?);
    boxes[1].daemon = Some(Proc::serve(
        &bins.twin,
        &pair.tcfg,
        &boxes[1].stderr(&work),
    )?);
    until("B follows A", Duration::from_secs(20), || {
        tstatus(boxes[1].metrics).filter(|t| t.connected)
    })
    .await?;

    let mut totals = Totals::default();
    // 8 MiB before the first cycle: a rejoin that copied the log would show.
    {
        let admin = boxes[0].admin()?;
        let c = daemons::connect(
            &admin,
            boxes[0].fp,
            boxes[0].listen,
            Duration::from_secs(10),
        )
        .await?;
        for n in 0..128u64 {
            let blob = small_blob(n, 64 << 10);
            let meta = format!("preload {n}").into_bytes();
            let (seq, got) = c
                .append(APP_KIND, &meta, &blob, Durability::Twin)
                .await
                .ctx(|| format!("preload append {n}"))?;
            if got != Durability::Twin {
                out.fail(format!("preload frame {seq} acknowledged {got:?}"));
            }
        }
    }
    let preloaded = daemons::read_log(&boxes[0].log(), 0, 1 << 20)?;

    let mut primary = 0usize;
    // Every promotion, and every switchover, begins the next term; its
    // first epoch is `term.0`.
    let mut term = 0u64;
    let mut epoch: u64;
    for round in 1..=rounds {
        let (x, y) = (primary, 1 - primary);
        let natural = round % 3 == 0;
        totals.natural_rounds += u64::from(natural);
        eprintln!(
            "== round {round}/{rounds}: kill {} (primary), promote {}{}",
            boxes[x].name,
            boxes[y].name,
            if natural { ", twin left running" } else { "" }
        );
        // 1. Writers on X; a tail Y never sees.
        let admin_x = boxes[x].admin()?;
        let w1 = Writers::start(
            &admin_x,
            boxes[x].fp,
            boxes[x].listen,
            &format!("r{round}-one"),
            &[Durability::Twin, Durability::Twin, Durability::Local],
            Duration::ZERO,
        );
        let at = 30 + s.rng.below(200) as usize;
        if !w1.more(at, Durability::Twin, Duration::from_secs(30)).await {
            return Err(DrillError(format!(
                "round {round}: {at} twin acknowledgements did not come in 30 s"
            )));
        }
        if !natural {
            if let Some(d) = &boxes[y].daemon {
                signal(d, libc::SIGSTOP)?;
            }
            let acked = until("X's status", Duration::from_secs(5), || {
                pstatus(boxes[x].metrics)
            })
            .await?
            .twin_acked;
            let tail = 20 + s.rng.below(200);
            until("a local tail on X", Duration::from_secs(20), || {
                pstatus(boxes[x].metrics).filter(|st| st.head >= acked + tail)
            })
            .await?;
        }
        // 2. X killed under the writers; Y stopped and promoted.
        boxes[x].daemon.as_mut().map(Proc::sigkill).transpose()?;
        let killed = Instant::now();
        let w1_acked = w1.abort();
        if natural {
            boxes[y].daemon.as_mut().map(Proc::stop).transpose()?;
        } else {
            boxes[y].daemon.as_mut().map(Proc::sigkill).transpose()?;
        }
        boxes[x].daemon = None;
        boxes[y].daemon = None;
        // Opened, not tailed: a tail stops at the last frame whose index
        // entry a SIGKILL left unwritten, and promote opens the log.
        let promoted_head = Log::open_with(boxes[y].log(), 1 << 20)
            .ctx(|| "open the stopped twin's log".into())?
            .head_seq();
        let x_head_killed = Log::open_with(boxes[x].log(), 1 << 20)
            .ctx(|| "open the killed primary's log".into())?
            .head_seq();
        for a in &w1_acked {
            match a.got {
                Durability::Twin => totals.twin_acked.push(a.clone()),
                _ => totals.local_acked += 1,
            }
        }
        let (said, refusals) = promote(&bins, &boxes[y], &boxes[x]).await?;
        totals.promote_refusals += refusals;
        totals.kill_to_promoted_max = totals.kill_to_promoted_max.max(killed.elapsed());
        term += 1;
        epoch = term << 32;
        if !said.contains(&format!(
            "promoted at epoch {} with head {promoted_head}",
            EpochName(epoch)
        )) {
            out.fail(format!(
                "round {round}: promote said {said:?}; epoch {} at head {promoted_head} was due",
                EpochName(epoch)
            ));
        }
        if broken == "no-fence" {
            // The promoted box does not call the box it replaced.
            std::fs::remove_file(
                boxes[y]
                    .data
                    .join(twinlog::node::predecessor::PREDECESSOR_FILE),
            )
            .ctx(|| "remove PREDECESSOR".into())?;
        }
        boxes[y].daemon = Some(Proc::serve(
            &bins.primary,
            &boxes[y].primary_cfg(),
            &boxes[y].stderr(&work),
        )?);
        until("the promoted box serves", Duration::from_secs(20), || {
            pstatus(boxes[y].metrics)
        })
        .await?;
        let admin_y = boxes[y].admin()?;
        let w2 = Writers::start(
            &admin_y,
            boxes[y].fp,
            boxes[y].listen,
            &format!("r{round}-two"),
            &[Durability::Twin, Durability::Twin, Durability::Local],
            Duration::from_millis(1),
        );
        w2.more(20, Durability::Local, Duration::from_secs(20))
            .await;

        // 3. X back as a primary: fenced, it acknowledges nothing.
        boxes[x].daemon = Some(Proc::serve(
            &bins.primary,
            &boxes[x].primary_cfg(),
            &boxes[x].stderr(&work),
        )?);
        until("the old primary serves", Duration::from_secs(20), || {
            pstatus(boxes[x].metrics)
        })
        .await?;
        if broken == "no-fence" {
            // Nor held by its start after the crash: released by hand.
            daemons::run(
                &bins.primary,
                &[
                    "release",
                    "--config",
                    &boxes[x].primary_cfg().display().to_string(),
                ],
            )?;
        }
        if broken != "no-fence" {
            // The operator's hold, until the promoted box's call arrives.
            daemons::run(
                &bins.primary,
                &[
                    "fence",
                    "--config",
                    &boxes[x].primary_cfg().display().to_string(),
                ],
            )?;
            let st = pstatus(boxes[x].metrics).unwrap_or_default();
            if !st
                .fenced
                .as_ref()
                .is_some_and(|f| f.held || f.epoch == epoch)
            {
                out.fail(format!(
                    "round {round}: the old primary's status after `primary fence`: fenced {:?}",
                    st.fenced
                ));
            }
            // The call heard: fenced by the promoted box's epoch, proven,
            // which the hold gives way to.
            until(
                "the promoted box tells its predecessor",
                Duration::from_secs(30),
                || {
                    pstatus(boxes[y].metrics)
                        .and_then(|st| st.predecessor)
                        .filter(|p| p.told)
                },
            )
            .await?;
            let st = pstatus(boxes[x].metrics).unwrap_or_default();
            if !st
                .fenced
                .as_ref()
                .is_some_and(|f| !f.held && f.epoch == epoch)
            {
                out.fail(format!(
                    "round {round}: once told, the old primary is fenced {:?}; by epoch {} was due",
                    st.fenced,
                    EpochName(epoch)
                ));
            }
        }
        // Its old clients try it: twin appends (no twin of its epoch will
        // take them) and local ones.
        let w_old = Writers::start(
            &admin_x,
            boxes[x].fp,
            boxes[x].listen,
            &format!("r{round}-old"),
            &[Durability::Local, Durability::Local, Durability::Twin],
            Duration::from_millis(2),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let old_fenced = w_old.fenced.load(Ordering::SeqCst);
        let old_acked = w_old.abort();
        totals.old_acked_after_promotion += old_acked.len() as u64;
        if broken != "no-fence" && old_fenced == 0 {
            out.fail(format!(
                "round {round}: the fenced old primary answered no append `Fenced`"
            ));
        }
        boxes[x].daemon.as_mut().map(Proc::stop).transpose()?;
        boxes[x].daemon = None;
        // A copy of the old primary's frames around and past the fork,
        // taken before the rejoin cuts them.
        let (x_head, x_before) = stopped_frames(&boxes[x].log(), promoted_head.saturating_sub(50))?;
        if broken != "no-fence" && x_head != x_head_killed {
            out.fail(format!(
                "round {round}: the fenced old primary's log grew from {x_head_killed} to {x_head}"
            ));
        }

        // The rejoin.
        let said = daemons::run(
            &bins.primary,
            &[
                "rejoin",
                "--config",
                &boxes[x].primary_cfg().display().to_string(),
                "--primary",
                &boxes[y].listen.to_string(),
                "--primary-fingerprint",
                &boxes[y].fp.to_string(),
                "--metrics",
                &boxes[x].metrics.to_string(),
            ],
        )?;
        if broken == "no-save" {
            for t in twinlog::node::divergent::list(&boxes[x].data).ctx(|| "list".into())? {
                let _ = std::fs::remove_file(
                    boxes[x]
                        .data
                        .join(twinlog::node::divergent::DIVERGENT_DIR)
                        .join(&t.file),
                );
            }
        }
        let fork = check_saved(
            &mut out,
            round,
            epoch,
            &boxes[x].data,
            promoted_head,
            x_head,
            &x_before,
            &w1_acked,
            &old_acked,
        );
        if fork != Some(promoted_head) {
            out.fail(format!(
                "round {round}: the rejoin forked at {fork:?}, the promoted head was {promoted_head} ({})",
                said.lines().next().unwrap_or_default()
            ));
        }
        let fork = fork.unwrap_or(promoted_head);
        totals.saved_frames += x_head.saturating_sub(fork);
        {
            let (cut_head, cut) =
                stopped_frames(&boxes[x].log(), promoted_head.saturating_sub(50))?;
            let kept_same = cut.iter().all(|(seq, f)| x_before.get(seq) == Some(f));
            if cut_head != fork || !kept_same {
                out.fail(format!(
                    "round {round}: after the rejoin the old primary's log ends at {cut_head} (fork {fork}), its frames {} as before",
                    if kept_same { "the same" } else { "NOT the same" }
                ));
            }
        }
        let prefix_bytes: u64 = read_log(&boxes[x].log(), 0, 0)?.values().map(wire).sum();

        // X follows Y: only the frames past the fork move.
        boxes[x].daemon = Some(Proc::serve(
            &bins.twin,
            &boxes[x].twin_cfg(),
            &boxes[x].stderr(&work),
        )?);
        let y_head = until("the new primary's head", Duration::from_secs(5), || {
            pstatus(boxes[y].metrics)
        })
        .await?
        .head;
        let caught = until(
            "the rejoined twin catches up",
            Duration::from_secs(30),
            || tstatus(boxes[x].metrics).filter(|t| t.connected && t.head >= y_head),
        )
        .await?;
        // The new primary ships a group before its own fsync: the twin may
        // have received frames past the primary's durable head. Groups are
        // made durable in order, so once the head moves past a reading
        // taken after the twin's, that group is durable and counted.
        let y_head_read = until("the new primary's head", Duration::from_secs(5), || {
            pstatus(boxes[y].metrics)
        })
        .await?
        .head;
        let y_head_after = until(
            "the new primary's head moves",
            Duration::from_secs(5),
            || pstatus(boxes[y].metrics).filter(|st| st.head > y_head_read),
        )
        .await?
        .head;
        let past_fork = read_log(&boxes[y].log(), fork + 1, 0)?;
        let due_low: u64 = past_fork.range(..=caught.head).map(|(_, f)| wire(f)).sum();
        let due_high: u64 = past_fork.range(..=y_head_after).map(|(_, f)| wire(f)).sum();
        if caught.snapshots_installed > 0 {
            totals.snapshots += caught.snapshots_installed;
            out.fail(format!(
                "round {round}: the rejoined twin installed a snapshot with its log intact"
            ));
        }
        if caught.frame_bytes_received < due_low || caught.frame_bytes_received > due_high {
            out.fail(format!(
                "round {round}: the rejoined twin received {} B of frames; the frames past the fork it held weigh {due_low}..={due_high} B",
                caught.frame_bytes_received
            ));
        }
        if caught.received_bytes > due_high * 3 / 2 + (64 << 10)
            || caught.received_bytes >= prefix_bytes
        {
            out.fail(format!(
                "round {round}: the rejoined twin received {} B on the wire for {due_high} B of frames past the fork (its log to the fork: {prefix_bytes} B)",
                caught.received_bytes
            ));
        }
        totals.rejoin_received += caught.received_bytes;
        totals.rejoin_due += due_high;
        totals.prefix_bytes_max = totals.prefix_bytes_max.max(prefix_bytes);
        totals.rejoin_ratio_max = totals
            .rejoin_ratio_max
            .max(caught.received_bytes as f64 / due_high.max(1) as f64);
        if !w2.more(10, Durability::Twin, Duration::from_secs(20)).await {
            out.fail(format!(
                "round {round}: no twin acknowledgement on the promoted box with the rejoined twin"
            ));
        }
        if let Some(first) = w2
            .acked()
            .iter()
            .filter(|a| a.got == Durability::Twin)
            .map(|a| a.at)
            .min()
        {
            totals.kill_to_twin_ack_max = totals
                .kill_to_twin_ack_max
                .max(first.duration_since(killed));
        }

        // 4. Switchover back to X (and in even rounds forward to Y again).
        let mut to = x;
        let hops = if round % 2 == 0 { 2 } else { 1 };
        let mut windows = Vec::new();
        for _ in 0..hops {
            let from = 1 - to;
            let t0 = Instant::now();
            let said = daemons::run(
                &bins.primary,
                &[
                    "switchover",
                    "--config",
                    &boxes[from].primary_cfg().display().to_string(),
                    "--wait",
                    "5000",
                ],
            );
            if let Err(e) = said {
                // Refused, writes went on: the role did not move, nor the
                // term.
                out.fail(format!(
                    "round {round}: switchover to {}: {e}",
                    boxes[to].name
                ));
                break;
            }
            term += 1;
            epoch = term << 32;
            until("the new primary serves", Duration::from_secs(20), || {
                pstatus(boxes[to].metrics).filter(|st| st.epoch == epoch)
            })
            .await?;
            until("the old primary follows", Duration::from_secs(20), || {
                tstatus(boxes[from].metrics).filter(|t| t.connected && t.epoch == epoch)
            })
            .await?;
            totals.switchovers += 1;
            let more = w2.more(20, Durability::Twin, Duration::from_secs(20)).await;
            windows.push((t0, Instant::now()));
            if !more {
                out.fail(format!(
                    "round {round}: no twin acknowledgement after the switchover to {}",
                    boxes[to].name
                ));
            }
            eprintln!(
                "   switchover to {} at epoch {}: {:.0} ms to both roles",
                boxes[to].name,
                EpochName(epoch),
                t0.elapsed().as_secs_f64() * 1000.0
            );
            to = from;
        }
        primary = 1 - to;
        let (w2_acked, redirects, _) = w2.halt().await;
        let longest = pause(&w2_acked, &windows);
        totals.switchover_pause_max = totals.switchover_pause_max.max(longest);
        // A switchover pauses writers briefly, not for QUIC's idle timeout
        // (10 s, which a deposed primary once waited out before it
        // followed as the twin).
        if longest > Duration::from_secs(5) {
            out.fail(format!(
                "round {round}: an append waited {} ms across the switchover",
                longest.as_millis()
            ));
        }
        if redirects == 0 {
            out.fail(format!(
                "round {round}: no writer was redirected by a switchover"
            ));
        }
        for a in &w2_acked {
            match a.got {
                Durability::Twin => totals.twin_acked.push(a.clone()),
                _ => totals.local_acked += 1,
            }
        }

        // Every twin acknowledgement so far on the current primary; every
        // acknowledgement of the fenced box too.
        let on_primary = read_log(&boxes[primary].log(), 0, 1 << 20)?;
        let missing: Vec<u64> = totals
            .twin_acked
            .iter()
            .filter(|a| !on_primary.get(&a.seq).is_some_and(|f| a.is(f)))
            .map(|a| a.seq)
            .collect();
        let preload_ok = preloaded
            .iter()
            .all(|(seq, f)| on_primary.get(seq) == Some(f));
        let lost_old: Vec<u64> = old_acked
            .iter()
            .filter(|a| !on_primary.get(&a.seq).is_some_and(|f| a.is(f)))
            .map(|a| a.seq)
            .collect();
        if !missing.is_empty() || !preload_ok {
            out.fail(format!(
                "round {round}: {} twin-acknowledged frames are not on the current primary {} as written (first {:?}); preload {}",
                missing.len(),
                boxes[primary].name,
                &missing[..missing.len().min(5)],
                if preload_ok { "whole" } else { "NOT whole" }
            ));
        }
        if !lost_old.is_empty() {
            out.fail(format!(
                "round {round}: the old primary acknowledged {} appends after the promotion that are not on the current primary (first {:?}): lost",
                lost_old.len(),
                &lost_old[..lost_old.len().min(5)]
            ));
        }
        out.line(format!(
            "round {round}: {} killed at {x_head} (tail past the fork {fork}: {}), {} promoted; rejoin received {} B for {due_high} B past the fork (log to the fork {prefix_bytes} B); {hops} switchover(s), longest append wait {} ms; {} twin acks checked on {}",
            boxes[x].name,
            x_head - fork,
            boxes[y].name,
            caught.received_bytes,
            longest.as_millis(),
            totals.twin_acked.len(),
            boxes[primary].name
        ));
    }

    // Both boxes hold the same log.
    let twin = 1 - primary;
    let head = pstatus(boxes[primary].metrics).map_or(0, |st| st.head);
    until("the twin holds the head", Duration::from_secs(20), || {
        tstatus(boxes[twin].metrics).filter(|t| t.head >= head)
    })
    .await?;
    for b in boxes.iter_mut() {
        b.daemon.as_mut().map(Proc::stop).transpose()?;
    }
    let (equal, differ, named) = daemons::compare_logs(&boxes[0].log(), &boxes[1].log(), 0)?;
    if differ > 0 {
        out.fail(format!(
            "the two logs differ in {differ} frames: {}",
            named.join("; ")
        ));
    }
    out.line(format!(
        "{rounds} cycles ({} with the twin left running): {} twin acknowledgements all on the final primary, {} local; {} divergent frames saved exactly; {} appends acknowledged by a deposed primary; the logs agree on {equal} frames",
        totals.natural_rounds,
        totals.twin_acked.len(),
        totals.local_acked,
        totals.saved_frames,
        totals.old_acked_after_promotion
    ));
    out.fig("rounds", rounds);
    out.fig("broken", broken.clone());
    out.fig("acked_twin", totals.twin_acked.len());
    out.fig("acked_local", totals.local_acked);
    out.fig("divergent_frames_saved", totals.saved_frames);
    out.fig(
        "old_primary_acks_after_promotion",
        totals.old_acked_after_promotion,
    );
    out.fig("rejoin_received_bytes", totals.rejoin_received);
    out.fig("rejoin_frames_past_fork_bytes", totals.rejoin_due);
    out.fig(
        "rejoin_ratio_max",
        (totals.rejoin_ratio_max * 1000.0).round() / 1000.0,
    );
    out.fig("log_to_fork_bytes_max", totals.prefix_bytes_max);
    out.fig("snapshots", totals.snapshots);
    out.fig("switchovers", totals.switchovers);
    out.fig(
        "switchover_pause_max_ms",
        totals.switchover_pause_max.as_millis() as u64,
    );
    out.fig(
        "kill_to_first_twin_ack_max_ms",
        totals.kill_to_twin_ack_max.as_millis() as u64,
    );
    out.fig("logs_equal_frames", equal);
    out.fig("promote_refusals", totals.promote_refusals);
    out.fig(
        "kill_to_promoted_max_ms",
        totals.kill_to_promoted_max.as_millis() as u64,
    );
    Ok(out)
}
