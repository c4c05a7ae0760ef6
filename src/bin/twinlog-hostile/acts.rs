//! What the hostile client does: one act at a time, chosen by its seed,
//! each on connections of its own in one of the four roles (read, write,
//! admin, and a certificate no one pinned), and each reduced to the names
//! of what it came to. An outcome the primary gave no name (an answer
//! that does not decode, a close or reset code it does not document, no
//! answer at all) is a violation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use twinlog::net::{self, Fingerprint, Identity, NetError, Pins, Role};
use twinlog::node::api::{Piped, PipedAnswer, RefMove};
use twinlog::node::{Durability, Request, Response};

/// The lengths a hostile body announces.
const EDGES: [u64; 5] = [0, 1, 1 << 31, i64::MAX as u64, u64::MAX];
/// Close codes the primary documents: shutdown, not pinned, not served
/// here, too many connections, reclaimed.
const CLOSES: [u64; 5] = [0, 1, 2, 5, 7];
/// Reset codes the primary documents: a read failed, a send stalled, a
/// request late.
const RESETS: [u64; 3] = [3, 8, 9];
/// No act may take longer: the primary cuts everything a client holds
/// within a few of its deadlines.
const ACT_CAP: Duration = Duration::from_secs(40);
/// How long an answer may take when one is due.
const ANSWER_CAP: Duration = Duration::from_secs(30);

/// A seeded xorshift: the same seed, the same acts.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// From 1 to `n` bytes.
    fn some_bytes(&mut self, n: u64) -> Vec<u8> {
        let len = 1 + self.below(n) as usize;
        self.bytes(len)
    }

    fn pick<'a, T>(&mut self, of: &'a [T]) -> &'a T {
        &of[self.below(of.len() as u64) as usize]
    }
}

/// What the hostile client knows of the primary it attacks.
pub struct World {
    pub listen: std::net::SocketAddr,
    pub primary: Fingerprint,
    /// Read, write, admin and unpinned identities.
    pub ids: [Arc<Identity>; 4],
    pub big_seq: u64,
    pub big_lfs: [u8; 32],
    /// The newest sequence the steady client has seen acknowledged.
    pub head: AtomicU64,
    pub stop: AtomicBool,
    /// One memory hog at a time.
    pub hog: tokio::sync::Semaphore,
    pub tally: Mutex<Tally>,
}

/// What the acts came to.
#[derive(Default, Debug)]
pub struct Tally {
    pub acts: u64,
    pub named: BTreeMap<String, u64>,
    pub unnamed: Vec<String>,
}

/// What one stream, connection or answer came to.
enum Outcome {
    Named(String),
    Unnamed(String),
}

use Outcome::{Named, Unnamed};

fn named(s: &str) -> Outcome {
    Named(s.to_owned())
}

fn of_response(r: &Response) -> Outcome {
    match r {
        Response::Error(e) => named(e.name()),
        _ => named("Answered"),
    }
}

fn of_conn(e: &quinn::ConnectionError) -> Outcome {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => {
            let code = u64::from(c.error_code);
            match CLOSES.contains(&code) {
                true => Named(format!("Closed.{code}")),
                false => Unnamed(format!("closed with code {code}: {c}")),
            }
        }
        quinn::ConnectionError::LocallyClosed => named("ClosedHere"),
        // The primary closed the connection and forgot it, and its close
        // was lost (a flood drops datagrams): the next packet meets the
        // stateless reset the protocol documents. The primary runs all
        // along, so it closed it.
        quinn::ConnectionError::Reset => named("StatelessReset"),
        // A TLS alert travels as a QUIC crypto error, 0x100 plus the
        // alert: the certificate is not pinned there.
        quinn::ConnectionError::ConnectionClosed(c)
            if (0x100..0x200).contains(&u64::from(c.error_code)) =>
        {
            named("Unpinned")
        }
        other => Unnamed(format!("connection lost: {other}")),
    }
}

