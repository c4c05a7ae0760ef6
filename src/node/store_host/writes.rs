//! The primary's store writes: each checked against the state it lands
//! on, appended to the log and applied before it returns, so the store
//! and the log never disagree on what a write did.

use crate::log::{Kind, Meta};
use crate::pushlog::RefUpdate;
use crate::store::frames::{self, PackEvent, PackParser, RepoOp};
use crate::store::StoreError;

use super::{EraseDone, PushDone, StoreHost};

impl StoreHost {
    /// Create a repository: refused when it exists.
    pub fn create_repo(&self, repo: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        if store.repo(repo).is_ok() {
            return Err(StoreError::RepoExists(repo.to_owned()));
        }
        let f = frames::repo_frame(repo, RepoOp::Create)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// A push: the pack's `pack_len` bytes from `pieces` (checked object by
    /// object as they stream into the log; a pack that does not check is
    /// aborted and leaves nothing), then the ref updates, which must move
    /// each ref from where it is now. Both frames are durable and applied
    /// when this returns.
    pub fn push(
        &self,
        repo: &str,
        pack_len: u64,
        updates: &[RefUpdate],
        at_ms: u64,
        pieces: &mut dyn Iterator<Item = bytes::Bytes>,
    ) -> Result<PushDone, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        store.repo(repo)?;
        if pack_len == 0 && updates.is_empty() {
            return Err(StoreError::BadPush(
                "a push carries objects or ref updates".into(),
            ));
        }
        let refs = if updates.is_empty() {
            None
        } else {
            store.check_push(repo, updates)?;
            Some(frames::refs_frame(repo, at_ms, updates)?)
        };
        let _m = self.log.mutation();
        let mut done = PushDone::default();
        if pack_len > 0 {
            let meta = Meta::repo(repo).encode()?;
            let mut pending = self.log.begin(None, Kind::Pack.as_u16(), &meta, pack_len)?;
            let mut parser = PackParser::new(0);
            let mut got = 0u64;
            for piece in pieces {
                got += piece.len() as u64;
                if got > pack_len {
                    break;
                }
                parser.feed(&piece, &mut |ev| {
                    if let PackEvent::End(_) = ev {
                        done.objects += 1;
                    }
                    Ok(())
                })?;
                pending.write(&piece)?;
            }
            if got != pack_len {
                return Err(StoreError::BadPush(format!(
                    "the pack is {pack_len} bytes, {got} arrived"
                )));
            }
            parser.finish()?;
            done.pack_seq = Some(pending.commit()?);
        }
        if let Some(f) = refs {
            done.refs_seq = Some(self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?);
        }
        self.applied_after(&mut store, done.refs_seq.or(done.pack_seq).unwrap_or(0))?;
        Ok(done)
    }

    /// Put a large object: its `len` bytes from `pieces` stream into an
    /// LfsPut frame while their SHA-256 is computed; bytes that do not hash
    /// to `oid` abort the frame and nothing lands.
    pub fn lfs_put(
        &self,
        repo: &str,
        oid: [u8; frames::LFS_OID_LEN],
        len: u64,
        pieces: &mut dyn Iterator<Item = bytes::Bytes>,
    ) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        store.repo(repo)?;
        let meta = frames::lfs_meta(repo, &oid)?;
        let _m = self.log.mutation();
        let mut pending = self.log.begin(None, Kind::LfsPut.as_u16(), &meta, len)?;
        let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
        let mut got = 0u64;
        for piece in pieces {
            got += piece.len() as u64;
            if got > len {
                break;
            }
            sha.update(&piece);
            pending.write(&piece)?;
        }
        if got != len {
            return Err(StoreError::BadPush(format!(
                "the object is {len} bytes, {got} arrived"
            )));
        }
        if sha.finish().as_ref() != oid {
            return Err(StoreError::BadPush(format!(
                "the object does not hash to {}",
                frames::hex(&oid)
            )));
        }
        let seq = pending.commit()?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Delete a large object.
    pub fn lfs_delete(
        &self,
        repo: &str,
        oid: [u8; frames::LFS_OID_LEN],
    ) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        if !store.repo(repo)?.lfs().contains(&oid) {
            return Err(StoreError::BadPush(format!(
                "no large object {}",
                frames::hex(&oid)
            )));
        }
        let meta = frames::lfs_meta(repo, &oid)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(Kind::LfsDelete.as_u16(), &meta, &[])?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Delete a repository (a RepoStore Purge frame): refused when there is
    /// none. Its frames stay in the log until retention drops them; `erase`
    /// is what removes its data from the log.
    pub fn delete_repo(&self, repo: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        store.repo(repo)?;
        let f = frames::repo_frame(repo, RepoOp::Purge)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Delete a control document: refused when there is none.
    pub fn delete_doc(&self, name: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        if store.doc(name)?.is_none() {
            return Err(StoreError::NoDoc(name.to_owned()));
        }
        let f = frames::doc_delete_frame(name)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Write a control document.
    pub fn put_doc(&self, name: &str, content: &[u8]) -> Result<u64, StoreError> {
        let f = frames::doc_frame(name, content)?;
        self.append_checked(&f)
    }

    /// Erase the data frames of `repos` before `before`, on the log and
    /// the store of every box that applies the frame. `before` past the
    /// frame's own seq could never apply, and is refused here.
    pub fn erase(&self, before: u64, repos: &[String]) -> Result<u64, StoreError> {
        self.erase_counted(before, repos).map(|e| e.seq)
    }

    /// [`StoreHost::erase`], saying what it erased in this box's log.
    pub fn erase_counted(&self, before: u64, repos: &[String]) -> Result<EraseDone, StoreError> {
        let f = frames::erase_frame(before, repos)?;
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        let _m = self.log.mutation();
        // Under the store's lock no other store frame lands first, but a
        // raw append may: the frame's seq is at least the next one now.
        let next = self.log.head_seq() + 1;
        if before > next {
            return Err(StoreError::BadFrame {
                seq: next,
                why: format!("an erase before {before}, past the next sequence {next}"),
            });
        }
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        let (frames, bytes) = store.last_erased();
        Ok(EraseDone { seq, frames, bytes })
    }

    /// The first seq from which frames may have been written at or after
    /// `unix_ms`: every frame before it sits in a segment last written
    /// before then. To a segment's precision, and never past what the
    /// time allows: an erase before it erases no frame written later.
    pub fn seq_written_before(&self, unix_ms: u64) -> u64 {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
        let mut before = self.log.first_seq();
        for (first, last, _) in self.log.layout() {
            let written = self
                .log
                .storage()
                .modified(&crate::log::format::segment_path(self.log.dir(), first));
            match written {
                Ok(t) if t < at && last >= first => before = last + 1,
                _ => break,
            }
        }
        before
    }

    /// Append a checked frame that needs nothing of the store's state, and
    /// apply it.
    fn append_checked(&self, f: &frames::FrameParts) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }
}
