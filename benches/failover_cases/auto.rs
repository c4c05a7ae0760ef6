//! The automatic-failover cases of the failover benchmark: a pair under a
//! real etcd (Debian's, on loopback), `lease_ttl_s = 2`.
//!
//! - `auto_failover_ms`: from the primary's SIGKILL to the first
//!   `twin`-acknowledged append on the new primary, through a client that
//!   finds the primary in etcd by itself. The killed box comes back once
//!   the twin took over (a box that rebooted), rejoins it by itself and
//!   becomes its twin. The median of the rounds (the boxes swap each
//!   round); target TTL + 1,000 ms. Patroni's default is about 30 s.
//! - `fence_margin_ms`: the primary is cut off from etcd and its twin (relays
//!   cut); the gap between its last possible acknowledgement (its lease's
//!   end, as its `/status` shows it after the cut) and the new primary's
//!   first acknowledgement. The smallest over the rounds; target > 0 in
//!   every round.

use super::*;
use testkit::etcd::Etcd;
use testkit::proxy::{self, Proxy};
use twinlog::node::arbiter::{Arbiter, ArbiterOptions};
use twinlog::node::{FollowOptions, Following};

const TTL_S: u64 = 2;

/// A pair under `etcd`, each box reaching etcd through its own relay and
/// advertised to the other through one, so either can be cut off.
struct AutoPair {
    boxes: [Host; 2],
    to_etcd: [Proxy; 2],
    to_box: [Proxy; 2],
    arbiter: Arbiter,
    /// The client that measures: it finds the primary in etcd by itself
    /// and sends each append once, as an application would.
    following: Following,
}

async fn auto_pair(dir: &Path, etcd: &Etcd) -> AutoPair {
    let boxes = pair(dir);
    let to_etcd = [
        proxy::tcp(etcd.client_addr()).await.expect("relay"),
        proxy::tcp(etcd.client_addr()).await.expect("relay"),
    ];
    let to_box = [
        proxy::udp(boxes[0].listen).await.expect("relay"),
        proxy::udp(boxes[1].listen).await.expect("relay"),
    ];
    let section = |i: usize| daemon::config::FailoverSection {
        etcd: vec![format!("http://{}", to_etcd[i].addr)],
        cluster: "bench".into(),
        lease_ttl_s: TTL_S,
        auto_rejoin: true,
        advertise: Some(to_box[i].addr.into()),
        peer: Some(to_box[1 - i].addr.into()),
    };
    let mut p = PrimaryConfig::load(&boxes[0].primary_cfg()).expect("primary.toml");
    p.failover = Some(section(0));
    std::fs::write(boxes[0].primary_cfg(), p.render()).expect("write primary.toml");
    let mut t = TwinConfig::load(&boxes[1].twin_cfg()).expect("twin.toml");
    t.failover = Some(section(1));
    t.primary = to_box[0].addr.into();
    std::fs::write(boxes[1].twin_cfg(), t.render()).expect("write twin.toml");
    let arbiter = Arbiter::connect(ArbiterOptions {
        endpoints: vec![etcd.endpoint()],
        cluster: "bench".into(),
        ttl: Duration::from_secs(TTL_S),
        advertise: String::new(),
    })
    .await
    .expect("the bench's etcd client");
    let following = Following::new(
        boxes[0].admin(),
        None,
        Some(Arc::new(arbiter.clone())),
        FollowOptions {
            client: twinlog::node::ClientOptions {
                deadline: Duration::from_millis(300),
            },
            give_up_after: Duration::from_secs(60),
            retry_every: Duration::from_millis(5),
        },
    )
    .expect("a following client");
    AutoPair {
        boxes,
        to_etcd,
        to_box,
        arbiter,
        following,
    }
}

impl AutoPair {
    /// Which box the arbiter names, once it names `fp`'s.
    async fn leader_is(&self, i: usize) {
        let fp = self.boxes[i].fp;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((_, leader, _)) = self.arbiter.leader().await {
                if leader == fp {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "box {i} does not lead in 60 s; their logs:\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Box `i` leads, holds its lease, and its twin follows it and is
    /// recorded in sync.
    async fn steady(&self, i: usize) {
        self.leader_is(i).await;
        until("the twin follows", || {
            tstatus(self.boxes[1 - i].metrics).filter(|s| s.connected)
        })
        .await;
        until("the primary's twin recorded in sync", || {
            pstatus(self.boxes[i].metrics)
                .and_then(|s| s.arbiter)
                .filter(|a| a.lease.held && a.twin_in_sync)
        })
        .await;
    }

    /// Start box `i` in whichever role its directory holds.
    fn start(&mut self, i: usize) {
        let primary = self.boxes[i].primary_cfg().exists();
        self.boxes[i].serve(primary);
    }

    /// An append of `durability`, acknowledged so by whichever box is the
    /// primary, through the following client: when it answers.
    async fn follow_append(&self, durability: Durability) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self
                .following
                .append(KIND, b"", b"after the failover", durability)
                .await
            {
                Ok(a) if a.durability == durability => return Instant::now(),
                Ok(_) | Err(_) => {}
            }
            if Instant::now() > deadline {
                panic!(
                    "no acknowledgement in 60 s; the boxes' logs:\n{}",
                    self.logs()
                );
            }
        }
    }

    fn logs(&self) -> String {
        let logs: Vec<String> = self
            .boxes
            .iter()
            .map(|b| std::fs::read_to_string(b.dir.with_extension("log")).unwrap_or_default())
            .collect();
        logs.join("\n-----\n")
    }

    fn stop(&mut self) {
        for b in &mut self.boxes {
            if let Some(d) = b.daemon.as_mut() {
                d.stop();
            }
        }
    }
}

/// A pair under its own etcd in `dir`, both daemons started.
async fn running(dir: &Path) -> (Etcd, AutoPair) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let etcd = Etcd::start(&dir.join("etcd")).expect("etcd starts");
    let mut pair = auto_pair(dir, &etcd).await;
    pair.start(0);
    pair.start(1);
    (etcd, pair)
}

