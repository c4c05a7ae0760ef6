//! `primary repo ...` and `primary doc ...`: the store's client commands,
//! through the running daemon as its admin client.

use std::path::PathBuf;

use clap::Subcommand;
use tokio::io::AsyncWriteExt;
use twinlog::daemon::{DaemonError, IoAt};
use twinlog::node::api::RefMove;
use twinlog::node::{Client, Durability};
use twinlog::store::frames::{hex, type_name};

use crate::args;
use crate::out::{self, OutFile};

#[derive(Subcommand)]
pub enum RepoCmd {
    /// Create a repository.
    Create {
        /// The repository's name (as acme/widgets)
        #[arg(value_parser = args::repo_name)]
        name: String,
    },
    /// The repositories, one name a line.
    List,
    /// Delete a repository from the store, on both boxes.
    ///
    /// Its objects, refs and large objects go from both stores; its frames
    /// stay in the log until retention drops them. To remove its data from
    /// the log too, `erase` it first.
    Delete {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
    },
    /// Import a git repository's objects and refs (git must be installed).
    ///
    /// A repository the store holds already is brought up to date: only
    /// the objects it lacks are sent, and each ref moves from where it is
    /// now, as a push would (refs git does not have are left alone).
    Import {
        /// The repository's name in the store
        #[arg(value_parser = args::repo_name)]
        name: String,
        /// The git repository (a work tree or a bare repository)
        #[arg(long, value_name = "DIR")]
        git: PathBuf,
        /// The size of each pack sent, in MiB
        #[arg(long, default_value_t = 8)]
        pack_mib: usize,
    },
    /// Push a pack file and ref updates.
    ///
    /// Checked before anything is written: every object against its id,
    /// every ref against where it is. Either part may be left out, not
    /// both.
    Push {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
        /// A pack file: object records as a Pack frame's blob
        /// (docs/FORMAT.md), streamed
        pack: Option<PathBuf>,
        /// A ref update: the ref must be at OLD and moves to NEW; an empty
        /// side (or 40 zeros) is no ref: `NAME=..NEW` creates, `NAME=OLD..`
        /// deletes. Repeat for more; all move together or none does
        #[arg(long = "ref", value_name = "NAME=OLD..NEW", value_parser = args::ref_move)]
        refs: Vec<RefMove>,
    },
    /// A repository's current refs: `<oid> <name>` per line.
    Refs {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
    },
    /// A repository's pushes, oldest first.
    History {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
    },
    /// An object's bytes to stdout or a file (its type and size on stderr).
    Cat {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
        /// The object's id (40 hex digits)
        #[arg(value_parser = args::oid)]
        oid: [u8; 20],
        /// Write the object to this file (replaced only once the read
        /// succeeded) instead of stdout
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Which of these objects the repository holds: `<oid> yes|no`.
    Have {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
        /// Object ids (40 hex digits each)
        #[arg(value_parser = args::oid, required = true)]
        oids: Vec<[u8; 20]>,
    },
    /// Store a file as a large object (its SHA-256 names it), streamed.
    LfsPut {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
        /// The file to store
        file: PathBuf,
    },
    /// A large object's bytes, to a file or stdout.
    LfsGet {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
        /// The object's SHA-256 (64 hex digits)
        #[arg(value_parser = args::lfs_oid)]
        oid: [u8; 32],
        /// Write the object to this file (replaced only once the whole
        /// object arrived and checked) instead of stdout
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Delete a large object.
    LfsDelete {
        /// The repository's name
        #[arg(value_parser = args::repo_name)]
        name: String,
        /// The object's SHA-256 (64 hex digits)
        #[arg(value_parser = args::lfs_oid)]
        oid: [u8; 32],
    },
    /// Erase these repositories' data frames before a sequence or a time.
    ///
    /// In place, on this box and on the twin; their stores drop the data
    /// too. Says how many frames and bytes it erased.
    Erase {
        /// Frames before this sequence (`head + 1`: everything so far), or
        /// written before this UTC time (2026-11-01T00:00Z), to a
        /// segment's precision: the frames of every segment last written
        /// before it
        #[arg(long, value_parser = args::before, value_name = "SEQ|TIME")]
        before: args::Before,
        /// The repositories' names
        #[arg(required = true, value_parser = args::repo_name)]
        names: Vec<String>,
    },
}

/// A file's SHA-256, read in pieces.
fn sha256_of(path: &std::path::Path) -> Result<[u8; 32], DaemonError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).at("opening", path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).at("reading", path)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    let mut oid = [0u8; 32];
    oid.copy_from_slice(ctx.finish().as_ref());
    Ok(oid)
}

fn to_stdout(bytes: &[u8]) -> Result<(), DaemonError> {
    std::io::Write::write_all(&mut std::io::stdout(), bytes)
        .map_err(|e| DaemonError::Failed(format!("writing to stdout: {e}")))
}

fn show(o: Option<[u8; 20]>) -> String {
    o.map_or_else(|| "-".repeat(40), |o| hex(&o))
}

