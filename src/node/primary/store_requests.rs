//! The primary's store requests: writes checked and applied under the
//! store's lock, then as durable as asked; reads from the applied state.

use std::sync::Arc;

use quinn::{RecvStream, SendStream};

use super::answer::{DocPieces, Opened};
use super::{Caller, Primary};
use crate::net::NetError;
use crate::node::api::{ApiError, Durability, RefMove, Request, Response};
use crate::node::store_host::StoreHost;

impl Primary {
    pub(super) fn store(&self) -> Result<Arc<StoreHost>, ApiError> {
        self.store
            .clone()
            .ok_or_else(|| ApiError::Forbidden("this primary keeps no store".into()))
    }

    pub(super) async fn create_repo(&self, repo: String, durability: Durability) -> Response {
        self.store_write(move |host| host.create_repo(&repo), durability)
            .await
    }

    /// One store frame written on a blocking thread under the store's lock,
    /// then answered as durable as asked.
    pub(super) async fn store_write(
        &self,
        write: impl FnOnce(&StoreHost) -> Result<u64, crate::store::StoreError> + Send + 'static,
        durability: Durability,
    ) -> Response {
        let host = match self.store() {
            Ok(h) => h,
            Err(e) => return Response::Error(e),
        };
        let seq = match self.pool.run(move || write(&host)).await {
            Ok(Ok(seq)) => seq,
            Ok(Err(e)) => return Response::Error(e.into()),
            Err(e) => return Response::Error(ApiError::Store(e.to_string())),
        };
        self.acknowledge(seq, 64, durability).await
    }

    /// An erase: the frame appended and carried out here (log, then store)
    /// before the answer; the twin carries it out as it applies the frame.
    pub(super) async fn erase(
        &self,
        before: u64,
        repos: Vec<String>,
        durability: Durability,
    ) -> Response {
        let head = self.log.head_seq();
        if before > head + 1 {
            return Response::Error(ApiError::BadRequest(format!(
                "an erase before {before}, past the next sequence {}",
                head + 1
            )));
        }
        let done = Arc::new(std::sync::Mutex::new(
            crate::node::store_host::EraseDone::default(),
        ));
        let done2 = done.clone();
        let answer = self
            .store_write(
                move |host| {
                    let d = host.erase_counted(before, &repos)?;
                    *done2.lock().unwrap_or_else(|e| e.into_inner()) = d;
                    Ok(d.seq)
                },
                durability,
            )
            .await;
        let answer = match answer {
            Response::Appended {
                seq,
                durability: Durability::Twin,
                twin_wait_us,
            } => self.carried_out_on_twin(seq, twin_wait_us).await,
            other => other,
        };
        let d = *done.lock().unwrap_or_else(|e| e.into_inner());
        match answer {
            Response::Appended {
                seq,
                durability,
                twin_wait_us,
            } => Response::Erased {
                seq,
                durability,
                twin_wait_us,
                before,
                frames: d.frames,
                bytes: d.bytes,
            },
            other => other,
        }
    }

    /// An erase of what was written before a time: the time becomes the
    /// first sequence written after it, to a segment's precision (see
    /// `StoreHost::seq_written_before`), and the erase goes as one before
    /// that sequence, which the answer names.
    pub(super) async fn erase_before_time(
        &self,
        before_unix_ms: u64,
        repos: Vec<String>,
        durability: Durability,
    ) -> Response {
        let host = match self.store() {
            Ok(h) => h,
            Err(e) => return Response::Error(e),
        };
        let before = host.seq_written_before(before_unix_ms);
        self.erase(before, repos, durability).await
    }

    /// An erase is carried out on the twin once its store applied the
    /// frame (its log and store erased, its snapshots dropped), not when
    /// the frame is durable there: wait for the twin's report, as long as
    /// the durability policy waits. A twin store stopped before the frame
    /// is said by name at once.
    async fn carried_out_on_twin(&self, seq: u64, twin_wait_us: u64) -> Response {
        let started = crate::node::clock::instant();
        let mut reports = self.twin_store.subscribe();
        let deadline = self
            .cfg
            .policy
            .store_wait()
            .map(|d| crate::node::clock::instant() + d);
        loop {
            if let Some(h) = reports.borrow_and_update().as_ref() {
                if h.applied >= seq {
                    return Response::Appended {
                        seq,
                        durability: Durability::Twin,
                        twin_wait_us: twin_wait_us + started.elapsed().as_micros() as u64,
                    };
                }
                if let Some(st) = h.stalled.as_ref().filter(|st| st.seq <= seq) {
                    return Response::Error(ApiError::NotCarriedOutOnTwin {
                        seq,
                        why: format!(
                            "the twin's store is stopped at frame {}: {}",
                            st.seq, st.error
                        ),
                    });
                }
            }
            let changed = reports.changed();
            let ended = match deadline {
                None => changed.await.is_err(),
                Some(at) => match tokio::time::timeout_at(at, changed).await {
                    Ok(r) => r.is_err(),
                    Err(_) => true,
                },
            };
            if ended {
                return Response::Error(ApiError::NotCarriedOutOnTwin {
                    seq,
                    why: "the twin's store did not report applying it in time".into(),
                });
            }
        }
    }

