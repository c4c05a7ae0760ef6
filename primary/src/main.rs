//! `primary`: the twinlog primary daemon and its commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use twinlog::daemon::{self, DaemonError, PrimaryConfig};
use twinlog::net::Fingerprint;
use twinlog::node::{Client, Durability};

mod repo;
mod restore;

#[derive(Parser)]
#[command(
    name = "primary",
    version,
    about = "The twinlog primary: appends frames and streams them to its twin."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    Local,
    Twin,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mint a key and a certificate, write primary.toml, print the
    /// fingerprint to pin on the twin.
    Init {
        #[arg(long, default_value = "twinlog-primary")]
        data: PathBuf,
        #[arg(long, default_value = "0.0.0.0:7400")]
        listen: SocketAddr,
        #[arg(long, default_value = "127.0.0.1:9400")]
        metrics: SocketAddr,
        /// The twin's fingerprint, if known already (else `pin-twin`).
        #[arg(long)]
        twin_fingerprint: Option<Fingerprint>,
    },
    /// Pin the twin's certificate fingerprint in the configuration.
    PinTwin {
        #[arg(long, short)]
        config: PathBuf,
        fingerprint: Fingerprint,
    },
    /// Allow a client's certificate fingerprint.
    PinClient {
        #[arg(long, short)]
        config: PathBuf,
        fingerprint: Fingerprint,
    },
    /// Run the daemon until SIGTERM.
    Serve {
        #[arg(long, short)]
        config: PathBuf,
        /// Logs as JSON lines instead of human text.
        #[arg(long)]
        log_json: bool,
    },
    /// Read every durable frame of this box's log and check its crc,
    /// without writing anything (safe while the daemon runs).
    CheckLog {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Heads, the twin's lag and the durability policy's state.
    Status {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Append a frame through the running daemon (as the admin client).
    Append {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long, default_value_t = twinlog::log::APP_KIND_FIRST)]
        kind: u16,
        #[arg(long, value_enum, default_value = "twin")]
        durability: DurabilityArg,
        /// The blob: a file's bytes...
        #[arg(long, conflicts_with = "text")]
        file: Option<PathBuf>,
        /// ...or this text.
        #[arg(long)]
        text: Option<String>,
    },
    /// Drive a mixed workload (small frames from 8 clients, then one large
    /// blob) with twin durability and live progress; then check every
    /// acknowledged frame on the twin's log directory, if given.
    Load {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long, default_value_t = 2000)]
        frames: u64,
        #[arg(long, default_value_t = 64)]
        blob_mib: u64,
        /// The twin's log directory (`<twin data>/log`) on this box.
        #[arg(long)]
        verify_twin_log: Option<PathBuf>,
    },
    /// Follow the log from a sequence: one line per frame (sequence, kind,
    /// blob length) as each becomes durable.
    Tail {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long, default_value_t = 1)]
        from: u64,
    },
    /// The store's repositories: create, import from git, refs, history,
    /// objects.
    Repo {
        #[arg(long, short)]
        config: PathBuf,
        #[command(subcommand)]
        cmd: repo::RepoCmd,
    },
    /// Control documents: put and get.
    Doc {
        #[arg(long, short)]
        config: PathBuf,
        #[command(subcommand)]
        cmd: repo::DocCmd,
    },
    /// Fill this fresh box (after `primary init`) from a twin: its snapshot
    /// when its log does not reach back to 1, then every frame. Run again
    /// after an interruption, it resumes where it stopped.
    Restore {
        #[arg(long, short)]
        config: PathBuf,
        /// The twin's restore address (`restore_listen` in twin.toml).
        #[arg(long)]
        from: SocketAddr,
        /// The twin's certificate fingerprint.
        #[arg(long)]
        twin_fingerprint: Fingerprint,
        /// Print what was restored as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Drop the log's whole segments below a sequence by hand (the open
    /// segment is closed first). Past the twin's position only with --force.
    Retain {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        from: u64,
        #[arg(long)]
        force: bool,
    },
    /// The store when a frame does not apply: try again, or skip the frame
    /// on both boxes. `status` shows where the store stopped and why.
    Store {
        #[arg(long, short)]
        config: PathBuf,
        #[command(subcommand)]
        cmd: StoreCmd,
    },
    /// Read a frame through the running daemon; its blob to stdout or a file.
    Read {
        #[arg(long, short)]
        config: PathBuf,
        seq: u64,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Apply again now, after fixing what stopped the store (space, file
    /// descriptors, permissions). The store also retries by itself.
    Retry,
    /// Skip the frame the store stopped at, on both boxes: a StoreSkip
    /// frame is appended, and each box's store records the skip in
    /// `store/SKIPPED` instead of the frame's effect. Refused unless the
    /// twin's store stopped at the same frame.
    Skip {
        /// The frame the store stopped at, as `status` shows it.
        #[arg(long)]
        seq: u64,
        /// Why, kept in each box's skip record.
        #[arg(long)]
        reason: String,
        /// Skip even when the twin's store did not stop there: the twin
        /// then keeps the frame's effect and the boxes differ.
        #[arg(long)]
        force: bool,
    },
}

async fn admin(cfg: &PrimaryConfig) -> Result<Client, DaemonError> {
    daemon::load::admin_client(cfg).await
}

async fn run(cmd: Cmd) -> Result<(), DaemonError> {
    match cmd {
        Cmd::Init {
            data,
            listen,
            metrics,
            twin_fingerprint,
        } => {
            let (config, fp) = daemon::init_primary(&data, listen, metrics, twin_fingerprint)?;
            println!("wrote {}", config.display());
            println!("primary fingerprint (pin it on the twin): {fp}");
        }
        Cmd::PinTwin {
            config,
            fingerprint,
        } => daemon::pin_twin(&config, fingerprint)?,
        Cmd::PinClient {
            config,
            fingerprint,
        } => daemon::pin_client(&config, fingerprint)?,
        Cmd::Serve { config, log_json } => {
            daemon::init_tracing(log_json);
            let cfg = PrimaryConfig::load(&config)?;
            let shutdown = daemon::shutdown_on_signals()?;
            daemon::serve_primary(cfg, shutdown).await?;
        }
        Cmd::CheckLog { config } => {
            let cfg = PrimaryConfig::load(&config)?;
            let c = daemon::check_log(&cfg.data_dir.join(daemon::LOG_DIR))?;
            println!("{c}");
        }
        Cmd::Status { config, json } => {
            let cfg = PrimaryConfig::load(&config)?;
            let (text, status) = daemon::fetch_status::<twinlog::node::Status>(cfg.metrics)?;
            if json {
                println!("{text}");
            } else {
                print!("{}", daemon::render_primary_status(&status));
            }
        }
        Cmd::Append {
            config,
            kind,
            durability,
            file,
            text,
        } => {
            let cfg = PrimaryConfig::load(&config)?;
            let blob = match (file, text) {
                (Some(f), _) => std::fs::read(f)?,
                (None, Some(t)) => t.into_bytes(),
                (None, None) => {
                    let mut b = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)?;
                    b
                }
            };
            let d = match durability {
                DurabilityArg::Local => Durability::Local,
                DurabilityArg::Twin => Durability::Twin,
            };
            let client = admin(&cfg).await?;
            let (seq, got) = client
                .append(kind, &[], &blob, d)
                .await
                .map_err(|e| DaemonError::Setup(e.to_string()))?;
            println!("{seq} {got:?}");
        }
        Cmd::Load {
            config,
            frames,
            blob_mib,
            verify_twin_log,
        } => {
            let cfg = PrimaryConfig::load(&config)?;
            let r = daemon::load::run(&cfg, frames, blob_mib, verify_twin_log.as_deref()).await?;
            println!(
                "{} frames ({:.1} MiB) acknowledged as durable on both boxes in {:.1} s",
                r.frames,
                r.bytes as f64 / 1048576.0,
                r.secs
            );
            println!(
                "primary head {}, twin acknowledged {}",
                r.primary_head, r.twin_acked
            );
            if let Some(n) = r.verified_on_twin {
                println!(
                    "verified on the twin's log: {n} of {} acknowledged frames, byte for byte",
                    r.frames
                );
            }
        }
        Cmd::Tail { config, from } => {
            let cfg = PrimaryConfig::load(&config)?;
            let client = admin(&cfg).await?;
            let mut tail = client
                .tail(from)
                .await
                .map_err(|e| DaemonError::Setup(e.to_string()))?;
            while let Some(e) = tail
                .next()
                .await
                .map_err(|e| DaemonError::Setup(e.to_string()))?
            {
                println!("{} {} {}", e.seq, e.kind, e.blob.len());
            }
        }
        Cmd::Repo { config, cmd } => {
            let cfg = PrimaryConfig::load(&config)?;
            let client = admin(&cfg).await?;
            repo::run(&client, cmd).await?;
        }
        Cmd::Doc { config, cmd } => {
            let cfg = PrimaryConfig::load(&config)?;
            let client = admin(&cfg).await?;
            repo::run_doc(&client, cmd).await?;
        }
        Cmd::Restore {
            config,
            from,
            twin_fingerprint,
            json,
        } => {
            daemon::init_tracing(false);
            let cfg = PrimaryConfig::load(&config)?;
            restore::run(&cfg, from, twin_fingerprint, json).await?;
        }
        Cmd::Retain {
            config,
            from,
            force,
        } => {
            let cfg = PrimaryConfig::load(&config)?;
            let client = admin(&cfg).await?;
            let first = client
                .retain_from(from, force)
                .await
                .map_err(|e| DaemonError::Setup(e.to_string()))?;
            println!("the log retains from {first}");
        }
        Cmd::Store { config, cmd } => {
            let cfg = PrimaryConfig::load(&config)?;
            let client = admin(&cfg).await?;
            match cmd {
                StoreCmd::Retry => {
                    let h = client
                        .store_retry()
                        .await
                        .map_err(|e| DaemonError::Setup(e.to_string()))?;
                    print!(
                        "{}",
                        daemon::render_store(
                            "store",
                            &h,
                            "fix the cause and retry, or `store skip`"
                        )
                    );
                }
                StoreCmd::Skip { seq, reason, force } => {
                    let a = client
                        .store_skip(seq, &reason, force, Durability::Twin)
                        .await
                        .map_err(|e| DaemonError::Setup(e.to_string()))?;
                    println!(
                        "frame {seq} skipped: the StoreSkip frame is {} ({:?}); each box records it in store/SKIPPED",
                        a.seq, a.durability
                    );
                }
            }
        }
        Cmd::Read { config, seq, out } => {
            let cfg = PrimaryConfig::load(&config)?;
            let client = admin(&cfg).await?;
            let e = client
                .read(seq)
                .await
                .map_err(|e| DaemonError::Setup(e.to_string()))?;
            match out {
                Some(path) => std::fs::write(path, &e.blob)?,
                None => std::io::Write::write_all(&mut std::io::stdout(), &e.blob)?,
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.cmd).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("primary: {e}");
            ExitCode::from(e.exit_code().clamp(1, 255) as u8)
        }
    }
}