pub async fn run(client: &Client, cmd: RepoCmd) -> Result<(), DaemonError> {
    match cmd {
        RepoCmd::Create { name } => {
            let a = client
                .create_repo(&name, Durability::Twin)
                .await
                .map_err(DaemonError::request(format!("create {name}")))?;
            println!("created {name} at {} ({:?})", a.seq, a.durability);
        }
        RepoCmd::List => {
            let names = client
                .list_repos()
                .await
                .map_err(DaemonError::request("the repositories".to_string()))?;
            for n in names {
                println!("{n}");
            }
        }
        RepoCmd::Delete { name } => {
            let a = client
                .delete_repo(&name, Durability::Twin)
                .await
                .map_err(DaemonError::request(format!("delete of {name}")))?;
            println!(
                "deleted {name} from the store at {} ({:?}); its frames stay in the log until retention drops them",
                a.seq, a.durability
            );
        }
        RepoCmd::Import {
            name,
            git,
            pack_mib,
        } => {
            let started = std::time::Instant::now();
            let r = client
                .import_git(&git, &name, pack_mib << 20, Durability::Twin)
                .await
                .map_err(DaemonError::request(format!(
                    "import of {} into {name}",
                    git.display()
                )))?;
            let secs = started.elapsed().as_secs_f64();
            println!(
                "imported {} objects ({:.1} MiB) in {} packs in {secs:.1} s ({:.0} objects/s); {} held already",
                r.objects,
                r.bytes as f64 / 1048576.0,
                r.packs,
                r.objects as f64 / secs.max(1e-9),
                r.held
            );
            println!(
                "moved {} refs; {} already where git has them",
                r.refs, r.refs_unchanged
            );
        }
        RepoCmd::Push { name, pack, refs } => {
            let what = format!("push to {name}");
            let nrefs = refs.len();
            let p = match pack {
                Some(path) => {
                    let f = tokio::fs::File::open(&path).await.at("opening", &path)?;
                    let len = f.metadata().await.at("reading the size of", &path)?.len();
                    client
                        .push_reader(&name, len, f, refs, Durability::Twin)
                        .await
                }
                None if refs.is_empty() => {
                    return Err(DaemonError::Usage(
                        "nothing to push: give a pack file, --ref NAME=OLD..NEW, or both".into(),
                    ))
                }
                None => client.push(&name, &[], refs, Durability::Twin).await,
            }
            .map_err(DaemonError::request(what))?;
            let at = |s: Option<u64>| s.map_or_else(|| "-".to_owned(), |s| s.to_string());
            println!(
                "pushed {} objects (frame {}) and {nrefs} ref updates (frame {}) to {name} ({:?})",
                p.objects,
                at(p.pack_seq),
                at(p.refs_seq),
                p.durability
            );
        }
        RepoCmd::Refs { name } => {
            let refs = client
                .refs(&name)
                .await
                .map_err(DaemonError::request(format!("refs of {name}")))?;
            for (r, oid) in refs {
                println!("{} {r}", hex(&oid));
            }
        }
        RepoCmd::History { name } => {
            let pushes = client
                .push_history(&name)
                .await
                .map_err(DaemonError::request(format!("history of {name}")))?;
            for p in pushes {
                println!("push {} at {}", p.seq, twinlog::daemon::utc(p.at_ms));
                for u in p.updates {
                    println!("  {} {} {}", show(u.old), show(u.new), u.name);
                }
            }
        }
        RepoCmd::Cat { name, oid, out } => {
            let found = client
                .read_object(&name, oid)
                .await
                .map_err(DaemonError::request(format!(
                    "object {} of {name}",
                    hex(&oid)
                )))?;
            let Some((t, data)) = found else {
                return Err(DaemonError::Failed(format!(
                    "no object {} in {name}",
                    hex(&oid)
                )));
            };
            eprintln!("{} {}", type_name(t), data.len());
            match out {
                Some(path) => {
                    out::write(&path, &data)?;
                    println!(
                        "{} {} ({} bytes) written to {}",
                        type_name(t),
                        hex(&oid),
                        data.len(),
                        path.display()
                    );
                }
                None => to_stdout(&data)?,
            }
        }
        RepoCmd::LfsPut { name, file } => {
            let oid = sha256_of(&file)?;
            let f = tokio::fs::File::open(&file).await.at("opening", &file)?;
            let len = f.metadata().await.at("reading the size of", &file)?.len();
            let a = client
                .lfs_put(&name, oid, len, f, Durability::Twin)
                .await
                .map_err(DaemonError::request(format!(
                    "storing {} in {name}",
                    file.display()
                )))?;
            println!(
                "{} ({len} bytes) stored at {} ({:?})",
                hex(&oid),
                a.seq,
                a.durability
            );
        }
        RepoCmd::LfsGet { name, oid, out } => {
            let what = format!("large object {} of {name}", hex(&oid));
            let absent = || DaemonError::Failed(format!("no large object {} in {name}", hex(&oid)));
            match out {
                Some(path) => {
                    let (pending, file) = OutFile::create(&path)?;
                    let mut f = tokio::fs::File::from_std(file);
                    if !client
                        .lfs_get(&name, oid, &mut f)
                        .await
                        .map_err(DaemonError::request(what))?
                    {
                        return Err(absent());
                    }
                    f.flush().await.at("writing", &path)?;
                    let len = pending.commit(f.into_std().await)?;
                    println!("{} ({len} bytes) written to {}", hex(&oid), path.display());
                }
                None => {
                    let mut stdout = tokio::io::stdout();
                    if !client
                        .lfs_get(&name, oid, &mut stdout)
                        .await
                        .map_err(DaemonError::request(what))?
                    {
                        return Err(absent());
                    }
                    stdout
                        .flush()
                        .await
                        .map_err(|e| DaemonError::Failed(format!("writing to stdout: {e}")))?;
                }
            }
        }
        RepoCmd::LfsDelete { name, oid } => {
            let a = client
                .lfs_delete(&name, oid, Durability::Twin)
                .await
                .map_err(DaemonError::request(format!(
                    "delete of large object {} of {name}",
                    hex(&oid)
                )))?;
            println!("deleted {} at {} ({:?})", hex(&oid), a.seq, a.durability);
        }
        RepoCmd::Erase { before, names } => {
            let what = match before {
                args::Before::Seq(s) => format!("before {s}"),
                args::Before::Time(ms) => format!("written before {}", twinlog::daemon::utc(ms)),
            };
            let asked = match before {
                args::Before::Seq(s) => client.erase(s, &names, Durability::Twin).await,
                args::Before::Time(ms) => {
                    client.erase_before_time(ms, &names, Durability::Twin).await
                }
            };
            let e = asked.map_err(DaemonError::request(format!(
                "erase of {} {what}",
                names.join(", ")
            )))?;
            println!(
                "erased {} frames ({} bytes) of {} before {} in the log, and their data in the store; \
                 the Erase frame is {} and is carried out {}",
                e.frames,
                e.bytes,
                names.join(", "),
                e.before,
                e.seq,
                match e.durability {
                    Durability::Twin => "on both boxes",
                    Durability::Local => "on the primary (the twin carries it out when its store applies it)",
                }
            );
            if e.frames == 0 {
                println!(
                    "nothing was erased: no data frame of these repositories is before {}",
                    e.before
                );
            }
        }
        RepoCmd::Have { name, oids } => {
            let have = client
                .have(&name, &oids)
                .await
                .map_err(DaemonError::request(format!("have in {name}")))?;
            for (o, h) in oids.iter().zip(have) {
                println!("{} {}", hex(o), if h { "yes" } else { "no" });
            }
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum DocCmd {
    /// Write a control document from a file (at most 16 MiB).
    Put {
        /// The document's name
        #[arg(value_parser = args::doc_name)]
        name: String,
        /// The file to store
        file: PathBuf,
    },
    /// The control documents, one name a line.
    List,
    /// Delete a control document, on both boxes.
    Delete {
        /// The document's name
        #[arg(value_parser = args::doc_name)]
        name: String,
    },
    /// A control document's bytes to stdout or a file.
    Get {
        /// The document's name
        #[arg(value_parser = args::doc_name)]
        name: String,
        /// Write the document to this file (replaced only once the read
        /// succeeded) instead of stdout
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

pub async fn run_doc(client: &Client, cmd: DocCmd) -> Result<(), DaemonError> {
    match cmd {
        DocCmd::Put { name, file } => {
            let content = std::fs::read(&file).at("reading", &file)?;
            let a = client
                .put_doc(&name, &content, Durability::Twin)
                .await
                .map_err(DaemonError::request(format!("put of document {name}")))?;
            println!(
                "{name} ({} bytes) written at {} ({:?})",
                content.len(),
                a.seq,
                a.durability
            );
        }
        DocCmd::List => {
            let names = client
                .list_docs()
                .await
                .map_err(DaemonError::request("the documents".to_string()))?;
            for n in names {
                println!("{n}");
            }
        }
        DocCmd::Delete { name } => {
            let a = client
                .delete_doc(&name, Durability::Twin)
                .await
                .map_err(DaemonError::request(format!("delete of document {name}")))?;
            println!("deleted document {name} at {} ({:?})", a.seq, a.durability);
        }
        DocCmd::Get { name, out } => {
            let found = client
                .get_doc(&name)
                .await
                .map_err(DaemonError::request(format!("document {name}")))?;
            let Some(content) = found else {
                return Err(DaemonError::Failed(format!("no document {name:?}")));
            };
            match out {
                Some(path) => {
                    let len = out::write(&path, &content)?;
                    println!("{name}: {len} bytes written to {}", path.display());
                }
                None => to_stdout(&content)?,
            }
        }
    }
    Ok(())
}
