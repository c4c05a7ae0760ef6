//! A box's epochs, kept in its data directory: the epoch history of its
//! log, the newest epoch it has heard of, and so whether it is fenced.
//! The rules are [`crate::repl::epochs`]'; this keeps them durable.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::repl::epochs::{EpochError, EpochHistory, EpochState};
use crate::storage::{StdStorage, Storage};

/// The `EPOCHS` file: the state, and the format it is written in. Files
/// without a format were written before epochs had terms and lives.
#[derive(serde::Serialize, serde::Deserialize)]
struct EpochsFile {
    #[serde(default)]
    format: u32,
    #[serde(flatten)]
    state: EpochState,
}

/// The format this build writes: epochs as `term << 32 | life`.
const FORMAT: u32 = 2;

fn file_bytes(state: &EpochState) -> std::io::Result<Vec<u8>> {
    serde_json::to_vec_pretty(&EpochsFile {
        format: FORMAT,
        state: state.clone(),
    })
    .map_err(std::io::Error::other)
}

pub use crate::layout::{EPOCHS_FILE, LEGACY_EPOCH_FILE};

/// A box's epochs, durable when `path` is set. Every change is on disk
/// before it is visible here.
#[derive(Debug)]
pub struct Epochs {
    path: Option<PathBuf>,
    /// What `path` is written through.
    fs: Arc<dyn Storage>,
    state: Mutex<EpochState>,
    /// Turns true when this box is fenced.
    fenced: watch::Sender<bool>,
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{}: {why}", path.display()),
    )
}

impl Epochs {
    fn with(fs: Arc<dyn Storage>, path: Option<PathBuf>, state: EpochState) -> Epochs {
        let fenced = watch::channel(state.fenced()).0;
        Epochs {
            path,
            fs,
            state: Mutex::new(state),
            fenced,
        }
    }

    /// Epochs that live only in memory (tests): `epoch` from sequence 1.
    pub fn in_memory(epoch: u64) -> Epochs {
        Epochs::with(StdStorage::shared(), None, EpochState::new(epoch))
    }

    /// The epochs kept in `dir`. A directory with none yet is at epoch 0
    /// from sequence 1. One that kept only an epoch number `n` (`EPOCH`)
    /// is taken as epoch 0 up to `head` and `n` after it: the frames it
    /// holds are then treated as shared with a box of epoch 0, which is
    /// what a box promoted before epoch histories existed holds.
    pub fn load(dir: &Path, head: u64) -> std::io::Result<Epochs> {
        Self::load_with(StdStorage::shared(), dir, head)
    }

