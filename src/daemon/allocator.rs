//! The C allocator, tuned for a daemon that runs for months.
//!
//! glibc's malloc gives each thread that contends an arena of its own, up
//! to eight per core, and memory freed on another thread than the one that
//! allocated it (a blob read on a runtime worker, appended and dropped on a
//! blocking thread) goes back to the arena it came from, fragmenting every
//! one of them. Measured by the soak drill (`drills/run soak`, ten minutes,
//! about 5,000 appends/s): the primary's RSS grew from 30 to 56 MiB and was
//! still growing with the default; capped at two arenas it went from 21
//! to 26 MiB, still rising, while heaptrack showed a live heap of at most
//! 13 MiB and nothing leaked. So a thread also hands the free pages back to
//! the kernel every few seconds (`malloc_trim`), which keeps RSS near the
//! live heap whatever the pattern of allocations.

/// The arenas a daemon's malloc may use, unless `MALLOC_ARENA_MAX` says.
const ARENAS: i32 = 2;
/// How often the free pages go back to the kernel: a trim walks the free
/// lists of the arenas, well under a millisecond for a daemon's heap.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Cap glibc's malloc arenas at `ARENAS`, unless `MALLOC_ARENA_MAX` is
/// set in the environment (the operator's word wins), and start the thread
/// that trims them. Call it first thing in `main`, before any other thread
/// is started.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt sets one of glibc's allocator parameters and
            // touches no memory of ours; called before any other thread
            // exists, nothing allocates concurrently.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, ARENAS);
            }
        }
        let trimmer = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(|| loop {
                std::thread::sleep(TRIM_EVERY);
                // SAFETY: malloc_trim takes the arenas' own locks and only
                // returns free pages; no memory in use is touched.
                unsafe {
                    libc::malloc_trim(0);
                }
            });
        if let Err(e) = trimmer {
            tracing::warn!(error = %e, "no malloc-trim thread: RSS may stay above the live heap");
        }
    }
}
