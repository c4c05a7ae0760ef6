//! The client protocol: one bidirectional QUIC stream per request, a
//! length-prefixed postcard [`Request`], the request's blob bytes if it has
//! any, then a [`Response`] (and a frame's blob bytes after
//! `Response::Frame`); or one long-lived stream carrying many small
//! requests, each [`Piped`] with an id and answered by it
//! ([`Request::Pipeline`]). Documented in `docs/PROTOCOL.md`.

use serde::{Deserialize, Serialize};

/// How durable an append must be before it is acknowledged, as
/// PostgreSQL's `synchronous_commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Durability {
    /// Durable on the primary.
    Local,
    /// Durable on the primary, and the twin acknowledged a durable head at
    /// or past it.
    Twin,
}

/// What a pinned client may ask, set per fingerprint (`pin-client
/// --role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ClientRole {
    /// Reads, tails, status and the store's reads.
    Read,
    /// Also appends of application kinds and the store's writes: create,
    /// push, large objects, documents.
    Write,
    /// Also erase, retain, store retry and skip, repository deletion, and
    /// raw appends of twinlog's reserved kinds.
    Admin,
}

impl std::fmt::Display for ClientRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClientRole::Read => "read",
            ClientRole::Write => "write",
            ClientRole::Admin => "admin",
        })
    }
}

impl Request {
    /// The least role that may make this request (of a `Seen`, once
    /// split: [`Request::split_seen`]).
    pub fn needs(&self) -> ClientRole {
        match self {
            Request::Seen { .. } => ClientRole::Read,
            Request::Read { .. }
            | Request::Status
            | Request::Tail { .. }
            | Request::Refs { .. }
            | Request::PushHistory { .. }
            | Request::ReadObject { .. }
            | Request::Have { .. }
            | Request::LfsGet { .. }
            | Request::GetDoc { .. }
            | Request::ListRepos
            | Request::ListDocs
            | Request::Pipeline => ClientRole::Read,
            Request::Append { kind, .. } if *kind < crate::log::APP_KIND_FIRST => ClientRole::Admin,
            Request::Append { .. }
            | Request::CreateRepo { .. }
            | Request::Push { .. }
            | Request::LfsPut { .. }
            | Request::LfsDelete { .. }
            | Request::PutDoc { .. }
            | Request::DeleteDoc { .. } => ClientRole::Write,
            Request::Erase { .. }
            | Request::EraseBeforeTime { .. }
            | Request::RetainFrom { .. }
            | Request::StoreRetry
            | Request::StoreSkip { .. }
            | Request::Fence { .. }
            | Request::Switchover { .. }
            | Request::Verify { .. }
            | Request::DeleteRepo { .. } => ClientRole::Admin,
        }
    }

    /// The durability a writing request asks for; `None` for a request
    /// that appends no frame.
    pub fn durability(&self) -> Option<Durability> {
        match self {
            Request::Seen { .. } => None,
            Request::Append { durability, .. }
            | Request::CreateRepo { durability, .. }
            | Request::Push { durability, .. }
            | Request::Erase { durability, .. }
            | Request::EraseBeforeTime { durability, .. }
            | Request::LfsPut { durability, .. }
            | Request::LfsDelete { durability, .. }
            | Request::PutDoc { durability, .. }
            | Request::DeleteRepo { durability, .. }
            | Request::DeleteDoc { durability, .. }
            | Request::StoreSkip { durability, .. } => Some(*durability),
            _ => None,
        }
    }

    /// The epoch a [`Request::Seen`] names, and the request inside it;
    /// any other request as it is, with no epoch. A `Seen` inside a
    /// `Seen` is a bad request.
    pub fn split_seen(self) -> Result<(Option<u64>, Request), ApiError> {
        match self {
            Request::Seen { epoch, req } => match postcard::from_bytes::<Request>(&req) {
                Ok(Request::Seen { .. }) => Err(ApiError::BadRequest(
                    "a Seen request inside a Seen request".into(),
                )),
                Ok(inner) => Ok((Some(epoch), inner)),
                Err(e) => Err(ApiError::BadRequest(format!(
                    "the request inside a Seen request did not decode: {e}"
                ))),
            },
            req => Ok((None, req)),
        }
    }

