//! The thread that appends clients' small frames: requests queue to it, and
//! it stages every one that waits, syncs once and answers them all.
//!
//! A blocking task per append cost a thread hand-off per request each way
//! and one park and unpark per waiter in the log's group commit; here a
//! group costs one wake of this thread. It hands the group to the twin
//! sessions from the buffer in hand before its fdatasync, so that the
//! twin's sync runs beside this one (a `twin` answer waits for both), and
//! answers nobody before its own sync. Should the thread not start, the
//! same steps run on the blocking pool, one group at a time.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::once::{AppendIds, Found};
use super::pool::ClientPool;
use super::twin_answers::TwinAnswers;
use super::ApiError;
use bytes::Bytes;

use crate::log::once::wrap;
use crate::log::{Kind, Log};
use crate::node::api::AppendOnce;
use crate::node::WriteRefusal;
use crate::repl::in_hand::InHand;

/// Requests staged in one group at most, so that the first of a long queue
/// is not held back by the last; a group is shipped before its sync, so
/// this is also the most a twin can hold that a crash here loses.
const GROUP_MAX: usize = crate::repl::MAX_SHIPPED_UNSYNCED as usize;

/// Where a small append's answer goes: its seq, or why it was refused.
type Answer = oneshot::Sender<Result<u64, ApiError>>;

/// One small append.
struct Job {
    kind: u16,
    meta: Vec<u8>,
    blob: Vec<u8>,
    once: Option<AppendOnce>,
    /// Answered once the twin has it too: durable here, it may wait for
    /// the twin session's next turn (`TwinAnswers`).
    for_twin: bool,
    done: Answer,
}

/// The queue to the appender thread. Dropping it ends the thread and waits
/// for it, so that the log is closed once its primary is gone (a rejoin or
/// a promotion reopens it at once).
pub(super) struct Appender {
    jobs: Option<mpsc::UnboundedSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// When no thread could be spawned: the same steps, a group of one job
    /// at a time on the clients' blocking pool, one group after another as
    /// the thread would take them.
    inline: Option<Arc<tokio::sync::Mutex<Steps>>>,
}

/// What is done with a group of small appends, by the thread or inline.
struct Steps {
    log: Arc<Log>,
    in_hand: Arc<InHand>,
    shipped: Box<dyn Fn(u64, u64) + Send>,
    durable: Box<dyn Fn(u64) + Send>,
    /// The group's frames as shipped, and each one's end in it.
    wire: Vec<u8>,
    ends: Vec<(u64, usize)>,
    /// Each staged frame's seq, whether it waits for the twin, and its
    /// answer.
    staged: Vec<(u64, bool, Answer)>,
    twin_answers: Arc<TwinAnswers>,
    /// The ids of frames appended once, checked and recorded as each is
    /// staged.
    ids: Arc<std::sync::Mutex<AppendIds>>,
    /// Appends sent once whose frame is in the log already, at this seq.
    repeats: Vec<(u64, Answer)>,
}

impl Appender {
    /// Start the thread. Each group is put `in_hand` and `shipped(head,
    /// bytes)` is told of it (its last seq and its frames' bytes) before
    /// its sync; `durable(head)` once the sync made it readable, before any
    /// of its requests is answered. Should no thread be spawned, appends
    /// take the same steps on the blocking pool.
    pub(super) fn start(
        log: Arc<Log>,
        in_hand: Arc<InHand>,
        ids: Arc<std::sync::Mutex<AppendIds>>,
        twin_answers: Arc<TwinAnswers>,
        shipped: impl Fn(u64, u64) + Send + 'static,
        durable: impl Fn(u64) + Send + 'static,
    ) -> Appender {
        let steps = Steps {
            log,
            in_hand,
            shipped: Box::new(shipped),
            durable: Box::new(durable),
            wire: Vec::new(),
            ends: Vec::new(),
            staged: Vec::new(),
            twin_answers,
            ids,
            repeats: Vec::new(),
        };
        let (jobs, rx) = mpsc::unbounded_channel();
        // The steps go to the thread through a slot, so that they are kept
        // should the spawn fail.
        let slot = Arc::new(std::sync::Mutex::new(Some(steps)));
        let for_thread = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("appender".into())
            .spawn(move || {
                let steps = for_thread.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(steps) = steps {
                    run(steps, rx);
                }
            });
        match spawned {
            Ok(thread) => Appender {
                jobs: Some(jobs),
                thread: Some(thread),
                inline: None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "no appender thread: appends take blocking tasks");
                let steps = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                Appender {
                    jobs: None,
                    thread: None,
                    inline: steps.map(|s| Arc::new(tokio::sync::Mutex::new(s))),
                }
            }
        }
    }

    /// Append one frame; durable when this answers. With `once`, an
    /// append whose frame is in the log already is answered with its
    /// sequence once that is durable, and nothing is written. One that
    /// waits `for_twin` next may be answered a little later, at the twin
    /// session's next turn.
    pub(super) async fn append(
        &self,
        pool: &ClientPool,
        kind: u16,
        meta: Vec<u8>,
        blob: Vec<u8>,
        once: Option<AppendOnce>,
        for_twin: bool,
    ) -> Result<u64, ApiError> {
        let (done, answer) = oneshot::channel();
        let stopped = || {
            ApiError::Refused(WriteRefusal::Stopping {
                why: "the appender stopped".into(),
            })
        };
        let job = Job {
            kind,
            meta,
            blob,
            once,
            for_twin,
            done,
        };
        if let Some(inline) = &self.inline {
            // Taken before the blocking task, so that no thread of the pool
            // waits for another group's sync.
            let mut steps = inline.clone().lock_owned().await;
            pool.run(move || steps.group(vec![job]))
                .await
                .map_err(|e| ApiError::Refused(WriteRefusal::Stopping { why: e.to_string() }))?;
        } else {
            crate::budget::mark(crate::budget::Stage::Queued);
            self.jobs
                .as_ref()
                .ok_or_else(stopped)?
                .send(job)
                .map_err(|_| stopped())?;
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            // It ends once its group, at most one fdatasync, is answered.
            let _ = thread.join();
        }
    }
}

