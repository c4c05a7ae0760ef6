//! `primary`: the twinlog primary daemon and its commands.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;
use twinlog::daemon::{self, Address, DaemonError, IoAt};
use twinlog::net::Fingerprint;
use twinlog::node::Durability;

mod archive_restore;
mod args;
mod export;
mod out;
mod repo;
mod restore;
mod session;

use args::{ConfigArg, TimeoutArg};
use session::Connections;

#[derive(Parser)]
#[command(
    name = "primary",
    version,
    about = "The twinlog primary: appends frames and streams them to its twin.",
    after_help = "Exit codes: 0 success, 1 runtime failure, 2 bad arguments, 3 a configuration that cannot be used, 4 a key or certificate that cannot be used."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What a pinned client may ask.
#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    /// Reads, tails, status and the store's reads
    Read,
    /// Also appends of application kinds and the store's writes
    Write,
    /// Also erase, retain, store retry and skip, repository deletion and
    /// raw appends of reserved kinds
    Admin,
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    /// Durable on this box
    Local,
    /// Durable on this box and acknowledged by the twin
    Twin,
}

impl From<DurabilityArg> for Durability {
    fn from(d: DurabilityArg) -> Durability {
        match d {
            DurabilityArg::Local => Durability::Local,
            DurabilityArg::Twin => Durability::Twin,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Mint a key and a certificate, write primary.toml, print the
    /// fingerprint to pin on the twin.
    Init {
        /// The data directory to create (log, store, key, certificate,
        /// configuration)
        #[arg(long, default_value = "twinlog-primary", value_name = "DIR")]
        data: PathBuf,
        /// The QUIC address to serve the twin and clients on (HOST:PORT)
        #[arg(long, default_value = "0.0.0.0:7400", value_name = "ADDRESS")]
        listen: Address,
        /// The local HTTP address of /metrics and /status (HOST:PORT)
        #[arg(long, default_value = "127.0.0.1:9400", value_name = "ADDRESS")]
        metrics: Address,
        /// The twin's certificate fingerprint, if known already (else
        /// `pin-twin` later)
        #[arg(long, value_name = "FINGERPRINT")]
        twin_fingerprint: Option<Fingerprint>,
    },
    /// Pin the twin's certificate fingerprint in the configuration.
    PinTwin {
        #[command(flatten)]
        config: ConfigArg,
        /// The twin's fingerprint, as `twin init` printed it
        fingerprint: Fingerprint,
    },
    /// Allow a client's certificate fingerprint.
    PinClient {
        #[command(flatten)]
        config: ConfigArg,
        /// What the client may ask (pinning again changes its role)
        #[arg(long, value_enum, default_value = "write")]
        role: RoleArg,
        /// The client's certificate fingerprint
        fingerprint: Fingerprint,
    },
    /// Unpin a client, whatever its role.
    Unpin {
        #[command(flatten)]
        config: ConfigArg,
        /// The client's certificate fingerprint
        fingerprint: Fingerprint,
    },
    /// The peers this primary pins: the twin and each client with its role.
    Pins {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Run the daemon until SIGTERM.
    Serve {
        #[command(flatten)]
        config: ConfigArg,
        /// Logs as JSON lines instead of human text
        #[arg(long)]
        log_json: bool,
    },
    /// Check the crc of every durable frame of this box's log.
    ///
    /// Reads without writing anything: safe while the daemon runs.
    CheckLog {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Heads, the twin's lag and the durability policy's state.
    Status {
        #[command(flatten)]
        config: ConfigArg,
        /// The daemon's status as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Append a frame through the running daemon (as the admin client).
    ///
    /// The blob is --text, --file, or stdin when it is not a terminal; an
    /// empty blob only with --empty.
    Append {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// The frame's kind (application kinds start at 32768)
        #[arg(long, default_value_t = twinlog::log::APP_KIND_FIRST)]
        kind: u16,
        /// How durable the frame must be before it is acknowledged
        #[arg(long, value_enum, default_value = "twin")]
        durability: DurabilityArg,
        /// The blob: this file's bytes (`-`: stdin)
        #[arg(long, conflicts_with = "text", value_name = "FILE")]
        file: Option<PathBuf>,
        /// The blob: this text
        #[arg(long)]
        text: Option<String>,
        /// Allow an empty blob (refused otherwise, as a likely mistake)
        #[arg(long)]
        empty: bool,
    },
    /// Drive a test workload through the running daemon.
    ///
    /// Small frames from 8 clients, then one large blob, with twin
    /// durability and live progress; then every acknowledged frame is
    /// checked on the twin's log directory, if given.
    Load {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// Small frames to append
        #[arg(long, default_value_t = 2000)]
        frames: u64,
        /// The large blob's size in MiB (0: none)
        #[arg(long, default_value_t = 64)]
        blob_mib: u64,
        /// The twin's log directory (`<twin data>/log`) on this box, to
        /// check every acknowledged frame on it
        #[arg(long, value_name = "DIR")]
        verify_twin_log: Option<PathBuf>,
    },
    /// Follow the log from a sequence.
    ///
    /// One line per frame (sequence, kind, blob length) as each becomes
    /// durable, until the daemon stops or through --to; or each frame
    /// whole, as JSON lines or raw bytes, a piece at a time.
    Tail {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// The first sequence to print
        #[arg(long, default_value_t = 1, value_parser = args::seq, value_name = "SEQ")]
        from: u64,
        /// The last sequence to print: the command ends once it is out
        #[arg(long, value_parser = args::seq, value_name = "SEQ")]
        to: Option<u64>,
        /// What to print of each frame
        #[arg(long, value_enum, default_value_t = export::Format::Lines)]
        format: export::Format,
    },
    /// The store's repositories: create, import, push, read, erase.
    Repo {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        #[command(subcommand)]
        cmd: repo::RepoCmd,
    },
    /// Control documents: put and get.
    Doc {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        #[command(subcommand)]
        cmd: repo::DocCmd,
    },
    /// Fill this fresh box (after `primary init`) from a twin, or from
    /// the archive.
    ///
    /// From a twin: the twin's snapshot when its log does not reach back
    /// to 1, then every frame. From the archive (`--from-archive`, when
    /// both boxes are gone): the archived segments of the newest lineage,
    /// up to `--until` or `--until-time`, then the store rebuilt from the
    /// log; the bucket's endpoint, credentials and key come from
    /// `[archive]` in primary.toml. Run again after an interruption, it
    /// resumes where it stopped.
    Restore {
        #[command(flatten)]
        config: ConfigArg,
        /// The twin's restore address (`restore_listen` in twin.toml),
        /// HOST:PORT
        #[arg(
            long,
            alias = "from",
            value_name = "ADDRESS",
            required_unless_present_any = ["from_archive", "abandon"],
            conflicts_with = "from_archive",
            requires = "twin_fingerprint"
        )]
        twin: Option<Address>,
        /// The twin's certificate fingerprint
        #[arg(long, value_name = "FINGERPRINT")]
        twin_fingerprint: Option<Fingerprint>,
        /// Restore from the archive at this URL (s3://bucket/prefix or
        /// file:///dir) instead of a twin
        #[arg(long, value_name = "URL")]
        from_archive: Option<String>,
        /// Stop after this frame (with --from-archive)
        #[arg(
            long,
            value_name = "SEQ",
            value_parser = args::seq,
            requires = "from_archive",
            conflicts_with = "until_time"
        )]
        until: Option<u64>,
        /// Stop after the last frame archived as durable by this time
        /// (RFC 3339 UTC, 2026-12-01T10:00:00Z or 10:00:00.250Z; to 100 ms;
        /// with --from-archive)
        #[arg(long, value_name = "TIME", requires = "from_archive")]
        until_time: Option<String>,
        /// Restore what the bucket holds even when the archive's head
        /// record says it held more (objects deleted, a bucket rolled
        /// back) or does not read; what was lost is named (with
        /// --from-archive)
        #[arg(long, requires = "from_archive")]
        accept_shorter: bool,
        /// Throw away what an unfinished restore wrote (its log, store
        /// and epochs), leaving the box fresh: `serve` refuses a box a
        /// restore is filling
        #[arg(long, conflicts_with_all = ["twin", "from_archive"])]
        abandon: bool,
        /// Print what was restored as one JSON line
        #[arg(long)]
        json: bool,
    },
    /// Archive this stopped box's sealed segments now, with a progress bar.
    ///
    /// What the archiver of a serving box does in the background
    /// (`[archive]` in primary.toml names the bucket): every sealed
    /// segment the bucket lacks is uploaded, checked frame by frame,
    /// compressed and encrypted as configured. For a box about to be
    /// retired, or an archive turned on for a log that holds history.
    /// Refused while the daemon serves (it holds the log).
    ArchivePush {
        #[command(flatten)]
        config: ConfigArg,
        /// The report as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Mint an archive key file (64 hex digits, mode 0600) for
    /// `key_file` in `[archive]`: every archived byte is then encrypted.
    /// Keep a copy off both boxes: without it nothing restores.
    ///
    /// `--rotate FILE` puts a new key in front of the keys FILE holds: new
    /// objects are sealed under it, older objects still open under the
    /// keys kept. Copy the file to the other box and restart both daemons.
    ArchiveKey {
        /// Where to write it; an existing file is never overwritten
        #[arg(
            long,
            value_name = "FILE",
            required_unless_present = "rotate",
            conflicts_with = "rotate"
        )]
        out: Option<std::path::PathBuf>,
        /// Rotate the key file FILE in place: a new current key, the old
        /// ones kept
        #[arg(long, value_name = "FILE")]
        rotate: Option<std::path::PathBuf>,
    },
    /// Turn this stopped, deposed primary into the new primary's twin.
    ///
    /// Finds where the two logs forked from their epoch histories, checks
    /// the frame there, fences this box, saves the frames past the fork
    /// (they were never on the new primary; `divergent` reads them) and
    /// cuts them, then writes twin.toml and moves primary.toml aside. No
    /// full copy: only what the new primary has past the fork follows.
    /// Running it again after an interruption finishes the job.
    Rejoin {
        #[command(flatten)]
        config: ConfigArg,
        /// The new primary's QUIC address (HOST:PORT)
        #[arg(long, value_name = "ADDRESS")]
        primary: Address,
        /// The new primary's fingerprint, as `twin promote` printed it
        #[arg(long, value_name = "FINGERPRINT")]
        primary_fingerprint: Fingerprint,
        /// The twin's local HTTP address of /metrics and /status (HOST:PORT);
        /// the primary's by default
        #[arg(long, value_name = "ADDRESS")]
        metrics: Option<Address>,
        /// Seconds the new primary has to answer
        #[arg(long, default_value_t = 10, value_name = "SECONDS")]
        wait: u64,
    },
    /// Compare the twin's frames with this primary's while both serve.
    ///
    /// Both boxes digest ranges of their logs (sequence, kind, epoch, meta
    /// and blob of every frame), each at --mib-per-s, and the primary
    /// narrows a range that differs down to the first frame that differs.
    /// Covers the frames both hold, up to what the twin acknowledged and
    /// both stores applied, or --from/--to. Exit 1 when a frame differs or
    /// the verify could not finish; `status` shows the last one.
    Verify {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// The first frame to compare (default: the first both hold)
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// The last frame to compare (default: the last both hold)
        #[arg(long, value_name = "SEQ")]
        to: Option<u64>,
        /// The pace each box reads its log at, MiB/s (at most 4096): a
        /// share of the disk and CPU left to the writes
        #[arg(long, default_value_t = twinlog::node::verify::VERIFY_MIB_PER_S, value_name = "MIB")]
        mib_per_s: u32,
        /// How long the whole verify may take, beyond --timeout
        #[arg(long, default_value = "1h", value_parser = args::duration, value_name = "DURATION")]
        within: std::time::Duration,
        /// The report as JSON
        #[arg(long)]
        json: bool,
    },
    /// Hand the primary role to the twin, with no acknowledged frame lost.
    ///
    /// Writes pause (new ones wait, bounded by --wait); the twin
    /// acknowledges the head; it promotes itself under the next epoch and
    /// serves at its `listen_as_primary`; this box fences itself and
    /// follows it as its twin (the daemon restarts as `twin serve`).
    /// Paused clients are answered `Fenced`, naming the new primary. On a
    /// failure before the handover, writes go on here as before.
    Switchover {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// Milliseconds the twin has to catch up and take over
        #[arg(long, default_value_t = 5000, value_name = "MS")]
        wait: u64,
    },
    /// Hold a running primary: it acknowledges no write from now on.
    ///
    /// Durably, across restarts (reads go on), until `primary rejoin` or
    /// `primary unfence`. The hold fences this box only: it names no epoch
    /// to anyone else. A promoted twin fences its old primary by itself
    /// when it reaches it; this is for before, or when it cannot.
    Fence {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// The epoch of the box that replaces it, as a note in its status
        /// (TERM.LIFE, or the number)
        #[arg(long, value_name = "EPOCH")]
        epoch: Option<twinlog::repl::epochs::EpochName>,
    },
    /// Lift this stopped primary's hold or fence.
    ///
    /// A hold (`primary fence`, or a switchover whose outcome was unknown,
    /// once you know the twin did not take over) is lifted as it is. A
    /// fence by a newer epoch is lifted by making this box the primary of
    /// a new term, which needs --i-accept-split-brain. DANGER: that makes
    /// a split brain on purpose. The box that fenced it goes on serving
    /// its own epoch; both then take writes neither twin holds, and one
    /// side's are lost when they meet again. Only when the newer primary
    /// is gone for good and this log is the one to keep.
    Unfence {
        #[command(flatten)]
        config: ConfigArg,
        /// Say that you accept the risk above
        #[arg(long)]
        i_accept_split_brain: bool,
    },
    /// Let a waiting primary serve without what it waits for.
    ///
    /// Without an arbiter, a primary that did not stop cleanly starts
    /// held until its twin says hello at its epoch: the proof that the
    /// twin was not promoted while it was down. `release` lifts that hold.
    /// RISK: if the twin was promoted, two boxes then take writes.
    ///
    /// Under [failover], after etcd lost its data or was rolled back, a
    /// primary leads only with the other box's epoch history in hand.
    /// With --arbiter-lost --epoch-above N it leads above epoch N without
    /// it. RISK: name an N at or above every epoch the other box served
    /// (its `status` says, or its EPOCHS file); if it held a newer one,
    /// its frames past the fork are cut when it rejoins (saved under
    /// divergent/). Only when the other box is gone for good.
    ///
    /// Works on a running daemon (it takes the word within a second) or a
    /// stopped one (its next start takes it).
    Release {
        #[command(flatten)]
        config: ConfigArg,
        /// etcd forgot and the other box is gone for good: lead above
        /// --epoch-above
        #[arg(long, requires = "epoch_above")]
        arbiter_lost: bool,
        /// The epoch to lead above (TERM.LIFE), with --arbiter-lost
        #[arg(long, requires = "arbiter_lost")]
        epoch_above: Option<twinlog::repl::epochs::EpochName>,
    },
    /// The frames a rejoin cut from this box's log, saved beforehand.
    ///
    /// Lists each saved tail and its frames (every crc checked); with
    /// --seq, writes that frame's blob to stdout.
    Divergent {
        /// The box's data directory
        #[arg(long, default_value = "twinlog-primary", value_name = "DIR")]
        data: PathBuf,
        /// Write this frame's blob to stdout instead of listing
        #[arg(long, value_parser = args::seq, value_name = "SEQ")]
        seq: Option<u64>,
    },
    /// Drop the log's whole segments below a sequence by hand.
    ///
    /// The open segment is closed first. Past the twin's position only
    /// with --force.
    Retain {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// Keep the log from this sequence on
        #[arg(long, value_parser = args::seq, value_name = "SEQ")]
        from: u64,
        /// Drop frames the twin has not acknowledged too (it will then need
        /// a snapshot)
        #[arg(long)]
        force: bool,
    },
    /// The store when a frame does not apply: retry, or skip it.
    ///
    /// `status` shows where the store stopped and why.
    Store {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        #[command(subcommand)]
        cmd: StoreCmd,
    },
    /// Read a frame through the running daemon; its blob to stdout or a file.
    Read {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        timeout: TimeoutArg,
        /// The frame's sequence (sequences start at 1)
        #[arg(value_parser = args::seq)]
        seq: u64,
        /// Write the blob to this file (replaced only once the read
        /// succeeded) instead of stdout
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print a completion script for a shell to stdout.
    ///
    /// For bash: `primary completions bash | sudo tee
    /// /usr/share/bash-completion/completions/primary`.
    Completions {
        /// The shell the script is for
        shell: Shell,
    },
    /// Write the manual pages: primary.1 and one per subcommand.
    Man {
        /// The directory to write them to, created if missing (e.g.
        /// /usr/local/share/man/man1)
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Apply again now, after fixing what stopped the store.
    ///
    /// Space, file descriptors, permissions... The store also retries by
    /// itself.
    Retry,
    /// Skip the frame the store stopped at, on both boxes.
    ///
    /// A StoreSkip frame is appended, and each box's store records the
    /// skip in `store/SKIPPED` instead of the frame's effect. Refused
    /// unless the twin's store stopped at the same frame.
    Skip {
        /// The frame the store stopped at, as `status` shows it
        #[arg(long, value_parser = args::seq)]
        seq: u64,
        /// Why, kept in each box's skip record
        #[arg(long)]
        reason: String,
        /// Skip even when the twin's store did not stop there: the twin
        /// then keeps the frame's effect and the boxes differ
        #[arg(long)]
        force: bool,
    },
}

/// The blob `append` sends: --text, --file (`-` for stdin), or stdin when
/// it is not a terminal; an empty one only with --empty.
fn append_blob(
    file: Option<PathBuf>,
    text: Option<String>,
    empty: bool,
) -> Result<Vec<u8>, DaemonError> {
    let read_stdin = || {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| DaemonError::Failed(format!("reading the blob from stdin: {e}")))?;
        Ok::<_, DaemonError>(b)
    };
    let (blob, from) = match (file, text) {
        (_, Some(t)) => (t.into_bytes(), "--text".to_owned()),
        (Some(f), None) if f.as_os_str() == "-" => (read_stdin()?, "stdin".to_owned()),
        (Some(f), None) => (
            std::fs::read(&f).at("reading", &f)?,
            f.display().to_string(),
        ),
        (None, None) if std::io::stdin().is_terminal() => {
            if empty {
                return Ok(Vec::new());
            }
            return Err(DaemonError::Usage(
                "no blob to append: give --text TEXT or --file FILE, or pipe the bytes on stdin (stdin is a terminal)".into(),
            ));
        }
        (None, None) => (read_stdin()?, "stdin".to_owned()),
    };
    if blob.is_empty() && !empty {
        return Err(DaemonError::Usage(format!(
            "the blob from {from} is empty: pass --empty to append an empty frame"
        )));
    }
    Ok(blob)
}

fn durability_said(d: Durability) -> &'static str {
    match d {
        Durability::Twin => "durable on both boxes",
        Durability::Local => "durable on this box",
    }
}