    /// `req` sent by a client that has seen epoch `epoch`.
    pub fn seen(epoch: u64, req: &Request) -> Request {
        Request::Seen {
            epoch,
            // Encoding an in-memory request into a Vec cannot fail.
            req: postcard::to_allocvec(req).unwrap_or_default(),
        }
    }

    /// The bytes that follow the request on its stream.
    pub fn body_len(&self) -> u64 {
        match self {
            Request::Seen { .. } => 0,
            Request::Append { blob_len: len, .. }
            | Request::Push { pack_len: len, .. }
            | Request::LfsPut { len, .. }
            | Request::PutDoc { len, .. } => *len,
            _ => 0,
        }
    }
}

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Append a frame; `blob_len` bytes follow the request on the stream.
    /// With `once`, an application frame is appended at most once under
    /// its id: a retry of an append already in the log is answered with
    /// that frame's sequence, and nothing is written.
    Append {
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        durability: Durability,
        once: Option<AppendOnce>,
    },
    /// Read one frame.
    Read { seq: u64 },
    /// The primary's state.
    Status,
    /// Frames from `from` on, each as it becomes durable, until the client
    /// closes the stream: a `Response::Frame` and its blob per frame.
    Tail { from: u64 },
    /// Create a repository in the store.
    CreateRepo {
        repo: String,
        durability: Durability,
    },
    /// A push: `pack_len` bytes of objects follow (a Pack frame's blob,
    /// docs/FORMAT.md), then the ref updates apply, each from where the ref
    /// is now. Either part may be empty, not both.
    Push {
        repo: String,
        pack_len: u64,
        updates: Vec<RefMove>,
        durability: Durability,
    },
    /// A repository's current refs: `Response::Listing` of [`RefsListing`].
    Refs { repo: String },
    /// A repository's pushes: `Response::Listing` of [`HistoryListing`].
    PushHistory { repo: String },
    /// One object: `Response::Object` and its bytes, or `Response::Absent`.
    ReadObject { repo: String, oid: [u8; 20] },
    /// Which of these objects the repository holds (at most [`MAX_HAVE`]).
    Have { repo: String, oids: Vec<[u8; 20]> },
    /// Erase the data frames of `repos` before `before`, on both boxes: an
    /// Erase frame, carried out on each box's log and store. `Appended`.
    Erase {
        before: u64,
        repos: Vec<String>,
        durability: Durability,
    },
    /// Drop the whole segments below `seq` by hand (after closing the open
    /// one). Past the twin's position only with `force`. `Retained`.
    RetainFrom { seq: u64, force: bool },
    /// Put a large object: `len` bytes follow, which must hash (SHA-256)
    /// to `oid`. `Appended`.
    LfsPut {
        repo: String,
        oid: [u8; 32],
        len: u64,
        durability: Durability,
    },
    /// A large object: `Object` (type 0) and its bytes, or `Absent`.
    LfsGet { repo: String, oid: [u8; 32] },
    /// Delete a large object. `Appended`.
    LfsDelete {
        repo: String,
        oid: [u8; 32],
        durability: Durability,
    },
    /// Write a control document: `len` bytes (at most 16 MiB) follow.
    /// `Appended`.
    PutDoc {
        name: String,
        len: u64,
        durability: Durability,
    },
    /// A control document: `Object` (type 0) and its bytes, or `Absent`.
    GetDoc { name: String },
    /// Try the store again now, where it stopped at a frame that did not
    /// apply. `Store`.
    StoreRetry,
    /// Skip frame `seq`, where the store stopped, on both boxes: a
    /// StoreSkip frame is appended and each box's store records the skip.
    /// Refused unless this store is stopped at `seq` and the twin's store
    /// is stopped there too or has not reached it (`force` skips that
    /// check). `Appended`.
    StoreSkip {
        seq: u64,
        reason: String,
        force: bool,
        durability: Durability,
    },
    /// `Erase`, of the frames written before a time (ms since the Unix
    /// epoch), to a segment's precision: the frames of every segment last
    /// written before it. `Erased` names the sequence it became.
    EraseBeforeTime {
        before_unix_ms: u64,
        repos: Vec<String>,
        durability: Durability,
    },
    /// The repositories' names, sorted: `Listing` of `[string]`.
    ListRepos,
    /// Delete a repository from the store (a RepoStore Purge frame);
    /// `NoRepo` when there is none. `Appended`.
    DeleteRepo {
        repo: String,
        durability: Durability,
    },
    /// The control documents' names, sorted: `Listing` of `[string]`.
    ListDocs,
    /// Delete a control document (a DocDelete frame); `NoDoc` when there is
    /// none. `Appended`.
    DeleteDoc {
        name: String,
        durability: Durability,
    },
    /// Hold this primary: from then on, durably, it acknowledges no write,
    /// until it rejoins or is unfenced. `epoch` (0: none) is a note; no
    /// box proved it, so it is told to nobody. `Status`.
    Fence { epoch: u64 },
    /// Hand the primary role to the twin: stop taking writes, wait (at
    /// most `wait_ms`) until the twin holds the head, have it promote
    /// itself, fence this box and follow the new primary as its twin.
    /// `SwitchedOver`, or `SwitchoverRefused` with writes taken again.
    Switchover { wait_ms: u64 },
    /// Make this stream a pipeline: `Pipelining` answers, then the client
    /// sends [`Piped`] requests one after another, each `Append` followed
    /// by its blob, and the primary answers each by its id
    /// ([`PipedAnswer`]) as it completes, in any order. Only `Append` and
    /// `Status` are taken there; a blob past [`PIPED_BODY_MAX`] streams
    /// into the log before the next request is read.
    Pipeline,
    /// Compare the twin's frames `from..=through` with this primary's, by
    /// digests of ranges (0, 0: every frame both hold): `Verified`.
    Verify {
        from: u64,
        through: u64,
        /// The pace each box digests at (0: the default).
        mib_per_s: u32,
    },
    /// The request whose postcard bytes are `req`, from a client that has
    /// seen epoch `epoch`: a primary of an older epoch refuses it
    /// (`NotPrimary` when it knows the newer primary, else `StaleEpoch`)
    /// and does nothing. Bytes, not a nested `Request`, so that decoding
    /// never recurses: one request may not wrap another, and a `Seen`
    /// inside is refused. Build it with [`Request::seen`].
    Seen { epoch: u64, req: Vec<u8> },
}

