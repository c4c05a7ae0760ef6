//! `twin`: the twinlog twin daemon and its commands.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};
use clap_complete::Shell;
use twinlog::daemon::{self, Address, DaemonError, IoAt, TwinConfig};
use twinlog::net::Fingerprint;

/// The environment variable `--config` falls back to.
const CONFIG_ENV: &str = "TWINLOG_CONFIG";

#[derive(Parser)]
#[command(
    name = "twin",
    version,
    about = "The twinlog twin: follows a primary and keeps its log durable.",
    after_help = "Exit codes: 0 success, 1 runtime failure, 2 bad arguments, 3 a configuration that cannot be used, 4 a key or certificate that cannot be used."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// `--config`, on every command that reads the configuration: accepted
/// anywhere after the command's name, or from `TWINLOG_CONFIG`.
#[derive(Args, Clone, Debug)]
struct ConfigArg {
    /// The twin's configuration file (twin.toml, as `init` wrote it)
    #[arg(
        long,
        short,
        global = true,
        env = CONFIG_ENV,
        hide_env_values = true,
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
}

impl ConfigArg {
    fn path(&self) -> Result<&Path, DaemonError> {
        self.config.as_deref().ok_or_else(|| {
            DaemonError::Usage(format!(
                "no configuration: give --config FILE (twin.toml, as `twin init` wrote it) or set {CONFIG_ENV}"
            ))
        })
    }