    /// A push: the pack streams from the request into the store host's
    /// blocking writer, a piece at a time.
    pub(super) async fn push(
        &self,
        caller: &Caller,
        repo: String,
        pack_len: u64,
        updates: Vec<RefMove>,
        durability: Durability,
        recv: &mut RecvStream,
    ) -> Response {
        let host = match self.store() {
            Ok(h) => h,
            Err(e) => return Response::Error(e),
        };
        let updates: Vec<crate::pushlog::RefUpdate> = updates
            .into_iter()
            .map(|u| crate::pushlog::RefUpdate {
                name: u.name,
                old: u.old,
                new: u.new,
            })
            .collect();
        let at_ms = crate::node::clock::unix_ms();
        let body = super::body::Body::new(recv, pack_len, self.cfg.body_piece_deadline);
        let pushed = self
            .staged(caller, "a push's pack", body, move |pieces| {
                host.push(&repo, pack_len, &updates, at_ms, pieces)
            })
            .await;
        let done = match pushed {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return Response::Error(e.into()),
            Err(e) => return Response::Error(short_is_bad_push(e)),
        };
        let Some(last) = done.refs_seq.or(done.pack_seq) else {
            return Response::Error(ApiError::BadPush("nothing was pushed".into()));
        };
        match self.acknowledge(last, pack_len + 64, durability).await {
            Response::Appended {
                durability,
                twin_wait_us,
                ..
            } => Response::Pushed {
                pack_seq: done.pack_seq,
                refs_seq: done.refs_seq,
                objects: done.objects,
                durability,
                twin_wait_us,
            },
            refused => refused,
        }
    }

    /// A large object put: its bytes stream into the store host's blocking
    /// writer, which hashes them on the way into the log.
    pub(super) async fn lfs_put(
        &self,
        caller: &Caller,
        repo: String,
        oid: [u8; 32],
        len: u64,
        durability: Durability,
        recv: &mut RecvStream,
    ) -> Response {
        let host = match self.store() {
            Ok(h) => h,
            Err(e) => return Response::Error(e),
        };
        let body = super::body::Body::new(recv, len, self.cfg.body_piece_deadline);
        let put = self
            .staged(caller, "a large object", body, move |pieces| {
                host.lfs_put(&repo, oid, len, pieces)
            })
            .await;
        let seq = match put {
            Ok(Ok(seq)) => seq,
            Ok(Err(e)) => return Response::Error(e.into()),
            Err(e) => return Response::Error(short_is_bad_push(e)),
        };
        self.acknowledge(seq, len + 64, durability).await
    }

    /// A control document written: read whole (it is bounded), checked,
    /// appended and applied.
    pub(super) async fn put_doc(
        &self,
        caller: &Caller,
        name: String,
        len: u64,
        durability: Durability,
        recv: &mut RecvStream,
    ) -> Response {
        let max = crate::store::frames::MAX_DOC_BYTES;
        if len > max {
            return Response::Error(ApiError::BadRequest(format!(
                "a document of {len} bytes; at most {max}"
            )));
        }
        let _held = caller.memory.charge(len).await;
        let content = match super::body::Body::new(recv, len, self.cfg.body_piece_deadline)
            .read_all()
            .await
        {
            Ok(c) => c,
            Err(e) => return Response::Error(e),
        };
        self.store_write(move |host| host.put_doc(&name, &content), durability)
            .await
    }

    /// Try a stopped store again now; answers its health either way.
    pub(super) async fn store_retry(&self) -> Response {
        let host = match self.store() {
            Ok(h) => h,
            Err(e) => return Response::Error(e),
        };
        let h2 = host.clone();
        match self.pool.run(move || h2.retry()).await {
            Ok(Ok(_)) | Ok(Err(crate::store::StoreError::Stalled { .. })) => {
                Response::Store(host.health())
            }
            Ok(Err(e)) => Response::Error(e.into()),
            Err(e) => Response::Error(ApiError::Store(e.to_string())),
        }
    }