fn run(mut steps: Steps, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut group = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        crate::budget::mark(crate::budget::Stage::AppenderWoken);
        group.push(first);
        while group.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        steps.group(std::mem::take(&mut group));
    }
}

impl Steps {
    /// The one path of a small append: stage every job of the group, put
    /// them in hand and publish them to the twin sessions (`shipped`)
    /// before the one sync, so that the twin's sync runs beside it; then
    /// `durable`, then the answers. Nobody is answered before the sync.
    /// The other publish point is `Primary::acknowledge`, after the sync:
    /// a blob past 1 MiB or a store write is never in hand whole, so it
    /// cannot be shipped before its sync.
    fn group(&mut self, group: Vec<Job>) {
        let mut bytes = 0;
        self.wire.clear();
        self.ends.clear();
        let ids = self.ids.clone();
        let mut ids = ids.lock().unwrap_or_else(|e| e.into_inner());
        for job in group {
            let (kind, meta) = match &job.once {
                None => (job.kind, job.meta),
                Some(once) => match ids.find(once) {
                    Ok(Found::Written(seq)) => {
                        self.repeats.push((seq, job.done));
                        continue;
                    }
                    Ok(Found::New) => (Kind::Once.as_u16(), wrap(job.kind, once.id(), &job.meta)),
                    Err(why) => {
                        let _ = job.done.send(Err(why));
                        continue;
                    }
                },
            };
            match self.log.stage_framed(kind, &meta, &job.blob) {
                Ok(header) => {
                    let seq = header.seq;
                    if let Some(once) = &job.once {
                        ids.record(once.id(), seq);
                    }
                    bytes += header.frame_len();
                    self.wire.extend_from_slice(&header.encode());
                    self.wire.extend_from_slice(&meta);
                    self.wire.extend_from_slice(&job.blob);
                    self.ends.push((seq, self.wire.len()));
                    self.staged.push((seq, job.for_twin, job.done));
                }
                Err(e) => {
                    let _ = job.done.send(Err(ApiError::Refused(e.into())));
                }
            }
        }
        drop(ids);
        crate::budget::mark(crate::budget::Stage::Staged);
        if let Some(&(last, _, _)) = self.staged.last() {
            // Shipped while the local sync runs.
            let all = Bytes::from(std::mem::take(&mut self.wire));
            let mut start = 0;
            self.in_hand.put(self.ends.iter().map(|&(seq, end)| {
                let b = all.slice(start..end);
                start = end;
                (seq, b)
            }));
            (self.shipped)(last, bytes);
            crate::budget::mark(crate::budget::Stage::Published);
            let synced = self.log.sync_through(last);
            crate::budget::mark(crate::budget::Stage::LocalSynced);
            self.in_hand.durable_through(last);
            match synced {
                Ok(()) => {
                    (self.durable)(last);
                    for (seq, for_twin, done) in self.staged.drain(..) {
                        match for_twin {
                            true => self.twin_answers.durable_here(seq, done),
                            false => {
                                let _ = done.send(Ok(seq));
                            }
                        }
                    }
                }
                Err(e) => {
                    let why = WriteRefusal::from(e);
                    for (_, _, done) in self.staged.drain(..) {
                        let _ = done.send(Err(ApiError::Refused(why.clone())));
                    }
                }
            }
        }
        // A repeat's frame was staged by this group or an earlier one,
        // whose sync is done: durable, unless that sync failed.
        let head = self.log.head_seq();
        for (seq, done) in self.repeats.drain(..) {
            let answer = match seq <= head {
                true => Ok(seq),
                false => Err(ApiError::Refused(WriteRefusal::Poisoned {
                    why: self
                        .log
                        .poisoned_by()
                        .unwrap_or_else(|| "the frame's sync did not complete".into()),
                })),
            };
            let _ = done.send(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::format::FRAME_HEADER_LEN;
    use std::sync::Mutex;

    fn no_ids(log: &Log) -> Arc<Mutex<AppendIds>> {
        Arc::new(Mutex::new(AppendIds::from_past(log.head_seq(), 1024)))
    }

    /// An appender with nothing in hand, no session to park for, and no
    /// one told of its groups.
    fn quiet(log: &Arc<Log>) -> Appender {
        Appender::start(
            log.clone(),
            Default::default(),
            no_ids(log),
            Default::default(),
            |_, _| {},
            |_| {},
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_sent_once_is_one_frame_however_often_and_however_close_it_comes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Log::open(dir.path()).expect("open"));
        let appender = Arc::new(quiet(&log));
        let once = |seq| AppendOnce {
            client: [9; 16],
            seq,
            after: 0,
        };
        // Eight copies of each of four appends, all at once: the copies
        // share groups with their original or come after it.
        let tasks: Vec<_> = (0..32u64)
            .map(|i| {
                let a = appender.clone();
                let id = once(i % 4 + 1);
                tokio::spawn(async move {
                    let blob = vec![id.seq as u8; 10];
                    let seq = a
                        .append(
                            &ClientPool::default(),
                            0x8001,
                            b"m".to_vec(),
                            blob,
                            Some(id),
                            false,
                        )
                        .await
                        .expect("appended");
                    (id.seq, seq)
                })
            })
            .collect();
        let mut answered = std::collections::BTreeMap::new();
        for t in tasks {
            let (client_seq, seq) = t.await.expect("task");
            let first = *answered.entry(client_seq).or_insert(seq);
            assert_eq!(first, seq, "append {client_seq} answered at two sequences");
        }
        assert_eq!(log.head_seq(), 4, "one frame per append");
        for (client_seq, seq) in &answered {
            let e = log.read(*seq).expect("read");
            assert_eq!(e.kind, Kind::Once.as_u16());
            let (kind, id, meta) = crate::log::once::unwrap(&e.meta).expect("an id");
            assert_eq!(
                (kind, id, meta),
                (0x8001, once(*client_seq).id(), &b"m"[..])
            );
        }
        // A new life reads the ids back from the log.
        let ids = AppendIds::read(&log, 1024).expect("read ids");
        for (client_seq, seq) in &answered {
            assert_eq!(
                ids.find(&once(*client_seq)),
                Ok(super::super::once::Found::Written(*seq))
            );
        }
        assert_eq!(ids.find(&once(5)), Ok(super::super::once::Found::New));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_appends_share_syncs_are_shipped_from_hand_before_it_and_answered_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Log::open(dir.path()).expect("open"));
        let in_hand = Arc::new(InHand::default());
        let shipped = Arc::new(Mutex::new(Vec::new()));
        let durable = Arc::new(Mutex::new(Vec::new()));
        let appender = {
            let (shipped, durable) = (shipped.clone(), durable.clone());
            let (log2, log3, hand) = (log.clone(), log.clone(), in_hand.clone());
            Arc::new(Appender::start(
                log.clone(),
                in_hand.clone(),
                no_ids(&log),
                Default::default(),
                move |seq, bytes| {
                    // In hand, readable by a shipper, before the sync.
                    let frame = hand.get(seq).expect("in hand");
                    assert_eq!(frame.len() as u64, FRAME_HEADER_LEN as u64 + 1 + 100);
                    assert!(log2.head_seq() < seq, "{seq} durable before it was shipped");
                    shipped.lock().expect("lock").push((seq, bytes));
                },
                move |seq| {
                    assert!(log3.head_seq() >= seq);
                    durable.lock().expect("lock").push(seq);
                },
            ))
        };
        let tasks: Vec<_> = (0..64u8)
            .map(|i| {
                let a = appender.clone();
                tokio::spawn(async move {
                    a.append(
                        &ClientPool::default(),
                        1000,
                        vec![i],
                        vec![i; 100],
                        None,
                        false,
                    )
                    .await
                })
            })
            .collect();
        let mut seqs = Vec::new();
        for t in tasks {
            let seq = t.await.expect("task").expect("appended");
            let synced = durable.lock().expect("lock").clone();
            assert!(
                synced.iter().any(|&last| last >= seq),
                "{seq} answered before it was durable"
            );
            seqs.push(seq);
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=64).collect::<Vec<_>>());
        let groups = shipped.lock().expect("lock").clone();
        let bytes: u64 = groups.iter().map(|g| g.1).sum();
        assert_eq!(bytes, 64 * (FRAME_HEADER_LEN as u64 + 1 + 100));
        assert!(log.frame_syncs() <= groups.len() as u64);
        assert_eq!(log.head_seq(), 64);
        assert!(
            in_hand.get(64).is_none(),
            "durable frames are read from the log"
        );
    }

    #[tokio::test]
    async fn a_refused_frame_is_answered_by_name_and_the_rest_of_its_group_lands() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Log::open(dir.path()).expect("open"));
        let appender = quiet(&log);
        let pool = ClientPool::default();
        // Kind 0 is no kind.
        let refused = appender
            .append(&pool, 0, vec![], vec![1], None, false)
            .await;
        assert_eq!(
            refused,
            Err(ApiError::Refused(WriteRefusal::InvalidKind { kind: 0 }))
        );
        assert_eq!(
            appender
                .append(&pool, 1000, vec![], vec![1], None, false)
                .await
                .expect("appended"),
            1
        );
        // Gone with its queue: the log is this test's alone again.
        drop(appender);
        assert_eq!(Arc::strong_count(&log), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_twin_append_durable_here_waits_for_the_twin_session_s_next_turn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Log::open(dir.path()).expect("open"));
        let answers = Arc::new(TwinAnswers::default());
        answers.turn(0, true);
        let appender = Arc::new(Appender::start(
            log.clone(),
            Default::default(),
            no_ids(&log),
            answers.clone(),
            |_, _| {},
            |_| {},
        ));
        let pool = ClientPool::default();
        // A `local` one is answered once durable, whatever the session.
        let local = appender.append(&pool, 1000, vec![], vec![1], None, false);
        assert_eq!(local.await.expect("appended"), 1);
        let a = appender.clone();
        let twin = tokio::spawn(async move {
            a.append(&ClientPool::default(), 1000, vec![], vec![2], None, true)
                .await
        });
        // Durable here, and parked.
        let mut parked = false;
        for _ in 0..1000 {
            if answers.waiting() == 1 {
                parked = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(parked, "the twin append was parked");
        assert!(log.head_seq() >= 2, "durable before it was parked");
        assert!(!twin.is_finished(), "answered before the session's turn");
        answers.turn(0, true);
        assert_eq!(twin.await.expect("task").expect("appended"), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_its_thread_an_append_takes_the_same_steps_on_the_pool() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Log::open(dir.path()).expect("open"));
        let in_hand = Arc::new(InHand::default());
        let shipped = Arc::new(Mutex::new(Vec::new()));
        let (log2, hand, seen) = (log.clone(), in_hand.clone(), shipped.clone());
        let steps = Steps {
            log: log.clone(),
            in_hand: in_hand.clone(),
            shipped: Box::new(move |seq, _| {
                assert!(hand.get(seq).is_some(), "{seq} shipped from hand");
                assert!(log2.head_seq() < seq, "{seq} durable before it was shipped");
                seen.lock().expect("lock").push(seq);
            }),
            durable: Box::new(|_| {}),
            wire: Vec::new(),
            ends: Vec::new(),
            staged: Vec::new(),
            twin_answers: Default::default(),
            ids: no_ids(&log),
            repeats: Vec::new(),
        };
        let appender = Arc::new(Appender {
            jobs: None,
            thread: None,
            inline: Some(Arc::new(tokio::sync::Mutex::new(steps))),
        });
        let pool = Arc::new(ClientPool::default());
        let tasks: Vec<_> = (0..16u8)
            .map(|i| {
                let (a, pool) = (appender.clone(), pool.clone());
                tokio::spawn(
                    async move { a.append(&pool, 1000, vec![], vec![i], None, false).await },
                )
            })
            .collect();
        for t in tasks {
            let seq = t.await.expect("task").expect("appended");
            assert!(
                log.head_seq() >= seq,
                "{seq} answered before it was durable"
            );
        }
        let mut seqs = shipped.lock().expect("lock").clone();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=16).collect::<Vec<_>>());
    }
}
