//! `twin`: the twinlog twin daemon and its commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use twinlog::daemon::{self, DaemonError, TwinConfig};
use twinlog::net::Fingerprint;

#[derive(Parser)]
#[command(
    name = "twin",
    version,
    about = "The twinlog twin: follows a primary and keeps its log durable."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mint a key and a certificate, write twin.toml, print the fingerprint
    /// to pin on the primary.
    Init {
        #[arg(long, default_value = "twinlog-twin")]
        data: PathBuf,
        /// The primary's QUIC address.
        #[arg(long, default_value = "127.0.0.1:7400")]
        primary: SocketAddr,
        #[arg(long, default_value = "127.0.0.1:9401")]
        metrics: SocketAddr,
        #[arg(long)]
        primary_fingerprint: Option<Fingerprint>,
    },
    /// Pin the primary's certificate fingerprint in the configuration.
    Pin {
        #[arg(long, short)]
        config: PathBuf,
        fingerprint: Fingerprint,
    },
    /// Allow a box to restore from this twin (its primary fingerprint, as
    /// `primary init` printed it), serving restores on --listen.
    PinRestore {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        listen: Option<SocketAddr>,
        fingerprint: Fingerprint,
    },
    /// Follow the primary until SIGTERM.
    Serve {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        log_json: bool,
    },
    /// Make this stopped twin a primary under a new epoch, once its primary
    /// is gone: writes primary.toml beside twin.toml. The old primary is
    /// refused from then on.
    Promote {
        #[arg(long, short)]
        config: PathBuf,
        /// The QUIC address to serve on as a primary.
        #[arg(long, default_value = "0.0.0.0:7400")]
        listen: SocketAddr,
        #[arg(long, default_value = "127.0.0.1:9400")]
        metrics: SocketAddr,
    },
    /// Read every durable frame of this box's log and check its crc,
    /// without writing anything (safe while the daemon runs).
    CheckLog {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// The twin's head, connection and lag.
    Status {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

async fn run(cmd: Cmd) -> Result<(), DaemonError> {
    match cmd {
        Cmd::Init {
            data,
            primary,
            metrics,
            primary_fingerprint,
        } => {
            let (config, fp) = daemon::init_twin(&data, primary, metrics, primary_fingerprint)?;
            println!("wrote {}", config.display());
            println!("twin fingerprint (pin it on the primary): {fp}");
        }
        Cmd::Pin {
            config,
            fingerprint,
        } => daemon::pin_primary(&config, fingerprint)?,
        Cmd::PinRestore {
            config,
            listen,
            fingerprint,
        } => daemon::pin_restore(&config, fingerprint, listen)?,
        Cmd::Promote {
            config,
            listen,
            metrics,
        } => {
            let p = daemon::promote(&config, listen, metrics)?;
            println!("promoted at epoch {} with head {}", p.epoch, p.head);
            println!("wrote {}", p.config.display());
            println!(
                "serve it with: primary serve --config {}",
                p.config.display()
            );
            println!("its fingerprint (pin it on a new twin): {}", p.fingerprint);
        }
        Cmd::Serve { config, log_json } => {
            daemon::init_tracing(log_json);
            let cfg = TwinConfig::load(&config)?;
            let shutdown = daemon::shutdown_on_signals()?;
            daemon::serve_twin(cfg, shutdown).await?;
        }
        Cmd::CheckLog { config } => {
            let cfg = TwinConfig::load(&config)?;
            let c = daemon::check_log(&cfg.data_dir.join(daemon::LOG_DIR))?;
            println!("{c}");
        }
        Cmd::Status { config, json } => {
            let cfg = TwinConfig::load(&config)?;
            let (text, status) = daemon::fetch_status::<twinlog::node::TwinStatus>(cfg.metrics)?;
            if json {
                println!("{text}");
            } else {
                print!("{}", daemon::render_twin_status(&status));
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
            eprintln!("twin: {e}");
            ExitCode::from(e.exit_code().clamp(1, 255) as u8)
        }
    }
}
