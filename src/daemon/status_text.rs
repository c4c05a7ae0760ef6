//! Status as the `status` commands print it, and the times in it.

use super::*;

/// The store's health as `status` prints it.
pub fn render_store(who: &str, h: &crate::repl::StoreHealth, fix: &str) -> String {
    let mut out = match &h.stalled {
        None => format!("{who}: applied through {}", h.applied),
        Some(st) => format!(
            "{who}: STOPPED at frame {} (kind {}), {} tries since {}: {}\n  {fix}",
            st.seq,
            st.kind,
            st.attempts,
            crate::daemon::utc(st.since_ms),
            st.error
        ),
    };
    if h.skipped > 0 {
        out.push_str(&format!(" ({} frames skipped by operators)", h.skipped));
    }
    out.push('\n');
    out
}

/// A time as an RFC 3339 UTC date, to the second.
pub fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// An RFC 3339 UTC time (`2026-11-01`, `2026-11-01T00:00Z`,
/// `2026-11-01T00:00:00Z`, `2026-11-01T00:00:00.250Z`, or with `+00:00`)
/// as ms since the Unix epoch (a fraction past the ms is cut); None for
/// anything else.
pub fn parse_utc(s: &str) -> Option<u64> {
    let s = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix("+00:00"))
        .unwrap_or(s);
    let (date, time) = s.split_once('T').unwrap_or((s, "00:00:00"));
    let num = |t: &str| -> Option<i64> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let mut d = date.split('-');
    let (year, month, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    // RFC 3339's four-digit years; a longer one would overflow the sums below.
    if d.next().is_some()
        || !(0..=9999).contains(&year)
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
    {
        return None;
    }
    let mut t = time.split(':');
    let (h, m) = (num(t.next()?)?, num(t.next()?)?);
    // Seconds may carry a fraction; its first three digits count.
    let (sec, ms) = match t.next().map(|x| x.split_once('.').unwrap_or((x, "0"))) {
        Some((x, frac)) => {
            num(frac)?;
            let ms: i64 = frac
                .bytes()
                .chain(*b"00")
                .take(3)
                .fold(0, |ms, d| ms * 10 + i64::from(d - b'0'));
            (num(x)?, ms)
        }
        None => (0, 0),
    };
    if t.next().is_some() || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    // Days from a civil date (Howard Hinnant's algorithm), utc's inverse.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + sec;
    u64::try_from(secs * 1000 + ms).ok()
}

/// A poisoned log as `status` prints it: the cause and what to do.
pub(super) fn render_poisoned(why: &Option<String>) -> String {
    match why {
        None => String::new(),
        Some(why) => format!(
            "log: POISONED, every write is refused: {why}\n  \
             nothing acknowledged is lost; fix the cause (free space on the log's \
             file system, or replace the failing disk), then restart the daemon\n"
        ),
    }
}

/// Ask a running daemon for its status: the JSON text and its value.
pub fn fetch_status<T: serde::de::DeserializeOwned>(
    metrics: impl Into<Address>,
) -> Result<(String, T), DaemonError> {
    let metrics = metrics.into();
    let addr = resolve("metrics", &metrics)?;
    let body = http::get(addr, "/status").map_err(|error| DaemonError::NoDaemon {
        metrics: metrics.clone(),
        error,
    })?;
    let value =
        serde_json::from_str(&body).map_err(|error| DaemonError::BadStatus { metrics, error })?;
    Ok((body, value))
}

