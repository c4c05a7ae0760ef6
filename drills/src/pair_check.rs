//! One state of the pair power-cut drill, carried out on the host with the
//! real binaries: the primary restarted on its disk as a power cut left
//! it, new frames appended at its head + 1 that differ from the twin's at
//! those sequences (but the last, which repeats the twin's frame exactly:
//! one crc then proves nothing), the twin reconnected with what it held at
//! the cut, and both logs read once they converged and stopped.
//!
//! The twin's state at the cut is not guessed from the primary's disk: it
//! is the twin's final log (the guest's run, byte-identical to the
//! primary's final log at every sequence, same history and epochs) cut
//! after `t`, as many frames as the primary can have shipped before its
//! own fsync.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::Log;
use twinlog::node::client::ClientOptions;
use twinlog::node::{divergent, Client, Durability, Status, TwinStatus};

use crate::daemons::{free_tcp, free_udp, Proc};
use crate::marker::{Ack, Marker};
use crate::pair::{frames, letter_of, Letter, Stored, KIND};
use crate::{Context, DrillError, Result, Rng};

/// What every state shares.
pub struct Run {
    pub primary_bin: PathBuf,
    pub twin_bin: PathBuf,
    /// The twin's data directory as the guest's run left it.
    pub twin_final: PathBuf,
    /// The primary's final log: every frame the run staged.
    pub final_frames: BTreeMap<u64, Stored>,
    pub alphabet: Vec<Letter>,
    pub segment: u64,
    /// Scratch room for one state.
    pub work: PathBuf,
}

/// What one state came to.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// The primary's head as the power cut left it.
    pub head: u64,
    /// The twin's head at the cut.
    pub twin_head: u64,
    /// Markers of the state: answered `twin`, answered `local`.
    pub acked_twin: u64,
    pub acked_local: u64,
    /// Frames appended after the restart, all answered `twin`.
    pub appended: u64,
    /// Frames the twin saved to `divergent/` and cut.
    pub cut: u64,
    /// From the primary's start to both daemons stopped.
    pub millis: u64,
}

/// A check of one state: `Ok(Err(why))` when the invariant broke, `Err`
/// when the drill itself could not run it.
pub type Verdict = Result<std::result::Result<Checked, String>>;

