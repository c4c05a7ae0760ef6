//! The thread that appends clients' small frames: requests queue to it, and
//! it stages every one that waits, syncs once and answers them all.
//!
//! A blocking task per append cost a thread hand-off per request each way
//! and one park and unpark per waiter in the log's group commit; here a
//! group costs one wake of this thread, and it publishes the group to the
//! twin sessions before it answers anybody, so shipping starts first.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::ApiError;
use crate::log::format::FRAME_HEADER_LEN;
use crate::log::Log;
use crate::node::WriteRefusal;

/// Requests staged in one group at most, so that the first of a long queue
/// is not held back by the last.
const GROUP_MAX: usize = 256;

/// One small append.
struct Job {
    kind: u16,
    meta: Vec<u8>,
    blob: Vec<u8>,
    done: oneshot::Sender<Result<u64, ApiError>>,
}

/// The queue to the appender thread. Dropping it ends the thread and waits
/// for it, so that the log is closed once its primary is gone (a rejoin or
/// a promotion reopens it at once).
pub(super) struct Appender {
    jobs: Option<mpsc::UnboundedSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Appender {
    /// Start the thread. `published(head, bytes)` is told of each durable
    /// group (its last seq and its frames' bytes) before any of its
    /// requests is answered.
    pub(super) fn start(
        log: Arc<Log>,
        published: impl Fn(u64, u64) + Send + 'static,
    ) -> std::io::Result<Appender> {
        let (jobs, rx) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("appender".into())
            .spawn(move || run(&log, rx, published))?;
        Ok(Appender {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Append one frame; durable when this answers.
    pub(super) async fn append(
        &self,
        kind: u16,
        meta: Vec<u8>,
        blob: Vec<u8>,
    ) -> Result<u64, ApiError> {
        let (done, answer) = oneshot::channel();
        let stopped = || {
            ApiError::Refused(WriteRefusal::Stopping {
                why: "the appender stopped".into(),
            })
        };
        self.jobs
            .as_ref()
            .ok_or_else(stopped)?
            .send(Job {
                kind,
                meta,
                blob,
                done,
            })
            .map_err(|_| stopped())?;
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

fn run(log: &Log, mut rx: mpsc::UnboundedReceiver<Job>, published: impl Fn(u64, u64)) {
    let mut group = Vec::new();
    let mut staged = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        while group.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let mut bytes = 0;
        for job in group.drain(..) {
            match log.stage_raw(job.kind, &job.meta, &job.blob) {
                Ok(seq) => {
                    bytes +=
                        FRAME_HEADER_LEN as u64 + job.meta.len() as u64 + job.blob.len() as u64;
                    staged.push((seq, job.done));
                }
                Err(e) => {
                    let _ = job.done.send(Err(ApiError::Refused(e.into())));
                }
            }
        }
        let Some(&(last, _)) = staged.last() else {
            continue;
        };
        match log.sync_through(last) {
            Ok(()) => {
                published(last, bytes);
                for (seq, done) in staged.drain(..) {
                    let _ = done.send(Ok(seq));
                }
            }
            Err(e) => {
                let why = WriteRefusal::from(e);
                for (_, done) in staged.drain(..) {
                    let _ = done.send(Err(ApiError::Refused(why.clone())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_appends_share_syncs_and_each_group_is_published_before_it_is_answered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Log::open(dir.path()).expect("open"));
        let published = Arc::new(Mutex::new(Vec::new()));
        let appender = {
            let published = published.clone();
            let log2 = log.clone();
            Arc::new(
                Appender::start(log.clone(), move |seq, bytes| {
                    // Durable before anybody hears of it.
                    assert!(log2.head_seq() >= seq);
                    published.lock().expect("lock").push((seq, bytes));
                })
                .expect("start"),
            )
        };
        let tasks: Vec<_> = (0..64u8)
            .map(|i| {
                let a = appender.clone();
                tokio::spawn(async move { a.append(1000, vec![i], vec![i; 100]).await })
            })
            .collect();
        let mut seqs = Vec::new();
        for t in tasks {
            let seq = t.await.expect("task").expect("appended");
            let groups = published.lock().expect("lock").clone();
            assert!(
                groups.iter().any(|&(last, _)| last >= seq),
                "{seq} answered unpublished"
            );
            seqs.push(seq);
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=64).collect::<Vec<_>>());
        let groups = published.lock().expect("lock").clone();
        let bytes: u64 = groups.iter().map(|g| g.1).sum();
        assert_eq!(bytes, 64 * (FRAME_HEADER_LEN as u64 + 1 + 100));
        assert!(log.frame_syncs() <= groups.len() as u64);
        assert_eq!(log.head_seq(), 64);
    }

    #[tokio::test]
    async fn a_refused_frame_is_answered_by_name_and_the_rest_of_its_group_lands() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Arc::new(Log::open(dir.path()).expect("open"));
        let appender = Appender::start(log.clone(), |_, _| {}).expect("start");
        // Kind 0 is no kind.
        let refused = appender.append(0, vec![], vec![1]).await;
        assert_eq!(
            refused,
            Err(ApiError::Refused(WriteRefusal::InvalidKind { kind: 0 }))
        );
        assert_eq!(
            appender
                .append(1000, vec![], vec![1])
                .await
                .expect("appended"),
            1
        );
        // Gone with its queue: the log is this test's alone again.
        drop(appender);
        assert_eq!(Arc::strong_count(&log), 1);
    }
}
