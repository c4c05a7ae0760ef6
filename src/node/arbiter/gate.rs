//! The primary's lease, kept alive, and the judgement every
//! acknowledgement passes ([`crate::repl::lease`]'s rules on the node's
//! clock). A primary whose lease ran out on its own clock acknowledges
//! nothing, whether or not it heard from anyone: that is its self-fence.
//! A lease etcd says is gone ends the life.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::Arbiter;
use crate::node::clock;
use crate::repl::lease::{Ask, Lease, LeaseRefusal, LeaseRules};

/// The lease as `status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseShown {
    /// etcd's lease id.
    pub id: i64,
    /// Whether an acknowledgement may leave now.
    pub held: bool,
    /// What is left of it on this box's clock, less the drift and stall
    /// margins.
    pub remaining_ms: u64,
    /// Why not, when not held.
    #[serde(default)]
    pub refused: Option<String>,
    /// Whether the last call to etcd was answered.
    pub etcd_reachable: bool,
    #[serde(default)]
    pub etcd_error: Option<String>,
    /// Renewals answered, and failed.
    pub renewals: u64,
    pub renewals_failed: u64,
}

#[derive(Debug, Default)]
struct Calls {
    reachable: bool,
    error: Option<String>,
    renewals: u64,
    failed: u64,
}

/// Why etcd is not believed, judged on one read while a life is held
/// (`None`: it remembers what this box knows).
pub type Forgetting = Arc<dyn Fn(&crate::repl::arbiter::View) -> Option<String> + Send + Sync>;

/// The lease one primary life holds.
#[derive(Debug)]
pub struct LeaseGate {
    lease: Mutex<Lease>,
    id: std::sync::atomic::AtomicI64,
    calls: Mutex<Calls>,
    /// True once etcd said the lease is gone: the life is over.
    lost: watch::Sender<bool>,
}

/// A drill's negative control only (feature `drill-sabotage`, and
/// `TWINLOG_DRILL_SABOTAGE=no-self-fence` in the environment): a lease
/// that ran out on this box's clock still lets acknowledgements leave, so
/// a primary cut off from etcd serves on past the moment its twin may
/// take over. Only etcd saying the lease is gone stops it.
#[cfg(feature = "drill-sabotage")]
fn no_self_fence() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("TWINLOG_DRILL_SABOTAGE").is_ok_and(|v| v == "no-self-fence");
        if on {
            tracing::error!(
                "drill sabotage: this primary does not fence itself when its lease runs out"
            );
        }
        on
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LeaseGate {
    pub fn new(rules: LeaseRules) -> Arc<LeaseGate> {
        Arc::new(LeaseGate {
            lease: Mutex::new(Lease::new(rules)),
            id: std::sync::atomic::AtomicI64::new(0),
            calls: Mutex::new(Calls::default()),
            lost: watch::channel(false).0,
        })
    }

    /// A grant or renewal is about to be sent.
    pub fn ask(&self) -> Ask {
        lock(&self.lease).ask(clock::now().at)
    }

    /// etcd answered `ask` with `granted` (zero: the lease is gone).
    pub fn answered(&self, ask: Ask, granted: Duration) {
        let mut l = lock(&self.lease);
        l.answered(ask, granted);
        let lost = l.is_lost();
        drop(l);
        let mut c = lock(&self.calls);
        c.reachable = true;
        c.error = None;
        c.renewals += 1;
        drop(c);
        if lost {
            self.lost.send_replace(true);
        }
    }

    /// The life is over whatever etcd still grants: its lease is not
    /// relied on again.
    fn give_up(&self) {
        lock(&self.lease).lose();
        self.lost.send_replace(true);
    }

    fn failed(&self, why: String) {
        let mut c = lock(&self.calls);
        c.reachable = false;
        c.error = Some(why);
        c.failed += 1;
    }

    pub fn set_id(&self, id: i64) {
        self.id.store(id, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn id(&self) -> i64 {
        self.id.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether an acknowledgement may leave now.
    pub fn may_acknowledge(&self) -> Result<(), LeaseRefusal> {
        let judged = lock(&self.lease).may_acknowledge(clock::now().at);
        #[cfg(feature = "drill-sabotage")]
        if no_self_fence() && matches!(judged, Err(LeaseRefusal::Expired { .. })) {
            return Ok(());
        }
        judged
    }

    /// Becomes true when etcd says the lease is gone.
    pub fn watch_lost(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    pub fn shown(&self) -> LeaseShown {
        let now = clock::now().at;
        let l = lock(&self.lease);
        let refused = l.may_acknowledge(now).err();
        let remaining = l.remaining(now).unwrap_or_default();
        drop(l);
        let c = lock(&self.calls);
        LeaseShown {
            id: self.id(),
            held: refused.is_none(),
            remaining_ms: remaining.as_millis() as u64,
            refused: refused.map(|r| r.to_string()),
            etcd_reachable: c.reachable,
            etcd_error: c.error.clone(),
            renewals: c.renewals,
            renewals_failed: c.failed,
        }
    }

    /// Keep the lease alive until etcd says it is gone or `stop`: a
    /// renewal every third of the TTL, retried soon when one fails. A
    /// renewal waits at most what the lease has left or a third of the
    /// TTL, whichever is longer; what the gate allows never depends on
    /// it, only on the answers.
    ///
    /// With each renewal etcd is read and `forgot` judges the read: an
    /// etcd that forgot what this box knows (restored under this very
    /// lease, say) ends the life, as a lease it says is gone does.
    pub fn keep(
        self: Arc<Self>,
        arbiter: Arbiter,
        forgot: Forgetting,
        mut stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let rules = lock(&self.lease).rules();
            let retry =
                (rules.ttl / 20).clamp(Duration::from_millis(50), Duration::from_millis(500));
            loop {
                let at = lock(&self.lease).renew_at(clock::now().at);
                tokio::select! {
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                    _ = stop.wait_for(|&s| s) => return,
                }
                if lock(&self.lease).is_lost() {
                    return;
                }
                let left = lock(&self.lease)
                    .remaining(clock::now().at)
                    .unwrap_or_default();
                let limit = left
                    .max(rules.renew_every())
                    .max(Duration::from_millis(200));
                let ask = self.ask();
                match arbiter.keep_alive(self.id(), limit).await {
                    Ok(granted) => {
                        self.answered(ask, granted);
                        if granted.is_zero() {
                            tracing::error!(
                                lease = self.id(),
                                "etcd says this primary's lease is gone: this life is over"
                            );
                            return;
                        }
                        if let Ok(view) = arbiter.view().await {
                            if let Some(why) = forgot(&view) {
                                tracing::error!(why = %why, "etcd forgot what this box knows: this life is over");
                                self.give_up();
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, left_ms = left.as_millis() as u64, "renewing the lease failed");
                        self.failed(e.to_string());
                        tokio::select! {
                            _ = tokio::time::sleep(retry) => {}
                            _ = stop.wait_for(|&s| s) => return,
                        }
                    }
                }
            }
        })
    }
}
