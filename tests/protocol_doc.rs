//! docs/PROTOCOL.md names each message's variant index: the encoder must
//! put exactly that index first.

use twinlog::repl::msg::encode;
use twinlog::repl::{Position, PrimaryMsg, Refusal, TwinMsg};

fn documented(name: &str) -> u8 {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md"))
        .expect("read PROTOCOL.md");
    let needle = format!("| `{name}` |");
    let row = doc
        .lines()
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("PROTOCOL.md documents {name}"));
    row.trim_start_matches('|')
        .split('|')
        .next()
        .expect("index cell")
        .trim()
        .parse()
        .expect("an index")
}

/// `documented`, looking only in the `table` ("request" or "response")
/// under the heading `section`.
fn documented_in(section: &str, table: &str, name: &str) -> u8 {
    documented_row(section, table, name).0
}

/// The variant index: the first byte after the 4-byte length prefix.
fn index_of(bytes: &[u8]) -> u8 {
    bytes[4]
}

fn word() -> twinlog::repl::amnesia::PeerWord {
    twinlog::repl::amnesia::PeerWord {
        epochs: Default::default(),
        head: 1,
        newest: 0,
        primary: true,
    }
}

#[test]
fn documented_indices_are_the_encoder_s() {
    let twin = [
        (
            "Hello",
            TwinMsg::Hello {
                version: 1,
                history: [0; 16],
                head: Position::default(),
                first: 1,
                epochs: Default::default(),
            },
        ),
        ("Ack", TwinMsg::Ack { durable: 1 }),
        (
            "Store",
            TwinMsg::Store(twinlog::repl::StoreHealth::default()),
        ),
        (
            "Promoted",
            TwinMsg::Promoted {
                epochs: Default::default(),
                listen: "x".into(),
            },
        ),
        ("HandoverRefused", TwinMsg::HandoverRefused("x".into())),
        (
            "Digests",
            TwinMsg::Digests {
                id: 1,
                digests: vec![],
                error: None,
            },
        ),
        ("AskEpochs", TwinMsg::AskEpochs(word())),
    ];
    for (name, m) in twin {
        assert_eq!(index_of(&encode(&m)), documented(name), "{name}");
    }
    let primary = [
        (
            "Welcome",
            PrimaryMsg::Welcome {
                version: 1,
                history: [0; 16],
                from: 1,
                head: 1,
                first: 1,
                epochs: Default::default(),
            },
        ),
        ("BelowFloor", PrimaryMsg::BelowFloor { first: 1, head: 1 }),
        (
            "Heartbeat",
            PrimaryMsg::Heartbeat {
                head: 1,
                unix_ms: 1,
            },
        ),
        (
            "Handover",
            PrimaryMsg::Handover {
                head: 1,
                clients: vec![],
            },
        ),
        (
            "Verify",
            PrimaryMsg::Verify {
                id: 1,
                from: 1,
                through: 1,
                step: 1,
                mib_per_s: 64,
            },
        ),
        ("Epochs", PrimaryMsg::Epochs(word())),
    ];
    for (name, m) in primary {
        assert_eq!(index_of(&encode(&m)), documented(name), "{name}");
    }
    assert_eq!(index_of(&encode(&TwinMsg::Refuse(Refusal::Timeout))), 2);
    assert_eq!(index_of(&encode(&PrimaryMsg::Refuse(Refusal::Timeout))), 3);
    let refusals = [
        ("Version", Refusal::Version { ours: 1, theirs: 2 }),
        (
            "History",
            Refusal::History {
                primary: [0; 16],
                twin: [1; 16],
            },
        ),
        (
            "Diverged",
            Refusal::Diverged {
                seq: 1,
                primary_crc: 1,
                twin_crc: 2,
            },
        ),
        (
            "TwinAhead",
            Refusal::TwinAhead {
                twin_head: 2,
                primary_head: 1,
            },
        ),
        (
            "Gap",
            Refusal::Gap {
                expected: 1,
                got: 2,
            },
        ),
        ("BadFrame", Refusal::BadFrame("x".into())),
        (
            "TooLarge",
            Refusal::TooLarge {
                what: "x".into(),
                len: 2,
                max: 1,
            },
        ),
        ("Protocol", Refusal::Protocol("x".into())),
        ("Timeout", Refusal::Timeout),
        (
            "StaleEpoch",
            Refusal::StaleEpoch {
                primary: 1,
                twin: 2,
            },
        ),
        (
            "Forked",
            Refusal::Forked {
                at: 1,
                twin_head: 2,
                crc: None,
                epoch: 3,
            },
        ),
        ("WriteFailed", Refusal::WriteFailed("x".into())),
        (
            "LostOnPrimary",
            Refusal::LostOnPrimary {
                after: 1,
                twin_head: 2,
                crc: None,
                epochs: Default::default(),
            },
        ),
    ];
    for (name, r) in refusals {
        // A Refuse message: the refusal's index follows the message's.
        assert_eq!(encode(&TwinMsg::Refuse(r))[5], documented(name), "{name}");
    }
}

