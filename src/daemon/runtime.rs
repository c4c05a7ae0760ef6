//! Where a daemon's own future runs.

use std::future::Future;

use tokio::runtime::Runtime;

/// Run `serve` to its end on `rt`'s worker threads, not on this one.
///
/// `block_on` polls its future on the calling thread, outside the
/// workers: a daemon whose main loop ran there (the twin's session, which
/// trades a message with a worker task for every frame chunk, write and
/// sync) paid a futex wake and a context switch for each of those
/// hand-offs. Spawned, it shares the workers' run queues with the tasks
/// it talks to. A panic in it panics here.
pub fn block_on_workers<F>(rt: &Runtime, serve: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    rt.block_on(async move {
        match tokio::spawn(serve).await {
            Ok(out) => out,
            // Not cancelled: the runtime outlives this `block_on`.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    })
}

/// A daemon child's stderr, appended to `path`: a process's output wants
/// an OS file, which the storage seam does not hand out.
pub fn output_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}
