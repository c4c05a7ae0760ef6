//! The client's side of a pipeline: small requests from any number of
//! callers share one long-lived stream, each named by an id, and a reader
//! task hands each answer to the caller that waits for it.
//!
//! A caller that gives up (its deadline, or its future dropped) leaves no
//! trace: its id is forgotten and a late answer to it is dropped; a write
//! it was cut off in is finished by the next writer, so the stream's
//! framing always holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Semaphore, SemaphorePermit};

use super::api::{PipedAnswer, Response};
use super::error::ClientError;
use crate::net::{self, NetError};

/// An open pipeline.
pub(crate) struct Pipe {
    send: tokio::sync::Mutex<PipeSend>,
    calls: Arc<Mutex<Calls>>,
    /// The requests the primary takes at once on this connection.
    slots: Semaphore,
    reader: tokio::task::JoinHandle<()>,
}

struct PipeSend {
    stream: quinn::SendStream,
    /// The rest of a request whose caller was cut off mid-write.
    unsent: Vec<u8>,
}

/// A request being written: whatever of it is not written when this is
/// dropped (its caller cut off) is kept for the next writer to send.
struct Writing<'a, 'b> {
    send: &'a mut PipeSend,
    parts: &'b [&'b [u8]],
    /// The part being written, and how far into it.
    part: usize,
    at: usize,
}

impl<'b> Writing<'_, 'b> {
    /// What is left of the current part; None once all is written.
    fn rest(&mut self) -> Option<&'b [u8]> {
        while let Some(part) = self.parts.get(self.part) {
            if self.at < part.len() {
                return Some(&part[self.at..]);
            }
            self.part += 1;
            self.at = 0;
        }
        None
    }

    fn advance(&mut self, n: usize) {
        self.at += n;
    }
}

impl Drop for Writing<'_, '_> {
    fn drop(&mut self) {
        while let Some(rest) = self.rest() {
            self.send.unsent.extend_from_slice(rest);
            self.part += 1;
            self.at = 0;
        }
    }
}

#[derive(Default)]
struct Calls {
    next_id: u64,
    waiting: HashMap<u64, oneshot::Sender<Response>>,
    /// Why the pipeline ended, once it has.
    ended: Option<String>,
}

/// A caller's place among the waiting: forgotten when dropped.
pub(crate) struct Waiting<'a> {
    pipe: &'a Pipe,
    id: u64,
    answer: oneshot::Receiver<Response>,
    _slot: SemaphorePermit<'a>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.pipe.calls).waiting.remove(&self.id);
    }
}

fn lock(calls: &Mutex<Calls>) -> std::sync::MutexGuard<'_, Calls> {
    calls.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pipe {
    /// A pipeline on a stream the primary answered `Pipelining` on.
    pub(crate) fn new(send: quinn::SendStream, recv: quinn::RecvStream, in_flight: u32) -> Pipe {
        let calls = Arc::new(Mutex::new(Calls {
            next_id: 1,
            ..Calls::default()
        }));
        let reader = tokio::spawn(read_answers(recv, calls.clone()));
        Pipe {
            send: tokio::sync::Mutex::new(PipeSend {
                stream: send,
                unsent: Vec::new(),
            }),
            calls,
            slots: Semaphore::new(in_flight.max(1) as usize),
            reader,
        }
    }

    /// Why the pipeline ended, if it has.
    pub(crate) fn ended(&self) -> Option<String> {
        lock(&self.calls).ended.clone()
    }

    /// A slot and an id for one request.
    pub(crate) async fn enter(&self) -> Result<Waiting<'_>, ClientError> {
        let slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| ended("the pipeline closed"))?;
        let (tx, answer) = oneshot::channel();
        let mut calls = lock(&self.calls);
        if let Some(why) = &calls.ended {
            return Err(ended(why));
        }
        let id = calls.next_id;
        calls.next_id += 1;
        calls.waiting.insert(id, tx);
        Ok(Waiting {
            pipe: self,
            id,
            answer,
            _slot: slot,
        })
    }

    /// Write one request (its `parts` one after another) whole, each
    /// write taken within `deadline`, or give the pipeline up. A caller cut
    /// off half-way (its deadline, or its future dropped) leaves the rest
    /// of its request behind, and the next writer sends it first: the
    /// framing holds, and that request is done with its answer dropped, as
    /// any call given up after its write.
    pub(crate) async fn write(
        &self,
        parts: &[&[u8]],
        deadline: Duration,
    ) -> Result<(), ClientError> {
        let mut send = self.send.lock().await;
        while !send.unsent.is_empty() {
            let PipeSend { stream, unsent } = &mut *send;
            // `write` is cancel-safe: what it did not take is still here.
            let n = self.write_some(stream, unsent, deadline).await?;
            unsent.drain(..n);
        }
        let mut writing = Writing {
            send: &mut send,
            parts,
            part: 0,
            at: 0,
        };
        while let Some(rest) = writing.rest() {
            let n = self
                .write_some(&mut writing.send.stream, rest, deadline)
                .await?;
            writing.advance(n);
        }
        Ok(())
    }

    async fn write_some(
        &self,
        stream: &mut quinn::SendStream,
        bytes: &[u8],
        deadline: Duration,
    ) -> Result<usize, ClientError> {
        match tokio::time::timeout(deadline, stream.write(bytes)).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(self.lost(e)),
            Err(_) => Err(ClientError::Deadline { after: deadline }),
        }
    }

    fn lost(&self, e: quinn::WriteError) -> ClientError {
        let e = NetError::from(e);
        self.end(&e.to_string());
        e.into()
    }

    fn end(&self, why: &str) {
        let mut calls = lock(&self.calls);
        calls.ended.get_or_insert_with(|| why.to_owned());
        calls.waiting.clear();
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Waiting<'_> {
    /// The id to send the request under.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The answer, within `after`.
    pub(crate) async fn answer(&mut self, after: Duration) -> Result<Response, ClientError> {
        match tokio::time::timeout(after, &mut self.answer).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(_)) => Err(ended(
                &self
                    .pipe
                    .ended()
                    .unwrap_or_else(|| "the pipeline ended".into()),
            )),
            Err(_) => Err(ClientError::Deadline { after }),
        }
    }
}

/// A call lost with its pipeline: what it asked may have been done.
fn ended(why: &str) -> ClientError {
    ClientError::Net(NetError::Io(std::io::Error::other(format!(
        "the pipeline to the primary ended ({why}); what was asked may have been done"
    ))))
}

/// Hand each answer to its caller until the stream ends; then every
/// caller still waiting learns why.
async fn read_answers(mut recv: quinn::RecvStream, calls: Arc<Mutex<Calls>>) {
    let why = loop {
        match net::read_msg::<PipedAnswer>(&mut recv).await {
            Ok(Some(PipedAnswer { id: 0, resp })) => {
                break match resp {
                    Response::Error(e) => format!("the primary ended it: {e}"),
                    other => format!("the primary ended it: {other:?}"),
                }
            }
            Ok(Some(PipedAnswer { id, resp })) => {
                // A caller that gave up is gone: its late answer is dropped.
                if let Some(tx) = lock(&calls).waiting.remove(&id) {
                    let _ = tx.send(resp);
                }
            }
            Ok(None) => break "the primary finished it".to_owned(),
            Err(e) => break e.to_string(),
        }
    };
    let mut calls = lock(&calls);
    calls.ended.get_or_insert(why);
    calls.waiting.clear();
}
