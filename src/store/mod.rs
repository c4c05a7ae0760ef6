//! The store: the state the log feeds on each box. Repositories with their
//! objects (a pack archive and an [`ObjectReadStack`] over it), refs (a
//! [`PushLog`]) and large objects, plus control documents, applied frame by
//! frame in sequence order.
//!
//! The log is written before the state: a frame is applied only once it is
//! durable in the log, and the store records the seq it has applied up to
//! (`APPLIED`). Every effect is made durable before that record moves, and
//! every effect knows whether it is already there (the archive's last pack,
//! the push log's last push, the LFS journal's last operation), so a replay
//! after a crash applies each frame at most once and lands on the state an
//! uninterrupted run has.
//!
//! [`ObjectReadStack`]: crate::objects::ObjectReadStack
//! [`PushLog`]: crate::pushlog::PushLog

mod apply;
pub mod archive;
pub mod frames;
pub mod import;
pub mod install;
pub mod lfs;
mod marker;
pub mod repo;
pub mod skips;
pub mod snapshot;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::log::{self, HistoryId, Kind, Log, Meta};
use crate::objects::{ObjType, OID_LEN};
use crate::publish::sync_parent_with;
use crate::pushlog::{Push, PushLogError, RefUpdate};
use crate::storage::{OpenMode, StdStorage, Storage, StorageFile};

pub(crate) use archive::punch;
pub use frames::{FrameParts, PackBuilder, RepoOp};
pub use lfs::LfsObject;
pub use repo::{GitObjectReader, Repo};
pub use skips::SkipRecord;
pub use snapshot::{Manifest, ManifestFile};

/// A result of the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Everything the store refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("log: {0}")]
    Log(#[from] log::Error),
    #[error("push log: {0}")]
    PushLog(#[from] PushLogError),
    #[error("object index: {0}")]
    Objects(Box<crate::objects::Error>),
    /// A frame in the log does not hold what its kind says.
    #[error("frame {seq} does not apply: {why}")]
    BadFrame { seq: u64, why: String },
    /// A name a repository or document cannot have.
    #[error("bad name {name:?}: {why}")]
    BadName { name: String, why: String },
    /// A push that cannot be applied as asked.
    #[error("push refused: {0}")]
    BadPush(String),
    /// A ref moved since the pusher read it.
    #[error("ref {name} is at {current}, the push expected {expected}")]
    RefMoved {
        name: String,
        expected: String,
        current: String,
    },
    #[error("no repository {0:?}")]
    NoRepo(String),
    #[error("no document {0:?}")]
    NoDoc(String),
    #[error("repository {0:?} exists")]
    RepoExists(String),
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    /// Bytes of the store that do not decode.
    #[error("corrupt store file {}: at byte {at}: {what}", path.display())]
    Corrupt {
        path: PathBuf,
        at: u64,
        what: String,
    },
    /// The store belongs to another log.
    #[error("the store belongs to log history {store}, the log is {log}")]
    OtherHistory { store: String, log: String },
    /// The store is ahead of the log it is applied from.
    #[error("the store has applied up to {applied}, the log's head is {head}")]
    AheadOfLog { applied: u64, head: u64 },
    /// Frames of the store's own past `after`, which a cut would take from
    /// the log, were applied: its files hold them.
    #[error("the store applied its own frames up to {applied}, past frame {after} where the log must be cut: restore this box from its primary")]
    AppliedPastCut { after: u64, applied: u64 },
    /// The frames the store needs next are below the log's retention floor.
    #[error("the store needs frame {need}, the log retains from {first}: a snapshot is needed")]
    BelowFloor { need: u64, first: u64 },
    /// The store is closed (a snapshot install is swapping it).
    #[error("the store is closed: {0}")]
    Closed(String),
    /// A snapshot whose files do not match its manifest.
    #[error("snapshot {}: {what}", dir.display())]
    BadSnapshot { dir: PathBuf, what: String },
    /// The store is stopped at frame `seq`, which did not apply: nothing is
    /// appended until it applies or is skipped.
    #[error("the store is stopped at frame {seq}, which does not apply: {why}")]
    Stalled { seq: u64, why: String },
    /// The frame is durable in the log at `seq`, but the store has not
    /// applied it: it applies once the store can, on every box.
    #[error("frame {seq} is durable in the log, and the store has not applied it yet: {why}")]
    NotApplied { seq: u64, why: String },
    /// A skip of a frame the store is not stopped at.
    #[error("the store is not stopped at frame {seq}{}", stalled.map_or(String::new(), |s| format!(" (it is stopped at {s})")))]
    NotStalledAt { seq: u64, stalled: Option<u64> },
    /// Frame `seq` is durable in the log and did not apply: the store stops
    /// there until it applies (a retry after a fix) or a StoreSkip frame
    /// skips it.
    #[error("frame {seq} (kind {kind}) did not apply: {source}")]
    Apply {
        seq: u64,
        kind: u16,
        source: Box<StoreError>,
    },
}

impl From<crate::objects::Error> for StoreError {
    fn from(e: crate::objects::Error) -> StoreError {
        StoreError::Objects(Box::new(e))
    }
}

/// Tuning of a store.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// redb's page-cache ceiling per repository's object index.
    pub cache_bytes: usize,
    /// The piece size frames are read from the log in.
    pub piece: usize,
    /// Pushes a repository's live push log holds before it is compacted
    /// (the pushes move to its reflog archive), so opening it reads one
    /// checkpoint and the pushes since, not every push ever made.
    pub compact_after_pushes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_bytes: 16 << 20,
            piece: 1 << 20,
            compact_after_pushes: crate::pushlog::CompactionPolicy::default().min_pushes,
        }
    }
}

