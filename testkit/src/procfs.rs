//! What a process spends, from `/proc`.

use std::io;

/// User and system CPU the process `pid` has spent, in seconds.
pub fn cpu_secs(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: {stat}"),
        )
    };
    // `pid (comm) S ...`: utime and stime are the 12th and 13th fields
    // after the state; comm may hold spaces and parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .ok_or_else(bad)?
        .1
        .split_whitespace()
        .collect();
    let field = |i: usize| -> io::Result<u64> {
        fields.get(i).and_then(|f| f.parse().ok()).ok_or_else(bad)
    };
    let ticks = field(11)? + field(12)?;
    Ok(ticks as f64 / clock_ticks())
}

/// The kernel's clock ticks a second, the unit of `/proc/*/stat` times.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it has no
    // preconditions and touches no memory of ours.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
pub fn vm_kib(pid: u32, field: &str) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no {field} in /proc/{pid}/status"),
            )
        })
}

/// Whether every thread of `pid` is stopped: SIGSTOP is delivered to each
/// thread in its own time.
pub fn all_threads_stopped(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.filter_map(|t| t.ok()).all(|t| {
        // `pid (comm) S ...`: the state follows the last parenthesis.
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_spends_cpu_and_memory() {
        let me = std::process::id();
        assert!(super::cpu_secs(me).expect("stat") >= 0.0);
        assert!(super::vm_kib(me, "VmRSS").expect("status") > 0);
        assert!(super::vm_kib(me, "NoSuchField").is_err());
        assert!(!super::all_threads_stopped(me));
    }
}