    /// [`Epochs::load`], read and kept through `fs`.
    pub fn load_with(fs: Arc<dyn Storage>, dir: &Path, head: u64) -> std::io::Result<Epochs> {
        let path = dir.join(EPOCHS_FILE);
        let state = match fs.read(&path) {
            Ok(bytes) => {
                let file = serde_json::from_slice::<EpochsFile>(&bytes)
                    .map_err(|e| invalid(&path, format!("not an epoch history: {e}")))?;
                match file.format {
                    0 => file
                        .state
                        .from_untermed()
                        .map_err(|e| invalid(&path, e.to_string()))?,
                    FORMAT => file.state,
                    other => {
                        return Err(invalid(
                            &path,
                            format!("format {other} is not this build's ({FORMAT})"),
                        ))
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                legacy(&*fs, &dir.join(LEGACY_EPOCH_FILE), head)?
            }
            Err(e) => return Err(e),
        };
        if state.seen < state.current() {
            return Err(invalid(
                &path,
                format!(
                    "seen {} is below the current epoch {}",
                    state.seen,
                    state.current()
                ),
            ));
        }
        Ok(Epochs::with(fs, Some(path), state))
    }

    /// The state as it is now.
    pub fn state(&self) -> EpochState {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EpochState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The epoch this box writes under or follows.
    pub fn current(&self) -> u64 {
        self.lock().current()
    }

    /// The newest epoch known here.
    pub fn newest(&self) -> u64 {
        self.lock().newest()
    }

    pub fn history(&self) -> EpochHistory {
        self.lock().history.clone()
    }

    /// Whether this box, as a primary, is fenced.
    pub fn fenced(&self) -> bool {
        self.lock().fenced()
    }

    /// Turns true when this box is fenced.
    pub fn watch_fenced(&self) -> watch::Receiver<bool> {
        self.fenced.subscribe()
    }

    /// Change the state with `f`; a change is written (temp file, fsync,
    /// rename, directory fsync) before anyone sees it. An error leaves
    /// the state as it was.
    pub fn update<R>(
        &self,
        f: impl FnOnce(&mut EpochState) -> Result<R, EpochError>,
    ) -> std::io::Result<R> {
        let mut st = self.lock();
        let mut next = st.clone();
        let out =
            f(&mut next).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        if next != *st {
            if let Some(path) = &self.path {
                crate::publish::publish_with(&*self.fs, path, &file_bytes(&next)?)?;
            }
            *st = next;
            self.fenced.send_replace(st.fenced());
        }
        Ok(out)
    }

    /// `epoch` was heard of from `by`: a primary of an older one is fenced
    /// from now on. Answers whether this fenced it.
    /// Should the fence not reach the disk, it is kept in memory all the
    /// same (refusing writes is always safe) and the error answered.
    pub fn hear(&self, epoch: u64, by: &str) -> std::io::Result<bool> {
        match self.update(|s| Ok(s.hear(epoch, by))) {
            Ok(fenced) => Ok(fenced),
            Err(e) => {
                let mut st = self.lock();
                st.hear(epoch, by);
                self.fenced.send_replace(st.fenced());
                Err(e)
            }
        }
    }
}

impl Epochs {
    /// This box starts serving as a primary: a new life of its term, from
    /// the head its log came back at, on disk before anything is served
    /// or shipped. Answers the new epoch (see [`EpochState::restart`]).
    pub fn begin_life(&self, head: u64) -> std::io::Result<Option<u64>> {
        self.update(|s| s.restart(head))
    }

    /// Fence this box without naming an epoch (an operator's fence, a
    /// switchover's handover on its way), on disk before it returns.
    /// Answers whether it was not fenced before. Should the hold not reach
    /// the disk, it is kept in memory all the same and the error answered.
    pub fn hold(&self, why: &str) -> std::io::Result<bool> {
        match self.update(|s| Ok(s.hold(why))) {
            Ok(held) => Ok(held),
            Err(e) => {
                let mut st = self.lock();
                st.hold(why);
                self.fenced.send_replace(st.fenced());
                Err(e)
            }
        }
    }

    /// Lift a hold (the twin refused the handover). Answers whether one
    /// was lifted.
    pub fn release(&self) -> std::io::Result<bool> {
        self.update(|s| Ok(s.release()))
    }

    /// The newest epoch this box knows to have been taken by a life: its
    /// [`Epochs::newest`], less an epoch its own promotion began and no
    /// process served yet (an arbiter learns of that one only when its
    /// life begins there).
    pub fn newest_taken(&self) -> u64 {
        self.lock().newest_taken()
    }

    /// Whether this primary is held by its start after a crash, until its
    /// twin says hello at its epoch ([`HELD_FOR_HELLO`]).
    pub fn held_for_hello(&self) -> bool {
        self.lock().held.as_deref() == Some(HELD_FOR_HELLO)
    }

    /// The twin said hello at this primary's epoch: a hold of its start
    /// is lifted (no other). Answers whether one was.
    pub fn twin_said_hello(&self) -> std::io::Result<bool> {
        self.update(|s| {
            Ok(match s.held.as_deref() {
                Some(HELD_FOR_HELLO) => s.release(),
                _ => false,
            })
        })
    }
}

/// Why a primary that did not stop cleanly starts held: it may have been
/// deposed while it was down (a twin promoted by hand), and only its twin
/// saying hello at its epoch proves it was not.
pub const HELD_FOR_HELLO: &str = "waiting for the twin's hello";

fn legacy(fs: &dyn Storage, path: &Path, head: u64) -> std::io::Result<EpochState> {
    let n: u64 = match fs.read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            text.trim()
                .parse()
                .map_err(|_| invalid(path, format!("not an epoch: {text:?}")))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    let mut st = EpochState::new(0);
    if n > 0 {
        let epoch = n
            .checked_mul(1 << crate::repl::epochs::LIFE_BITS)
            .ok_or_else(|| invalid(path, format!("epoch {n} is out of range")))?;
        st.history
            .begin(epoch, head)
            .map_err(|e| invalid(path, e.to_string()))?;
        st.seen = epoch;
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::write_file;

    const T1: u64 = 1 << crate::repl::epochs::LIFE_BITS;

    #[test]
    fn epochs_are_kept_and_a_fence_survives_a_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Epochs::load(dir.path(), 0).expect("load");
        assert_eq!(e.current(), 0);
        assert!(!e.fenced());
        assert!(e.hear(3 * T1, "twin").expect("hear"));
        let again = Epochs::load(dir.path(), 0).expect("reload");
        assert!(again.fenced());
        assert_eq!(again.state().fenced_by.as_deref(), Some("twin"));
        again.update(|s| s.promote(10)).expect("promote");
        let promoted = Epochs::load(dir.path(), 0).expect("reload");
        assert_eq!(promoted.current(), 4 * T1);
        assert!(!promoted.fenced());
        assert_eq!(
            promoted.begin_life(12).expect("life"),
            Some(4 * T1),
            "its first serve"
        );
        assert_eq!(promoted.begin_life(12).expect("life"), Some(4 * T1 + 1));
        assert!(promoted.hold("an operator").expect("hold"));
        let held = Epochs::load(dir.path(), 0).expect("reload");
        assert!(held.fenced(), "a hold survives a restart");
        assert_eq!(held.begin_life(12).expect("a life"), Some(4 * T1 + 2));
        assert!(held.fenced(), "still held");
        assert!(held.release().expect("release"));
        assert!(!Epochs::load(dir.path(), 0).expect("reload").fenced());
        write_file(&StdStorage, &dir.path().join(EPOCHS_FILE), "x".as_bytes()).expect("damage");
        assert!(Epochs::load(dir.path(), 0).is_err());
    }

    #[test]
    fn a_file_written_before_terms_reads_each_epoch_as_a_term() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = r#"{"history":[{"epoch":0,"first":1},{"epoch":2,"first":9}],"seen":3,"fenced_by":"twin"}"#;
        write_file(&StdStorage, &dir.path().join(EPOCHS_FILE), old.as_bytes()).expect("write");
        let e = Epochs::load(dir.path(), 0).expect("load");
        assert_eq!(e.current(), 2 * T1);
        assert_eq!(e.newest(), 3 * T1);
        assert!(e.fenced());
        let future = r#"{"format":9,"history":[{"epoch":0,"first":1}],"seen":0,"fenced_by":null}"#;
        write_file(
            &StdStorage,
            &dir.path().join(EPOCHS_FILE),
            future.as_bytes(),
        )
        .expect("write");
        let err = Epochs::load(dir.path(), 0).expect_err("refused");
        assert!(err.to_string().contains("format 9"), "{err}");
    }

    #[test]
    fn an_older_directory_keeps_its_epoch_from_its_head_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_file(
            &StdStorage,
            &dir.path().join(LEGACY_EPOCH_FILE),
            "2\n".as_bytes(),
        )
        .expect("write");
        let e = Epochs::load(dir.path(), 40).expect("load");
        assert_eq!(e.current(), 2 * T1);
        assert_eq!(e.history().epoch_of(40), Some(0));
        assert_eq!(e.history().epoch_of(41), Some(2 * T1));
        write_file(
            &StdStorage,
            &dir.path().join(LEGACY_EPOCH_FILE),
            "two".as_bytes(),
        )
        .expect("damage");
        assert!(Epochs::load(dir.path(), 0).is_err());
    }
}