fn of_read(e: &quinn::ReadError) -> Outcome {
    match e {
        quinn::ReadError::Reset(code) if RESETS.contains(&u64::from(*code)) => {
            Named(format!("Reset.{code}"))
        }
        quinn::ReadError::ConnectionLost(c) => of_conn(c),
        other => Unnamed(format!("stream read: {other}")),
    }
}

fn of_net(e: &NetError) -> Outcome {
    match e {
        NetError::Read {
            source: quinn::ReadExactError::ReadError(r),
        } => of_read(r),
        NetError::Read {
            source: quinn::ReadExactError::FinishedEarly(_),
        } => named("FinishedEarly"),
        NetError::Write {
            source: quinn::WriteError::Stopped(_),
        } => named("Stopped"),
        NetError::Write {
            source: quinn::WriteError::ConnectionLost(c),
        }
        | NetError::Connection(c) => of_conn(c),
        e if net::refused_by_peer(e) => named("Unpinned"),
        other => Unnamed(format!("{other}")),
    }
}

/// The answer to a stream's request, named, within [`ANSWER_CAP`].
async fn answer(rx: &mut quinn::RecvStream) -> Outcome {
    match tokio::time::timeout(ANSWER_CAP, net::read_msg::<Response>(rx)).await {
        Ok(Ok(Some(r))) => of_response(&r),
        Ok(Ok(None)) => named("Finished"),
        Ok(Err(e)) => of_net(&e),
        Err(_) => Unnamed(format!("no answer within {ANSWER_CAP:?}")),
    }
}

/// The rest of a stream read and dropped, a few pieces at most.
async fn drain(rx: &mut quinn::RecvStream) -> Outcome {
    let read = async {
        let mut left = 8 << 20usize;
        while left > 0 {
            match rx.read_chunk(left, true).await {
                Ok(Some(c)) => left = left.saturating_sub(c.bytes.len()),
                Ok(None) => return named("Read"),
                Err(e) => return of_read(&e),
            }
        }
        named("ReadInPart")
    };
    tokio::time::timeout(ANSWER_CAP, read)
        .await
        .unwrap_or_else(|_| Unnamed("an answer's bytes stopped".into()))
}

/// A connection of `id`, its endpoint alive as long as it is.
struct Conn {
    conn: quinn::Connection,
    _endpoint: quinn::Endpoint,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.conn.close(0u32.into(), b"done");
    }
}

async fn connect(w: &World, id: &Identity) -> Result<Conn, Outcome> {
    let pins = Arc::new(Pins::new().pin(w.primary, Role::Primary));
    let endpoint = net::client(id, pins).map_err(|e| Unnamed(e.to_string()))?;
    match tokio::time::timeout(ANSWER_CAP, net::connect(&endpoint, w.listen)).await {
        Ok(Ok(conn)) => Ok(Conn {
            conn,
            _endpoint: endpoint,
        }),
        Ok(Err(e)) => Err(of_net(&e)),
        Err(_) => Err(Unnamed("no handshake within 30 s".into())),
    }
}

impl Conn {
    /// A stream with `req` written, or what stopped it.
    async fn ask(&self, req: &Request) -> Result<(quinn::SendStream, quinn::RecvStream), Outcome> {
        let (mut tx, rx) = match self.conn.open_bi().await {
            Ok(s) => s,
            Err(e) => return Err(of_conn(&e)),
        };
        net::write_msg(&mut tx, req).await.map_err(|e| of_net(&e))?;
        Ok((tx, rx))
    }
}

