//! A data directory a restore is filling (`RESTORING`) is neither served
//! nor half-trusted: `serve` refuses it, naming the restore to finish,
//! and `primary restore --abandon` throws away what the restore wrote so
//! that the box is fresh again. A box serving part of a restore would
//! acknowledge frames at numbers the source holds other frames at.

use super::*;
use crate::layout::{
    BASE_FILE, EPOCHS_FILE, INTENT_FILE, LEGACY_EPOCH_FILE, PARTIAL_FILE, RESTORING_FILE,
    RESTORING_FROM, SALVAGE_FILE, SALVAGE_META, STAGING_DIR,
};
use crate::storage::{StdStorage, Storage};

/// Where an abandoned restore's files wait to be deleted: renamed there
/// first, so that a crash leaves either the restore or nothing of it.
const ABANDONED_DIR: &str = "restore.abandoned";

/// The restore command the marker in `data_dir` names, to finish it.
fn finish_command(marker: &str) -> String {
    match marker.lines().find_map(|l| l.strip_prefix(RESTORING_FROM)) {
        Some(from) => format!("`primary restore --config … {}`", from.trim()),
        None => "the `primary restore` that started it".into(),
    }
}

/// Refuse to serve `data_dir` while a restore is filling it.
pub(super) fn refuse_restoring(data_dir: &Path) -> Result<(), DaemonError> {
    let marker = data_dir.join(RESTORING_FILE);
    match std::fs::read_to_string(&marker) {
        Ok(text) => Err(DaemonError::Restoring {
            data_dir: data_dir.to_owned(),
            finish: finish_command(&text),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // Unreadable is not absent: serving would be a guess.
        Err(e) => Err(DaemonError::File {
            what: "reading",
            path: marker,
            source: e,
        }),
    }
}

/// What `primary restore --abandon` removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Abandoned {
    /// The names moved out of the data directory and deleted.
    pub removed: Vec<String>,
}

/// Throw away an unfinished restore: its log, store, epochs and partial
/// files go, the marker last; the box is as `init` left it. Refused
/// without a marker (a served box's data is never thrown away this way)
/// and while the log is held (a restore or a daemon running).
pub fn abandon_restore(data_dir: &Path) -> Result<Abandoned, DaemonError> {
    abandon_restore_with(&*StdStorage::shared(), data_dir)
}

/// [`abandon_restore`] through `fs`.
pub fn abandon_restore_with(fs: &dyn Storage, data_dir: &Path) -> Result<Abandoned, DaemonError> {
    let marker = data_dir.join(RESTORING_FILE);
    if !fs.exists(&marker).at("reading", &marker)? {
        return Err(DaemonError::NotRestoring {
            data_dir: data_dir.to_owned(),
        });
    }
    // Held while its files move: no restore or daemon starts on it
    // meanwhile.
    let log_dir = data_dir.join(LOG_DIR);
    let _log = if fs.exists(&log_dir).at("reading", &log_dir)? {
        match Log::open(&log_dir) {
            Ok(l) => Some(l),
            Err(crate::log::Error::Locked(_)) => {
                return Err(DaemonError::Running {
                    data_dir: data_dir.to_owned(),
                    before: "abandoning its restore (or is the restore still running?)",
                })
            }
            // A log too broken to open is still the restore's to remove.
            Err(e) => {
                tracing::warn!(error = %e, "the unfinished restore's log does not open; removed all the same");
                None
            }
        }
    } else {
        None
    };
    let trash = data_dir.join(ABANDONED_DIR);
    fs.create_dir_all(&trash).at("creating", &trash)?;
    let mut removed = Vec::new();
    for name in [
        LOG_DIR,
        STORE_DIR,
        STAGING_DIR,
        INTENT_FILE,
        BASE_FILE,
        PARTIAL_FILE,
        SALVAGE_FILE,
        SALVAGE_META,
        EPOCHS_FILE,
        LEGACY_EPOCH_FILE,
    ] {
        let from = data_dir.join(name);
        if !fs.exists(&from).at("reading", &from)? {
            continue;
        }
        fs.rename(&from, &trash.join(name))
            .at("moving aside", &from)?;
        removed.push(name.to_owned());
    }
    fs.sync_dir(data_dir).at("syncing", data_dir)?;
    fs.remove(&marker).at("removing", &marker)?;
    fs.sync_dir(data_dir).at("syncing", data_dir)?;
    fs.remove_dir_all(&trash).at("removing", &trash)?;
    Ok(Abandoned { removed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::restoring_marker;

    #[test]
    fn the_marker_names_the_restore_to_finish() {
        let m = String::from_utf8(restoring_marker("--from-archive s3://b/p")).unwrap();
        assert_eq!(
            finish_command(&m),
            "`primary restore --config … --from-archive s3://b/p`"
        );
        // A marker of an older build says nothing of where from.
        assert!(finish_command("a restore is filling this box\n").contains("started it"));
    }

    #[test]
    fn abandon_leaves_a_fresh_box_and_refuses_one_without_a_restore() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        assert!(matches!(
            abandon_restore(data),
            Err(DaemonError::NotRestoring { .. })
        ));
        std::fs::write(data.join(CERT_FILE), b"cert").unwrap();
        let log = Log::open_with(data.join(LOG_DIR), 1 << 20).unwrap();
        log.append(
            crate::log::Kind::App(0x8000),
            &crate::log::Meta::default(),
            b"x",
        )
        .unwrap();
        std::fs::create_dir_all(data.join(STORE_DIR)).unwrap();
        std::fs::write(data.join(RESTORING_FILE), restoring_marker("--twin a")).unwrap();
        assert!(matches!(
            abandon_restore(data),
            Err(DaemonError::Running { .. })
        ));
        drop(log);
        assert!(refuse_restoring(data).is_err());
        let a = abandon_restore(data).unwrap();
        assert_eq!(a.removed, vec![LOG_DIR.to_owned(), STORE_DIR.to_owned()]);
        refuse_restoring(data).unwrap();
        let mut left: Vec<_> = std::fs::read_dir(data)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec![CERT_FILE.to_owned()]);
    }
}