/// Check the state whose primary data directory is mounted at `pdir`
/// (changed: the daemon runs on it), whose markers are `markers`; `next`
/// is the primary's head in the state at the next flush.
pub async fn check_state(
    run: &Run,
    pdir: &Path,
    markers: &[Marker],
    next: u64,
    rng: &mut Rng,
) -> Verdict {
    let mut c = Checked::default();
    let plog = pdir.join(daemon::LOG_DIR);
    let (history, recovered) = frames(&plog, run.segment)?;
    c.head = recovered.keys().next_back().copied().unwrap_or(0);
    // Acknowledged, `local` or `twin`: durable on the primary.
    let acks: Vec<(u64, u32, bool)> = markers
        .iter()
        .filter_map(|m| match m.ack {
            Ack::Durable { seq, crc, twin, .. } => Some((seq, crc, twin)),
            _ => None,
        })
        .collect();
    c.acked_twin = acks.iter().filter(|a| a.2).count() as u64;
    c.acked_local = acks.len() as u64 - c.acked_twin;
    for &(seq, crc, twin) in &acks {
        if recovered.get(&seq).is_none_or(|f| f.crc != crc) {
            return Ok(Err(format!(
                "LOST on the primary: frame {seq} (crc {crc:08x}) was answered {}, the recovered log's head is {}",
                if twin { "twin" } else { "local" },
                c.head
            )));
        }
    }
    for (seq, f) in &recovered {
        if run.final_frames.get(seq) != Some(f) {
            return Ok(Err(format!(
                "the recovered primary holds a frame at {seq} the run never wrote there"
            )));
        }
    }
    // The twin at the cut: at least every frame it acknowledged, and as
    // many as the primary had staged by the next flush.
    let final_head = run.final_frames.keys().next_back().copied().unwrap_or(0);
    let twin_acked = acks.iter().filter(|a| a.2).map(|a| a.0).max().unwrap_or(0);
    let t = next.max(twin_acked).max(c.head);
    if t > final_head {
        return Err(DrillError(format!(
            "the twin would hold {t} frames, the run wrote {final_head}"
        )));
    }
    c.twin_head = t;
    let tdir = run.work.join("twin");
    twin_at_cut(run, &tdir, t, &history)?;

    // The primary, restarted on its disk.
    let (plisten, pmetrics, tmetrics) = (free_udp()?, free_tcp()?, free_tcp()?);
    let mut pcfg = PrimaryConfig::load(&pdir.join(daemon::PRIMARY_CONFIG))
        .ctx(|| "the primary's configuration".into())?;
    pcfg.data_dir = pdir.to_owned();
    pcfg.listen = plisten.into();
    pcfg.metrics = pmetrics.into();
    let pcfg_path = run.work.join("primary.toml");
    std::fs::write(&pcfg_path, pcfg.render()).ctx(|| "write primary.toml".into())?;
    let mut tcfg = TwinConfig::load(&tdir.join(daemon::TWIN_CONFIG))
        .ctx(|| "the twin's configuration".into())?;
    tcfg.data_dir = tdir.clone();
    tcfg.primary = plisten.into();
    tcfg.metrics = tmetrics.into();
    let tcfg_path = run.work.join("twin.toml");
    std::fs::write(&tcfg_path, tcfg.render()).ctx(|| "write twin.toml".into())?;
    let started = Instant::now();
    let mut primary = Proc::serve(
        &run.primary_bin,
        &pcfg_path,
        &run.work.join("primary.stderr"),
    )?;
    let st: Status = match until("the restarted primary serves", || {
        daemon::fetch_status::<Status>(pmetrics).ok().map(|s| s.1)
    })
    .await
    {
        Ok(st) => st,
        Err(e) => {
            return Ok(Err(format!(
                "{e} (see {})",
                run.work.join("primary.stderr").display()
            )))
        }
    };
    if st.head != c.head {
        return Ok(Err(format!(
            "the restarted primary's head is {}, its log's is {}",
            st.head, c.head
        )));
    }
    let admin =
        daemon::load_identity(&pdir.join(daemon::ADMIN_DIR)).ctx(|| "the admin identity".into())?;
    let me = daemon::load_identity(pdir).ctx(|| "the primary's identity".into())?;
    let opts = ClientOptions {
        deadline: Duration::from_secs(30),
    };
    let client = std::sync::Arc::new(
        Client::connect_with(&admin, me.fingerprint(), plisten, opts)
            .await
            .ctx(|| "connect to the restarted primary".into())?,
    );
    // Frames that differ from the twin's at its sequences, but the last,
    // which repeats its frame there exactly; two more past it. Each is
    // sent once the one before has its sequence, so each lands where it is
    // meant to.
    let mut plan: Vec<(u64, Letter)> = Vec::new();
    for seq in c.head + 1..=t + 2 {
        let letter = match run.final_frames.get(&seq) {
            Some(theirs) if seq <= t => {
                let Some(same) = letter_of(&run.alphabet, theirs.crc).filter(|l| theirs.is(l))
                else {
                    return Err(DrillError(format!("frame {seq} of the run is no letter")));
                };
                if seq == t {
                    same.clone()
                } else {
                    let others: Vec<&Letter> =
                        run.alphabet.iter().filter(|l| l.crc != same.crc).collect();
                    others[rng.below(others.len() as u64) as usize].clone()
                }
            }
            _ => run.alphabet[rng.below(run.alphabet.len() as u64) as usize].clone(),
        };
        plan.push((seq, letter));
    }
    let mut answers = Vec::new();
    for (seq, letter) in &plan {
        let (client, letter) = (client.clone(), letter.clone());
        answers.push(tokio::spawn(async move {
            client
                .append(KIND, &letter.meta, &letter.blob, Durability::Twin)
                .await
        }));
        let seq = *seq;
        until("an append reaches the primary's log", || {
            daemon::fetch_status::<Status>(pmetrics)
                .ok()
                .filter(|s| s.1.head >= seq)
        })
        .await?;
    }
    let mut twin = Proc::serve(&run.twin_bin, &tcfg_path, &run.work.join("twin.stderr"))?;
    let mut answered = Vec::new();
    for a in answers {
        answered.push(a.await.ctx(|| "an append task".into())?);
    }
    let head = daemon::fetch_status::<Status>(pmetrics)
        .ctx(|| "the primary's status".into())?
        .1
        .head;
    let converged = until("the twin holds the primary's head", || {
        daemon::fetch_status::<TwinStatus>(tmetrics)
            .ok()
            .filter(|s| s.1.connected && s.1.head >= head)
    })
    .await;
    drop(client);
    primary.stop()?;
    twin.stop()?;
    c.millis = started.elapsed().as_millis() as u64;
    if let Err(e) = converged {
        return Ok(Err(format!(
            "{e} (see {})",
            run.work.join("twin.stderr").display()
        )));
    }
    c.appended = plan.len() as u64;
    for ((seq, _), got) in plan.iter().zip(&answered) {
        match got {
            Ok((s, Durability::Twin)) if s == seq => {}
            other => {
                return Ok(Err(format!(
                    "the append meant for {seq} was answered {other:?}"
                )))
            }
        }
    }
    let (_, pframes) = frames(&plog, run.segment)?;
    let (_, tframes) = frames(&tdir.join(daemon::LOG_DIR), run.segment)?;
    // (1) No twin-acknowledged frame is lost: neither the run's nor the
    // restarted primary's.
    let wanted = acks
        .iter()
        .filter(|a| a.2)
        .map(|&(seq, crc, _)| (seq, crc))
        .chain(plan.iter().map(|(seq, l)| (*seq, l.crc)));
    for (seq, crc) in wanted {
        let Some(letter) = letter_of(&run.alphabet, crc) else {
            return Err(DrillError(format!("crc {crc:08x} names no letter")));
        };
        for (side, fs) in [("twin", &tframes), ("primary", &pframes)] {
            if !fs.get(&seq).is_some_and(|f| f.is(letter)) {
                return Ok(Err(format!(
                    "LOST: frame {seq} answered twin (crc {crc:08x}); the {side} holds {}",
                    fs.get(&seq)
                        .map_or("nothing".to_owned(), |f| format!("crc {:08x}", f.crc))
                )));
            }
        }
    }
    // (2) The logs agree frame by frame up to the common head.
    let common = pframes.len().min(tframes.len()) as u64;
    if let Some(seq) = (1..=common).find(|s| pframes.get(s) != tframes.get(s)) {
        return Ok(Err(format!(
            "the logs DIFFER at {seq}: the primary holds crc {:08x}, the twin crc {:08x}",
            pframes.get(&seq).map_or(0, |f| f.crc),
            tframes.get(&seq).map_or(0, |f| f.crc)
        )));
    }
    if pframes.len() != tframes.len() {
        return Ok(Err(format!(
            "the primary holds {} frames, the twin {}",
            pframes.len(),
            tframes.len()
        )));
    }
    // What the twin cut is saved, exactly.
    match saved(&tdir)? {
        None if t == c.head => {}
        None => {
            return Ok(Err(format!(
                "the twin held {}..={t} past the primary's head and saved nothing",
                c.head + 1
            )))
        }
        Some((fork, got)) => {
            let want: BTreeMap<u64, Stored> = run
                .final_frames
                .range(c.head + 1..=t)
                .map(|(s, f)| (*s, f.clone()))
                .collect();
            if fork != c.head || got != want {
                return Ok(Err(format!(
                    "the twin saved {} frames after {fork}; its {} frames {}..={t} were due",
                    got.len(),
                    want.len(),
                    c.head + 1
                )));
            }
            c.cut = got.len() as u64;
        }
    }
    Ok(Ok(c))
}