/// A primary's status as `primary status` prints it.
pub fn render_primary_status(s: &crate::node::Status) -> String {
    let mut out = format!(
        "primary, epoch {}, twinlog {}\nhead {}  first {}\n",
        crate::repl::epochs::EpochName(s.epoch),
        s.build,
        s.head,
        s.first
    );
    if let Some(why) = &s.waiting {
        out.push_str(&format!("WAITING: {why}: this box serves nothing yet\n"));
    }
    if let Some(why) = &s.arbiter_amnesia {
        out.push_str(&format!("ARBITER AMNESIA: {why}\n"));
    }
    match &s.fenced {
        Some(f) if f.held && f.by == crate::node::epoch::HELD_FOR_HELLO => out.push_str(&format!(
            "held: {}: a start after a crash acknowledges nothing until the twin proves it was not promoted (primary release serves without it)\n",
            f.by
        )),
        Some(f) if f.held => out.push_str(&format!(
            "HELD ({}): this box acknowledges no write (reads go on). Rejoin it to the new primary (primary rejoin), or lift the hold (primary unfence)\n",
            f.by
        )),
        Some(f) => out.push_str(&format!(
            "FENCED: epoch {} exists ({}): another box is primary, and this one acknowledges no write (reads go on). Rejoin it as the new primary's twin: primary rejoin\n",
            crate::repl::epochs::EpochName(f.epoch),
            f.by
        )),
        None => {}
    }
    if let Some(v) = &s.last_verify {
        let when = utc(v.ended_ms);
        out.push_str(&match (v.first_difference, &v.stopped) {
            (Some(seq), _) => format!(
                "last verify ({when}): the twin's frame {seq} is NOT this primary's (frames {}..={})\n",
                v.from, v.through
            ),
            (None, Some(why)) => format!(
                "last verify ({when}): stopped after frames {}..: {why}\n",
                v.from
            ),
            (None, None) => format!(
                "last verify ({when}): frames {}..={} the same on both boxes\n",
                v.from, v.through
            ),
        });
    }
    if let Some(a) = &s.arbiter {
        out.push_str(&super::render_primary_arbiter(a));
    }
    if let Some(a) = &s.archive {
        out.push_str(&super::render_archive(a));
    }
    if let Some(f) = &s.last_failover {
        out.push_str(&super::last_failover::render(f));
    }
    if let Some(p) = &s.predecessor {
        out.push_str(&match p.told {
            true => format!(
                "predecessor: {} heard of epoch {}: it is fenced\n",
                p.addr,
                crate::repl::epochs::EpochName(p.epoch)
            ),
            false => format!(
                "predecessor: {} NOT told of epoch {} yet ({} calls{}): it may still take `local` writes\n",
                p.addr,
                crate::repl::epochs::EpochName(p.epoch),
                p.attempts,
                p.last_error
                    .as_deref()
                    .map(|e| format!("; last: {e}"))
                    .unwrap_or_default()
            ),
        });
    }
    if !s.twin_configured {
        out.push_str("twin: NONE configured: `twin` appends are refused at once (NoTwin); pin one with `primary pin-twin` and restart\n");
    }
    out.push_str(&render_poisoned(&s.log_poisoned));
    if s.twin_configured {
        out.push_str(&format!(
            "twin: {}, acknowledged {}, lag {} frames, {} bytes, {:.3} s\n",
            if s.twin_connected {
                "connected"
            } else {
                "not connected"
            },
            s.twin_acked,
            s.lag_frames,
            s.lag_bytes,
            s.lag_ms as f64 / 1000.0
        ));
    }
    out.push_str(&format!(
        "durability: policy {}{}, {} append{} waiting on the twin\n",
        s.policy,
        if s.degraded {
            ", DEGRADED: twin appends are acknowledged as local until the twin catches up"
        } else {
            ""
        },
        s.twin_waiting,
        if s.twin_waiting == 1 { "" } else { "s" }
    ));
    if let Some(e) = &s.twin_last_error {
        out.push_str(&format!("last twin disconnect: {e}\n"));
    }
    out.push_str(&format!(
        "clients: {} connected, {} requests in progress, {:.1} MiB of the memory budget held, {:.1} MiB of bodies staged\n",
        s.client_connections,
        s.client_requests,
        s.memory_held as f64 / (1 << 20) as f64,
        s.staging_held as f64 / (1 << 20) as f64
    ));
    if !s.refusals.is_empty() {
        let named: Vec<String> = s.refusals.iter().map(|(n, c)| format!("{n} {c}")).collect();
        out.push_str(&format!("clients refused: {}\n", named.join(", ")));
    }
    if s.unpinned_refused > 0 {
        out.push_str(&format!(
            "handshakes of unpinned certificates refused: {}\n",
            s.unpinned_refused
        ));
    }
    for r in &s.refused_peers {
        out.push_str(&format!(
            "refused a certificate that is not pinned: {} at {} (pin it with `primary pin-twin` or `pin-client` if it is yours)\n",
            r.fingerprint,
            utc(r.at_ms)
        ));
    }
    out.push_str(&format!(
        "retention: {:.1} MiB of log{}, holding from the twin's position {}\n",
        s.log_bytes as f64 / 1048576.0,
        if s.retention_max_bytes == 0 {
            String::from(", no cap")
        } else {
            format!(", cap {:.1} MiB", s.retention_max_bytes as f64 / 1048576.0)
        },
        s.twin_hold
    ));
    if s.twin_below_floor {
        out.push_str("twin: BELOW THE RETENTION FLOOR: it needs a snapshot\n");
    }
    if let Some(h) = &s.store {
        out.push_str(&render_store(
            "store",
            h,
            "fix the cause, then `primary store retry`; or skip the frame on both boxes with `primary store skip --seq N --reason TEXT`",
        ));
    }
    if let Some(h) = &s.twin_store {
        out.push_str(&render_store(
            "twin's store",
            h,
            "the twin retries by itself; fix the cause on the twin, or skip the frame with `primary store skip`",
        ));
    }
    out
}