    fn load(&self) -> Result<TwinConfig, DaemonError> {
        Ok(TwinConfig::load(self.path()?)?)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Mint a key and a certificate, write twin.toml, print the fingerprint
    /// to pin on the primary.
    Init {
        /// The data directory to create (log, store, key, certificate,
        /// configuration)
        #[arg(long, default_value = "twinlog-twin", value_name = "DIR")]
        data: PathBuf,
        /// The primary's QUIC address (HOST:PORT)
        #[arg(long, default_value = "127.0.0.1:7400", value_name = "ADDRESS")]
        primary: Address,
        /// The local HTTP address of /metrics and /status (HOST:PORT)
        #[arg(long, default_value = "127.0.0.1:9401", value_name = "ADDRESS")]
        metrics: Address,
        /// The primary's certificate fingerprint, if known already (else
        /// `pin` later)
        #[arg(long, value_name = "FINGERPRINT")]
        primary_fingerprint: Option<Fingerprint>,
    },
    /// Pin the primary's certificate fingerprint in the configuration.
    Pin {
        #[command(flatten)]
        config: ConfigArg,
        /// The primary's fingerprint, as `primary init` printed it
        fingerprint: Fingerprint,
    },
    /// Allow a box to restore from this twin.
    ///
    /// The box is named by its fingerprint, as `primary init` printed it;
    /// restores are served on --listen (restore_listen in twin.toml).
    PinRestore {
        #[command(flatten)]
        config: ConfigArg,
        /// The QUIC address to serve restores on (HOST:PORT; sets
        /// restore_listen, needed unless it is set already)
        #[arg(long, value_name = "ADDRESS")]
        listen: Option<Address>,
        /// How long the pin lasts: the box's handshakes are refused after
        /// (seconds, or with a unit: 30m, 24h, 7d)
        #[arg(long, default_value = "24h", value_parser = expiry, value_name = "DURATION", conflicts_with = "no_expiry")]
        expires_in: std::time::Duration,
        /// A pin that never expires
        #[arg(long)]
        no_expiry: bool,
        /// The restoring box's fingerprint
        fingerprint: Fingerprint,
    },
    /// Unpin a box being restored.
    UnpinRestore {
        #[command(flatten)]
        config: ConfigArg,
        /// The restoring box's fingerprint
        fingerprint: Fingerprint,
    },
    /// The peers this twin pins: its primary and the boxes it restores.
    Pins {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Follow the primary until SIGTERM.
    Serve {
        #[command(flatten)]
        config: ConfigArg,
        /// Logs as JSON lines instead of human text
        #[arg(long)]
        log_json: bool,
    },
    /// Make this stopped twin a primary of a new term.
    ///
    /// Once its primary is gone: writes primary.toml beside twin.toml.
    /// Refused while this twin heard its primary within promote_quiet_ms
    /// (twin.toml), unless --force. Once served, the new primary calls the
    /// old one at the address twin.toml names until it hears: the old
    /// primary then fences itself and acknowledges nothing from then on
    /// (`status` shows the call). Without --twin-fingerprint the new
    /// primary has no twin: `twin` appends are refused at once (NoTwin)
    /// until one is pinned.
    Promote {
        #[command(flatten)]
        config: ConfigArg,
        /// The new twin's fingerprint: the old primary's, printed by
        /// `primary init`, for it to rejoin as this box's twin
        #[arg(long, value_name = "FINGERPRINT")]
        twin_fingerprint: Option<Fingerprint>,
        /// The QUIC address to serve on as a primary (HOST:PORT)
        #[arg(long, default_value = "0.0.0.0:7400", value_name = "ADDRESS")]
        listen: Address,
        /// The primary's local HTTP address of /metrics and /status
        /// (HOST:PORT)
        #[arg(long, default_value = "127.0.0.1:9400", value_name = "ADDRESS")]
        metrics: Address,
        /// Promote even though this twin heard its primary lately. This
        /// risks two primaries taking writes if the old one is alive and
        /// only cut off from this box: it is fenced once this box reaches
        /// it, and what it acknowledged meanwhile is saved, not kept, when
        /// it rejoins.
        #[arg(long)]
        force: bool,
    },
    /// Archive this stopped box's sealed segments now, with a progress bar.
    ///
    /// What the archiver of a serving box does in the background
    /// (`[archive]` in twin.toml names the bucket): every sealed segment
    /// the bucket lacks is uploaded, checked frame by frame, compressed
    /// and encrypted as configured. For a box about to be retired, or an
    /// archive turned on for a log that holds history. Refused while the
    /// daemon serves (it holds the log).
    ArchivePush {
        #[command(flatten)]
        config: ConfigArg,
        /// The report as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Check the crc of every durable frame of this box's log.
    ///
    /// Reads without writing anything: safe while the daemon runs.
    CheckLog {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// The twin's head, connection and lag.
    Status {
        #[command(flatten)]
        config: ConfigArg,
        /// The daemon's status as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Print a completion script for a shell to stdout.
    ///
    /// For bash: `twin completions bash | sudo tee
    /// /usr/share/bash-completion/completions/twin`.
    Completions {
        /// The shell the script is for
        shell: Shell,
    },
    /// Write the manual pages: twin.1 and one per subcommand.
    Man {
        /// The directory to write them to, created if missing (e.g.
        /// /usr/local/share/man/man1)
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Print `twin`'s completion script for `shell`. It is built in memory
/// first: the generator panics on a failed write, and a closed stdout
/// (`| head`) must be an error like any other.
fn completions(shell: Shell) -> Result<(), DaemonError> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "twin", &mut script);
    std::io::Write::write_all(&mut std::io::stdout(), &script)
        .map_err(|e| DaemonError::Failed(format!("writing to stdout: {e}")))
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
        } => print!("{}", daemon::pin_primary(config.path()?, fingerprint)?),
        Cmd::PinRestore {
            config,
            listen,
            expires_in,
            no_expiry,
            fingerprint,
        } => print!(
            "{}",
            daemon::pin_restore(
                config.path()?,
                fingerprint,
                listen,
                (!no_expiry).then_some(expires_in)
            )?
        ),
        Cmd::UnpinRestore {
            config,
            fingerprint,
        } => print!("{}", daemon::unpin_restore(config.path()?, fingerprint)?),
        Cmd::Pins { config } => print!("{}", daemon::twin_pins(config.path()?)?),
        Cmd::Promote {
            config,
            twin_fingerprint,
            listen,
            metrics,
            force,
        } => {
            let p = daemon::failover::promote(
                config.path()?,
                listen,
                metrics,
                twin_fingerprint,
                force,
            )?;
            println!(
                "promoted at epoch {} with head {}",
                twinlog::repl::epochs::EpochName(p.epoch),
                p.head
            );
            println!("wrote {}", p.config.display());
            match twin_fingerprint {
                Some(fp) => println!("its twin: {fp} (the old primary rejoins with `primary rejoin`)"),
                None => println!(
                    "no twin yet: `twin` appends are refused (NoTwin) until one is pinned with `primary pin-twin`"
                ),
            }
            println!(
                "serve it with: primary serve --config {}",
                p.config.display()
            );
            println!("its fingerprint (pin it on a new twin): {}", p.fingerprint);
        }
        Cmd::Serve { config, log_json } => {
            daemon::init_tracing(log_json);
            let cfg = config.load()?;
            let shutdown = daemon::shutdown_on_signals()?;
            let served = daemon::serve_twin(cfg, shutdown.clone()).await?;
            let served = daemon::auto_failover::stop_wins(served, &shutdown);
            daemon::failover::continue_as(&served, log_json)?;
        }
        Cmd::ArchivePush { config, json } => {
            let cfg = config.load()?;
            daemon::archive_push(&cfg.data_dir, cfg.archive.as_ref(), json).await?;
        }
        Cmd::CheckLog { config } => {
            let cfg = config.load()?;
            let c = daemon::check_log(&cfg.data_dir.join(daemon::LOG_DIR))?;
            println!("{c}");
        }
        Cmd::Status { config, json } => {
            let cfg = config.load()?;
            let (text, status) = daemon::fetch_status::<twinlog::node::TwinStatus>(&cfg.metrics)?;
            if json {
                println!("{text}");
            } else {
                print!("{}", daemon::render_twin_status(&status));
            }
        }
        Cmd::Completions { shell } => completions(shell)?,
        Cmd::Man { out } => {
            std::fs::create_dir_all(&out).at("creating", &out)?;
            clap_mangen::generate_to(Cli::command(), &out).at("writing manual pages to", &out)?;
            println!(
                "wrote twin.1 and a page per subcommand to {}",
                out.display()
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    twinlog::daemon::allocator::tune();
    let cli = Cli::parse();
    let serves = matches!(cli.cmd, Cmd::Serve { .. });
    let runtime = match twinlog::daemon::runtime::for_command(serves) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("twin: no async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match twinlog::daemon::runtime::block_on_workers(&runtime, run(cli.cmd)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twin: {e}");
            ExitCode::from(e.exit_code().clamp(1, 255) as u8)
        }
    }
}

/// A pin's lifetime: a number and its unit, `s`, `m`, `h` or `d` (`s` when
/// none), from a second to a year.
fn expiry(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 24h"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("{s:?}: the unit is s, m, h or d")),
    };
    if !(1..=365 * 86_400).contains(&secs) {
        return Err(format!("{s:?}: from 1s to 365d"));
    }
    Ok(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn walk(cmd: &clap::Command, path: &str, each: &mut dyn FnMut(String, &clap::Command)) {
        each(path.to_owned(), cmd);
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), each);
        }
    }

    #[test]
    fn every_command_and_argument_has_help() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        walk(&cli, "twin", &mut |path, cmd| {
            assert!(cmd.get_about().is_some(), "{path} has no help");
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(arg.get_help().is_some(), "{path}: {id} has no help");
            }
        });
    }
}