    /// Skip the frame the store stopped at, on both boxes. Unless forced,
    /// only when the twin's store stopped at the same frame: a frame the
    /// twin applied, skipped here, would leave the boxes different.
    pub(super) async fn store_skip(
        &self,
        seq: u64,
        reason: String,
        force: bool,
        durability: Durability,
    ) -> Response {
        if !force {
            let twin = self.twin_store.borrow().clone();
            let refusal = match twin {
                None => Some("the twin has not reported its store (is it connected?)".to_string()),
                Some(h) => match h.stalled {
                    Some(st) if st.seq == seq => None,
                    Some(st) => Some(format!("the twin's store is stopped at {}, not here", st.seq)),
                    None if h.applied >= seq => Some(format!(
                        "the twin's store applied frame {seq}: skipping it here would leave the boxes different; fix the cause and retry"
                    )),
                    None => Some(format!(
                        "the twin's store has not reached frame {seq} yet (it applied {}): wait until it stops there too",
                        h.applied
                    )),
                },
            };
            if let Some(why) = refusal {
                return Response::Error(ApiError::SkipRefused {
                    seq,
                    why: format!("{why}; --force skips it regardless"),
                });
            }
        }
        self.store_write(move |host| host.skip(seq, &reason), durability)
            .await
    }

    /// A large object delete.
    pub(super) async fn lfs_delete(
        &self,
        repo: String,
        oid: [u8; 32],
        durability: Durability,
    ) -> Response {
        self.store_write(move |host| host.lfs_delete(&repo, oid), durability)
            .await
    }

    /// An object of `repo` read out, a large object or a git object,
    /// whichever `open` finds there (see [`Primary::send_object`]).
    pub(super) async fn send_repo_object(
        &self,
        caller: &Caller,
        repo: String,
        send: SendStream,
        open: impl FnOnce(&crate::store::Repo) -> Result<Option<Opened>, crate::store::StoreError>
            + Send
            + 'static,
    ) -> Result<(), NetError> {
        self.send_object(caller, send, move |store| open(store.repo(&repo)?))
            .await
    }

    /// A control document read out as it was when opened (see
    /// [`Primary::send_object`]).
    pub(super) async fn get_doc(
        &self,
        caller: &Caller,
        name: String,
        send: SendStream,
    ) -> Result<(), NetError> {
        self.send_object(caller, send, move |store| {
            let Some(file) = store.open_doc(&name)? else {
                return Ok(None);
            };
            Ok(Some(Opened {
                obj_type: 0,
                len: file.len()?,
                pieces: Box::new(DocPieces(crate::storage::Cursor::new(file))),
            }))
        })
        .await
    }
}

/// A pack or large object whose stream ended short is a bad push, as one
/// that does not check is: nothing of it landed.
fn short_is_bad_push(e: ApiError) -> ApiError {
    match e {
        ApiError::BadRequest(why) => ApiError::BadPush(why),
        other => other,
    }
}

/// Kinds whose frames the store applies; a raw append of one could hold
/// anything, and the store would stop at it.
pub(super) fn is_store_kind(kind: u16) -> bool {
    crate::store::is_store_kind(kind) || kind == crate::log::Kind::Redacted.as_u16()
}

/// A store read's response and the bytes that follow it.
pub(super) fn store_answer(
    host: &StoreHost,
    req: Request,
) -> Result<(Response, Vec<u8>), ApiError> {
    use crate::node::api::{PushRecord, MAX_HAVE};
    let store = host.lock()?;
    let listing = |bytes: Vec<u8>| {
        (
            Response::Listing {
                len: bytes.len() as u64,
            },
            bytes,
        )
    };
    Ok(match req {
        Request::ListRepos => {
            let names: Vec<String> = store.repos().map(str::to_owned).collect();
            listing(encode(&names)?)
        }
        Request::ListDocs => listing(encode(&store.docs()?)?),
        Request::Refs { repo } => {
            let refs: crate::node::api::RefsListing = store.refs(&repo)?.into_iter().collect();
            listing(encode(&refs)?)
        }
        Request::PushHistory { repo } => {
            let history: crate::node::api::HistoryListing = store
                .push_history(&repo)?
                .into_iter()
                .map(|p| PushRecord {
                    seq: p.seq,
                    at_ms: p.at_ms,
                    updates: p
                        .updates
                        .into_iter()
                        .map(|u| RefMove {
                            name: u.name,
                            old: u.old,
                            new: u.new,
                        })
                        .collect(),
                })
                .collect();
            listing(encode(&history)?)
        }
        Request::Have { repo, oids } => {
            if oids.len() > MAX_HAVE {
                return Err(ApiError::BadRequest(format!(
                    "{} oids in one have; at most {MAX_HAVE}",
                    oids.len()
                )));
            }
            let refs: Vec<&[u8]> = oids.iter().map(|o| &o[..]).collect();
            (Response::Have(store.have(&repo, &refs)?), Vec::new())
        }
        other => return Err(ApiError::BadRequest(format!("not a store read: {other:?}"))),
    })
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, ApiError> {
    postcard::to_stdvec(v).map_err(|e| ApiError::Store(e.to_string()))
}