/// One act, chosen by `rng`, to its end; its outcomes tallied.
pub async fn act(w: &World, rng: &mut Rng, hog: bool) {
    let pick = if hog { 99 } else { rng.below(100) };
    let name = match pick {
        0..=29 => "valid",
        30..=44 => "edge length",
        45..=52 => "stall",
        53..=57 => "trickle",
        58..=69 => "never read",
        70..=79 => "pipeline",
        80..=89 => "garbage",
        90..=94 => "connections",
        95..=97 => "unpinned",
        _ => "memory hog",
    };
    let acted = tokio::time::timeout(ACT_CAP, async {
        match pick {
            0..=29 => valid(w, rng).await,
            30..=44 => edge_length(w, rng).await,
            45..=52 => stall(w, rng).await,
            53..=57 => trickle(w, rng).await,
            58..=69 => never_read(w, rng).await,
            70..=79 => pipeline(w, rng).await,
            80..=89 => garbage(w, rng).await,
            90..=94 => connections(w, rng).await,
            95..=97 => unpinned(w).await,
            _ => memory_hog(w, rng).await,
        }
    })
    .await;
    let outcomes =
        acted.unwrap_or_else(|_| vec![Unnamed(format!("{name}: the act ran past {ACT_CAP:?}"))]);
    let mut t = w.tally.lock().unwrap_or_else(|e| e.into_inner());
    t.acts += 1;
    for o in outcomes {
        match o {
            Named(n) => *t.named.entry(n).or_default() += 1,
            Unnamed(why) if t.unnamed.len() < 50 => t.unnamed.push(format!("{name}: {why}")),
            Unnamed(_) => {}
        }
    }
}

/// A pinned identity: read, write or admin.
fn pinned<'a>(w: &'a World, rng: &mut Rng) -> &'a Identity {
    &w.ids[rng.below(3) as usize]
}

/// A request the protocol takes, well formed, from any pinned role.
async fn valid(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let conn = match connect(w, pinned(w, rng)).await {
        Ok(c) => c,
        Err(o) => return vec![o],
    };
    let head = w.head.load(Ordering::Relaxed);
    let (req, body) = match rng.below(8) {
        0 => (Request::Status, Vec::new()),
        1 => {
            let blob = rng.some_bytes(4096);
            let req = Request::Append {
                kind: 0x8000 + rng.below(16) as u16,
                meta: b"valid".to_vec(),
                blob_len: blob.len() as u64,
                durability: Durability::Local,
                once: None,
            };
            (req, blob)
        }
        2 => (
            Request::Read {
                seq: rng.below(head + 5),
            },
            Vec::new(),
        ),
        3 => (Request::GetDoc { name: "doc".into() }, Vec::new()),
        4 => (Request::Refs { repo: "r".into() }, Vec::new()),
        5 => (Request::ListDocs, Vec::new()),
        6 => (
            Request::Have {
                repo: "r".into(),
                oids: (0..10).map(|_| [rng.next() as u8; 20]).collect(),
            },
            Vec::new(),
        ),
        _ => (
            Request::Tail {
                from: head.saturating_sub(2).max(1),
            },
            Vec::new(),
        ),
    };
    let tail = matches!(req, Request::Tail { .. });
    let (mut tx, mut rx) = match conn.ask(&req).await {
        Ok(s) => s,
        Err(o) => return vec![o],
    };
    if !body.is_empty() {
        if let Err(e) = tx.write_all(&body).await {
            return vec![of_net(&NetError::from(e))];
        }
    }
    let _ = tx.finish();
    let first = answer(&mut rx).await;
    if tail {
        // A tail's next frames, if they come soon; then it is dropped.
        let _ = tokio::time::timeout(Duration::from_secs(1), drain(&mut rx)).await;
        return vec![first];
    }
    vec![first, drain(&mut rx).await]
}

/// A body-carrying request announcing an edge length, its body exact,
/// short or long.
async fn edge_length(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let conn = match connect(w, pinned(w, rng)).await {
        Ok(c) => c,
        Err(o) => return vec![o],
    };
    let len = *rng.pick(&EDGES);
    let n = rng.next();
    let req = match rng.below(4) {
        0 => Request::Append {
            kind: 0x8000,
            meta: Vec::new(),
            blob_len: len,
            durability: Durability::Local,
            once: None,
        },
        1 => Request::PutDoc {
            name: format!("edge{}", n % 8),
            len,
            durability: Durability::Local,
        },
        2 => Request::LfsPut {
            repo: "r".into(),
            oid: [n as u8; 32],
            len,
            durability: Durability::Local,
        },
        _ => Request::Push {
            repo: "r".into(),
            pack_len: len,
            updates: vec![RefMove {
                name: format!("refs/heads/edge{}", n % 8),
                old: None,
                new: Some([n as u8; 20]),
            }],
            durability: Durability::Local,
        },
    };
    let (mut tx, mut rx) = match conn.ask(&req).await {
        Ok(s) => s,
        Err(o) => return vec![o],
    };
    // Exact when small, else a few bytes; short or long by a few.
    let sent = match rng.below(3) {
        0 if len <= 1 << 16 => len,
        1 => len.min(1000) / 2,
        _ => len.min(1000) + 16,
    };
    let _ = tx.write_all(&rng.bytes(sent as usize)).await;
    let _ = tx.finish();
    vec![answer(&mut rx).await]
}

