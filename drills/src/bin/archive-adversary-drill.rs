//! The archive drill's adversary phase: the bucket is attacked through
//! S3 directly, one attack at a time, each against a pair of its own (the
//! real binaries, `[archive]` on both boxes, the twin uploading to a
//! one-node Garage under a prefix of the attack's, encrypted and zstd'ed,
//! with small segments and a small `[retention] max_bytes` on both), while
//! writers append with `twin` durability and keep every acknowledged
//! frame (`drills::archive_adversary` names the attacks).
//!
//! Each attack:
//!
//! 1. the load runs until both boxes dropped frames only the archive
//!    keeps; the writers pause, the twin archives everything sealed, and
//!    both boxes are back under their cap;
//! 2. the twin (the uploader) is frozen (SIGSTOP) and the bucket is
//!    attacked; a restore to the end is run at once, nothing repaired yet
//!    (most attacks): it must be refused by name, or give every frame
//!    byte for byte as far as the archive had reached;
//! 3. the twin is thawed and the writers write past both caps again, so
//!    that retention wants to drop; once the twin archived all it sealed
//!    and each box either holds its retention or is back under its cap,
//!    both boxes are read back (the primary through its tail, the twin's
//!    log without its lock), a fresh box is restored to the end of the
//!    archive, and frames below the primary's floor are read through it
//!    (tiered reads from the archive);
//! 4. the rule: every acknowledged frame a box held when the bucket was
//!    attacked is on a box or in the restore, byte for byte; a frame only
//!    the bucket held may be in a restore refused by name instead (the
//!    attack took it); a restore that succeeds, and a tiered read that
//!    answers, give the acknowledged bytes; refusals name the object or
//!    the frames (`LOST`, `DIFFER`, `BROKEN` otherwise).
//!
//! `--broken CONTROL` names a negative control: the daemons and the
//! restore built with `drill-sabotage` and run with
//! `TWINLOG_DRILL_SABOTAGE=CONTROL`; the attacks it must break run (or
//! those of `--attacks`), and the drill exits 1 only when every one
//! broke (2 when one held: the checker missed the sabotage).
//!
//! The attacks run a few at once (`--parallel`), each with its pair and its
//! prefix. Every wait is on the daemons' `/status`, the writers' count or
//! the bucket, polled.
//!
//! `archive-adversary-drill --primary-bin P --twin-bin T --work DIR
//! [--frames 1200] [--seed S] [--segment-kib 128] [--cap-kib 512]
//! [--attacks a,b] [--parallel 4]
//! [--broken trust-bucket|accept-unsealed|ignore-head]`

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::garage::Garage;
use twinlog::archive::bucket::Bucket;
use twinlog::archive::codec::{ArchiveKey, Codec};
use twinlog::archive::fetch::{open_object, Pieces};
use twinlog::archive::names::SegmentName;
use twinlog::archive::object::{Content, SegmentInfo};
use twinlog::archive::walk::FrameWalk;
use twinlog::log::format::{FrameHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use twinlog::node::{Client, Status, TwinStatus};

use drills::archive::{check_restored, runs, Acked};
use drills::archive_adversary::{
    self as adv, bucket_only, judge, on_boxes, Attack, Look, Restore, ATTACKS, CONTROLS,
};
use drills::archive_pair::{
    lock, repeats, run_restore, twin_archive, wait_on, writer, Archiving, Load, RestoreRun,
    Secrets, Shape,
};
use drills::daemons::{connect, primary_status_now, read_log, tenths, Bins, PairOpts, Proc};
use drills::{Args, Context, DrillError, Result, Rng};

const WRITERS: u64 = 4;
/// How long the pair, Garage or a state may take before the drill gives up.
const WAIT: Duration = Duration::from_secs(90);
/// Frames read through the primary below its floor, after an attack.
const TIERED_READS: usize = 6;

/// What every attack shares.
struct Cx {
    bins: Bins,
    work: PathBuf,
    endpoint: String,
    secrets: Secrets,
    key: ArchiveKey,
    segment: u64,
    cap: u64,
    frames: u64,
    seed: u64,
    broken: Option<String>,
}

/// What one attack came to.
struct Ran {
    attack: Attack,
    /// Broken rules (`LOST`, `DIFFER`, `BROKEN` lines).
    lines: Vec<String>,
    /// What happened, for the reader.
    notes: Vec<String>,
    /// A process of the control said its sabotage.
    sabotage_said: bool,
    json: serde_json::Value,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    drills::verdict("archive-adversary", run().await)
}

async fn run() -> Result<bool> {
    let args = Args::parse(&[])?;
    let bins = Bins {
        primary: args.path("primary-bin")?,
        twin: args.path("twin-bin")?,
    };
    let work = args.path("work")?;
    let broken = args.0.get("broken").cloned();
    if let Some(b) = &broken {
        if !CONTROLS.contains(&b.as_str()) {
            return Err(DrillError(format!(
                "--broken {b}: one of {}",
                CONTROLS.join(", ")
            )));
        }
        if std::env::var("TWINLOG_DRILL_SABOTAGE").as_deref() != Ok(b.as_str()) {
            return Err(DrillError(format!(
                "--broken {b} needs TWINLOG_DRILL_SABOTAGE={b} in the environment (drills/run sets it)"
            )));
        }
    }
    let default = match &broken {
        Some(b) => adv::broken_by(b),
        None => ATTACKS.to_vec(),
    };
    let attacks = adv::chosen(args.0.get("attacks").map(String::as_str), default)?;
    let parallel = args.num("parallel", 4)? as usize;
    if work.exists() {
        std::fs::remove_dir_all(&work).ctx(|| format!("clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work).ctx(|| format!("mkdir {}", work.display()))?;
    let work = std::path::absolute(&work).ctx(|| format!("{}", work.display()))?;
    let started = Instant::now();
    let g = tokio::task::block_in_place(|| Garage::start(&work.join("garage"), 1))
        .ctx(|| "start Garage".into())?;
    let secrets = Secrets::make(&work.join("secrets"), &bins.primary)?;
    let key = ArchiveKey::load(&secrets.key_file).ctx(|| "the archive key".into())?;
    let cx = Cx {
        bins,
        endpoint: g.endpoint(0),
        work,
        secrets,
        key,
        segment: args.num("segment-kib", 128)? << 10,
        cap: args.num("cap-kib", 512)? << 10,
        frames: args.num("frames", 1200)?.max(300),
        seed: args.num("seed", 1)?,
        broken,
    };
    // Each attack has its pair and its prefix: a few at once, as most of
    // an attack is waiting on the boxes' listings of the bucket.
    let cx = Arc::new(cx);
    let slots = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut tasks = Vec::new();
    for (i, a) in attacks.iter().copied().enumerate() {
        let (cx, slots) = (cx.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await;
            eprintln!(
                "archive-adversary: [{:.1} s] {}: {}",
                started.elapsed().as_secs_f64(),
                a.name,
                a.what
            );
            let r = run_attack(&cx, a, i as u64).await;
            match &r {
                Ok(r) => {
                    let notes: Vec<String> = r
                        .notes
                        .iter()
                        .map(|n| format!("archive-adversary:   {}: {n}", a.name))
                        .collect();
                    eprintln!("{}", notes.join("\n"));
                }
                Err(e) => eprintln!("archive-adversary:   {}: could not run: {e}", a.name),
            }
            r
        }));
    }
    let mut ran = Vec::new();
    for t in tasks {
        ran.push(
            t.await
                .map_err(|e| DrillError(format!("an attack's task failed: {e}")))??,
        );
    }
    drop(g);

    for r in &ran {
        for l in &r.lines {
            println!("{l}");
        }
    }
    for r in &ran {
        println!(
            "attack {}: {}",
            r.attack.name,
            if r.lines.is_empty() {
                "held".to_owned()
            } else {
                format!("BROKEN ({} rules)", r.lines.len())
            }
        );
    }
    let held = ran.iter().all(|r| r.lines.is_empty());
    let json = serde_json::json!({
        "drill": "archive-adversary",
        "seed": cx.seed,
        "broken": cx.broken,
        "frames": cx.frames,
        "segment_kib": cx.segment >> 10,
        "cap_kib": cx.cap >> 10,
        "attacks": ran.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
        "held": held,
        "seconds": tenths(started.elapsed().as_secs_f64()),
    });
    println!(
        "invariant: after each attack on the bucket, every acknowledged frame a box held is on a box or in an exact restore, a frame only the bucket held is in an exact restore or one refused by name, and nothing read from the bucket is served unless it is what was acknowledged: {}",
        if held { "held" } else { "BROKEN" }
    );
    println!("{json}");
    let Some(control) = &cx.broken else {
        return Ok(held);
    };
    let missed: Vec<&str> = ran
        .iter()
        .filter(|r| r.lines.is_empty())
        .map(|r| r.attack.name)
        .collect();
    if missed.is_empty() {
        return Ok(false);
    }
    if !ran.iter().any(|r| r.sabotage_said) {
        return Err(DrillError(format!(
            "no process of the control {control} said \"drill sabotage\": built without drill-sabotage?"
        )));
    }
    Err(DrillError(format!(
        "the control {control} did not break {}: the checker missed its sabotage",
        missed.join(", ")
    )))
}

/// SIGSTOP a daemon; SIGCONT when dropped.
struct Frozen(i32);

impl Frozen {
    fn new(p: &Proc) -> Result<Frozen> {
        let pid = p
            .pid()
            .ok_or_else(|| DrillError("the twin does not run".into()))? as i32;
        // SAFETY: kill(2) on a child of this process.
        if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
            return Err(DrillError(format!(
                "SIGSTOP {pid}: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Frozen(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child of this process.
        unsafe {
            libc::kill(self.0, libc::SIGCONT);
        }
    }
}

/// Both boxes as a steady state shows them: the writers' frames on both,
/// everything sealed archived, and each box back under its cap or holding
/// its retention (with `dropped`: both dropped frames too).
async fn steady(
    (cap, twin_cap): (u64, u64),
    pm: SocketAddr,
    tm: SocketAddr,
    load: &Load,
    dropped: bool,
) -> Result<(Status, TwinStatus)> {
    let head = lock(&load.acked).keys().next_back().copied().unwrap_or(0);
    wait_on("steady", WAIT, || async {
        let p = primary_status_now(pm)
            .await
            .ok_or("the primary does not answer")?;
        let (t, a) = twin_archive(tm).await?;
        let pa = p.archive.clone().unwrap_or_default();
        // Under its cap, retention wants nothing; holding, it drops nothing.
        let p_done = p.log_bytes <= cap || pa.retention_held;
        let t_done = t.retention.log_bytes <= twin_cap || a.retention_held;
        if p.head >= head
            && t.head == p.head
            && a.lag_segments == 0
            && p_done
            && t_done
            && (!dropped || (p.first > 1 && t.first > 1))
        {
            Ok((p, t))
        } else {
            Err(format!(
                "primary head {} first {} ({} bytes, held {}), twin head {} first {} ({} bytes, held {}), lag {} segments, error {:?}",
                p.head,
                p.first,
                p.log_bytes,
                pa.retention_held,
                t.head,
                t.first,
                t.retention.log_bytes,
                a.retention_held,
                a.lag_segments,
                a.last_error
            ))
        }
    })
    .await
}

/// Delete the head record and wait until each box listed the bucket
/// since (a box reads the head record first when it lists): the uploader
/// writes it again, in a generation above (nothing else is archived
/// meanwhile), and then the other box shows that generation, which it
/// learns only from a listing.
async fn listed_since(
    bucket: &Bucket,
    head_key: &str,
    pm: SocketAddr,
    tm: SocketAddr,
) -> Result<()> {
    let (_, a) = twin_archive(tm).await.map_err(DrillError)?;
    let before = a.head_generation;
    bucket
        .delete(head_key)
        .await
        .ctx(|| format!("delete {head_key}"))?;
    let again = wait_on(
        "the uploader writing the head record again",
        WAIT,
        || async {
            let (_, a) = twin_archive(tm).await?;
            if a.head_generation > before {
                Ok(a.head_generation)
            } else {
                Err(format!(
                    "generation {}, head note {:?}",
                    a.head_generation, a.head_note
                ))
            }
        },
    )
    .await?;
    wait_on("the primary listing the bucket", WAIT, || async {
        let p = primary_status_now(pm)
            .await
            .ok_or("the primary does not answer")?;
        let pa = p.archive.unwrap_or_default();
        if pa.head_generation >= again {
            Ok(())
        } else {
            Err(format!(
                "the primary knows head generation {}, the twin wrote {again}",
                pa.head_generation
            ))
        }
    })
    .await
}

/// What an archived segment's footer says.
async fn footer(cx: &Cx, bucket: &Bucket, name: &SegmentName, size: u64) -> Result<SegmentInfo> {
    let key = bucket.segment_key(name);
    let opened = open_object(bucket, &key, size, Some(&cx.key))
        .await
        .ctx(|| format!("open {key}"))?;
    match &opened.reader.footer().content {
        Content::Segment(info) => Ok(info.clone()),
        _ => Err(DrillError(format!("{key}: not a segment"))),
    }
}

/// The bucket as it was at some point: its head record's bytes, and the
/// objects it held.
struct Copy {
    head_key: String,
    head: Vec<u8>,
    names: BTreeSet<SegmentName>,
}

async fn copy_of(cx: &Cx, bucket: &Bucket) -> Result<Copy> {
    // The head first: it names only objects written before it.
    let listed = bucket.segments().await.ctx(|| "list".into())?;
    let (newest, size) = *listed
        .last()
        .ok_or_else(|| DrillError("nothing archived yet".into()))?;
    let info = footer(cx, bucket, &newest, size).await?;
    let head_key = bucket.head_key(&info.history);
    let head = bucket
        .get_small(&head_key, 1 << 20)
        .await
        .ctx(|| format!("get {head_key}"))?
        .ok_or_else(|| DrillError(format!("{head_key}: no head record yet")))?
        .to_vec();
    let names = bucket
        .segments()
        .await
        .ctx(|| "list".into())?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    Ok(Copy {
        head_key,
        head,
        names,
    })
}

/// What the attack did: its words, and the frames of the objects it took.
struct Struck {
    did: String,
    ranges: Vec<(u64, u64)>,
}

/// Make the attack on the bucket.
async fn strike(
    cx: &Cx,
    attack: Attack,
    bucket: &Bucket,
    listed: &[(SegmentName, u64)],
    held_from: u64,
    twin_first: u64,
    earlier: Option<&Copy>,
) -> Result<Struck> {
    let key_of = |n: &SegmentName| bucket.segment_key(n);
    let delete = |n: SegmentName| async move {
        bucket
            .delete(&bucket.segment_key(&n))
            .await
            .ctx(|| format!("delete {}", bucket.segment_key(&n)))
    };
    let first_on_boxes = || {
        on_boxes(listed, held_from)
            .first()
            .copied()
            .ok_or_else(|| DrillError("no archived object holds a frame a box holds".into()))
    };
    let range = |n: &SegmentName| (n.first, n.last);
    match attack.name {
        "deleted" => {
            let mut doomed = on_boxes(listed, held_from);
            doomed.extend(bucket_only(listed, held_from).last().copied());
            for (n, _) in &doomed {
                delete(*n).await?;
            }
            Ok(Struck {
                did: format!("deleted {} objects", doomed.len()),
                ranges: doomed.iter().map(|(n, _)| range(n)).collect(),
            })
        }
        "moved" => {
            let (x, size) = first_on_boxes()?;
            let bytes = adv::get(bucket, &key_of(&x), size).await?;
            let to = SegmentName {
                first: x.first + 1,
                last: x.last + 1,
                ..x
            };
            adv::put(bucket, &key_of(&to), bytes).await?;
            delete(x).await?;
            Ok(Struck {
                did: format!("moved {} to {}", key_of(&x), key_of(&to)),
                ranges: vec![range(&x)],
            })
        }
        "renamed" => {
            let (x, size) = first_on_boxes()?;
            let bytes = adv::get(bucket, &key_of(&x), size).await?;
            let to = SegmentName {
                generation: x.generation + 1,
                ..x
            };
            adv::put(bucket, &key_of(&to), bytes).await?;
            delete(x).await?;
            Ok(Struck {
                did: format!("renamed {} to {}", key_of(&x), key_of(&to)),
                ranges: vec![range(&x)],
            })
        }
        "replaced-sealed" | "replaced-unsealed" | "adopted" => {
            let (x, size) = if attack.name == "adopted" {
                *on_boxes(listed, held_from)
                    .iter()
                    .find(|(n, _)| n.last < twin_first)
                    .ok_or_else(|| {
                        DrillError("no archived object holds frames only the primary holds".into())
                    })?
            } else {
                first_on_boxes()?
            };
            let info = footer(cx, bucket, &x, size).await?;
            let (epochs, other) = adv::other_lineage(&info.history, x.first, x.last);
            let sealed = attack.name != "replaced-unsealed";
            let codec = Codec {
                zstd_level: Some(3),
                key: sealed.then(|| cx.key.clone()),
            };
            let bytes = adv::forge(
                &codec,
                &key_of(&other),
                info.history,
                &epochs,
                x.first,
                x.last,
            )?;
            adv::put(bucket, &key_of(&x), bytes).await?;
            Ok(Struck {
                did: format!(
                    "replaced {} by another lineage's {} object of frames {} to {}",
                    key_of(&x),
                    if sealed { "sealed" } else { "unsealed" },
                    x.first,
                    x.last
                ),
                ranges: vec![range(&x)],
            })
        }
        "truncated" => {
            // The newest objects, of frames the twin still holds (so it can
            // archive them again): up to two.
            let newest: Vec<(SegmentName, u64)> = listed
                .iter()
                .rev()
                .filter(|(n, _)| n.first >= twin_first)
                .take(2)
                .copied()
                .collect();
            if newest.is_empty() {
                return Err(DrillError(
                    "no archived object holds only frames the twin holds".into(),
                ));
            }
            for (n, _) in &newest {
                delete(*n).await?;
            }
            Ok(Struck {
                did: format!("deleted the newest {} objects", newest.len()),
                ranges: newest.iter().map(|(n, _)| range(n)).collect(),
            })
        }
        "rolled-back" => {
            let e = earlier.ok_or_else(|| DrillError("no earlier copy of the bucket".into()))?;
            adv::put(bucket, &e.head_key, e.head.clone()).await?;
            let since: Vec<SegmentName> = listed
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| !e.names.contains(n))
                .collect();
            for n in &since {
                delete(*n).await?;
            }
            Ok(Struck {
                did: format!(
                    "put back the head record as it was at {} objects and deleted the {} objects since",
                    e.names.len(),
                    since.len()
                ),
                ranges: since.iter().map(range).collect(),
            })
        }
        "downgraded" => {
            let (x, size) = *bucket_only(listed, held_from)
                .last()
                .ok_or_else(|| DrillError("no object holds frames only the bucket holds".into()))?;
            let info = footer(cx, bucket, &x, size).await?;
            let codec = Codec {
                zstd_level: Some(3),
                key: None,
            };
            let bytes = adv::forge(
                &codec,
                &key_of(&x),
                info.history,
                &info.epochs,
                x.first,
                x.last,
            )?;
            adv::put(bucket, &key_of(&x), bytes).await?;
            Ok(Struck {
                did: format!(
                    "replaced {} by unsealed bytes holding other frames {} to {}",
                    key_of(&x),
                    x.first,
                    x.last
                ),
                ranges: vec![range(&x)],
            })
        }
        other => Err(DrillError(format!("no attack {other}"))),
    }
}

/// A restore to the end (or `until`) into `dir`, checked against `acked`.
fn restore(
    cx: &Cx,
    section: &twinlog::daemon::config::ArchiveSection,
    dir: &Path,
    until: Option<u64>,
    acked: &Acked,
) -> Result<(Restore, RestoreRun)> {
    let run = tokio::task::block_in_place(|| {
        run_restore(&cx.bins.primary, dir, section, cx.segment, until)
    })?;
    if !run.ok {
        return Ok((Restore::Refused(run.error.clone()), run));
    }
    let head = run.report["head"]
        .as_u64()
        .ok_or_else(|| DrillError(format!("the restore's report has no head: {}", run.report)))?;
    let r = check_restored(&run.log_dir, cx.segment, head, acked)?;
    Ok((Restore::Done(r), run))
}

fn restore_brief(r: &Restore) -> String {
    match r {
        Restore::Done(r) => format!(
            "restored frames {} to {} ({} acknowledged checked, {} lost, {} differ)",
            r.first,
            r.head,
            r.checked,
            r.lost.len(),
            r.differ.len()
        ),
        Restore::Refused(e) => format!("refused: {e}"),
    }
}

/// The acknowledged frames each box holds now, read back equal: the
/// primary's through its tail, the twin's from its log without its lock.
/// Frames a box holds that are not the acknowledged ones are `DIFFER`.
async fn read_boxes(
    reader: &Client,
    p: &Status,
    tlog: &Path,
    t_first: u64,
    acked: &Acked,
    lines: &mut Vec<String>,
) -> Result<(BTreeSet<u64>, u64, u64)> {
    let mut on_box = BTreeSet::new();
    let (mut from_primary, mut from_twin) = (0, 0);
    let mut check = |who: &str, seq: u64, kind: u16, meta: &[u8], blob: &[u8]| {
        if let Some(sent) = acked.get(&seq) {
            if sent.kind == kind && sent.meta == meta && sent.blob == blob {
                on_box.insert(seq);
            } else {
                lines.push(format!(
                    "DIFFER frame {seq}: the {who} holds other bytes than were acknowledged"
                ));
            }
        }
    };
    if p.head >= p.first {
        let mut tail = reader
            .tail(p.first)
            .await
            .ctx(|| format!("tail the primary from {}", p.first))?;
        loop {
            let e = tokio::time::timeout(WAIT, tail.next())
                .await
                .map_err(|_| DrillError("the primary's tail stalled".into()))?
                .ctx(|| "the primary's tail".into())?
                .ok_or_else(|| DrillError("the primary ended its tail".into()))?;
            check("primary", e.seq, e.kind, &e.meta, &e.blob);
            from_primary += 1;
            if e.seq >= p.head {
                break;
            }
        }
    }
    let frames = tokio::task::block_in_place(|| read_log(tlog, t_first, usize::MAX))?;
    for (seq, f) in frames {
        let blob = f.blob.unwrap_or_default();
        check("twin", seq, f.kind, &f.meta, &blob);
        from_twin += 1;
    }
    Ok((on_box, from_primary, from_twin))
}

/// Frames below the primary's floor read through it (from the archive):
/// one that answers must be the acknowledged one. (served, refused, first
/// refusal).
async fn tiered_reads(
    reader: &Client,
    below: u64,
    ranges: &[(u64, u64)],
    acked: &Acked,
    rng: &mut Rng,
    lines: &mut Vec<String>,
) -> (u64, u64, Option<String>) {
    let mut seqs: BTreeSet<u64> = BTreeSet::new();
    for &(a, b) in ranges.iter().take(TIERED_READS / 2) {
        let b = b.min(below.saturating_sub(1));
        if a <= b {
            seqs.insert(a);
            seqs.insert(a + (b - a) / 2);
        }
    }
    let under: Vec<u64> = acked.range(..below).map(|(&s, _)| s).collect();
    while !under.is_empty() && seqs.len() < TIERED_READS {
        seqs.insert(under[rng.below(under.len() as u64) as usize]);
    }
    let (mut served, mut refused, mut first_refusal) = (0, 0, None);
    for seq in seqs {
        let Some(sent) = acked.get(&seq) else {
            continue;
        };
        match tokio::time::timeout(WAIT, reader.read(seq)).await {
            Ok(Ok(e)) => {
                served += 1;
                if e.seq != seq || e.kind != sent.kind || e.meta != sent.meta || e.blob != sent.blob
                {
                    lines.push(format!(
                        "DIFFER frame {seq}: the primary served it from the archive as frame {} with meta {:?} ({} bytes), not as acknowledged",
                        e.seq,
                        String::from_utf8_lossy(&e.meta),
                        e.blob.len()
                    ));
                }
            }
            Ok(Err(e)) => {
                refused += 1;
                first_refusal.get_or_insert_with(|| format!("frame {seq}: {e}"));
            }
            Err(_) => {
                refused += 1;
                first_refusal.get_or_insert_with(|| format!("frame {seq}: no answer"));
            }
        }
    }
    (served, refused, first_refusal)
}

/// Of the acknowledged frames `want`, those the bucket keeps as
/// acknowledged: in an object of the frames its name gives, that opens
/// under the key and whose frames all check.
async fn kept_in_bucket(
    cx: &Cx,
    bucket: &Bucket,
    acked: &Acked,
    want: &BTreeSet<u64>,
) -> Result<BTreeSet<u64>> {
    let mut kept = BTreeSet::new();
    let (Some(&lo), Some(&hi)) = (want.first(), want.last()) else {
        return Ok(kept);
    };
    let listed = bucket.segments().await.ctx(|| "list the bucket".into())?;
    for (n, size) in listed.iter().filter(|(n, _)| n.last >= lo && n.first <= hi) {
        let key = bucket.segment_key(n);
        let Ok(opened) = open_object(bucket, &key, *size, Some(&cx.key)).await else {
            continue;
        };
        let Content::Segment(info) = &opened.reader.footer().content else {
            continue;
        };
        let mut walk = FrameWalk::new(n.first, info.history);
        let mut plain = Vec::new();
        let mut pieces = Pieces::new(bucket, &opened, 0);
        let whole = loop {
            match pieces.next().await {
                Ok(Some((_, p))) => {
                    if walk.feed(&p).is_err() {
                        break false;
                    }
                    plain.extend(p);
                }
                Ok(None) => break walk.finish().is_ok_and(|l| l == n.last),
                Err(_) => break false,
            }
        };
        if !whole {
            continue;
        }
        let mut at = SEGMENT_HEADER_LEN;
        while at + FRAME_HEADER_LEN <= plain.len() {
            let mut b = [0u8; FRAME_HEADER_LEN];
            b.copy_from_slice(&plain[at..at + FRAME_HEADER_LEN]);
            let Ok(h) = FrameHeader::decode(&b) else {
                break;
            };
            let meta_at = at + FRAME_HEADER_LEN;
            let blob_at = meta_at + h.meta_len as usize;
            let end = blob_at + h.blob_len as usize;
            if end > plain.len() {
                break;
            }
            if let Some(sent) = acked.get(&h.seq) {
                if want.contains(&h.seq)
                    && sent.kind == h.kind
                    && sent.meta == plain[meta_at..blob_at]
                    && sent.blob == plain[blob_at..end]
                {
                    kept.insert(h.seq);
                }
            }
            at = end;
        }
    }
    Ok(kept)
}

/// What a box said of the bucket's head record, first (the drill's own
/// deletion of it, to see the boxes list, left out).
fn head_said(stderr: &Path) -> Option<String> {
    let text = std::fs::read_to_string(stderr).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("head record is not what this box recorded"))
        .filter_map(|l| l.split_once("note=").map(|(_, n)| n.to_owned()))
        .find(|n| !n.contains("is gone from the bucket"))
}

fn says_sabotage(paths: &[&Path]) -> bool {
    paths.iter().any(|p| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .contains("drill sabotage")
    })
}

async fn run_attack(cx: &Cx, attack: Attack, i: u64) -> Result<Ran> {
    let started = Instant::now();
    let work = cx.work.join(attack.name);
    let toml = cx
        .secrets
        .archive_toml(&format!("adversary-{}", attack.name), &cx.endpoint, 0);
    let opts = PairOpts {
        segment_bytes: cx.segment,
        max_bytes: cx.cap,
        restore: None,
    };
    // Only the primary holds some frames the bucket holds: a cap of half
    // the primary's on the twin.
    let twin_cap = if attack.name == "adopted" {
        cx.cap / 2
    } else {
        cx.cap
    };
    let mut ar = Archiving::start(&work, &cx.bins, &opts, &toml, twin_cap, WAIT).await?;
    let caps = (cx.cap, twin_cap);
    let bucket = ar
        .section
        .settings(&work)
        .map_err(|e| DrillError(format!("the archive's settings: {e}")))?
        .bucket;
    let (pm, tm) = (ar.pair.primary_metrics, ar.pair.twin_metrics);
    let admin = Arc::new(ar.pair.admin()?);
    let seed = cx.seed.wrapping_mul(31).wrapping_add(i);
    let mut rng = Rng::new(seed ^ 0xadd5);
    let reps = repeats(&mut rng);
    let load = Arc::new(Load::default());
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let c = connect(&admin, ar.pair.primary_fp, ar.pair.listen, WAIT).await?;
        writers.push(tokio::spawn(writer(
            w,
            c,
            seed,
            reps.clone(),
            Shape {
                segment: cx.segment,
                large_every: 0,
                huge_after: u64::MAX,
            },
            load.clone(),
        )));
    }
    let reader = connect(&admin, ar.pair.primary_fp, ar.pair.listen, WAIT).await?;
    let mut lines: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();

    // 1. The load, until both boxes dropped what the archive holds.
    let earlier = if attack.name == "rolled-back" {
        load.allow(cx.frames / 2);
        load.reached(WAIT).await?;
        steady(caps, pm, tm, &load, false).await?;
        Some(copy_of(cx, &bucket).await?)
    } else {
        None
    };
    load.allow(cx.frames);
    load.reached(WAIT).await?;
    let (p_at, t_at) = steady(caps, pm, tm, &load, true).await?;
    let a_at = t_at.archive.clone().unwrap_or_default();
    let reached = a_at.floor.saturating_sub(1);
    let held_from = p_at.first.min(t_at.first);
    let listed = bucket.segments().await.ctx(|| "list the bucket".into())?;
    let head_key = {
        let (n, size) = *listed
            .last()
            .ok_or_else(|| DrillError("nothing archived".into()))?;
        bucket.head_key(&footer(cx, &bucket, &n, size).await?.history)
    };
    let acked_at = load.count();
    notes.push(format!(
        "{acked_at} frames acknowledged; the primary holds from {}, the twin from {}; the bucket holds {} objects to frame {reached}",
        p_at.first,
        t_at.first,
        listed.len()
    ));

    // 2. The uploader frozen, the bucket attacked, a restore at once.
    let mut restore_now = None;
    let struck = {
        let _frozen = Frozen::new(&ar.twin)?;
        let struck = strike(
            cx,
            attack,
            &bucket,
            &listed,
            held_from,
            t_at.first,
            earlier.as_ref(),
        )
        .await?;
        notes.push(format!("the adversary {}", struck.did));
        if attack.restore_now {
            let acked = lock(&load.acked).clone();
            let (r, run) = restore(cx, &ar.section, &work.join("restore-now"), None, &acked)?;
            notes.push(format!(
                "a restore at once ({:.1} s): {}",
                run.seconds,
                restore_brief(&r)
            ));
            let l = judge(&Look {
                what: &format!("{} (a restore at once)", attack.name),
                acked: &acked,
                on_box: None,
                in_bucket: None,
                held_from,
                reached: Some(reached),
                restore: &r,
            })
            .lines;
            lines.extend(l);
            restore_now = Some((r, run));
        }
        struck
    };
    let mut said_paths: Vec<PathBuf> = vec![ar.plog_err.clone(), ar.tlog_err.clone()];
    if let Some((_, run)) = &restore_now {
        let p = work.join("restore-now.stderr");
        let _ = std::fs::write(&p, &run.stderr);
        said_paths.push(p);
    }

    // A control that broke already has made its point.
    let stop_early = cx.broken.is_some() && !lines.is_empty();
    let mut end = None;
    let mut figures = serde_json::json!({});
    if !stop_early {
        // 3. Writes past both caps: retention wants to drop.
        load.allow(cx.frames + cx.frames / 2);
        load.reached(WAIT).await?;
        steady(caps, pm, tm, &load, false).await?;
        // Both boxes listed the attacked bucket, and retention did what it
        // would with what they found.
        listed_since(&bucket, &head_key, pm, tm).await?;
        let (p, t) = steady(caps, pm, tm, &load, false).await?;
        let acked = lock(&load.acked).clone();
        let (on_box, from_primary, from_twin) =
            read_boxes(&reader, &p, &ar.pair.tlog(), t.first, &acked, &mut lines).await?;
        let (r, run) = restore(cx, &ar.section, &work.join("restore-end"), None, &acked)?;
        let p_err = work.join("restore-end.stderr");
        let _ = std::fs::write(&p_err, &run.stderr);
        said_paths.push(p_err);
        // Frames a box held that no box holds now, nor the restore: does
        // the bucket still keep them, in objects that open under the key?
        let restored_to = match &r {
            Restore::Done(d) if d.lost.is_empty() => d.head,
            _ => 0,
        };
        let want: BTreeSet<u64> = acked
            .keys()
            .copied()
            .filter(|&s| s >= held_from && s > restored_to && !on_box.contains(&s))
            .collect();
        let in_bucket = kept_in_bucket(cx, &bucket, &acked, &want).await?;
        let judged = judge(&Look {
            what: attack.name,
            acked: &acked,
            on_box: Some(&on_box),
            in_bucket: Some(&in_bucket),
            held_from,
            reached: Some(reached),
            restore: &r,
        });
        lines.extend(judged.lines);
        let taken = judged.taken;
        if !judged.behind.is_empty() {
            notes.push(format!(
                "{} acknowledged frames a box held when the bucket was attacked ({}) are on no box now: the bucket keeps them, past an object the restore refuses",
                judged.behind.len(),
                runs(&judged.behind, 4)
            ));
        }
        let pa = p.archive.clone().unwrap_or_default();
        let ta = t.archive.clone().unwrap_or_default();
        notes.push(format!(
            "after {} more frames: the primary holds {} to {} ({} KiB, retention held {}, {} objects missing), the twin {} to {} ({} KiB, held {}, {} missing, {} found missing since start); {} and {} frames read back",
            acked.len() as u64 - acked_at,
            p.first,
            p.head,
            p.log_bytes >> 10,
            pa.retention_held,
            pa.missing_objects,
            t.first,
            t.head,
            t.retention.log_bytes >> 10,
            ta.retention_held,
            ta.missing_objects,
            ta.missing_found,
            from_primary,
            from_twin
        ));
        notes.push(format!(
            "the restore to the end ({:.1} s): {}{}",
            run.seconds,
            restore_brief(&r),
            if taken > 0 {
                format!(
                    "; {taken} acknowledged frames only the bucket held were taken by the attack"
                )
            } else {
                String::new()
            }
        ));
        // Below the attack the archive is whole: a restore to there.
        let below = struck.ranges.iter().map(|r| r.0).min().unwrap_or(1);
        let mut intact = serde_json::Value::Null;
        if matches!(r, Restore::Refused(_)) && below > 1 {
            let (r2, run2) = restore(
                cx,
                &ar.section,
                &work.join("restore-below"),
                Some(below - 1),
                &acked,
            )?;
            if let Restore::Done(d) = &r2 {
                let l = judge(&Look {
                    what: &format!(
                        "{} (a restore to {}, below the attack)",
                        attack.name,
                        below - 1
                    ),
                    acked: &acked,
                    on_box: None,
                    in_bucket: None,
                    held_from,
                    reached: None,
                    restore: &r2,
                })
                .lines;
                lines.extend(l);
                if d.head != below - 1 {
                    lines.push(format!(
                        "LOST: {}: a restore to {} ended at {}",
                        attack.name,
                        below - 1,
                        d.head
                    ));
                }
            }
            notes.push(format!(
                "a restore to {} ({:.1} s): {}",
                below - 1,
                run2.seconds,
                restore_brief(&r2)
            ));
            intact = serde_json::json!(matches!(r2, Restore::Done(_)));
        }
        let (served, refused, why) = tiered_reads(
            &reader,
            p.first,
            &struck.ranges,
            &acked,
            &mut rng,
            &mut lines,
        )
        .await;
        notes.push(format!(
            "{served} frames below the primary's floor served from the archive as acknowledged, {refused} refused{}",
            why.map_or(String::new(), |w| format!(" ({w})"))
        ));
        figures = serde_json::json!({
            "primary_first": p.first,
            "twin_first": t.first,
            "head": p.head,
            "primary_retention_held": pa.retention_held,
            "twin_retention_held": ta.retention_held,
            "primary_missing": pa.missing_objects,
            "twin_missing": ta.missing_objects,
            "restore_end": match &r { Restore::Done(d) => serde_json::json!(d.head), Restore::Refused(_) => serde_json::json!("refused") },
            "restore_end_s": tenths(run.seconds),
            "restore_below_exact": intact,
            "taken_by_attack": taken,
            "behind_refusal": judged.behind.len(),
            "tiered_served": served,
            "tiered_refused": refused,
        });
        end = Some(p.head);
    }
    load.stop.store(true, Ordering::SeqCst);
    for w in writers {
        let _ = w.await;
    }
    let twice = lock(&load.twice).clone();
    if !twice.is_empty() {
        lines.push(format!(
            "BROKEN: {}: sequences acknowledged twice: {}",
            attack.name,
            runs(&twice, 8)
        ));
    }
    let local = load.local.load(Ordering::SeqCst);
    if local > 0 {
        lines.push(format!(
            "BROKEN: {}: {local} twin appends acknowledged local under the wait policy",
            attack.name
        ));
    }
    ar.primary.sigkill()?;
    ar.twin.sigkill()?;
    for (who, path) in [("primary", &ar.plog_err), ("twin", &ar.tlog_err)] {
        if let Some(n) = head_said(path) {
            notes.push(format!("the {who} said of the head record: {n}"));
        }
    }
    let paths: Vec<&Path> = said_paths.iter().map(PathBuf::as_path).collect();
    let sabotage_said = says_sabotage(&paths);
    let seconds = started.elapsed().as_secs_f64();
    notes.push(format!(
        "{} in {seconds:.1} s",
        if lines.is_empty() { "held" } else { "BROKEN" }
    ));
    let json = serde_json::json!({
        "attack": attack.name,
        "acked_at_attack": acked_at,
        "held_from": held_from,
        "archived_to": reached,
        "objects": listed.len(),
        "struck": struck.ranges.len(),
        "restore_now": restore_now.as_ref().map(|(r, _)| match r {
            Restore::Done(d) => serde_json::json!(d.head),
            Restore::Refused(_) => serde_json::json!("refused"),
        }),
        "after": figures,
        "head_after": end,
        "broken_rules": lines.len(),
        "seconds": tenths(seconds),
    });
    Ok(Ran {
        attack,
        lines,
        notes,
        sabotage_said,
        json,
    })
}
