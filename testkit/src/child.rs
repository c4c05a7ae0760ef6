//! A child process that is SIGKILLed and reaped when its owner lets go of
//! it, passed or failed, so no daemon outlives the test or drill that
//! started it.

use std::io;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// A child killed on drop. Empty once it was stopped, killed or reaped.
#[derive(Debug, Default)]
pub struct Guard(Option<Child>);

impl Guard {
    pub fn new(child: Child) -> Guard {
        Guard(Some(child))
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }

    pub fn running(&self) -> bool {
        self.0.is_some()
    }

    /// The child itself, to read its pipes.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.0.as_mut()
    }

    /// Send `signal` (`libc::SIGSTOP`, `SIGCONT`, ...). Nothing when it
    /// is not running.
    pub fn signal(&self, signal: libc::c_int) -> io::Result<()> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
        // SAFETY: kill(2) takes integers; the pid is our unreaped child's,
        // so it names no other process.
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) -> io::Result<()> {
        if let Some(mut c) = self.0.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// Its exit status if it ended by itself; the child is kept (its pipes
    /// still read) until [`Guard::take`].
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.0.as_mut() {
            Some(c) => c.try_wait(),
            None => Ok(None),
        }
    }

    /// Let go of the child without killing it.
    pub fn take(&mut self) -> Option<Child> {
        self.0.take()
    }

    /// SIGTERM, a clean stop, and wait for it: its exit status, or
    /// `TimedOut` after `limit`, when it is SIGKILLed instead.
    pub fn stop(&mut self, limit: Duration) -> io::Result<Option<ExitStatus>> {
        if self.0.is_none() {
            return Ok(None);
        }
        self.signal(libc::SIGTERM)?;
        let Some(mut c) = self.0.take() else {
            return Ok(None);
        };
        let by = Instant::now() + limit;
        loop {
            if let Some(status) = c.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= by {
                let _ = c.kill();
                let _ = c.wait();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("pid {} did not stop within {limit:?} of SIGTERM", c.id()),
                ));
            }
            // A process exit has no wait with a timeout in std: poll.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Guard;
    use std::process::Command;
    use std::time::Duration;

    #[test]
    fn a_dropped_guard_kills_and_a_stop_is_clean() {
        let g = Guard::new(Command::new("sleep").arg("60").spawn().expect("sleep"));
        let pid = g.pid().expect("running");
        drop(g);
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "killed and reaped"
        );
        let mut g = Guard::new(Command::new("sleep").arg("60").spawn().expect("sleep"));
        let status = g.stop(Duration::from_secs(10)).expect("stopped");
        assert!(status.is_some_and(|s| !s.success()), "ended by SIGTERM");
        assert!(!g.running());
    }
}
