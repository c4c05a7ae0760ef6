//! Replay a dm-log-writes log (QEMU's `blklogwrites`) onto a copy of the
//! disk it started from: the disk as a power cut right after the Nth FLUSH
//! would leave it (`--flush N`, from 1), or after every entry (`--all`);
//! `--compare IMAGE` then checks the result against the disk QEMU left,
//! byte for byte, which checks the replayer.
//!
//! `replay-log-writes --log LOG --start START --out OUT (--flush N | --all)
//! [--compare DATA]`

use std::fs::OpenOptions;
use std::process::ExitCode;

use drills::dmlog::{first_difference, WriteLog};
use drills::{Args, Context, DrillError, Result};

fn run() -> Result<bool> {
    let args = Args::parse(&["all"])?;
    let wl = WriteLog::open(&args.path("log")?)?;
    let start = args.path("start")?;
    let out = args.path("out")?;
    std::fs::copy(&start, &out).ctx(|| format!("copy {} to {}", start.display(), out.display()))?;
    let image = OpenOptions::new()
        .write(true)
        .open(&out)
        .ctx(|| format!("open {}", out.display()))?;
    let flushes = wl.flushes();
    let end = if args.flag("all") {
        wl.entries.len()
    } else {
        let n = args.num("flush", 0)?;
        let i = n
            .checked_sub(1)
            .and_then(|i| flushes.get(i as usize))
            .ok_or_else(|| {
                DrillError(format!(
                    "--flush {n}: the log has {} flushes",
                    flushes.len()
                ))
            })?;
        i + 1
    };
    for e in &wl.entries[..end] {
        wl.apply(e, &image)?;
    }
    image
        .sync_all()
        .ctx(|| format!("fsync {}", out.display()))?;
    println!(
        "replayed {end} of {} entries ({} flushes in the log) onto {}",
        wl.entries.len(),
        flushes.len(),
        out.display()
    );
    if let Some(data) = args.opt_path("compare") {
        return match first_difference(&out, &data)? {
            None => {
                println!("identical to {}", data.display());
                Ok(true)
            }
            Some(at) => {
                println!("differs from {} at byte {at}", data.display());
                Ok(false)
            }
        };
    }
    Ok(true)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("replay-log-writes: {e}");
            ExitCode::from(2)
        }
    }
}