#[test]
fn documented_client_indices_are_the_encoder_s() {
    use twinlog::node::{ApiError, Durability, Request, Response};
    let requests = [
        (
            "Append",
            Request::Append {
                kind: 1,
                meta: vec![],
                blob_len: 0,
                durability: Durability::Twin,
                once: None,
            },
        ),
        ("Read", Request::Read { seq: 1 }),
        ("Status", Request::Status),
        ("Tail", Request::Tail { from: 1 }),
        (
            "CreateRepo",
            Request::CreateRepo {
                repo: "r".into(),
                durability: Durability::Twin,
            },
        ),
        (
            "Push",
            Request::Push {
                repo: "r".into(),
                pack_len: 0,
                updates: Vec::new(),
                durability: Durability::Twin,
            },
        ),
        ("Refs", Request::Refs { repo: "r".into() }),
        ("PushHistory", Request::PushHistory { repo: "r".into() }),
        (
            "ReadObject",
            Request::ReadObject {
                repo: "r".into(),
                oid: [0; 20],
            },
        ),
        (
            "Have",
            Request::Have {
                repo: "r".into(),
                oids: Vec::new(),
            },
        ),
        (
            "Erase",
            Request::Erase {
                before: 1,
                repos: Vec::new(),
                durability: Durability::Twin,
            },
        ),
        (
            "RetainFrom",
            Request::RetainFrom {
                seq: 1,
                force: false,
            },
        ),
        (
            "LfsPut",
            Request::LfsPut {
                repo: "r".into(),
                oid: [0; 32],
                len: 0,
                durability: Durability::Twin,
            },
        ),
        (
            "LfsGet",
            Request::LfsGet {
                repo: "r".into(),
                oid: [0; 32],
            },
        ),
        (
            "LfsDelete",
            Request::LfsDelete {
                repo: "r".into(),
                oid: [0; 32],
                durability: Durability::Twin,
            },
        ),
        (
            "PutDoc",
            Request::PutDoc {
                name: "d".into(),
                len: 0,
                durability: Durability::Twin,
            },
        ),
        ("GetDoc", Request::GetDoc { name: "d".into() }),
        ("StoreRetry", Request::StoreRetry),
        (
            "StoreSkip",
            Request::StoreSkip {
                seq: 1,
                reason: "r".into(),
                force: false,
                durability: Durability::Twin,
            },
        ),
        (
            "EraseBeforeTime",
            Request::EraseBeforeTime {
                before_unix_ms: 1,
                repos: Vec::new(),
                durability: Durability::Twin,
            },
        ),
        ("ListRepos", Request::ListRepos),
        (
            "DeleteRepo",
            Request::DeleteRepo {
                repo: "r".into(),
                durability: Durability::Twin,
            },
        ),
        ("ListDocs", Request::ListDocs),
        (
            "DeleteDoc",
            Request::DeleteDoc {
                name: "d".into(),
                durability: Durability::Twin,
            },
        ),
        ("Fence", Request::Fence { epoch: 1 }),
        ("Switchover", Request::Switchover { wait_ms: 1 }),
        ("Pipeline", Request::Pipeline),
        (
            "Verify",
            Request::Verify {
                from: 0,
                through: 0,
                mib_per_s: 0,
            },
        ),
        ("Seen", Request::seen(1, &Request::Status)),
    ];
    for (name, r) in requests {
        assert_eq!(
            index_of(&encode(&r)),
            documented_in("Client protocol", "request", name),
            "{name}"
        );
    }
    let responses = [
        (
            "Appended",
            Response::Appended {
                seq: 1,
                durability: Durability::Local,
                twin_wait_us: 0,
            },
        ),
        (
            "Frame",
            Response::Frame {
                seq: 1,
                kind: 1,
                meta: vec![],
                blob_len: 0,
                payload_crc: 0,
            },
        ),
        ("Status", Response::Status(Box::default())),
        ("Error", Response::Error(ApiError::BadRequest("x".into()))),
        (
            "Pushed",
            Response::Pushed {
                pack_seq: None,
                refs_seq: Some(1),
                objects: 0,
                durability: Durability::Twin,
                twin_wait_us: 0,
            },
        ),
        ("Listing", Response::Listing { len: 0 }),
        (
            "Object",
            Response::Object {
                obj_type: 3,
                len: 0,
            },
        ),
        ("Absent", Response::Absent),
        ("Retained", Response::Retained { first: 1 }),
        (
            "Store",
            Response::Store(twinlog::repl::StoreHealth::default()),
        ),
        (
            "Erased",
            Response::Erased {
                seq: 1,
                durability: Durability::Twin,
                twin_wait_us: 0,
                before: 1,
                frames: 0,
                bytes: 0,
            },
        ),
        (
            "SwitchedOver",
            Response::SwitchedOver {
                epoch: 1,
                head: 1,
                primary: Default::default(),
            },
        ),
        (
            "Pipelining",
            Response::Pipelining {
                in_flight: 1,
                body_bytes: 1,
            },
        ),
        ("Verified", Response::Verified(Default::default())),
    ];
    for (name, r) in responses {
        assert_eq!(
            index_of(&encode(&r)),
            documented_in("Client protocol", "response", name),
            "{name}"
        );
    }
    // Durability::Local is 0 and Twin is 1, as documented.
    assert_eq!(encode(&Durability::Local)[4], 0);
    assert_eq!(encode(&Durability::Twin)[4], 1);
}

