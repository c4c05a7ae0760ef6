//! Running under systemd: the shipped units are valid (`systemd-analyze
//! verify`), and the daemon speaks the `Type=notify` protocol they rely on:
//! `READY=1` once it serves, `STOPPING=1` when SIGTERM begins its stop.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const UNITS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../dist/systemd");

#[test]
fn the_shipped_units_verify() {
    let dir = tempfile::tempdir().expect("tempdir");
    for role in ["primary", "twin"] {
        let unit = format!("twinlog-{role}.service");
        let text = std::fs::read_to_string(Path::new(UNITS).join(&unit)).expect("unit");
        assert!(text.contains("Type=notify"), "{unit}");
        // verify checks that the command exists: point it at this build.
        let text = text.replace(
            &format!("/usr/local/bin/{role}"),
            env!("CARGO_BIN_EXE_primary"),
        );
        let path = dir.path().join(&unit);
        std::fs::write(&path, text).expect("write");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze (Debian's systemd package) runs");
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{unit}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_daemon_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("p");
    let (config, _) = twinlog::daemon::init_primary(
        &data,
        "127.0.0.1:0".parse::<std::net::SocketAddr>().expect("addr"),
        "127.0.0.1:0".parse::<std::net::SocketAddr>().expect("addr"),
        None,
    )
    .expect("init");
    let socket = dir.path().join("notify");
    let listener = UnixDatagram::bind(&socket).expect("bind");
    listener
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_primary"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &socket)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let mut buf = [0u8; 4096];
    let n = listener.recv(&mut buf).expect("READY=1 within a minute");
    let said = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        said.starts_with("READY=1\nSTATUS=primary serving"),
        "{said}"
    );
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    let killed = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(killed, 0);
    let n = listener.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
}