/// A twin's status as `twin status` prints it.
pub fn render_twin_status(s: &crate::node::TwinStatus) -> String {
    let mut out = format!(
        "twin, epoch {}, twinlog {}\nhead {}  first {}\n",
        crate::repl::epochs::EpochName(s.epoch),
        s.build,
        s.head,
        s.first
    );
    out.push_str(&render_poisoned(&s.log_poisoned));
    out.push_str(&format!(
        "primary: {}, its head {}, lag {} frames{}\n",
        if s.connected {
            "connected"
        } else {
            "not connected"
        },
        s.primary_head,
        s.lag_frames,
        if s.below_floor {
            ", BELOW THE RETENTION FLOOR: a snapshot is needed"
        } else {
            ""
        }
    ));
    if s.below_floor && s.snapshot_total > 0 {
        out.push_str(&format!(
            "snapshot: {:.1} of {:.1} MiB fetched\n",
            s.snapshot_held as f64 / 1048576.0,
            s.snapshot_total as f64 / 1048576.0
        ));
    }
    if s.snapshots_installed > 0 {
        out.push_str(&format!(
            "snapshots installed: {}, the last at {}\n",
            s.snapshots_installed, s.snapshot_at
        ));
    }
    if let Some(e) = &s.last_error {
        out.push_str(&format!("last disconnect: {e}\n"));
    }
    if let Some(a) = &s.arbiter {
        out.push_str(&super::render_twin_arbiter(a));
    }
    if let Some(f) = &s.last_failover {
        out.push_str(&super::last_failover::render(f));
    }
    out.push_str(&render_twin_retention(&s.retention));
    if let Some(a) = &s.archive {
        out.push_str(&super::render_archive(a));
    }
    out.push_str(&render_store(
        "store",
        &s.store,
        "it retries by itself (every few seconds, and as frames arrive); fix the cause here, or skip the frame on both boxes with `primary store skip` on the primary",
    ));
    out
}

/// The twin's retention as `twin status` prints it.
pub(super) fn render_twin_retention(
    r: &crate::node::twin_retention::TwinRetentionStatus,
) -> String {
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut limits = Vec::new();
    if r.max_bytes > 0 {
        limits.push(format!("cap {:.1} MiB", mib(r.max_bytes)));
    }
    if r.max_age_secs > 0 {
        limits.push(format!("max age {} s", r.max_age_secs));
    }
    let limits = if limits.is_empty() {
        "no cap".to_owned()
    } else {
        limits.join(", ")
    };
    let mut out = format!(
        "retention: {:.1} MiB of log, {limits}, {} segments dropped{}\n",
        mib(r.log_bytes),
        r.dropped_segments,
        if r.held_by.is_empty() {
            String::new()
        } else {
            format!(", floor held by the {}", r.held_by)
        }
    );
    if let Some(e) = &r.last_error {
        out.push_str(&format!("retention: FAILING: {e}\n"));
    }
    out
}

#[cfg(test)]
mod time_tests {
    use super::{parse_utc, utc};

    #[test]
    fn a_restore_pin_lasts_as_long_as_asked_and_unpinning_drops_its_expiry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cfg, _) = super::init_twin(
            dir.path(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 7400)),
            std::net::SocketAddr::from(([127, 0, 0, 1], 9401)),
            None,
        )
        .expect("init");
        let (a, b) = (
            crate::net::Fingerprint([5; 32]),
            crate::net::Fingerprint([6; 32]),
        );
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 7401));
        super::pin_restore(
            &cfg,
            a,
            Some(listen),
            Some(std::time::Duration::from_secs(3600)),
        )
        .expect("pin a");
        super::pin_restore(&cfg, b, None::<std::net::SocketAddr>, None).expect("pin b");
        let listed = super::twin_pins(&cfg).expect("pins");
        assert!(
            listed.contains(&format!("{a}  restore, until ")),
            "{listed}"
        );
        assert!(listed.contains(&format!("{b}  restore\n")), "{listed}");
        let t = super::TwinConfig::load(&cfg).expect("load");
        let pins = super::restore_pins(&t).expect("pins");
        assert!(pins.role(&a).is_some() && pins.role(&b).is_some());
        super::unpin_restore(&cfg, a).expect("unpin");
        let t = super::TwinConfig::load(&cfg).expect("load");
        assert!(t.restore_expiry.is_empty(), "the expiry goes with the pin");
    }

    #[test]
    fn times_print_and_parse_as_rfc_3339_utc() {
        for ms in [0, 951_782_400_000, 1_764_480_000_000, 4_102_444_799_000] {
            assert_eq!(parse_utc(&utc(ms)), Some(ms), "{}", utc(ms));
        }
        assert_eq!(utc(1_764_479_520_000), "2025-11-30T05:12:00Z");
        assert_eq!(parse_utc("2026-11-01T00:00Z"), parse_utc("2026-11-01"));
        assert_eq!(
            parse_utc("2026-11-01T00:00:00+00:00"),
            parse_utc("2026-11-01")
        );
        let day = parse_utc("2026-11-01").unwrap();
        for (frac, ms) in [(".250", 250), (".2", 200), (".05", 50), (".999999", 999)] {
            let t = format!("2026-11-01T00:00:07{frac}Z");
            assert_eq!(parse_utc(&t), Some(day + 7_000 + ms), "{t}");
        }
        for bad in [
            "",
            "2026-13-01",
            "2026-11-01T00:00:07.Z",
            "2026-11-01T00:00:07.2.5Z",
            "2026-11-01T00:00:07.-1Z",
            "99999999999999-01-01",
            "9223372036854775807-01-01T00:00:00.999Z",
            "2026-11-01T24:00Z",
            "yesterday",
            "2026-11",
            "1e3",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }
}