#[test]
fn snapshot_messages_have_their_documented_indices() {
    use twinlog::node::snapshot_transfer::{SnapshotReq, SnapshotResp};
    use twinlog::store::install::SnapshotBase;
    let reqs = [
        ("Manifest", SnapshotReq::Manifest),
        (
            "File",
            SnapshotReq::File {
                at: 1,
                path: "x".into(),
                offset: 0,
            },
        ),
    ];
    for (name, m) in reqs {
        assert_eq!(index_of(&encode(&m)), documented(name), "{name}");
    }
    let resps = [
        (
            "Manifest",
            SnapshotResp::Manifest {
                base: SnapshotBase {
                    at: 1,
                    crc_at: 0,
                    history: [0; 16],
                },
                len: 0,
            },
        ),
        ("File", SnapshotResp::File { len: 0 }),
        ("Refused", SnapshotResp::Refused("x".into())),
    ];
    for (name, m) in resps {
        assert_eq!(index_of(&encode(&m)), documented(name), "{name}");
    }
}

#[test]
fn restore_messages_have_their_documented_indices_and_extend_the_snapshot_ones() {
    use twinlog::node::restore_serve::{RestoreReq, RestoreResp};
    use twinlog::node::snapshot_transfer::SnapshotReq;
    let reqs = [
        ("Hello", RestoreReq::Hello),
        ("Frames", RestoreReq::Frames { from: 1, offset: 0 }),
        (
            "Digests",
            RestoreReq::Digests {
                from: 1,
                through: 2,
                step: 1,
            },
        ),
    ];
    for (name, m) in reqs {
        assert_eq!(
            index_of(&encode(&m)),
            documented_in("Restore", "request", name),
            "{name}"
        );
    }
    let resps = [
        (
            "Welcome",
            RestoreResp::Welcome {
                history: [0; 16],
                first: 1,
                head: 0,
                head_crc: 0,
                epoch: 0,
                epochs: Default::default(),
            },
        ),
        ("Frames", RestoreResp::Frames { through: 1 }),
        ("Refused", RestoreResp::Refused("x".into())),
        ("Digests", RestoreResp::Digests(vec![[0; 16]])),
    ];
    for (name, m) in resps {
        assert_eq!(
            index_of(&encode(&m)),
            documented_in("Restore", "response", name),
            "{name}"
        );
    }
    assert_eq!(
        encode(&RestoreReq::Manifest),
        encode(&SnapshotReq::Manifest)
    );
    let file = |at, path: &str, offset| (at, path.to_owned(), offset);
    let (at, path, offset) = file(7, "repos/r/archive", 9);
    assert_eq!(
        encode(&RestoreReq::File {
            at,
            path: path.clone(),
            offset
        }),
        encode(&SnapshotReq::File { at, path, offset })
    );
}