pub(super) async fn auto_failover(cfg: &Config, dir: &Path) {
    eprintln!("auto_failover_ms ...");
    let (_etcd, mut pair) = running(dir).await;
    let (mut p, mut t) = (0usize, 1usize);
    let (mut totals, mut takeovers) = (Vec::new(), Vec::new());
    for round in 0..cfg.auto_rounds {
        pair.steady(p).await;
        pair.follow_append(Durability::Twin).await;
        let t0 = Instant::now();
        pair.boxes[p].daemon().sigkill();
        pair.leader_is(t).await;
        let t_took = Instant::now();
        // The killed box is back, as a box that rebooted: it finds a
        // newer term, rejoins and follows.
        pair.start(p);
        let t_ack = pair.follow_append(Durability::Twin).await;
        let total = ms(t_ack - t0);
        eprintln!(
            "  round {}: {total:.0} ms (the twin took over at {:.0} ms)",
            round + 1,
            ms(t_took - t0)
        );
        totals.push(total);
        takeovers.push(ms(t_took - t0));
        (p, t) = (t, p);
    }
    let mut sorted = totals.clone();
    let med = median(&mut sorted);
    let mut took = takeovers.clone();
    Line::new(BENCH, "auto_failover_ms", med, "ms")
        .target((TTL_S * 1000 + 1000) as f64)
        .lower_is_better()
        .num("max", sorted[sorted.len() - 1])
        .int("rounds", totals.len() as u64)
        .int("lease_ttl_ms", TTL_S * 1000)
        .num("take_over_ms", median(&mut took))
        .print();
    pair.stop();
}

pub(super) async fn fence_margin(cfg: &Config, dir: &Path) {
    eprintln!("fence_margin_ms ...");
    let (_etcd, mut pair) = running(dir).await;
    let (mut p, mut t) = (0usize, 1usize);
    let mut margins = Vec::new();
    for round in 0..cfg.auto_rounds {
        pair.steady(p).await;
        pair.to_etcd[p].cut(true);
        pair.to_box[p].cut(true);
        let cut = Instant::now();
        // The cut-off primary's lease end, as its status shows it: it
        // cannot renew from the cut on, so each reading names the same
        // end, up to the clock read between.
        let metrics = pair.boxes[p].metrics;
        let watch = tokio::task::spawn_blocking(move || {
            let mut end: Option<Instant> = None;
            loop {
                let at = Instant::now();
                match pstatus(metrics).and_then(|s| s.arbiter) {
                    Some(a) if a.lease.held => {
                        let e = at + Duration::from_millis(a.lease.remaining_ms);
                        end = Some(end.map_or(e, |x| x.max(e)));
                    }
                    Some(_) => return end,
                    None => {}
                }
                if at - cut > Duration::from_secs(60) {
                    return end;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        pair.leader_is(t).await;
        let first = pair.follow_append(Durability::Local).await;
        let last_possible = watch.await.expect("the status watch").unwrap_or(cut);
        let margin = if first > last_possible {
            ms(first - last_possible)
        } else {
            -ms(last_possible - first)
        };
        eprintln!(
            "  round {}: lease end {:.0} ms after the cut, new primary's first ack {:.0} ms: margin {margin:.0} ms",
            round + 1,
            ms(last_possible.saturating_duration_since(cut)),
            ms(first - cut)
        );
        margins.push(margin);
        pair.to_etcd[p].cut(false);
        pair.to_box[p].cut(false);
        (p, t) = (t, p);
    }
    let least = margins.iter().copied().fold(f64::INFINITY, f64::min);
    let mut sorted = margins.clone();
    Line::new(BENCH, "fence_margin_ms", least, "ms")
        .target(0.0)
        .num("median", median(&mut sorted))
        .int("rounds", margins.len() as u64)
        .int("lease_ttl_ms", TTL_S * 1000)
        .int(
            "rounds_above_zero",
            margins.iter().filter(|&&m| m > 0.0).count() as u64,
        )
        .print();
    pair.stop();
}