/// An append of `blob_len` bytes announced by `id` on a connection of its
/// own, its request written and its body not.
async fn announce(
    w: &World,
    id: &Identity,
    meta: &[u8],
    blob_len: u64,
) -> Result<(Conn, quinn::SendStream, quinn::RecvStream), Outcome> {
    let conn = connect(w, id).await?;
    let req = Request::Append {
        kind: 0x8000,
        meta: meta.to_vec(),
        blob_len,
        durability: Durability::Local,
        once: None,
    };
    let (tx, rx) = conn.ask(&req).await?;
    Ok((conn, tx, rx))
}

/// An append that stops sending a third of the way in, at most.
async fn stall(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let (_conn, mut tx, mut rx) = match announce(w, &w.ids[1], b"stalled", 2 << 20).await {
        Ok(s) => s,
        Err(o) => return vec![o],
    };
    let _ = tx.write_all(&rng.some_bytes(700_000)).await;
    vec![answer(&mut rx).await]
}

/// An append whose body comes a byte at a time, quick enough for every
/// piece deadline.
async fn trickle(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let id = &w.ids[1 + rng.below(2) as usize];
    let (_conn, mut tx, mut rx) = match announce(w, id, b"trickled", 300 << 10).await {
        Ok(s) => s,
        Err(o) => return vec![o],
    };
    let drip = tokio::spawn(async move {
        while tx.write_all(&[7]).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let got = answer(&mut rx).await;
    drip.abort();
    vec![got]
}

/// A large answer asked for and never read, held a while, dropped.
async fn never_read(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let conn = match connect(w, pinned(w, rng)).await {
        Ok(c) => c,
        Err(o) => return vec![o],
    };
    let mut held = Vec::new();
    for _ in 0..1 + rng.below(8) {
        let req = match rng.below(3) {
            0 => Request::GetDoc { name: "big".into() },
            1 => Request::Read { seq: w.big_seq },
            _ => Request::LfsGet {
                repo: "r".into(),
                oid: w.big_lfs,
            },
        };
        match conn.ask(&req).await {
            Ok(s) => held.push(s),
            Err(o) => return vec![o],
        }
    }
    tokio::time::sleep(Duration::from_millis(500 + rng.below(2000))).await;
    vec![named("Abandoned")]
}

/// A pipeline: appends (refused by role for a reader), then broken
/// framing, an id 0, a request it does not take, or the stream dropped.
async fn pipeline(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let conn = match connect(w, pinned(w, rng)).await {
        Ok(c) => c,
        Err(o) => return vec![o],
    };
    let (mut tx, mut rx) = match conn.ask(&Request::Pipeline).await {
        Ok(s) => s,
        Err(o) => return vec![o],
    };
    let mut out = vec![answer(&mut rx).await];
    let n = 1 + rng.below(5);
    for id in 1..=n {
        let blob = rng.some_bytes(2000);
        let piped = Piped {
            id,
            req: Request::Append {
                kind: 0x8000,
                meta: Vec::new(),
                blob_len: blob.len() as u64,
                durability: Durability::Local,
                once: None,
            },
        };
        if net::write_msg(&mut tx, &piped).await.is_err() || tx.write_all(&blob).await.is_err() {
            break;
        }
    }
    let ending = match rng.below(4) {
        0 => vec![0, 0, 0x01],
        1 => twinlog::repl::msg::encode(&Piped {
            id: 0,
            req: Request::Status,
        }),
        2 => twinlog::repl::msg::encode(&Piped {
            id: n + 1,
            req: Request::ListRepos,
        }),
        _ => return vec![named("Abandoned")],
    };
    let _ = tx.write_all(&ending).await;
    let _ = tx.finish();
    let answers = async {
        loop {
            match net::read_msg::<PipedAnswer>(&mut rx).await {
                Ok(Some(a)) => out.push(of_response(&a.resp)),
                Ok(None) => break,
                Err(e) => {
                    out.push(of_net(&e));
                    break;
                }
            }
        }
        out
    };
    tokio::time::timeout(ANSWER_CAP, answers)
        .await
        .unwrap_or_else(|_| vec![Unnamed("a pipeline did not end".into())])
}

/// Bytes that do not decode as a request, finished or left hanging.
async fn garbage(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let conn = match connect(w, pinned(w, rng)).await {
        Ok(c) => c,
        Err(o) => return vec![o],
    };
    let (mut tx, mut rx) = match conn.conn.open_bi().await {
        Ok(s) => s,
        Err(e) => return vec![of_conn(&e)],
    };
    let bytes = match rng.below(4) {
        0 => rng.some_bytes(200),
        1 => vec![0xff, 0xff, 0xff, 0xff],
        2 => [&[3u8, 0, 0, 0][..], &[0xfe, 0xff, 0xff]].concat(),
        _ => [&[40u8, 0, 0, 0][..], &rng.bytes(10)].concat(),
    };
    let _ = tx.write_all(&bytes).await;
    if rng.below(2) == 0 {
        let _ = tx.finish();
    }
    vec![answer(&mut rx).await]
}

/// A burst of connections of one client, each asking its status.
async fn connections(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let id = pinned(w, rng);
    let mut held = Vec::new();
    let mut out = Vec::new();
    for _ in 0..6 {
        match connect(w, id).await {
            Ok(c) => {
                match c.ask(&Request::Status).await {
                    Ok((_, mut rx)) => out.push(answer(&mut rx).await),
                    Err(o) => out.push(o),
                }
                held.push(c);
            }
            Err(o) => out.push(o),
        }
    }
    out
}

/// A certificate no one pinned.
async fn unpinned(w: &World) -> Vec<Outcome> {
    match connect(w, &w.ids[3]).await {
        Ok(c) => match c.ask(&Request::Status).await {
            Ok((_, mut rx)) => vec![answer(&mut rx).await],
            Err(o) => vec![o],
        },
        Err(o) => vec![o],
    }
}

/// Documents of 16 MiB announced on 96 streams at once, each body sent
/// but its last byte: memory the budget must hold back.
async fn memory_hog(w: &World, rng: &mut Rng) -> Vec<Outcome> {
    let Ok(_one) = w.hog.try_acquire() else {
        return vec![named("HogBusy")];
    };
    let (mut conns, mut streams, mut out) = (Vec::new(), Vec::new(), Vec::new());
    // Every request first, then the bodies: a body in flight takes the
    // connection's window, which a request behind it would wait for.
    for c in 0..3 {
        let conn = match connect(w, &w.ids[1]).await {
            Ok(conn) => conn,
            Err(o) => {
                out.push(o);
                continue;
            }
        };
        for s in 0..32 {
            let req = Request::PutDoc {
                name: format!("hog{c}-{s}"),
                len: 16 << 20,
                durability: Durability::Local,
            };
            match conn.ask(&req).await {
                Ok(st) => streams.push(st),
                Err(o) => {
                    out.push(o);
                    break;
                }
            }
        }
        conns.push(conn);
    }
    let fill = rng.next() as u8;
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|(mut tx, mut rx)| {
            tokio::spawn(async move {
                let body = vec![fill; (16 << 20) - 1];
                let sent = tokio::time::timeout(Duration::from_secs(3), tx.write_all(&body));
                if !matches!(sent.await, Ok(Ok(()))) {
                    // Cut here: the primary sees the body fail.
                    let _ = tx.reset(0u32.into());
                }
                answer(&mut rx).await
            })
        })
        .collect();
    for t in tasks {
        out.push(
            t.await
                .unwrap_or_else(|e| Unnamed(format!("a hog stream: {e}"))),
        );
    }
    out
}