/// The index and the field names, in order, of `name`'s row in the table
/// headed `| index | {table} |` under `## {section}`. A newtype's cell
/// (`WriteRefusal`, `string`) gives `None`: its content is one value, not
/// named fields.
fn documented_row(section: &str, table: &str, name: &str) -> (u8, Option<Vec<String>>) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md"))
        .expect("read PROTOCOL.md");
    let section_at = doc
        .find(&format!("## {section}"))
        .unwrap_or_else(|| panic!("PROTOCOL.md has a section {section}"));
    let start = section_at
        + doc[section_at..]
            .find(&format!("| index | {table} |"))
            .unwrap_or_else(|| panic!("{section} has a {table} table"));
    let needle = format!("| `{name}` |");
    let row = doc[start..]
        .lines()
        .take_while(|l| l.starts_with('|'))
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("the {table} table documents {name}"));
    let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
    let index = cells[0].parse().expect("an index");
    if !cells[2].is_empty() && !cells[2].contains(':') {
        return (index, None);
    }
    let fields = cells[2]
        .split(", ")
        .filter_map(|f| f.trim_matches('`').split_once(':'))
        .map(|(n, _)| n.trim().to_owned())
        .collect();
    (index, Some(fields))
}

/// The field names of a struct variant, in the order serde writes them
/// (its declaration order); none for a unit or newtype variant.
fn field_order(v: &impl serde::Serialize) -> Vec<String> {
    let json = serde_json::to_string(v).expect("json");
    // `{"Variant":{"a":1,"b":"x"}}`: the keys at depth two, in order.
    let (mut depth, mut names, mut in_str, mut escaped) = (0, Vec::new(), false, false);
    let mut current = String::new();
    let bytes: Vec<char> = json.chars().collect();
    for (i, &c) in bytes.iter().enumerate() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
                if depth == 2 && bytes.get(i + 1) == Some(&':') {
                    names.push(std::mem::take(&mut current));
                }
                current.clear();
            } else {
                current.push(c);
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
    }
    names
}

/// Every variant's index and field order is the documented one, and the
/// table documents no variant the samples do not have. The samples are the
/// enums' variants in order: a variant added to one gets a new index, which
/// its table must document.
fn check_table<T: serde::Serialize>(table: &str, samples: &[(&str, T)]) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md"))
        .expect("read PROTOCOL.md");
    let at = doc
        .find(&format!("| index | {table} |"))
        .unwrap_or_else(|| panic!("a {table} table"));
    let rows = doc[at..].lines().take_while(|l| l.starts_with('|')).count() - 2;
    assert_eq!(rows, samples.len(), "the {table} table's rows");
    for (i, (name, v)) in samples.iter().enumerate() {
        assert_eq!(
            usize::from(index_of(&encode(v))),
            i,
            "{table} {name}: samples in order"
        );
        let (index, fields) = documented_row("Client protocol", table, name);
        assert_eq!(index_of(&encode(v)), index, "{table} {name}: index");
        if let Some(fields) = fields {
            assert_eq!(field_order(v), fields, "{table} {name}: fields in order");
        }
    }
}