/// What applying one frame did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub frames: u64,
    pub objects: u64,
    pub bytes: u64,
}

/// The directory, directly under the store, where every file the store
/// stages before a rename is written: beside `repos/` and `docs/`, so no
/// repository or document name reaches it. Emptied at every open and never
/// part of a snapshot.
pub const TMP_DIR: &str = "tmp";

/// The store of one box.
pub struct Store {
    fs: Arc<dyn Storage>,
    dir: PathBuf,
    history: HistoryId,
    applied: u64,
    marker: marker::AppliedMarker,
    skips: skips::Skips,
    repos: BTreeMap<String, Repo>,
    opts: StoreOptions,
    /// The newest Erase frame this store applied since it was opened.
    last_erase: u64,
    /// What the last Erase frame applied here erased in the log: frames
    /// and bytes.
    last_erased: (u64, u64),
    /// Other copies of the log's frames an erase must reach, before the
    /// store counts it applied.
    erase_also: Option<EraseAlso>,
}

/// The Erase frame at `seq` erases frames before `before` of `repos`: in
/// the copies of the log's frames and of the store kept elsewhere too (a
/// rejoin's saved tails, a snapshot staged before the erase). Called as
/// each Erase frame applies, after the log's own erase and before the
/// store records it applied, so a crash in between repeats both; an error
/// stops the store at that frame, to be tried again. Answers the frames
/// erased there.
pub type EraseAlso =
    std::sync::Arc<dyn Fn(u64, u64, &[String]) -> std::io::Result<u64> + Send + Sync>;

