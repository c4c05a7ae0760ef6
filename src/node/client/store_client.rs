//! The client's store requests: create a repository, push, list refs and
//! pushes, read an object, ask which objects a repository has, and import a
//! git repository through pushes.

use std::collections::BTreeMap;
use std::path::Path;

use super::api::{
    ApiError, Durability, HistoryListing, PushRecord, RefMove, RefsListing, Request, Response,
    MAX_HAVE, MAX_LISTING,
};
use super::{Appended, Client, ClientError};
use crate::net::NetError;
use crate::objects::ObjType;
use crate::store::import::{self, GitImport};
use crate::store::Result as StoreResult;

/// An acknowledged erase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Erased {
    /// The Erase frame's seq.
    pub seq: u64,
    pub durability: Durability,
    pub twin_wait: std::time::Duration,
    /// The frames before this sequence were erased.
    pub before: u64,
    /// Data frames erased in the primary's log, and their bytes.
    pub frames: u64,
    pub bytes: u64,
}

fn erased(resp: Response) -> Result<Erased, ClientError> {
    match resp {
        Response::Erased {
            seq,
            durability,
            twin_wait_us,
            before,
            frames,
            bytes,
        } => Ok(Erased {
            seq,
            durability,
            twin_wait: std::time::Duration::from_micros(twin_wait_us),
            before,
            frames,
            bytes,
        }),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// An acknowledged push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pushed {
    pub pack_seq: Option<u64>,
    pub refs_seq: Option<u64>,
    pub objects: u64,
    pub durability: Durability,
}

impl Client {
    /// Create a repository.
    pub async fn create_repo(
        &self,
        repo: &str,
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::CreateRepo {
            repo: repo.to_owned(),
            durability,
        };
        Client::appended(self.call(&req, &[]).await?.0)
    }

    /// Push a pack (a Pack frame's blob, possibly empty) and ref updates.
    pub async fn push(
        &self,
        repo: &str,
        pack: &[u8],
        updates: Vec<RefMove>,
        durability: Durability,
    ) -> Result<Pushed, ClientError> {
        let req = Request::Push {
            repo: repo.to_owned(),
            pack_len: pack.len() as u64,
            updates,
            durability,
        };
        pushed(self.call(&req, pack).await?.0)
    }

    /// [`Client::push`] of a pack of `len` bytes read from `pack` in
    /// pieces: memory is one piece whatever the size. A reader that ends
    /// early makes the primary refuse the push, with nothing written.
    pub async fn push_reader<R: tokio::io::AsyncRead + Unpin>(
        &self,
        repo: &str,
        len: u64,
        mut pack: R,
        updates: Vec<RefMove>,
        durability: Durability,
    ) -> Result<Pushed, ClientError> {
        let req = Request::Push {
            repo: repo.to_owned(),
            pack_len: len,
            updates,
            durability,
        };
        pushed(self.call_streamed(&req, len, &mut pack).await?)
    }

    async fn listing<T: serde::de::DeserializeOwned>(
        &self,
        req: &Request,
    ) -> Result<T, ClientError> {
        let (resp, mut recv) = self.call(req, &[]).await?;
        let Response::Listing { len } = resp else {
            return Err(ClientError::Unexpected(format!("{resp:?}")));
        };
        let bytes = self
            .read_body(&mut recv, len, MAX_LISTING, "a listing")
            .await?;
        postcard::from_bytes(&bytes).map_err(|e| ClientError::Unexpected(format!("listing: {e}")))
    }

    /// A repository's current refs.
    pub async fn refs(&self, repo: &str) -> Result<BTreeMap<String, [u8; 20]>, ClientError> {
        let refs: RefsListing = self
            .listing(&Request::Refs {
                repo: repo.to_owned(),
            })
            .await?;
        Ok(refs.into_iter().collect())
    }

    /// A repository's pushes, oldest first.
    pub async fn push_history(&self, repo: &str) -> Result<Vec<PushRecord>, ClientError> {
        let h: HistoryListing = self
            .listing(&Request::PushHistory {
                repo: repo.to_owned(),
            })
            .await?;
        Ok(h)
    }

    /// One object's type and bytes; None when the repository lacks it.
    pub async fn read_object(
        &self,
        repo: &str,
        oid: [u8; 20],
    ) -> Result<Option<(ObjType, Vec<u8>)>, ClientError> {
        let req = Request::ReadObject {
            repo: repo.to_owned(),
            oid,
        };
        let (resp, mut recv) = self.call(&req, &[]).await?;
        match resp {
            Response::Absent => Ok(None),
            Response::Object { obj_type, len } => {
                let t = ObjType::from_u8(obj_type)
                    .ok_or_else(|| ClientError::Unexpected(format!("object type {obj_type}")))?;
                let data = self
                    .read_body(
                        &mut recv,
                        len,
                        crate::store::frames::MAX_OBJECT_BYTES,
                        "an object",
                    )
                    .await?;
                if crate::store::frames::git_oid(t, &data) != oid {
                    return Err(ClientError::Unexpected(
                        "the object does not hash to its id".into(),
                    ));
                }
                Ok(Some((t, data)))
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Erase the data frames of `repos` before `before` on both boxes.
    pub async fn erase(
        &self,
        before: u64,
        repos: &[String],
        durability: Durability,
    ) -> Result<Erased, ClientError> {
        let req = Request::Erase {
            before,
            repos: repos.to_vec(),
            durability,
        };
        erased(self.call(&req, &[]).await?.0)
    }

    /// Erase the data frames of `repos` written before `unix_ms`, to a
    /// segment's precision; the answer names the sequence it became.
    pub async fn erase_before_time(
        &self,
        unix_ms: u64,
        repos: &[String],
        durability: Durability,
    ) -> Result<Erased, ClientError> {
        let req = Request::EraseBeforeTime {
            before_unix_ms: unix_ms,
            repos: repos.to_vec(),
            durability,
        };
        erased(self.call(&req, &[]).await?.0)
    }

    /// The repositories' names, sorted.
    pub async fn list_repos(&self) -> Result<Vec<String>, ClientError> {
        self.listing(&Request::ListRepos).await
    }

    /// The control documents' names, sorted.
    pub async fn list_docs(&self) -> Result<Vec<String>, ClientError> {
        self.listing(&Request::ListDocs).await
    }

    /// Delete a repository from the store.
    pub async fn delete_repo(
        &self,
        repo: &str,
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::DeleteRepo {
            repo: repo.to_owned(),
            durability,
        };
        Client::appended(self.call(&req, &[]).await?.0)
    }

    /// Delete a control document.
    pub async fn delete_doc(
        &self,
        name: &str,
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::DeleteDoc {
            name: name.to_owned(),
            durability,
        };
        Client::appended(self.call(&req, &[]).await?.0)
    }

    /// Try the primary's stopped store again now; answers its health.
    pub async fn store_retry(&self) -> Result<crate::repl::StoreHealth, ClientError> {
        match self.call(&Request::StoreRetry, &[]).await?.0 {
            Response::Store(h) => Ok(h),
            Response::Error(e) => Err(ClientError::Api(e)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Skip frame `seq`, where the store stopped, on both boxes (a
    /// StoreSkip frame); `force` skips the check that the twin's store
    /// stopped there too.
    pub async fn store_skip(
        &self,
        seq: u64,
        reason: &str,
        force: bool,
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::StoreSkip {
            seq,
            reason: reason.to_owned(),
            force,
            durability,
        };
        Client::appended(self.call(&req, &[]).await?.0)
    }

    /// Drop the log's whole segments below `seq` by hand; past the twin's
    /// position only with `force`. Answers the new first sequence.
    pub async fn retain_from(&self, seq: u64, force: bool) -> Result<u64, ClientError> {
        match self.call(&Request::RetainFrom { seq, force }, &[]).await?.0 {
            Response::Retained { first } => Ok(first),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Put a large object of `len` bytes read from `content` in pieces; its
    /// SHA-256 (`oid`) is checked by the primary as it streams.
    pub async fn lfs_put<R: tokio::io::AsyncRead + Unpin>(
        &self,
        repo: &str,
        oid: [u8; 32],
        len: u64,
        mut content: R,
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::LfsPut {
            repo: repo.to_owned(),
            oid,
            len,
            durability,
        };
        Client::appended(self.call_streamed(&req, len, &mut content).await?)
    }

    /// A large object's bytes, written to `out` as they arrive; false when
    /// the repository has no such object.
    pub async fn lfs_get<W: tokio::io::AsyncWrite + Unpin>(
        &self,
        repo: &str,
        oid: [u8; 32],
        mut out: W,
    ) -> Result<bool, ClientError> {
        use tokio::io::AsyncWriteExt;
        let req = Request::LfsGet {
            repo: repo.to_owned(),
            oid,
        };
        let (resp, mut recv) = self.call(&req, &[]).await?;
        let len = match resp {
            Response::Absent => return Ok(false),
            Response::Object { len, .. } => len,
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        };
        let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
        let mut left = len;
        while left > 0 {
            let want = (1 << 20).min(left as usize);
            let chunk = self
                .timed(async {
                    recv.read_chunk(want, true)
                        .await
                        .map_err(|e| NetError::Io(std::io::Error::other(e)))
                })
                .await?
                .ok_or_else(|| {
                    ClientError::Unexpected(format!("the object ended {left} bytes short"))
                })?;
            sha.update(&chunk.bytes);
            out.write_all(&chunk.bytes).await.map_err(NetError::from)?;
            left -= chunk.bytes.len() as u64;
        }
        if sha.finish().as_ref() != oid {
            return Err(ClientError::Unexpected(
                "the object does not hash to its id".into(),
            ));
        }
        Ok(true)
    }

    /// Write a control document.
    pub async fn put_doc(
        &self,
        name: &str,
        content: &[u8],
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::PutDoc {
            name: name.to_owned(),
            len: content.len() as u64,
            durability,
        };
        Client::appended(self.call(&req, content).await?.0)
    }

    /// A control document; None when there is none of that name.
    pub async fn get_doc(&self, name: &str) -> Result<Option<Vec<u8>>, ClientError> {
        let req = Request::GetDoc {
            name: name.to_owned(),
        };
        let (resp, mut recv) = self.call(&req, &[]).await?;
        match resp {
            Response::Absent => Ok(None),
            Response::Object { len, .. } => Ok(Some(
                self.read_body(
                    &mut recv,
                    len,
                    crate::store::frames::MAX_DOC_BYTES,
                    "a document",
                )
                .await?,
            )),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Delete a large object.
    pub async fn lfs_delete(
        &self,
        repo: &str,
        oid: [u8; 32],
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::LfsDelete {
            repo: repo.to_owned(),
            oid,
            durability,
        };
        Client::appended(self.call(&req, &[]).await?.0)
    }

    /// Which of `oids` the repository holds, asked in batches.
    pub async fn have(&self, repo: &str, oids: &[[u8; 20]]) -> Result<Vec<bool>, ClientError> {
        let mut out = Vec::with_capacity(oids.len());
        for batch in oids.chunks(MAX_HAVE) {
            let req = Request::Have {
                repo: repo.to_owned(),
                oids: batch.to_vec(),
            };
            match self.call(&req, &[]).await?.0 {
                Response::Have(h) if h.len() == batch.len() => out.extend(h),
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
        Ok(out)
    }

    /// Import the git repository at `git_dir` as repository `repo`. A new
    /// repository is created, then gets every object in packs of about
    /// `pack_bytes`, then its refs. One the store holds already is brought
    /// up to date: only the objects it lacks (asked with `have`) are sent,
    /// and each ref git has moves from where it is now, as a push would; a
    /// ref git does not have is left alone.
    pub async fn import_git(
        &self,
        git_dir: &Path,
        repo: &str,
        pack_bytes: usize,
        durability: Durability,
    ) -> Result<GitImport, ClientError> {
        let current = match self.refs(repo).await {
            Ok(refs) => Some(refs),
            Err(ClientError::Api(ApiError::NoRepo(_))) => None,
            Err(e) => return Err(e),
        };
        let dir = git_dir.to_owned();
        let wanted = blocking(move || import::read_refs(&dir)).await?;
        let mut held = 0;
        let only = match &current {
            None => {
                self.create_repo(repo, durability).await?;
                None
            }
            Some(_) => {
                let dir = git_dir.to_owned();
                let all = blocking(move || import::list_objects(&dir)).await?;
                let have = self.have(repo, &all).await?;
                let missing: Vec<[u8; 20]> = all
                    .iter()
                    .zip(&have)
                    .filter_map(|(oid, h)| (!h).then_some(*oid))
                    .collect();
                held = (all.len() - missing.len()) as u64;
                Some(missing)
            }
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let (dir, name) = (git_dir.to_owned(), repo.to_owned());
        // Started now (not on first poll), to fill the channel as it drains.
        let reader = tokio::task::spawn_blocking(move || {
            import::read_objects(&dir, &name, pack_bytes, only, &mut |f| {
                tx.blocking_send(f).map_err(|_| {
                    crate::store::StoreError::Io(std::io::Error::other("import cancelled"))
                })
            })
        });
        while let Some(f) = rx.recv().await {
            self.push(repo, &f.blob, Vec::new(), durability).await?;
        }
        let mut done = reader
            .await
            .map_err(|e| ClientError::Import(e.to_string()))?
            .map_err(|e| ClientError::Import(e.to_string()))?;
        let (moves, unchanged) = import::refs_to_move(&wanted, &current.unwrap_or_default());
        if !moves.is_empty() {
            let updates = moves
                .into_iter()
                .map(|u| RefMove {
                    name: u.name,
                    old: u.old,
                    new: u.new,
                })
                .collect::<Vec<_>>();
            done.refs = updates.len() as u64;
            self.push(repo, &[], updates, durability).await?;
        }
        done.held = held;
        done.refs_unchanged = unchanged;
        Ok(done)
    }
}

/// The answer to a push.
fn pushed(resp: Response) -> Result<Pushed, ClientError> {
    match resp {
        Response::Pushed {
            pack_seq,
            refs_seq,
            objects,
            durability,
            ..
        } => Ok(Pushed {
            pack_seq,
            refs_seq,
            objects,
            durability,
        }),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// Run a piece of the git import on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> Result<T, ClientError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ClientError::Import(e.to_string()))?
        .map_err(|e| ClientError::Import(e.to_string()))
}