/// Poll `f` every 5 ms for up to 30 s.
async fn until<T>(what: &str, f: impl FnMut() -> Option<T>) -> Result<T> {
    crate::daemons::wait_for(Duration::from_secs(30), Duration::from_millis(5), f)
        .await
        .ok_or_else(|| DrillError(format!("{what}: not within 30 s")))
}

/// The twin's data directory at the cut, in `dir`: its final one, the log
/// cut after `t`, without its store (rebuilt from the log at the start,
/// as the store of a twin that held only those frames would be).
fn twin_at_cut(run: &Run, dir: &Path, t: u64, history: &[u8; 16]) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).ctx(|| format!("clear {}", dir.display()))?;
    }
    copy_dir(&run.twin_final, dir)?;
    let store = dir.join(daemon::STORE_DIR);
    if store.exists() {
        std::fs::remove_dir_all(&store).ctx(|| format!("remove {}", store.display()))?;
    }
    let log = Log::open_with(dir.join(daemon::LOG_DIR), run.segment)
        .ctx(|| "open the twin's log".into())?;
    // A primary that had not made its new log durable had served nothing:
    // then the twin holds no frame, and takes the history it is given.
    if t > 0 && log.history().0 != *history {
        return Err(DrillError(format!(
            "the twin would hold {t} frames of another history than the primary's"
        )));
    }
    if log.head_seq() > t {
        log.truncate_after(t)
            .ctx(|| format!("cut the twin's log after {t}"))?;
    }
    Ok(())
}

/// The frames the twin saved before it cut them, and the fork it named;
/// None when it saved nothing.
fn saved(dir: &Path) -> Result<Option<(u64, BTreeMap<u64, Stored>)>> {
    let tails = divergent::list(dir).ctx(|| "list the twin's saved tails".into())?;
    let Some(tail) = tails.first() else {
        return Ok(None);
    };
    if tails.len() > 1 {
        return Err(DrillError(format!("the twin saved {} tails", tails.len())));
    }
    let mut got = BTreeMap::new();
    divergent::read(
        &dir.join(divergent::DIVERGENT_DIR).join(&tail.file),
        |_| true,
        |f, meta, blob| {
            got.insert(
                f.seq,
                Stored {
                    kind: f.kind,
                    meta: meta.to_vec(),
                    blob: blob.to_vec(),
                    crc: f.payload_crc,
                },
            );
            Ok(())
        },
    )
    .ctx(|| "read the twin's saved tail".into())?;
    Ok(Some((tail.fork, got)))
}

/// Copy a directory tree (files and directories only).
pub fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).ctx(|| format!("create {}", to.display()))?;
    for e in std::fs::read_dir(from).ctx(|| format!("list {}", from.display()))? {
        let e = e.ctx(|| format!("list {}", from.display()))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let kind = e.file_type().ctx(|| format!("stat {}", src.display()))?;
        if kind.is_dir() {
            copy_dir(&src, &dst)?;
        } else if kind.is_file() {
            std::fs::copy(&src, &dst).ctx(|| format!("copy {}", src.display()))?;
        }
    }
    Ok(())
}
