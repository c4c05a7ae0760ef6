//! Group commit: a frame is durable once an fdatasync covers it, and one
//! fsync covers every frame staged before it. A waiter leads when nobody
//! is in an fsync, syncs outside the writer lock while appenders keep
//! staging, then publishes what the fsync covered and wakes exactly the
//! waiters it covered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{self, Thread, ThreadId};
use std::time::Duration;

use super::{lock, Error, Log, Result};

/// How long a group-commit waiter sleeps before it looks again on its own.
const WAITER_SAFETY_NET: Duration = Duration::from_millis(50);

/// What group-commit leaders learn from the fsyncs before theirs.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Threads the next group is expected to hold.
    expected: AtomicU64,
    /// A moving average of the fdatasync time, in nanoseconds.
    fsync_ns: AtomicU64,
}

/// The longest a leader waits for its group.
const MAX_PATIENCE: Duration = Duration::from_micros(500);

impl Pacing {
    fn expected(&self) -> u64 {
        self.expected.load(Ordering::Relaxed)
    }

    fn expect(&self, frames: u64) {
        self.expected.store(frames, Ordering::Relaxed);
    }

    fn fsynced(&self, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.fsync_ns.load(Ordering::Relaxed);
        let avg = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.fsync_ns.store(avg, Ordering::Relaxed);
    }

    fn patience(&self) -> Duration {
        Duration::from_nanos(self.fsync_ns.load(Ordering::Relaxed) / 2).min(MAX_PATIENCE)
    }
}

/// Who waits for durability, and whether a leader is in its fsync.
#[derive(Debug, Default)]
pub(super) struct SyncState {
    leader: bool,
    waiters: Vec<(u64, ThreadId, Thread)>,
}
impl Log {
    /// Wake every waiter a publication through `head` covered.
    pub(super) fn wake_covered(&self, head: u64) {
        let mut s = lock(&self.sync);
        s.waiters.retain(|(seq, _, thread)| {
            if *seq <= head {
                thread.unpark();
                false
            } else {
                true
            }
        });
    }

    /// Return once frame `seq` is durable, making it so if nobody is: a
    /// waiter becomes the leader when no leader is in its fsync, fdatasyncs
    /// the segment without holding the writer lock (appenders keep staging
    /// behind it), then indexes and publishes everything that fsync covered
    /// and wakes exactly the waiters it covered, and the first one it did
    /// not, to lead next. No lock is held across the fsync.
    pub fn sync_through(&self, seq: u64) -> Result<()> {
        let me = thread::current();
        let mut waited = false;
        loop {
            let mut s = lock(&self.sync);
            if self.head_seq() >= seq {
                if waited && !s.leader {
                    // Woken by a publication that covered us but not every
                    // waiter: make sure somebody leads for the rest.
                    Self::hand_off(&mut s);
                }
                return Ok(());
            }
            if let Err(e) = self.check_poison() {
                Self::hand_off(&mut s);
                return Err(e);
            }
            if s.leader {
                s.waiters.push((seq, me.id(), me.clone()));
                drop(s);
                // The timeout is a safety net only: every path that ends a
                // leadership or publishes wakes the waiters it must.
                thread::park_timeout(WAITER_SAFETY_NET);
                lock(&self.sync).waiters.retain(|(_, id, _)| *id != me.id());
                waited = true;
                continue;
            }
            s.leader = true;
            drop(s);
            let led = self.lead(seq);
            let mut s = lock(&self.sync);
            s.leader = false;
            let head = self.head_seq();
            let failed = led.is_err();
            let mut covered = Vec::new();
            s.waiters.retain(|(wseq, _, thread)| {
                if *wseq <= head || failed {
                    covered.push(thread.clone());
                    false
                } else {
                    true
                }
            });
            // Those released, the ones still waiting and this leader are the
            // threads about to take part in the next group.
            self.pacing
                .expect(covered.len() as u64 + s.waiters.len() as u64 + 1);
            Self::hand_off(&mut s);
            drop(s);
            // The next leader is woken first; the covered ones are woken
            // holding no lock, while its fsync runs.
            for thread in covered {
                thread.unpark();
            }
            led?;
        }
    }

