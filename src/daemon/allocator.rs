//! The C allocator, tuned for a daemon that runs for months.
//!
//! glibc's malloc gives each thread that contends an arena of its own, up
//! to eight per core, and memory freed on another thread than the one that
//! allocated it (a blob read on a runtime worker, appended and dropped on a
//! blocking thread) goes back to the arena it came from, fragmenting every
//! one of them. Measured by the soak drill (`drills/run soak`, ten minutes,
//! about 5,000 appends/s): the primary's RSS grew from 30 to 56 MiB and was
//! still growing with the default; capped at two arenas it stayed near
//! 22 MiB.

/// The arenas a daemon's malloc may use, unless `MALLOC_ARENA_MAX` says.
const ARENAS: i32 = 2;

/// Cap glibc's malloc arenas at [`ARENAS`], unless `MALLOC_ARENA_MAX` is
/// set in the environment (the operator's word wins). Call it first thing
/// in `main`, before any thread is started.
pub fn tune() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets one of glibc's allocator parameters and touches
    // no memory of ours; called before any other thread exists, nothing
    // allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}