/// An append's id, so that it is written at most once however often it is
/// sent: the client's 16 random bytes and its sequence among the client's
/// appends. `after` is a sequence the log held before the append was
/// first sent (the highest this primary life answered the client, or its
/// head when the client connected): the frame, if written, is past it,
/// so a primary whose record of ids reaches back that far can tell a
/// retry of a lost answer from an append never received. One that cannot
/// refuses it by name (`RetryUnresolved`) rather than risk a second copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendOnce {
    pub client: [u8; 16],
    pub seq: u64,
    pub after: u64,
}

impl AppendOnce {
    /// The id the log stores with the frame.
    pub fn id(&self) -> crate::log::once::AppendId {
        crate::log::once::AppendId {
            client: self.client,
            seq: self.seq,
        }
    }
}

/// A request on a pipeline, named by the client's `id` (not 0).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piped {
    pub id: u64,
    pub req: Request,
}

/// [`Piped`] as a client sends it, encoded the same, without a copy of
/// the request (a call sent again on a new pipeline still has it).
#[derive(Serialize)]
pub(crate) struct PipedRef<'a> {
    pub id: u64,
    pub req: &'a Request,
}

/// The answer to the piped request `id`. Id 0 answers the pipeline
/// itself: an error that ends it (a request that did not decode, or whose
/// body could not be read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipedAnswer {
    pub id: u64,
    pub resp: Response,
}

/// The largest blob a piped `Append` is held whole with, the next request
/// read at once; a larger one streams into the log first. Other requests
/// announcing a larger body end the pipeline.
pub const PIPED_BODY_MAX: u64 = 1 << 20;

