//! Applying one frame to the store: each kind's effect, written so that
//! a replay after a crash finds it done and makes it durable, and the
//! applied mark moved only after it.

use super::*;

impl Store {
    /// Apply frame `seq`, which must be `applied + 1` and durable in `log`.
    pub fn apply(&mut self, log: &Log, seq: u64) -> Result<Applied> {
        if seq != self.applied + 1 {
            return Err(StoreError::BadFrame {
                seq,
                why: format!("the store applies {} next", self.applied + 1),
            });
        }
        let loc = log.locate_blob(seq)?;
        let kind = Kind::from_u16(loc.kind).ok();
        let mut done = Applied {
            frames: 1,
            objects: 0,
            bytes: loc.blob_len,
        };
        match kind {
            Some(Kind::RepoStore) => {
                let op: RepoOp = frames::decode_small(seq, &self.small_blob(log, seq, &loc)?)?;
                let repo = self.repo_of(seq, &loc.meta)?;
                match op {
                    RepoOp::Create => self.create_repo(&repo)?,
                    RepoOp::Purge => self.purge_repo(&repo)?,
                }
            }
            Some(Kind::Pack) => {
                let name = self.repo_of(seq, &loc.meta)?;
                let repo = self.repos.get_mut(&name).ok_or(StoreError::NoRepo(name))?;
                if repo.last_pack_seq() < seq {
                    let mut p = repo.begin_pack(seq)?;
                    log.read_pieces_from::<StoreError>(seq, 0, self.opts.piece, |_, piece, _| {
                        repo.pack_piece(&mut p, piece)
                    })?;
                    done.objects = repo.finish_pack(p)?;
                } else {
                    repo.sync()?;
                }
            }
            Some(Kind::Refs) => {
                let body: frames::RefsBody =
                    frames::decode_small(seq, &self.small_blob(log, seq, &loc)?)?;
                let name = self.repo_of(seq, &loc.meta)?;
                let repo = self.repos.get_mut(&name).ok_or(StoreError::NoRepo(name))?;
                repo.apply_push(
                    self.opts.compact_after_pushes,
                    &Push {
                        seq,
                        at_ms: body.at_ms,
                        updates: body
                            .updates
                            .into_iter()
                            .map(|(name, old, new)| RefUpdate { name, old, new })
                            .collect(),
                    },
                )?;
            }
            Some(Kind::LfsPut) => {
                let (name, oid) = self.lfs_target(seq, &loc.meta)?;
                let repo = self.repos.get_mut(&name).ok_or(StoreError::NoRepo(name))?;
                if repo.lfs().last_seq() < seq {
                    let mut put = repo.lfs().begin_put(seq, oid)?;
                    log.read_pieces_from::<StoreError>(seq, 0, self.opts.piece, |_, piece, _| {
                        put.write(piece)
                    })?;
                    repo.lfs_mut().finish_put(put)?;
                    done.objects = 1;
                } else {
                    repo.sync()?;
                }
            }
            Some(Kind::LfsDelete) => {
                let (name, oid) = self.lfs_target(seq, &loc.meta)?;
                let repo = self.repos.get_mut(&name).ok_or(StoreError::NoRepo(name))?;
                if repo.lfs().last_seq() < seq {
                    repo.lfs_mut().delete(seq, oid)?;
                } else {
                    repo.sync()?;
                }
            }
            Some(Kind::ControlDoc) => {
                let name = doc_name(seq, &loc.meta)?;
                if loc.blob_len > frames::MAX_DOC_BYTES {
                    return Err(StoreError::TooLarge {
                        what: "control document",
                        len: loc.blob_len,
                        max: frames::MAX_DOC_BYTES,
                    });
                }
                let content = log.read(seq)?.blob;
                self.write_doc(&name, &content)?;
            }
            Some(Kind::DocDelete) => {
                let name = doc_name(seq, &loc.meta)?;
                self.delete_doc(&name)?;
            }
            Some(Kind::Erase) => {
                let body: frames::EraseBody =
                    frames::decode_small(seq, &self.small_blob(log, seq, &loc)?)?;
                if body.before > seq {
                    return Err(StoreError::BadFrame {
                        seq,
                        why: format!("an erase of frames before {} at {seq}", body.before),
                    });
                }
                // The log first: its erase is idempotent, so a crash
                // before the store's part repeats both on replay, and a
                // restore from this box finds no erased byte.
                let erased = log.erase(body.before, &body.repos)?;
                tracing::info!(
                    seq, before = body.before, repos = ?body.repos, frames = erased.frames,
                    bytes = erased.bytes, "erase carried out on the log"
                );
                if let Some(also) = &self.erase_also {
                    let n = also(seq, body.before, &body.repos)?;
                    if n > 0 {
                        tracing::info!(seq, frames = n, "erase carried out on saved copies");
                    }
                }
                for name in &body.repos {
                    if let Some(repo) = self.repos.get_mut(name) {
                        repo.erase_before(body.before)?;
                    }
                }
                self.last_erase = seq;
                self.last_erased = (erased.frames, erased.bytes);
            }
            Some(Kind::StoreSkip) => {
                let body: frames::SkipBody =
                    frames::decode_small(seq, &self.small_blob(log, seq, &loc)?)?;
                // The skipped frame came first: catch_up skipped it here, or
                // it applied here and this box differs from one that
                // skipped it, which is said loudly.
                if body.seq >= seq {
                    return Err(StoreError::BadFrame {
                        seq,
                        why: format!("a skip of frame {} at {seq}", body.seq),
                    });
                }
                if self.skips.get(body.seq).is_none() && body.seq >= log.first_seq() {
                    tracing::warn!(
                        seq, skipped = body.seq,
                        "a StoreSkip frame names a frame this store applied: this box kept its effect"
                    );
                }
                done.bytes = 0;
            }
            // Erased data, the embedding Wal's records and applications' own
            // kinds are no state of the store.
            Some(Kind::Redacted | Kind::Record | Kind::Once | Kind::App(_) | Kind::Reserved(_))
            | None => {
                done.bytes = 0;
            }
        }
        self.applied = seq;
        Ok(done)
    }

