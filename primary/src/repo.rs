//! `primary repo ...`: the store's client commands, through the running
//! daemon as its admin client.

use std::path::PathBuf;

use clap::Subcommand;
use twinlog::daemon::DaemonError;
use twinlog::node::{Client, Durability};
use twinlog::store::frames::{hex, type_name, unhex};

#[derive(Subcommand)]
pub enum RepoCmd {
    /// Create a repository.
    Create { name: String },
    /// Import a git repository's objects and refs (git must be installed).
    Import {
        name: String,
        /// The git repository (a work tree or a bare repository).
        #[arg(long)]
        git: PathBuf,
        #[arg(long, default_value_t = 8)]
        pack_mib: usize,
    },
    /// A repository's current refs: `<oid> <name>` per line.
    Refs { name: String },
    /// A repository's pushes, oldest first.
    History { name: String },
    /// An object's bytes to stdout (its type on stderr).
    Cat { name: String, oid: String },
    /// Which of these objects the repository holds: `<oid> yes|no`.
    Have { name: String, oids: Vec<String> },
    /// Store a file as a large object (its SHA-256 names it), streamed.
    LfsPut { name: String, file: PathBuf },
    /// A large object's bytes, to a file or stdout.
    LfsGet {
        name: String,
        oid: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Delete a large object.
    LfsDelete { name: String, oid: String },
    /// Erase every data frame of these repositories before a sequence, in
    /// place, on this box and on the twin (their stores drop the data too).
    Erase {
        /// Frames before this sequence (`head + 1`: everything so far).
        #[arg(long)]
        before: u64,
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn failed(e: impl std::fmt::Display) -> DaemonError {
    DaemonError::Setup(e.to_string())
}

fn oid_arg(s: &str) -> Result<[u8; 20], DaemonError> {
    unhex::<20>(s).ok_or_else(|| failed(format!("{s:?} is not a 40-digit hex object id")))
}

fn lfs_oid_arg(s: &str) -> Result<[u8; 32], DaemonError> {
    unhex::<32>(s).ok_or_else(|| failed(format!("{s:?} is not a 64-digit hex SHA-256")))
}

/// A file's SHA-256, read in pieces.
fn sha256_of(path: &std::path::Path) -> Result<[u8; 32], DaemonError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    let mut oid = [0u8; 32];
    oid.copy_from_slice(ctx.finish().as_ref());
    Ok(oid)
}

pub async fn run(client: &Client, cmd: RepoCmd) -> Result<(), DaemonError> {
    match cmd {
        RepoCmd::Create { name } => {
            let a = client
                .create_repo(&name, Durability::Twin)
                .await
                .map_err(failed)?;
            println!("created {name} at {} ({:?})", a.seq, a.durability);
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
                .map_err(failed)?;
            let secs = started.elapsed().as_secs_f64();
            println!(
                "imported {} objects ({:.1} MiB) in {} packs and {} refs in {secs:.1} s ({:.0} objects/s)",
                r.objects,
                r.bytes as f64 / 1048576.0,
                r.packs,
                r.refs,
                r.objects as f64 / secs.max(1e-9)
            );
        }
        RepoCmd::Refs { name } => {
            for (r, oid) in client.refs(&name).await.map_err(failed)? {
                println!("{} {r}", hex(&oid));
            }
        }
        RepoCmd::History { name } => {
            let show = |o: Option<[u8; 20]>| o.map_or_else(|| "-".repeat(40), |o| hex(&o));
            for p in client.push_history(&name).await.map_err(failed)? {
                println!("push {} at {} ms", p.seq, p.at_ms);
                for u in p.updates {
                    println!("  {} {} {}", show(u.old), show(u.new), u.name);
                }
            }
        }
        RepoCmd::Cat { name, oid } => {
            let oid = oid_arg(&oid)?;
            match client.read_object(&name, oid).await.map_err(failed)? {
                Some((t, data)) => {
                    eprintln!("{} {}", type_name(t), data.len());
                    std::io::Write::write_all(&mut std::io::stdout(), &data)?;
                }
                None => return Err(failed(format!("no object {} in {name}", hex(&oid)))),
            }
        }
        RepoCmd::LfsPut { name, file } => {
            let oid = sha256_of(&file)?;
            let len = std::fs::metadata(&file)?.len();
            let f = tokio::fs::File::open(&file).await?;
            let a = client
                .lfs_put(&name, oid, len, f, Durability::Twin)
                .await
                .map_err(failed)?;
            println!(
                "{} ({len} bytes) stored at {} ({:?})",
                hex(&oid),
                a.seq,
                a.durability
            );
        }
        RepoCmd::LfsGet { name, oid, out } => {
            let oid = lfs_oid_arg(&oid)?;
            let found = match out {
                Some(path) => {
                    let f = tokio::fs::File::create(&path).await?;
                    client.lfs_get(&name, oid, f).await.map_err(failed)?
                }
                None => client
                    .lfs_get(&name, oid, tokio::io::stdout())
                    .await
                    .map_err(failed)?,
            };
            if !found {
                return Err(failed(format!("no large object {} in {name}", hex(&oid))));
            }
        }
        RepoCmd::LfsDelete { name, oid } => {
            let oid = lfs_oid_arg(&oid)?;
            let a = client
                .lfs_delete(&name, oid, Durability::Twin)
                .await
                .map_err(failed)?;
            println!("deleted at {} ({:?})", a.seq, a.durability);
        }
        RepoCmd::Erase { before, names } => {
            let a = client
                .erase(before, &names, Durability::Twin)
                .await
                .map_err(failed)?;
            println!(
                "erase of {} before {before} appended at {} and carried out ({:?})",
                names.join(", "),
                a.seq,
                a.durability
            );
        }
        RepoCmd::Have { name, oids } => {
            let parsed = oids
                .iter()
                .map(|o| oid_arg(o))
                .collect::<Result<Vec<_>, _>>()?;
            let have = client.have(&name, &parsed).await.map_err(failed)?;
            for (o, h) in oids.iter().zip(have) {
                println!("{o} {}", if h { "yes" } else { "no" });
            }
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum DocCmd {
    /// Write a control document from a file (at most 16 MiB).
    Put { name: String, file: PathBuf },
    /// A control document's bytes to stdout.
    Get { name: String },
}

pub async fn run_doc(client: &Client, cmd: DocCmd) -> Result<(), DaemonError> {
    match cmd {
        DocCmd::Put { name, file } => {
            let content = std::fs::read(&file)?;
            let a = client
                .put_doc(&name, &content, Durability::Twin)
                .await
                .map_err(failed)?;
            println!("{name} written at {} ({:?})", a.seq, a.durability);
        }
        DocCmd::Get { name } => match client.get_doc(&name).await.map_err(failed)? {
            Some(content) => std::io::Write::write_all(&mut std::io::stdout(), &content)?,
            None => return Err(failed(format!("no document {name:?}"))),
        },
    }
    Ok(())
}