/// The most oids one `Have` asks about: the request stays well inside a
/// control message.
pub const MAX_HAVE: usize = 2048;
/// The largest listing a `Response::Listing` announces.
pub const MAX_LISTING: u64 = 64 << 20;

/// A ref moved by a push: created (`old` None), deleted (`new` None) or
/// updated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefMove {
    pub name: String,
    pub old: Option<[u8; 20]>,
    pub new: Option<[u8; 20]>,
}

/// A repository's refs, by name.
pub type RefsListing = Vec<(String, [u8; 20])>;

/// One push as the history lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushRecord {
    pub seq: u64,
    pub at_ms: u64,
    pub updates: Vec<RefMove>,
}

/// A repository's pushes, oldest first.
pub type HistoryListing = Vec<PushRecord>;

/// What the primary answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The frame has its sequence and is as durable as `durability` says.
    /// `twin_wait_us` is how long the primary waited, once the frame was
    /// durable locally, for the twin's acknowledgement (0 for `Local`).
    Appended {
        seq: u64,
        durability: Durability,
        twin_wait_us: u64,
    },
    /// A frame: its blob's `blob_len` bytes follow on the stream.
    Frame {
        seq: u64,
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        payload_crc: u32,
    },
    Status(Box<Status>),
    /// The request was refused or failed; nothing was changed unless the
    /// error says the frame is durable locally.
    Error(ApiError),
    /// A push landed: its frames, as durable as `durability` says.
    Pushed {
        pack_seq: Option<u64>,
        refs_seq: Option<u64>,
        objects: u64,
        durability: Durability,
        twin_wait_us: u64,
    },
    /// `len` bytes of a postcard-encoded listing follow.
    Listing {
        len: u64,
    },
    /// An object: its type (git's number) and its `len` bytes follow.
    Object {
        obj_type: u8,
        len: u64,
    },
    /// The object is not in the repository.
    Absent,
    /// `Have`'s answer, one per oid asked.
    Have(Vec<bool>),
    /// The log now retains from `first`.
    Retained {
        first: u64,
    },
    /// The store's health after a retry.
    Store(crate::repl::StoreHealth),
    /// An erase: its frame at `seq`, as durable and carried out as
    /// `durability` says, of the frames before `before`; `frames` data
    /// frames of `bytes` bytes were erased in this box's log.
    Erased {
        seq: u64,
        durability: Durability,
        twin_wait_us: u64,
        before: u64,
        frames: u64,
        bytes: u64,
    },
    /// A switchover: the twin is the primary of `epoch` at `primary`,
    /// holding every frame through `head`; this box follows it.
    SwitchedOver {
        epoch: u64,
        head: u64,
        primary: NewPrimary,
    },
    /// The stream is a pipeline: at most `in_flight` piped requests, and
    /// `body_bytes` bytes of their blobs, are taken at once per
    /// connection; past them the primary reads no further until it has
    /// answered some.
    Pipelining {
        in_flight: u32,
        body_bytes: u64,
    },
    /// What a verify found.
    Verified(crate::node::verify::VerifyReport),
}