    fn small_blob(&self, log: &Log, seq: u64, loc: &log::Located) -> Result<Vec<u8>> {
        if loc.blob_len > frames::MAX_SMALL_BLOB {
            return Err(StoreError::TooLarge {
                what: "RepoStore, Refs or Erase blob",
                len: loc.blob_len,
                max: frames::MAX_SMALL_BLOB,
            });
        }
        Ok(log.read(seq)?.blob)
    }

    fn repo_of(&self, seq: u64, meta: &[u8]) -> Result<String> {
        let name = Meta::repo_of(meta).map_err(|e| StoreError::BadFrame {
            seq,
            why: e.to_string(),
        })?;
        frames::check_repo_name(name)?;
        Ok(name.to_owned())
    }

    fn lfs_target(&self, seq: u64, meta: &[u8]) -> Result<(String, [u8; frames::LFS_OID_LEN])> {
        let m = Meta::decode(meta)?;
        frames::check_repo_name(&m.repo)?;
        let oid: [u8; frames::LFS_OID_LEN] =
            m.detail
                .as_slice()
                .try_into()
                .map_err(|_| StoreError::BadFrame {
                    seq,
                    why: format!("a large object's id of {} bytes", m.detail.len()),
                })?;
        Ok((m.repo, oid))
    }

    fn repo_path(&self, name: &str) -> PathBuf {
        self.dir.join("repos").join(repo_dir_name(name))
    }

    fn create_repo(&mut self, name: &str) -> Result<()> {
        if !self.repos.contains_key(name) {
            let repo = Repo::open_with(
                Arc::clone(&self.fs),
                &self.repo_path(name),
                &self.tmp_dir(),
                self.opts.cache_bytes,
            )?;
            self.repos.insert(name.to_owned(), repo);
        }
        Ok(())
    }

    /// Move the repository to the trash (one rename, durable), then delete
    /// it; `open` finishes a delete a crash interrupted.
    fn purge_repo(&mut self, name: &str) -> Result<()> {
        let Some(repo) = self.repos.remove(name) else {
            // Gone already, perhaps by a try whose directory fsync failed:
            // its absence is made durable before the frame counts applied.
            sync_parent_with(&*self.fs, &self.repo_path(name))?;
            sync_parent_with(&*self.fs, &self.dir.join("trash").join("x"))?;
            return Ok(());
        };
        let from = repo.dir().to_owned();
        drop(repo);
        // Named by the purging frame alone: a repository's directory name
        // may already be as long as a file name can be.
        let to = self.dir.join("trash").join((self.applied + 1).to_string());
        let fs = &*self.fs;
        fs.rename(&from, &to)?;
        sync_parent_with(fs, &from)?;
        sync_parent_with(fs, &to)?;
        fs.remove_dir_all(&to)?;
        Ok(())
    }

    /// Publish a document by rename from the tmp directory, whose entry
    /// moves too: both directories are fsynced.
    fn write_doc(&self, name: &str, content: &[u8]) -> Result<()> {
        let path = self.dir.join("docs").join(name);
        let tmp = self.tmp_dir().join(format!("doc-{name}"));
        let fs = &*self.fs;
        let f = fs.open(&tmp, OpenMode::Create)?;
        f.set_len(0)?;
        f.write_all_at(content, 0)?;
        if !crate::publish::sabotage::fsync_skipped() {
            f.sync_all()?;
        }
        fs.rename(&tmp, &path)?;
        sync_parent_with(fs, &path)?;
        sync_parent_with(fs, &tmp)?;
        Ok(())
    }

    /// Delete a control document, durably; deleting one that is not there
    /// changes nothing (a replay) but the fsync of its directory, since a
    /// try whose fsync failed may have left the removal undurable.
    fn delete_doc(&self, name: &str) -> Result<()> {
        let path = self.dir.join("docs").join(name);
        match self.fs.remove(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        Ok(sync_parent_with(&*self.fs, &path)?)
    }
}

/// The checked document name a document frame's meta carries.
fn doc_name(seq: u64, meta: &[u8]) -> Result<String> {
    let meta = Meta::decode(meta)?;
    let name = String::from_utf8(meta.detail).map_err(|_| StoreError::BadFrame {
        seq,
        why: "a document name that is not UTF-8".into(),
    })?;
    frames::check_doc_name(&name)?;
    Ok(name)
}