    /// Run `f` as the group-commit leader, once no other leader is in its
    /// fsync: what must not overlap a leader's use of the open segment's
    /// file (release).
    pub(super) fn as_leader<T>(&self, f: impl FnOnce() -> T) -> T {
        loop {
            let mut s = lock(&self.sync);
            if !s.leader {
                s.leader = true;
                break;
            }
            drop(s);
            thread::sleep(std::time::Duration::from_micros(200));
        }
        let out = f();
        let mut s = lock(&self.sync);
        s.leader = false;
        Self::hand_off(&mut s);
        out
    }

    /// Wake the waiter with the lowest sequence, to lead next.
    fn hand_off(s: &mut SyncState) {
        let next = s
            .waiters
            .iter()
            .enumerate()
            .min_by_key(|(_, (seq, _, _))| *seq)
            .map(|(i, _)| i);
        if let Some(i) = next {
            let (_, _, thread) = s.waiters.swap_remove(i);
            thread.unpark();
        }
    }

    /// One leader's turn: capture the staged head and the open segment,
    /// fdatasync it outside the writer lock, publish what it covered.
    fn lead(&self, seq: u64) -> Result<()> {
        self.gather();
        let (target, log, generation) = {
            let w = self.writer_locked();
            self.check_writable(&w)?;
            let target = w.next_seq - 1;
            if target < seq {
                return Err(Error::PastHead { seq, head: target });
            }
            if target <= w.published {
                return Ok(());
            }
            (target, w.files()?.log.clone(), w.generation)
        };
        let started = self.clock.now();
        log.sync_data()
            .map_err(|e| self.poison_io("fdatasync", e))?;
        let took = self.clock.now().saturating_duration_since(started);
        self.pacing.fsynced(took);
        self.sync_time.observe(took);
        self.frame_syncs.fetch_add(1, Ordering::SeqCst);
        let mut w = self.writer_locked();
        if w.generation == generation && w.files.is_some() && target > w.published {
            // Quietly: waking the covered waiters here would hold the writer
            // lock (and every appender) across one futex wake per waiter.
            self.write_index(&mut w, target)?;
            self.publish_quiet(&mut w, target);
        }
        Ok(())
    }

    /// Before a leader captures its group: the threads the last fsync
    /// released are about to stage again, and a leader that captured at
    /// once would leave them for the next fsync, splitting the appenders
    /// into two halves that take turns. Wait, yielding the processor, until
    /// as many threads wait as took part in the last group, for at most half
    /// an fsync. A lone appender expects only itself and never waits.
    fn gather(&self) {
        let expected = self.pacing.expected();
        if expected <= 1 {
            return;
        }
        let deadline = self.clock.now() + self.pacing.patience();
        while (lock(&self.sync).waiters.len() as u64 + 1) < expected && self.clock.now() < deadline
        {
            thread::yield_now();
        }
    }

    /// Make a group commit durable and visible: every frame committed with
    /// [`Pending::commit_unsynced`](super::Pending::commit_unsynced) (or staged) since the last sync is
    /// fdatasynced once, indexed with one write, and published; readers see
    /// it and the head moves only now. Answers the head. Nothing pending:
    /// no I/O. A segment roll inside a group is a sync too: the frames
    /// before it are durable and published when the roll returns.
    pub fn sync(&self) -> Result<u64> {
        let staged = {
            let w = self.writer_locked();
            self.check_poison()?;
            w.next_seq - 1
        };
        if staged > self.head_seq() {
            self.sync_through(staged)?;
        }
        Ok(self.head_seq())
    }

    /// Frames committed and not yet durable ([`Log::sync`] makes them so).
    pub fn unsynced(&self) -> u64 {
        self.writer_locked().unsynced.len() as u64
    }
}
