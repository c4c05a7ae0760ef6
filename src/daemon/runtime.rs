//! Where a daemon's own future runs.

use std::future::Future;

use tokio::runtime::{Builder, Runtime};

/// The runtime a command runs on: a daemon's (`serves`) is one thread,
/// anything else the usual pool of workers.
///
/// A daemon's network side is a chain of small hand-offs (a request to the
/// appender, a group to the twin's session, an acknowledgement back to the
/// request): on a pool of workers every hand-off between two tasks may
/// unpark a second worker that then finds nothing to steal, a futex wake
/// and two context switches for no work. On one thread those hand-offs are
/// queue pushes. Its blocking work (syncs, reads of the log) keeps threads
/// of its own: the appender, the twin's writer, the blocking pool. Measured
/// alternately on the replication bench, two runs each, `--quick`: context
/// switches per `twin` append at 1 client 27.3 and 26.9 on a pool, 17.4
/// and 17.3 on one thread; `twin_128b_c8` 6,567 and 8,234 appends/s on a
/// pool, 9,178 and 9,578 on one thread; the bulk cases no slower.
pub fn for_command(serves: bool) -> std::io::Result<Runtime> {
    match serves {
        true => Builder::new_current_thread().enable_all().build(),
        false => Runtime::new(),
    }
}

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