/// Print `primary`'s completion script for `shell`. It is built in memory
/// first: the generator panics on a failed write, and a closed stdout
/// (`| head`) must be an error like any other.
fn completions(shell: Shell) -> Result<(), DaemonError> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "primary", &mut script);
    std::io::Write::write_all(&mut std::io::stdout(), &script)
        .map_err(|e| DaemonError::Failed(format!("writing to stdout: {e}")))
}

async fn run(cmd: Cmd, open: &Connections) -> Result<(), DaemonError> {
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
        } => print!("{}", daemon::pin_twin(config.path()?, fingerprint)?),
        Cmd::PinClient {
            config,
            role,
            fingerprint,
        } => {
            let role = match role {
                RoleArg::Read => twinlog::node::api::ClientRole::Read,
                RoleArg::Write => twinlog::node::api::ClientRole::Write,
                RoleArg::Admin => twinlog::node::api::ClientRole::Admin,
            };
            print!("{}", daemon::pin_client(config.path()?, fingerprint, role)?)
        }
        Cmd::Unpin {
            config,
            fingerprint,
        } => print!("{}", daemon::unpin_client(config.path()?, fingerprint)?),
        Cmd::Pins { config } => print!("{}", daemon::primary_pins(config.path()?)?),
        Cmd::Serve { config, log_json } => {
            daemon::init_tracing(log_json);
            let cfg = config.load()?;
            let shutdown = daemon::shutdown_on_signals()?;
            let served = daemon::serve_primary(cfg, shutdown.clone()).await?;
            let served =
                daemon::auto_failover::after_primary_serve(served, config.path()?, shutdown)
                    .await?;
            daemon::failover::continue_as(&served, log_json)?;
        }
        Cmd::CheckLog { config } => {
            let cfg = config.load()?;
            let c = daemon::check_log(&cfg.data_dir.join(daemon::LOG_DIR))?;
            println!("{c}");
        }
        Cmd::Status { config, json } => {
            let cfg = config.load()?;
            let (text, status) = daemon::fetch_status::<twinlog::node::Status>(&cfg.metrics)?;
            if json {
                println!("{text}");
            } else {
                print!("{}", daemon::render_primary_status(&status));
            }
        }
        Cmd::Append {
            config,
            timeout,
            kind,
            durability,
            file,
            text,
            empty,
        } => {
            let blob = append_blob(file, text, empty)?;
            let cfg = config.load()?;
            let got = if cfg.failover.is_some() {
                // Under `[failover]`: the primary etcd names, followed
                // across a failover, the append sent once so that a
                // retry is never written twice.
                let following = daemon::load::following_admin(&cfg, timeout.options()).await?;
                let got = following
                    .append(kind, &[], &blob, durability.into())
                    .await
                    .map_err(DaemonError::request("append"));
                following.close().await;
                got?
            } else {
                let client = open.admin_with(&cfg, timeout.options()).await?;
                client
                    .append_timed(kind, &[], &blob, durability.into())
                    .await
                    .map_err(DaemonError::request("append"))?
            };
            println!(
                "appended frame {} ({} bytes), {}",
                got.seq,
                blob.len(),
                durability_said(got.durability)
            );
        }
        Cmd::Load {
            config,
            timeout,
            frames,
            blob_mib,
            verify_twin_log,
        } => {
            let cfg = config.load()?;
            let r = daemon::load::run(
                &cfg,
                frames,
                blob_mib,
                verify_twin_log.as_deref(),
                timeout.options(),
            )
            .await?;
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
        Cmd::Tail {
            config,
            timeout,
            from,
            to,
            format,
        } => {
            let client = open.admin(&config, &timeout).await?;
            export::tail(&client, from, to, format).await?;
        }
        Cmd::Repo {
            config,
            timeout,
            cmd,
        } => {
            let client = open.admin(&config, &timeout).await?;
            repo::run(&client, cmd).await?;
        }
        Cmd::Doc {
            config,
            timeout,
            cmd,
        } => {
            let client = open.admin(&config, &timeout).await?;
            repo::run_doc(&client, cmd).await?;
        }
        Cmd::Restore {
            config,
            twin,
            twin_fingerprint,
            from_archive,
            until,
            until_time,
            accept_shorter,
            abandon,
            json,
        } => {
            daemon::init_tracing(false);
            let cfg = config.load()?;
            if abandon {
                let a = daemon::abandon_restore(&cfg.data_dir)?;
                if json {
                    println!(
                        "{}",
                        serde_json::to_string(&a)
                            .map_err(|e| DaemonError::Failed(format!("the report as JSON: {e}")))?
                    );
                } else {
                    println!(
                        "abandoned the unfinished restore of {}: removed {}; the box is fresh",
                        cfg.data_dir.display(),
                        a.removed.join(", ")
                    );
                }
                return Ok(());
            }
            match (from_archive, twin, twin_fingerprint) {
                (Some(url), _, _) => {
                    let until = archive_restore::until(until, until_time.as_deref())?;
                    let how = archive_restore::How {
                        until,
                        until_time: until_time.as_deref(),
                        accept_shorter,
                        json,
                    };
                    archive_restore::run(&cfg, &url, how).await?;
                }
                (None, Some(twin), Some(fp)) => restore::run(&cfg, &twin, fp, json).await?,
                _ => {
                    return Err(DaemonError::Usage(
                        "restore needs --twin and --twin-fingerprint, or --from-archive".into(),
                    ))
                }
            }
        }
        Cmd::ArchiveKey { out, rotate } => match (out, rotate) {
            (_, Some(file)) => archive_restore::rotate_key(&file)?,
            (Some(out), None) => archive_restore::mint_key(&out)?,
            (None, None) => {
                return Err(DaemonError::Usage(
                    "archive-key needs --out FILE or --rotate FILE".into(),
                ))
            }
        },
        Cmd::ArchivePush { config, json } => {
            let cfg = config.load()?;
            daemon::archive_push(&cfg.data_dir, cfg.archive.as_ref(), json).await?;
        }
        Cmd::Rejoin {
            config,
            primary,
            primary_fingerprint,
            metrics,
            wait,
        } => {
            daemon::init_tracing(false);
            let report = daemon::failover::rejoin(
                config.path()?,
                primary,
                primary_fingerprint,
                metrics,
                std::time::Duration::from_secs(wait),
            )
            .await?;
            println!("{report}");
        }
        Cmd::Switchover {
            config,
            timeout,
            wait,
        } => {
            // The answer comes once the twin took over: give it the wait
            // on top of the usual deadline.
            let mut options = timeout.options();
            options.deadline += std::time::Duration::from_millis(wait);
            let client = open.admin_with(&config.load()?, options).await?;
            let (epoch, head, np) = client
                .switchover(std::time::Duration::from_millis(wait))
                .await
                .map_err(DaemonError::request("switchover"))?;
            println!(
                "switched over: the twin is the primary of epoch {epoch} at {} (fingerprint {}), holding every frame through {head}",
                np.addr, np.fingerprint
            );
            println!("this box follows it as its twin now");
        }
        Cmd::Verify {
            config,
            timeout,
            from,
            to,
            within,
            mib_per_s,
            json,
        } => {
            let mut options = timeout.options();
            options.deadline += within;
            let client = daemon::load::admin_client_with(&config.load()?, options).await?;
            let r = client
                .verify(from.unwrap_or(0), to.unwrap_or(0), mib_per_s.max(1))
                .await
                .map_err(DaemonError::request("verify"))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&r).map_err(|e| DaemonError::Failed(e.to_string()))?
                );
            }
            let range = format!("frames {}..={}", r.from, r.through);
            match (r.first_difference, &r.stopped) {
                (Some(seq), _) => {
                    return Err(DaemonError::Failed(format!(
                    "the twin's frame {seq} is NOT this primary's ({range}; those before it agree)"
                )))
                }
                (None, Some(why)) => {
                    return Err(DaemonError::Failed(format!(
                        "verify of {range} stopped: {why}"
                    )))
                }
                (None, None) if !json => println!(
                    "{range}: the twin's frames are this primary's ({} bytes read here, {} ms)",
                    r.bytes, r.took_ms
                ),
                (None, None) => {}
            }
        }
        Cmd::Fence {
            config,
            timeout,
            epoch,
        } => {
            let client = open.admin(&config, &timeout).await?;
            let s = client
                .fence(epoch.map_or(0, |e| e.0))
                .await
                .map_err(DaemonError::request("fence"))?;
            match s.fenced {
                Some(f) if f.held => println!(
                    "held ({}): this primary (epoch {}) acknowledges no write from now on; `primary rejoin` or `primary unfence` ends it",
                    f.by,
                    twinlog::repl::epochs::EpochName(s.epoch)
                ),
                Some(f) => println!(
                    "fenced already: epoch {} exists ({}); this primary (epoch {}) acknowledges no write",
                    twinlog::repl::epochs::EpochName(f.epoch),
                    f.by,
                    twinlog::repl::epochs::EpochName(s.epoch)
                ),
                None => println!("not fenced: the primary did not record the hold"),
            }
        }
        Cmd::Release {
            config,
            arbiter_lost: _,
            epoch_above,
        } => match daemon::held_start::release(config.path()?, epoch_above.map(|e| e.0))? {
            daemon::held_start::Released::HeldStart => println!(
                "released: the primary acknowledges without its twin's hello (if the twin was promoted meanwhile, two boxes now take writes)"
            ),
            daemon::held_start::Released::ArbiterLost { above } => println!(
                "released: the primary leads above epoch {} without the other box's history (if that box held a newer epoch, its frames past the fork are cut when it rejoins, saved under divergent/)",
                twinlog::repl::epochs::EpochName(above)
            ),
        },
        Cmd::Unfence {
            config,
            i_accept_split_brain,
        } => match daemon::failover::unfence(config.path()?, i_accept_split_brain)? {
            daemon::failover::Unfenced::Released { epoch } => println!(
                "hold lifted: this box serves epoch {} again",
                twinlog::repl::epochs::EpochName(epoch)
            ),
            daemon::failover::Unfenced::NewTerm { epoch, head } => {
                println!(
                    "fence lifted: this box is the primary of epoch {} from frame {}",
                    twinlog::repl::epochs::EpochName(epoch),
                    head + 1
                );
                println!("any other primary of an older epoch is fenced when it hears of this one");
            }
        },
        Cmd::Divergent { data, seq } => {
            let stdout = std::io::stdout();
            let text = daemon::failover::divergent(&data, seq, stdout.lock())?;
            print!("{text}");
        }
        Cmd::Retain {
            config,
            timeout,
            from,
            force,
        } => {
            let client = open.admin(&config, &timeout).await?;
            if !force {
                // The daemon refuses this too; asked first, the refusal can
                // name the flag that overrides it.
                let hold = client
                    .status()
                    .await
                    .map_err(DaemonError::request("status"))?
                    .twin_hold
                    .max(1);
                if from > hold {
                    return Err(DaemonError::Failed(format!(
                        "retaining from {from} drops frames the twin has not acknowledged (its position is {hold}); pass --force to drop them anyway (the twin then needs a snapshot)"
                    )));
                }
            }
            let first = client
                .retain_from(from, force)
                .await
                .map_err(DaemonError::request(format!("retain from {from}")))?;
            println!("the log retains from {first}");
        }
        Cmd::Store {
            config,
            timeout,
            cmd,
        } => {
            let client = open.admin(&config, &timeout).await?;
            match cmd {
                StoreCmd::Retry => {
                    let h = client
                        .store_retry()
                        .await
                        .map_err(DaemonError::request("store retry"))?;
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
                        .map_err(DaemonError::request(format!("store skip of frame {seq}")))?;
                    println!(
                        "frame {seq} skipped: the StoreSkip frame is {} ({:?}); each box records it in store/SKIPPED",
                        a.seq, a.durability
                    );
                }
            }
        }
        Cmd::Read {
            config,
            timeout,
            seq,
            out,
        } => {
            let client = open.admin(&config, &timeout).await?;
            let e = client
                .read(seq)
                .await
                .map_err(DaemonError::request(format!("frame {seq}")))?;
            match out {
                Some(path) => {
                    let len = out::write(&path, &e.blob)?;
                    println!(
                        "frame {seq} (kind {}): {len} bytes written to {}",
                        e.kind,
                        path.display()
                    );
                }
                None => std::io::Write::write_all(&mut std::io::stdout(), &e.blob)
                    .map_err(|e| DaemonError::Failed(format!("writing to stdout: {e}")))?,
            }
        }
        Cmd::Completions { shell } => completions(shell)?,
        Cmd::Man { out } => {
            std::fs::create_dir_all(&out).at("creating", &out)?;
            clap_mangen::generate_to(Cli::command(), &out).at("writing manual pages to", &out)?;
            println!(
                "wrote primary.1 and a page per subcommand to {}",
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
            eprintln!("primary: no async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ran = async move {
        let open = Connections::default();
        let ran = run(cli.cmd, &open).await;
        open.close().await;
        ran
    };
    match twinlog::daemon::runtime::block_on_workers(&runtime, ran) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("primary: {e}");
            ExitCode::from(e.exit_code().clamp(1, 255) as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command and every argument of `cmd` and below, with its path.
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
        walk(&cli, "primary", &mut |path, cmd| {
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

    #[test]
    fn history_dates_are_rfc3339_utc_to_the_second() {
        // `repo history` prints a push's time with this.
        for (ms, date) in [
            (0, "1970-01-01T00:00:00Z"),
            (1_796_015_523_999, "2026-11-30T05:12:03Z"),
            (1_709_251_199_000, "2024-02-29T23:59:59Z"),
            (951_868_800_000, "2000-03-01T00:00:00Z"),
        ] {
            assert_eq!(daemon::utc(ms), date, "{ms} ms");
        }
    }

    #[test]
    fn config_is_accepted_after_nested_commands() {
        let cli = Cli::try_parse_from(["primary", "repo", "refs", "acme/widgets", "-c", "p.toml"])
            .expect("parse");
        let Cmd::Repo { config, .. } = cli.cmd else {
            panic!("not repo");
        };
        assert_eq!(config.path().ok(), Some(std::path::Path::new("p.toml")));
    }
}