/// A request's failure, by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApiError {
    /// The write was not taken, by name (follower, poisoned, too large,
    /// disk full, ...): nothing of it was written.
    #[error("refused: {0}")]
    Refused(super::refusal::WriteRefusal),
    /// The frame is durable on the primary at `seq`, but the twin did not
    /// acknowledge it within the policy's timeout.
    #[error("frame {seq} is durable locally; the twin did not acknowledge it in time")]
    TwinTimeout { seq: u64 },
    /// Past the head, below the retention floor, or unreadable.
    #[error("read: {0}")]
    Read(super::refusal::ReadRefusal),
    /// A request this peer's role may not make.
    #[error("not allowed for this peer: {0}")]
    Forbidden(String),
    /// The request did not decode or its bytes ran short.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// No such repository.
    #[error("no repository {0:?}")]
    NoRepo(String),
    /// The repository exists already.
    #[error("repository {0:?} exists")]
    RepoExists(String),
    /// A ref is not where the push said it was: nothing was written.
    #[error("ref {name} is at {current}, the push expected {expected}")]
    RefMoved {
        name: String,
        expected: String,
        current: String,
    },
    /// A push whose pack or updates do not check: nothing was written.
    #[error("push refused: {0}")]
    BadPush(String),
    /// The store failed or refused otherwise.
    #[error("store: {0}")]
    Store(String),
    /// The frame is durable on the primary at `seq`, but the twin installed
    /// a snapshot taken past it and will never hold it.
    #[error("frame {seq} is durable locally; the twin restarted from a snapshot past it and does not hold it")]
    NotOnTwin { seq: u64 },
    /// The store is stopped at frame `seq`, which does not apply: nothing
    /// was written. `status` shows it; `store retry` or `store skip`.
    #[error("the store is stopped at frame {seq}, which does not apply ({why}); nothing was written: see `status`, then `store retry` or `store skip`")]
    StoreStalled { seq: u64, why: String },
    /// The frame is durable in the log at `seq`, and the store has not
    /// applied it: it will once it can, on both boxes.
    #[error("frame {seq} is durable in the log, and the store has not applied it yet ({why}): see `status`")]
    NotApplied { seq: u64, why: String },
    /// A skip refused: the store is not stopped at `seq`, or the twin's
    /// store applied it (the boxes would differ).
    #[error("skip of frame {seq} refused: {why}")]
    SkipRefused { seq: u64, why: String },
    /// No such control document.
    #[error("no document {0:?}")]
    NoDoc(String),
    /// The erase at `seq` is durable on both boxes and carried out on the
    /// primary; the twin's store has not carried it out (yet): it will
    /// when its store applies the frame.
    #[error("the erase at {seq} is carried out on the primary, not yet on the twin: {why}")]
    NotCarriedOutOnTwin { seq: u64, why: String },
    /// A box of a newer epoch exists: this primary was superseded and
    /// acknowledges no write. Nothing was written, or, when `seq` is set,
    /// that frame was appended here before the fence and is not
    /// acknowledged (it is cut when this box rejoins).
    #[error("this primary is fenced: {}{}. {}", fenced_why(*.epoch, *.newer, by), seq.map(|s| format!(" (frame {s} is in this log, unacknowledged)")).unwrap_or_default(), match primary { Some(p) => format!("The primary is now {} (fingerprint {})", p.addr, p.fingerprint), None => "Write to the new primary; rejoin this box as its twin with `primary rejoin`".into() })]
    Fenced {
        epoch: u64,
        newer: u64,
        by: String,
        seq: Option<u64>,
        /// Where the new primary serves, when this box knows (after a
        /// switchover).
        primary: Option<NewPrimary>,
    },
    /// The client sent no byte of a request's body for `after_ms`: the
    /// request was cut off and nothing of it was written.
    #[error("the body stalled: {received} of {expected} bytes arrived, then nothing for {after_ms} ms; nothing was written")]
    BodyStalled {
        received: u64,
        expected: u64,
        after_ms: u64,
    },
    /// A switchover did not happen: the primary takes writes again.
    #[error("switchover refused: {why}; this box is still the primary")]
    SwitchoverRefused { why: String },
    /// `twin` durability asked of a primary with no twin pinned: nothing
    /// was written.
    #[error("no twin is configured on this primary, so nothing can be durable on it: nothing was written. Append with `--durability local`, or pin a twin (`primary pin-twin`) and restart")]
    NoTwin,
    /// The client sent fewer than `min_bytes` of a request's body in
    /// `after_ms`, the least rate a body must keep: the request was cut
    /// off and nothing of it was written.
    #[error("the body came too slowly: {received} of {expected} bytes arrived, fewer than {min_bytes} in the last {after_ms} ms; nothing was written")]
    BodyTooSlow {
        received: u64,
        expected: u64,
        min_bytes: u64,
        after_ms: u64,
    },
    /// Under automatic failover, this primary holds no unexpired lease
    /// from the arbiter, so it acknowledges nothing: its lease ran out on
    /// its own clock, etcd said it is gone, or it has not taken one yet.
    /// `seq`: a frame appended here before it, unacknowledged.
    #[error("this primary holds no lease from the arbiter ({why}), so it acknowledges nothing{}. The arbiter names the primary", seq.map(|s| format!(" (frame {s} is in this log, unacknowledged)")).unwrap_or_default())]
    NoLease { why: String, seq: Option<u64> },
    /// A `twin` append the twin did not acknowledge in time, under
    /// `fallback`: it would be answered `local`, but "not in sync" could
    /// not be recorded in the arbiter first, so it is not acknowledged.
    #[error("frame {seq} is durable locally; the twin did not acknowledge it in time, and the arbiter could not be told the twin is behind ({why}), so it is not acknowledged")]
    SyncNotRecorded { seq: u64, why: String },
    /// This box is not the primary: the primary of epoch `epoch` serves at
    /// `addr` with certificate `fingerprint`. Nothing was done.
    #[error("this box is not the primary: the primary of epoch {} serves at {addr} (fingerprint {fingerprint}); nothing was done", crate::repl::epochs::EpochName(*.epoch))]
    NotPrimary {
        epoch: u64,
        addr: String,
        fingerprint: String,
    },
    /// The client has seen epoch `seen`, newer than this primary's
    /// `epoch`: this box was superseded, whether or not it knows it yet.
    /// Nothing was done.
    #[error("the client has seen epoch {}, and this primary serves epoch {}: it was superseded; nothing was done", crate::repl::epochs::EpochName(*.seen), crate::repl::epochs::EpochName(*.epoch))]
    StaleEpoch { epoch: u64, seen: u64 },
    /// A retry of an append whose original, if written, would be at or
    /// before `horizon - 1` (past `after`), where this primary keeps no
    /// record of appends' ids any more: it cannot tell whether it is in
    /// the log, so it is not written again. Nothing was written; read the
    /// log past `after` to find it.
    #[error("append {client_seq} is a retry this primary cannot resolve: it keeps appends' ids from frame {horizon} on, and the append, if written, is past frame {after}; nothing was written (read the log past {after} to find it)")]
    RetryUnresolved {
        client_seq: u64,
        after: u64,
        horizon: u64,
    },
}