/// Whether a store directory holds no repository and no document: only
/// then may it take another history.
fn holds_nothing(fs: &dyn Storage, dir: &Path) -> Result<bool> {
    for sub in ["repos", "docs"] {
        if !fs.list(&dir.join(sub))?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether frames of this kind change the store.
pub fn is_store_kind(kind: u16) -> bool {
    matches!(
        Kind::from_u16(kind),
        Ok(Kind::RepoStore
            | Kind::Pack
            | Kind::Refs
            | Kind::LfsPut
            | Kind::LfsDelete
            | Kind::ControlDoc
            | Kind::Erase
            | Kind::StoreSkip
            | Kind::DocDelete)
    )
}

/// A repository's directory name: its name with every byte outside
/// `[A-Za-z0-9._-]` as `%XX`, so names map one to one onto directories.
pub fn repo_dir_name(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn repo_name_of_dir(dir: &str) -> Option<String> {
    let b = dir.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Drop for Store {
    /// A clean close records how far the store got, so a rejoin or a
    /// restart reads an exact mark. A failure here loses nothing: the mark
    /// stays behind and the reopen rescans.
    fn drop(&mut self) {
        if let Err(e) = self.checkpoint() {
            tracing::warn!(error = %e, "the store's applied mark was not recorded at close");
        }
    }
}

impl Store {
    /// Open or create the store in `dir` for the log of `history`. A store
    /// of another history is refused by name (one that has applied nothing
    /// takes the new history: its log was fresh and adopted a leader's); what a crash left half done
    /// (a purge, a staged file, an unindexed pack, a torn push or journal record) is
    /// finished or cut here.
    pub fn open(dir: impl AsRef<Path>, history: HistoryId, opts: StoreOptions) -> Result<Store> {
        Self::open_with(StdStorage::shared(), dir, history, opts)
    }

    /// [`Store::open`], every file of the store read and written through
    /// `fs`.
    pub fn open_with(
        fs: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        history: HistoryId,
        opts: StoreOptions,
    ) -> Result<Store> {
        let dir = dir.as_ref().to_owned();
        for sub in ["repos", "docs", "trash", TMP_DIR] {
            let d = dir.join(sub);
            if !fs.exists(&d)? {
                fs.create_dir_all(&d)?;
                sync_parent_with(&*fs, &d)?;
            }
        }
        let mut marker = marker::AppliedMarker::open(&*fs, &dir.join("APPLIED"), history)?;
        if marker.history() != history && marker.applied() == 0 && holds_nothing(&*fs, &dir)? {
            marker.rebind(history)?;
        }
        if marker.history() != history {
            return Err(StoreError::OtherHistory {
                store: marker.history().to_string(),
                log: history.to_string(),
            });
        }
        // A purge moved the repository here first; finish deleting it.
        for name in fs.list(&dir.join("trash"))? {
            fs.remove_dir_all(&dir.join("trash").join(name))?;
        }
        // What a crash left staged was never published: it goes. Not
        // fsynced, since a removal lost to a power cut is redone here.
        let tmp = dir.join(TMP_DIR);
        for name in fs.list(&tmp)? {
            let path = tmp.join(name);
            if fs.is_dir(&path)? {
                fs.remove_dir_all(&path)?;
            } else {
                fs.remove(&path)?;
            }
        }
        let mut repos = BTreeMap::new();
        for fname in fs.list(&dir.join("repos"))? {
            let path = dir.join("repos").join(&fname);
            let name = repo_name_of_dir(&fname).ok_or_else(|| StoreError::Corrupt {
                path: path.clone(),
                at: 0,
                what: "a directory that names no repository".into(),
            })?;
            let repo = Repo::open_with(Arc::clone(&fs), &path, &tmp, opts.cache_bytes)?;
            repos.insert(name, repo);
        }
        let skips = skips::Skips::open(Arc::clone(&fs), &dir)?;
        Ok(Store {
            fs,
            applied: marker.applied(),
            dir,
            history,
            marker,
            skips,
            last_erase: 0,
            last_erased: (0, 0),
            erase_also: None,
            repos,
            opts,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The seq the store in `dir` has durably applied up to.
    pub fn applied_mark(dir: &Path, history: HistoryId) -> Result<u64> {
        Self::applied_mark_with(&StdStorage, dir, history)
    }

    /// [`Store::applied_mark`] through `fs`.
    pub fn applied_mark_with(fs: &dyn Storage, dir: &Path, history: HistoryId) -> Result<u64> {
        Ok(marker::AppliedMarker::open(fs, &dir.join("APPLIED"), history)?.applied())
    }

    /// Forget that frames past `seq` were applied: the log they came from
    /// was cut after `seq` (a rejoin), and the caller checked that none of
    /// them was the store's, so the store's files hold nothing of them.
    /// Recorded durably; a store at or below `seq` is left alone.
    pub fn rewind_to(dir: &Path, history: HistoryId, seq: u64) -> Result<u64> {
        Self::rewind_to_with(&StdStorage, dir, history, seq)
    }

    /// [`Store::rewind_to`] through `fs`.
    pub fn rewind_to_with(
        fs: &dyn Storage,
        dir: &Path,
        history: HistoryId,
        seq: u64,
    ) -> Result<u64> {
        let mut marker = marker::AppliedMarker::open(fs, &dir.join("APPLIED"), history)?;
        let was = marker.applied();
        if was > seq {
            marker.rewind(seq)?;
        }
        Ok(was)
    }

    /// Where the store stages files (see [`TMP_DIR`]).
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join(TMP_DIR)
    }

    pub fn history(&self) -> HistoryId {
        self.history
    }

    /// The seq applied up to (durably recorded or not).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Apply every frame from `applied + 1` to the log's head, then record
    /// the new applied seq durably. Returns what was applied.
    pub fn catch_up(&mut self, log: &Log) -> Result<Applied> {
        if log.history() != self.history {
            if self.applied != 0 || !holds_nothing(&*self.fs, &self.dir)? {
                return Err(StoreError::OtherHistory {
                    store: self.history.to_string(),
                    log: log.history().to_string(),
                });
            }
            // A fresh follower's log adopted its leader's history.
            self.marker.rebind(log.history())?;
            self.history = log.history();
        }
        let head = log.head_seq();
        if self.applied > head {
            return Err(StoreError::AheadOfLog {
                applied: self.applied,
                head,
            });
        }
        let mut done = Applied::default();
        // Whether a frame of the store's changed its files: only then must
        // the mark be durable now (see `checkpoint`).
        let mut changed = false;
        while self.applied < head {
            if self.applied + 1 < log.first_seq() {
                return Err(StoreError::BelowFloor {
                    need: self.applied + 1,
                    first: log.first_seq(),
                });
            }
            // Headers only, in one pass: frames that are not the store's
            // cost no lookup of their own.
            let pass = log.scan_kinds::<StoreError>(self.applied + 1, head, |seq, kind| {
                if is_store_kind(kind) {
                    changed = true;
                    let a = self.apply(log, seq).map_err(|e| match e {
                        e @ StoreError::Apply { .. } => e,
                        e => StoreError::Apply {
                            seq,
                            kind,
                            source: Box::new(e),
                        },
                    })?;
                    done.objects += a.objects;
                    done.bytes += a.bytes;
                } else if seq == self.applied + 1 {
                    self.applied = seq;
                } else {
                    return Err(StoreError::BadFrame {
                        seq,
                        why: format!("the store applies {} next", self.applied + 1),
                    });
                }
                done.frames += 1;
                Ok(())
            });
            match pass {
                Ok(()) => {}
                Err(StoreError::Apply { seq, kind, source }) => {
                    // What applied before it stays applied.
                    self.checkpoint()?;
                    match self.find_skip(log, seq, head)? {
                        Some(by) => {
                            let crc = log.locate_blob(seq)?.payload_crc;
                            tracing::warn!(
                                seq, kind, by, error = %source,
                                "the store skips a frame that does not apply, as a StoreSkip frame says"
                            );
                            self.skips.record(SkipRecord {
                                seq,
                                kind,
                                crc,
                                by,
                                error: source.to_string(),
                            })?;
                            self.applied = seq;
                            changed = true;
                            done.frames += 1;
                        }
                        None => return Err(StoreError::Apply { seq, kind, source }),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if changed {
            self.checkpoint()?;
        }
        Ok(done)
    }

    /// The StoreSkip frame after `seq` (through `head`) that skips it, if
    /// the log holds one: its seq. A skip names the frame by seq and
    /// payload crc, so it never skips another frame at that number.
    fn find_skip(&self, log: &Log, seq: u64, head: u64) -> Result<Option<u64>> {
        let crc = log.locate_blob(seq)?.payload_crc;
        let mut found = None;
        log.scan_kinds::<StoreError>(seq + 1, head, |at, kind| {
            if found.is_none() && kind == Kind::StoreSkip.as_u16() {
                let body: frames::SkipBody = frames::decode_small(at, &log.read(at)?.blob)?;
                if body.seq == seq && body.crc == crc {
                    found = Some(at);
                }
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Erase frames in `also` too as each Erase frame applies
    /// ([`EraseAlso`]).
    pub fn set_erase_also(&mut self, also: Option<EraseAlso>) {
        self.erase_also = also;
    }

    /// The newest Erase frame applied since this store was opened (0: none):
    /// what was copied out of the store before it (a snapshot) may hold
    /// erased data.
    pub fn last_erase(&self) -> u64 {
        self.last_erase
    }

    /// What the last Erase frame applied here erased in the log: frames
    /// rewritten as erased, and the bytes of meta and blob they held.
    pub fn last_erased(&self) -> (u64, u64) {
        self.last_erased
    }

    /// The frames this store skipped, oldest first.
    pub fn skipped(&self) -> Vec<SkipRecord> {
        self.skips.all().cloned().collect()
    }

    /// How many frames this store skipped: what a health report carries,
    /// without copying the records.
    pub fn skipped_count(&self) -> u64 {
        self.skips.all().count() as u64
    }

    /// Record the applied seq durably.
    /// The applied seq, recorded durably first if it moved past the mark:
    /// what may be dropped from the log below it (retention) must never be
    /// needed by a store that reopens from the mark after a crash.
    pub fn applied_durably(&mut self) -> Result<u64> {
        self.checkpoint()?;
        Ok(self.applied)
    }

    /// Record the applied seq durably (one fdatasync of the mark) if it
    /// moved. A catch-up that applies a frame of the store's does so before
    /// it returns; one that passes only other frames leaves the mark behind
    /// (a twin's applier would otherwise sync the mark once per batch of
    /// plain appends), which costs a reopen a rescan of their headers and
    /// nothing else: the store's files hold nothing of those frames.
    /// Retention, snapshots and a clean close record it.
    pub fn checkpoint(&mut self) -> Result<()> {
        if self.marker.applied() != self.applied {
            self.marker.record(self.applied)?;
        }
        Ok(())
    }

    /// The control documents' names, sorted.
    pub fn docs(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for name in self.fs.list(&self.dir.join("docs"))? {
            if frames::check_doc_name(&name).is_ok() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// The repositories, by name.
    pub fn repos(&self) -> impl Iterator<Item = &str> {
        self.repos.keys().map(String::as_str)
    }

    /// A repository.
    pub fn repo(&self, name: &str) -> Result<&Repo> {
        self.repos
            .get(name)
            .ok_or_else(|| StoreError::NoRepo(name.to_owned()))
    }

    /// A repository's current refs.
    pub fn refs(&self, repo: &str) -> Result<BTreeMap<String, [u8; OID_LEN]>> {
        Ok(self.repo(repo)?.refs())
    }

    /// A repository's pushes, oldest first.
    pub fn push_history(&self, repo: &str) -> Result<Vec<Push>> {
        self.repo(repo)?.history()
    }

    /// An object's type and bytes.
    /// An object's stored length, when the repository holds it.
    pub fn read_object(&self, repo: &str, oid: &[u8]) -> Result<Option<(ObjType, Vec<u8>)>> {
        self.repo(repo)?.read_object(oid)
    }

    /// Which of `oids` the repository holds.
    pub fn have(&self, repo: &str, oids: &[&[u8]]) -> Result<Vec<bool>> {
        self.repo(repo)?.have(oids)
    }

    /// A control document.
    pub fn doc(&self, name: &str) -> Result<Option<Vec<u8>>> {
        frames::check_doc_name(name)?;
        match self.fs.read(&self.dir.join("docs").join(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A control document opened for reading: once open it reads without
    /// the store, as it was (a put replaces it by rename, and the open
    /// file keeps what it opened).
    pub fn open_doc(&self, name: &str) -> Result<Option<Arc<dyn StorageFile>>> {
        frames::check_doc_name(name)?;
        match self
            .fs
            .open(&self.dir.join("docs").join(name), OpenMode::Read)
        {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Check a push against the current refs: every update's `old` must be
    /// where the ref is now (None: the ref must not exist).
    pub fn check_push(&self, repo: &str, updates: &[RefUpdate]) -> Result<()> {
        let refs = self.refs(repo)?;
        if updates.is_empty() {
            return Err(StoreError::BadPush("a push moves at least one ref".into()));
        }
        let mut names = std::collections::HashSet::new();
        for u in updates {
            if !names.insert(&u.name) {
                return Err(StoreError::BadPush(format!("ref {} moved twice", u.name)));
            }
            let current = refs.get(&u.name).copied();
            if current != u.old {
                let show =
                    |o: Option<[u8; OID_LEN]>| o.map_or("nothing".into(), |o| frames::hex(&o));
                return Err(StoreError::RefMoved {
                    name: u.name.clone(),
                    expected: show(u.old),
                    current: show(current),
                });
            }
        }
        Ok(())
    }
}
