//! PostgreSQL as the peer twinlog is measured against: a primary and a
//! synchronous standby on loopback in a temporary directory, driven by
//! `pgbench`, as an operator would set them up (see `benches/peers.rs`).
//!
//! Installed from Debian's packages where it is missing. The servers run as
//! the `postgres` user when this process is root (PostgreSQL refuses to run
//! as root), and are stopped when the pair is dropped, on a panic too.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use super::cases::MachineBusy;
use testkit::free_tcp;

/// The server and client programs of one PostgreSQL version.
pub(crate) struct Programs {
    bin: PathBuf,
    pub(crate) version: String,
}

impl Programs {
    /// The newest PostgreSQL on this machine, installed from Debian's
    /// packages when there is none; Err says why it cannot be had.
    pub(crate) fn find_or_install() -> Result<Programs, String> {
        if let Some(p) = Self::find() {
            return Ok(p);
        }
        eprintln!("PostgreSQL is missing: installing it from Debian's packages");
        let sudo = !is_root();
        let apt = |args: &[&str]| {
            let mut c = if sudo {
                let mut c = Command::new("sudo");
                c.args(["-n", "apt-get"]);
                c
            } else {
                Command::new("apt-get")
            };
            c.args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(Stdio::null())
                .status()
                .map_err(|e| format!("apt-get: {e}"))
                .and_then(|s| match s.success() {
                    true => Ok(()),
                    false => Err(format!("apt-get {} failed ({s})", args.join(" "))),
                })
        };
        apt(&["update", "-q"])?;
        apt(&[
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "postgresql",
            "postgresql-client",
        ])?;
        Self::find().ok_or_else(|| "installed, yet no PostgreSQL under /usr/lib/postgresql".into())
    }

    fn find() -> Option<Programs> {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                let bin = e.path().join("bin");
                ["initdb", "pg_ctl", "pg_basebackup", "pgbench", "psql"]
                    .iter()
                    .all(|p| bin.join(p).exists())
                    .then_some((v, bin))
            })
            .collect();
        versions.sort();
        let (v, bin) = versions.pop()?;
        Some(Programs {
            bin,
            version: v.to_string(),
        })
    }

    fn program(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// A command run as the user the servers run as.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(c: &mut Command, what: &str) -> Output {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Make `dir` the server user's, and let it through every parent.
fn hand_over(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("mkdir");
    if !is_root() {
        return;
    }
    let mut up = dir.parent();
    while let Some(p) = up {
        if let Ok(m) = std::fs::metadata(p) {
            let mode = m.permissions().mode();
            if mode & 0o001 == 0 {
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o011));
            }
        }
        up = p.parent();
    }
    run(
        Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir),
        "chown",
    );
}

/// A primary and its synchronous standby, started.
pub(crate) struct PgPair {
    programs: PathBuf,
    root: PathBuf,
    pub(crate) port: u16,
    pub(crate) tls: bool,
    running: Vec<PathBuf>,
}

/// What one pgbench run did.
pub(crate) struct Run {
    pub(crate) tps: f64,
    pub(crate) transactions: u64,
    pub(crate) secs: f64,
    /// Core-seconds the whole machine was busy meanwhile.
    pub(crate) machine_cpu_secs: f64,
}