#[test]
fn errors_and_refusals_have_their_documented_indices_and_fields() {
    use twinlog::node::{ApiError as E, ReadRefusal as R, WriteRefusal as W};
    let s = || String::from("x");
    check_table(
        "error",
        &[
            ("Refused", E::Refused(W::Follower)),
            ("TwinTimeout", E::TwinTimeout { seq: 1 }),
            ("Read", E::Read(R::PastHead { seq: 2, head: 1 })),
            ("Forbidden", E::Forbidden(s())),
            ("BadRequest", E::BadRequest(s())),
            ("NoRepo", E::NoRepo(s())),
            ("RepoExists", E::RepoExists(s())),
            (
                "RefMoved",
                E::RefMoved {
                    name: s(),
                    expected: s(),
                    current: s(),
                },
            ),
            ("BadPush", E::BadPush(s())),
            ("Store", E::Store(s())),
            ("NotOnTwin", E::NotOnTwin { seq: 1 }),
            ("StoreStalled", E::StoreStalled { seq: 1, why: s() }),
            ("NotApplied", E::NotApplied { seq: 1, why: s() }),
            ("SkipRefused", E::SkipRefused { seq: 1, why: s() }),
            ("NoDoc", E::NoDoc(s())),
            (
                "NotCarriedOutOnTwin",
                E::NotCarriedOutOnTwin { seq: 1, why: s() },
            ),
            (
                "Fenced",
                E::Fenced {
                    epoch: 1,
                    newer: 2,
                    by: s(),
                    seq: Some(3),
                    primary: Some(Default::default()),
                },
            ),
            (
                "BodyStalled",
                E::BodyStalled {
                    received: 1,
                    expected: 2,
                    after_ms: 3,
                },
            ),
            ("SwitchoverRefused", E::SwitchoverRefused { why: s() }),
            ("NoTwin", E::NoTwin),
            (
                "BodyTooSlow",
                E::BodyTooSlow {
                    received: 1,
                    expected: 2,
                    min_bytes: 3,
                    after_ms: 4,
                },
            ),
            (
                "NoLease",
                E::NoLease {
                    why: "x".into(),
                    seq: Some(1),
                },
            ),
            (
                "SyncNotRecorded",
                E::SyncNotRecorded {
                    seq: 1,
                    why: "x".into(),
                },
            ),
            (
                "NotPrimary",
                E::NotPrimary {
                    epoch: 1,
                    addr: "a".into(),
                    fingerprint: "f".into(),
                },
            ),
            ("StaleEpoch", E::StaleEpoch { epoch: 1, seen: 2 }),
            (
                "RetryUnresolved",
                E::RetryUnresolved {
                    client_seq: 1,
                    after: 2,
                    horizon: 3,
                },
            ),
        ],
    );
    check_table(
        "write refusal",
        &[
            ("Follower", W::Follower),
            ("Poisoned", W::Poisoned { why: s() }),
            ("Released", W::Released),
            (
                "TooLarge",
                W::TooLarge {
                    what: s(),
                    len: 2,
                    max: 1,
                },
            ),
            (
                "BlobLength",
                W::BlobLength {
                    announced: 2,
                    got: 1,
                },
            ),
            ("InvalidKind", W::InvalidKind { kind: 0 }),
            ("BadMeta", W::BadMeta { why: s() }),
            ("NoSpace", W::NoSpace { why: s() }),
            ("Io", W::Io { why: s() }),
            ("TwinNotPast", W::TwinNotPast { seq: 2, twin_at: 1 }),
            ("StoreNotPast", W::StoreNotPast { applied: 1 }),
            ("Staging", W::Staging { why: s() }),
            ("Stopping", W::Stopping { why: s() }),
            ("Log", W::Log { why: s() }),
            ("ArchiveNotPast", W::ArchiveNotPast { archived_below: 5 }),
        ],
    );
    check_table(
        "read refusal",
        &[
            ("BelowFloor", R::BelowFloor { seq: 1, first: 2 }),
            ("PastHead", R::PastHead { seq: 2, head: 1 }),
            ("Unreadable", R::Unreadable { seq: 1, why: s() }),
        ],
    );
}
