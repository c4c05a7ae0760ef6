//! A real S3-compatible server for tests and drills: Garage, started on
//! loopback in a directory of the caller's, one node (or several, joined
//! into one cluster), with a bucket and a key made for the test, killed on
//! drop. A node can be killed and started again on the same data.
//!
//! The binary is built from crates.io by `scripts/install-deps.sh` (it
//! is AGPL and runs as its own process, never linked): `GARAGE_BIN`, else
//! `~/.cache/twinlog/garage-<version>/bin/garage`.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::Guard;

/// The version `scripts/install-deps.sh` builds.
pub const VERSION: &str = "2.5.0";
/// The bucket every test gets.
pub const BUCKET: &str = "twinlog";
/// The region Garage answers for.
pub const REGION: &str = "garage";
/// A fixed key, imported into every cluster (Garage's key ids start
/// with GK and hold 12 bytes of hex; secrets 32).
pub const KEY_ID: &str = "GK0123456789abcdef01234567";
pub const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

const UP_WITHIN: Duration = Duration::from_secs(60);

/// One Garage node.
#[derive(Debug)]
pub struct Node {
    dir: PathBuf,
    s3: SocketAddr,
    rpc: SocketAddr,
    admin: SocketAddr,
    secret: String,
    process: Guard,
}

/// A cluster of one or more nodes with the test bucket and key.
#[derive(Debug)]
pub struct Garage {
    pub nodes: Vec<Node>,
}

fn free_tcp_port() -> io::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}

impl Garage {
    /// The binary: `GARAGE_BIN`, else the one the install script builds.
    pub fn binary() -> PathBuf {
        if let Some(b) = std::env::var_os("GARAGE_BIN") {
            return PathBuf::from(b);
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        home.join(format!(".cache/twinlog/garage-{VERSION}/bin/garage"))
    }

    /// Start `n` nodes under `dir`, join them, give them a layout with
    /// every node holding data, and make the bucket and the key.
    pub fn start(dir: &Path, n: usize) -> io::Result<Garage> {
        let bin = Self::binary();
        if !bin.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} is missing: scripts/install-deps.sh builds it (the test command runs it), or set GARAGE_BIN",
                    bin.display()
                ),
            ));
        }
        let secret: String = (0..32)
            .map(|i| format!("{:02x}", (i * 37 + std::process::id() as usize) % 256))
            .collect();
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let d = dir.join(format!("node{i}"));
            std::fs::create_dir_all(&d)?;
            let mut node = Node {
                dir: d,
                s3: free_tcp_port()?,
                rpc: free_tcp_port()?,
                admin: free_tcp_port()?,
                secret: secret.clone(),
                process: Guard::default(),
            };
            node.write_config(n)?;
            node.spawn()?;
            nodes.push(node);
        }
        let g = Garage { nodes };
        g.join_and_layout()?;
        g.cli(&["bucket", "create", BUCKET])?;
        g.cli(&[
            "key",
            "import",
            "--yes",
            "-n",
            "twinlog-tests",
            KEY_ID,
            SECRET,
        ])?;
        g.cli(&[
            "bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", KEY_ID,
        ])?;
        Ok(g)
    }

    /// The S3 endpoint of node `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}", self.nodes[i].s3)
    }

    /// Start node `i` again on its data and connect every running node to
    /// it at once: left alone, Garage dials a lost peer again only about
    /// every 30 s, and the cluster misses a quorum meanwhile.
    pub fn restart_node(&mut self, i: usize) -> io::Result<()> {
        self.nodes[i].restart()?;
        let me = format!("{}@{}", self.nodes[i].node_id()?, self.nodes[i].rpc);
        for (j, n) in self.nodes.iter().enumerate() {
            if j != i && n.process.running() {
                n.cli(&["node", "connect", &me])?;
            }
        }
        Ok(())
    }

    /// Run the CLI against node 0 (or the first node that runs).
    pub fn cli(&self, args: &[&str]) -> io::Result<String> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.process.running())
            .ok_or_else(|| io::Error::other("no Garage node runs"))?;
        node.cli(args)
    }

    fn join_and_layout(&self) -> io::Result<()> {
        let ids: Vec<String> = self
            .nodes
            .iter()
            .map(|n| n.node_id())
            .collect::<io::Result<_>>()?;
        for (node, id) in self.nodes.iter().zip(&ids).skip(1) {
            self.cli(&["node", "connect", &format!("{id}@{}", node.rpc)])?;
        }
        for (i, id) in ids.iter().enumerate() {
            let short = &id[..16];
            self.cli(&[
                "layout",
                "assign",
                "-z",
                &format!("dc{i}"),
                "-c",
                "1G",
                short,
            ])?;
        }
        self.cli(&["layout", "apply", "--version", "1"])?;
        Ok(())
    }
}

impl Node {
    fn write_config(&self, nodes: usize) -> io::Result<()> {
        let replication = if nodes >= 3 { 3 } else { 1 };
        let text = format!(
            r#"metadata_dir = "{meta}"
data_dir = "{data}"
db_engine = "lmdb"
replication_factor = {replication}
rpc_bind_addr = "{rpc}"
rpc_public_addr = "{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "{s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "{admin}"
"#,
            meta = self.dir.join("meta").display(),
            data = self.dir.join("data").display(),
            rpc = self.rpc,
            secret = self.secret,
            s3 = self.s3,
            admin = self.admin,
        );
        std::fs::write(self.config(), text)
    }

    fn config(&self) -> PathBuf {
        self.dir.join("garage.toml")
    }

    fn cli(&self, args: &[&str]) -> io::Result<String> {
        let out = Command::new(Garage::binary())
            .arg("-c")
            .arg(self.config())
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "garage {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn node_id(&self) -> io::Result<String> {
        let by = Instant::now() + UP_WITHIN;
        loop {
            match self.cli(&["node", "id", "-q"]) {
                Ok(out) => {
                    let id = out.trim().split('@').next().unwrap_or("").to_owned();
                    if id.len() >= 16 {
                        return Ok(id);
                    }
                }
                Err(e) if Instant::now() >= by => return Err(e),
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn spawn(&mut self) -> io::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("garage.log"))?;
        let child = Command::new(Garage::binary())
            .arg("-c")
            .arg(self.config())
            .arg("server")
            .env("RUST_LOG", "garage=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.process = Guard::new(child);
        let by = Instant::now() + UP_WITHIN;
        while TcpStream::connect_timeout(&self.s3, Duration::from_millis(200)).is_err() {
            if let Some(status) = self.process.try_wait()? {
                return Err(io::Error::other(format!(
                    "garage exited ({status}) before it listened; its log: {}",
                    self.dir.join("garage.log").display()
                )));
            }
            if Instant::now() >= by {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "garage did not listen in time",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kill the node (SIGKILL): its data stays.
    pub fn kill(&mut self) -> io::Result<()> {
        self.process.kill()
    }

    /// Start the node again on its data and ports.
    pub fn restart(&mut self) -> io::Result<()> {
        self.process.kill()?;
        self.spawn()
    }
}