impl ApiError {
    /// The error's name, as the metrics count it; a write or read
    /// refusal's names its kind too (`Refused.TooLarge`).
    pub fn name(&self) -> &'static str {
        match self {
            ApiError::Refused(w) => w.name(),
            ApiError::Read(r) => r.name(),
            ApiError::TwinTimeout { .. } => "TwinTimeout",
            ApiError::Forbidden(_) => "Forbidden",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::NoRepo(_) => "NoRepo",
            ApiError::RepoExists(_) => "RepoExists",
            ApiError::RefMoved { .. } => "RefMoved",
            ApiError::BadPush(_) => "BadPush",
            ApiError::Store(_) => "Store",
            ApiError::NotOnTwin { .. } => "NotOnTwin",
            ApiError::StoreStalled { .. } => "StoreStalled",
            ApiError::NotApplied { .. } => "NotApplied",
            ApiError::SkipRefused { .. } => "SkipRefused",
            ApiError::NoDoc(_) => "NoDoc",
            ApiError::NotCarriedOutOnTwin { .. } => "NotCarriedOutOnTwin",
            ApiError::Fenced { .. } => "Fenced",
            ApiError::BodyStalled { .. } => "BodyStalled",
            ApiError::SwitchoverRefused { .. } => "SwitchoverRefused",
            ApiError::NoTwin => "NoTwin",
            ApiError::BodyTooSlow { .. } => "BodyTooSlow",
            ApiError::NoLease { .. } => "NoLease",
            ApiError::SyncNotRecorded { .. } => "SyncNotRecorded",
            ApiError::NotPrimary { .. } => "NotPrimary",
            ApiError::StaleEpoch { .. } => "StaleEpoch",
            ApiError::RetryUnresolved { .. } => "RetryUnresolved",
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> ApiError {
        use crate::store::StoreError as E;
        match e {
            E::NoRepo(r) => ApiError::NoRepo(r),
            E::NoDoc(d) => ApiError::NoDoc(d),
            E::RepoExists(r) => ApiError::RepoExists(r),
            E::RefMoved {
                name,
                expected,
                current,
            } => ApiError::RefMoved {
                name,
                expected,
                current,
            },
            E::BadPush(why) => ApiError::BadPush(why),
            E::BadFrame { why, .. } => ApiError::BadPush(why),
            E::BadName { name, why } => ApiError::BadRequest(format!("{name:?}: {why}")),
            E::TooLarge { .. } => ApiError::BadPush(e.to_string()),
            E::Log(l) => ApiError::Refused(l.into()),
            E::Stalled { seq, why } => ApiError::StoreStalled { seq, why },
            E::NotApplied { seq, why } => ApiError::NotApplied { seq, why },
            E::NotStalledAt { seq, .. } => ApiError::SkipRefused {
                seq,
                why: e.to_string(),
            },
            other => ApiError::Store(other.to_string()),
        }
    }
}

pub use super::status::Status;

/// Why a primary is fenced, as its refusals say.
fn fenced_why(epoch: u64, newer: u64, by: &str) -> String {
    use crate::repl::epochs::EpochName;
    if newer > epoch {
        format!(
            "epoch {} exists ({by}) and this box serves epoch {}, so it acknowledges no write",
            EpochName(newer),
            EpochName(epoch)
        )
    } else {
        format!("it is held ({by}), so it acknowledges no write")
    }
}

/// Where the primary is after a switchover.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPrimary {
    /// Its client address (HOST:PORT).
    pub addr: String,
    /// Its certificate fingerprint, to pin.
    pub fingerprint: String,
}