impl PgPair {
    /// `initdb` a primary with `synchronous_commit = on` and
    /// `synchronous_standby_names = '*'` (everything else default; with
    /// `tls`, `ssl = on`), `pg_basebackup` a standby from it, start both,
    /// and wait until the standby is synchronous.
    pub(crate) fn start(p: &Programs, root: &Path, tls: bool) -> PgPair {
        hand_over(root);
        let primary = root.join("primary");
        let standby = root.join("standby");
        let port = free_tcp().port();
        let mut pair = PgPair {
            programs: p.bin.clone(),
            root: root.to_owned(),
            port,
            tls,
            running: Vec::new(),
        };
        run(
            as_server_user(&p.program("initdb"))
                .args(["-D"])
                .arg(&primary)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"])
                .arg("--no-instructions"),
            "initdb",
        );
        let mut conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             synchronous_commit = on\nsynchronous_standby_names = '*'\n",
            root.display()
        );
        if tls {
            let key = rcgen::KeyPair::generate().expect("a key");
            let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
                .and_then(|c| c.self_signed(&key))
                .expect("a certificate");
            std::fs::write(primary.join("server.crt"), cert.pem()).expect("server.crt");
            std::fs::write(primary.join("server.key"), key.serialize_pem()).expect("server.key");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                primary.join("server.key"),
                std::fs::Permissions::from_mode(0o600),
            )
            .expect("chmod");
            conf.push_str("ssl = on\n");
        }
        append(&primary.join("postgresql.conf"), &conf);
        hand_over(&primary);
        pair.pg_ctl_start(&primary);
        run(
            as_server_user(&p.program("pg_basebackup"))
                .arg("-D")
                .arg(&standby)
                .args(["-R", "-X", "stream", "-d"])
                .arg(pair.conninfo(port)),
            "pg_basebackup of the standby",
        );
        let standby_port = free_tcp().port();
        append(
            &standby.join("postgresql.conf"),
            &format!("\nport = {standby_port}\n"),
        );
        pair.pg_ctl_start(&standby);
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while pair
            .sql("SELECT sync_state FROM pg_stat_replication")
            .trim()
            != "sync"
        {
            assert!(
                Instant::now() < deadline,
                "the standby never became synchronous"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        pair.sql(
            "CREATE TABLE small (b bytea); CREATE TABLE big (b text); \
             ALTER TABLE big ALTER COLUMN b SET STORAGE EXTERNAL;",
        );
        pair
    }

    fn conninfo(&self, port: u16) -> String {
        let ssl = if self.tls { " sslmode=require" } else { "" };
        format!("host=127.0.0.1 port={port} user=postgres dbname=postgres{ssl}")
    }

    fn pg_ctl_start(&mut self, dir: &Path) {
        run(
            as_server_user(&self.programs.join("pg_ctl"))
                .arg("-D")
                .arg(dir)
                .arg("-l")
                .arg(dir.with_extension("log"))
                .args(["-w", "start"]),
            "pg_ctl start",
        );
        self.running.push(dir.to_owned());
    }

    /// One statement through psql on the primary: its unaligned output.
    pub(crate) fn sql(&self, statement: &str) -> String {
        let out = run(
            Command::new(self.programs.join("psql"))
                .args(["-X", "-A", "-t", "-q", "-d"])
                .arg(self.conninfo(self.port))
                .args(["-c", statement]),
            "psql",
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `pgbench` of `script` (one statement) with `clients` clients for
    /// `secs`, `-j 2` as far as the clients go; `local` runs it with
    /// `synchronous_commit = local`.
    pub(crate) fn bench(
        &self,
        name: &str,
        script: &str,
        clients: u32,
        secs: u32,
        local: bool,
    ) -> Run {
        let file = self.root.join(format!("{name}.sql"));
        std::fs::write(&file, script).expect("the script");
        let mut c = Command::new(self.programs.join("pgbench"));
        c.args(["-n", "-f"])
            .arg(&file)
            .args([
                "-c",
                &clients.to_string(),
                "-j",
                &clients.min(2).to_string(),
            ])
            .args(["-T", &secs.to_string()])
            .arg(self.conninfo(self.port));
        if local {
            c.env("PGOPTIONS", "-c synchronous_commit=local");
        }
        let busy = MachineBusy::start();
        let t = Instant::now();
        let out = run(&mut c, &format!("pgbench {name}"));
        let wall = t.elapsed().as_secs_f64();
        let busy = busy.secs();
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |prefix: &str| -> f64 {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(prefix))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no `{prefix}` in pgbench's output: {text}"))
        };
        let transactions = field("number of transactions actually processed:") as u64;
        Run {
            tps: field("tps ="),
            transactions,
            secs: wall,
            machine_cpu_secs: busy,
        }
    }

    /// Fill `big` with `mib` rows of 1 MiB, then time `pg_basebackup -X
    /// stream` of the whole cluster into a fresh directory (fsynced, its
    /// default): bytes written and seconds.
    pub(crate) fn basebackup(&self, mib: u64) -> (u64, f64) {
        self.sql(&format!(
            "INSERT INTO big SELECT repeat(md5(g::text), 32768) FROM generate_series(1, {mib}) g; CHECKPOINT;"
        ));
        let dst = self.root.join("backup");
        // Warm, as before twinlog's restore it measures against.
        super::common::warm_page_cache(&self.root, mib << 20);
        sync_all();
        let t = Instant::now();
        run(
            as_server_user(&self.programs.join("pg_basebackup"))
                .arg("-D")
                .arg(&dst)
                .args(["-X", "stream", "-d"])
                .arg(self.conninfo(self.port)),
            "pg_basebackup",
        );
        let secs = t.elapsed().as_secs_f64();
        let bytes = dir_bytes(&dst);
        let _ = std::fs::remove_dir_all(&dst);
        (bytes, secs)
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for dir in self.running.iter().rev() {
            let _ = as_server_user(&self.programs.join("pg_ctl"))
                .arg("-D")
                .arg(dir)
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open a configuration");
    f.write_all(text.as_bytes()).expect("append");
}

fn sync_all() {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_bytes(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