/// What fenced a primary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The newer epoch heard of (the box's own when `held`).
    pub epoch: u64,
    /// Who told of it, or why it is held.
    pub by: String,
    /// Held with no newer epoch named: an operator's fence, or a
    /// switchover whose outcome is not known.
    #[serde(default)]
    pub held: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piped_request_is_encoded_the_same_by_reference() {
        let req = Request::Append {
            kind: 0x8001,
            meta: b"m".to_vec(),
            blob_len: 300,
            durability: Durability::Twin,
            once: None,
        };
        let by_ref = crate::repl::msg::encode(&PipedRef { id: 77, req: &req });
        let owned = crate::repl::msg::encode(&Piped { id: 77, req });
        assert_eq!(by_ref, owned);
    }
}

#[cfg(test)]
mod seen_tests {
    use super::*;

    /// A hostile client's `Seen` nested as deep as a control message
    /// allows: two bytes a level. Decoding it must not recurse once per
    /// level until the stack runs out.
    #[test]
    fn a_seen_nested_a_hundred_thousand_deep_decodes_without_recursing() {
        // Seen's index as postcard writes it, epoch 1, then a length: two
        // or three bytes a level, were each level decoded inside the last.
        let seen = postcard::to_allocvec(&Request::seen(1, &Request::Status)).expect("encode");
        let mut body = seen[..2].repeat(100_000);
        body.push(2); // Status
                      // Whatever these bytes decode to, they decode in one level: with
                      // `req: Box<Request>` this overflowed the stack, and a primary
                      // decoding it would have aborted.
        if let Ok(r) = postcard::from_bytes::<Request>(&body) {
            if let Ok((_, inner)) = r.split_seen() {
                assert!(!matches!(inner, Request::Seen { .. }));
            }
        }
    }

    #[test]
    fn a_seen_request_splits_into_its_epoch_and_request_once() {
        let inner = Request::Read { seq: 7 };
        assert_eq!(
            Request::seen(3, &inner).split_seen(),
            Ok((Some(3), inner.clone()))
        );
        let twice = Request::seen(4, &Request::seen(3, &inner));
        assert!(matches!(twice.split_seen(), Err(ApiError::BadRequest(_))));
        let garbled = Request::Seen {
            epoch: 1,
            req: vec![0xff; 3],
        };
        assert!(matches!(garbled.split_seen(), Err(ApiError::BadRequest(_))));
    }
}
