//! docs/FORMAT.md is the specification of the bytes on disk: its field
//! tables must name the offsets and lengths the code writes.

use twinlog::log::format::*;

fn table(doc: &str, title: &str) -> Vec<(usize, usize, String)> {
    let start = doc
        .find(&format!("{title}:"))
        .unwrap_or_else(|| panic!("FORMAT.md has no table '{title}'"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            let num = |s: &str| {
                s.parse::<usize>()
                    .unwrap_or_else(|_| panic!("bad number in {row}"))
            };
            (num(cells[0]), num(cells[1]), cells[2].to_string())
        })
        .collect()
}

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/FORMAT.md"))
        .expect("read FORMAT.md")
}

/// Each table row's offset is the previous row's end, and the last row ends
/// at the code's header length.
fn contiguous(rows: &[(usize, usize, String)], total: usize) {
    let mut at = 0;
    for (offset, len, field) in rows {
        assert_eq!(
            *offset, at,
            "field {field} does not follow the previous one"
        );
        at += len;
    }
    assert_eq!(at, total, "the table does not end at the header length");
}

fn offsets(rows: &[(usize, usize, String)]) -> Vec<(String, usize)> {
    rows.iter().map(|(o, _, f)| (f.clone(), *o)).collect()
}

#[test]
fn segment_header_table_matches_the_code() {
    let rows = table(&doc(), "Segment header fields");
    contiguous(&rows, SEGMENT_HEADER_LEN);
    let want = [
        ("magic", SEG_MAGIC_OFFSET),
        ("version", SEG_VERSION_OFFSET),
        ("flags", SEG_FLAGS_OFFSET),
        ("first_seq", SEG_FIRST_SEQ_OFFSET),
        ("history", SEG_HISTORY_OFFSET),
        ("capacity", SEG_CAPACITY_OFFSET),
        ("reserved", SEG_RESERVED_OFFSET),
        ("crc", SEG_CRC_OFFSET),
    ];
    assert_eq!(
        offsets(&rows),
        want.map(|(f, o)| (f.to_string(), o)).to_vec()
    );
    let h = SegmentHeader {
        first_seq: 0x0102_0304_0506_0708,
        history: [0xab; 16],
        capacity: 77,
    };
    let b = h.encode();
    assert_eq!(b[..8], SEGMENT_MAGIC);
    assert_eq!(
        u64::from_le_bytes(b[SEG_FIRST_SEQ_OFFSET..][..8].try_into().expect("8")),
        h.first_seq
    );
    assert_eq!(b[SEG_HISTORY_OFFSET..][..16], [0xab; 16]);
    assert_eq!(
        u64::from_le_bytes(b[SEG_CAPACITY_OFFSET..][..8].try_into().expect("8")),
        77
    );
    assert_eq!(
        u32::from_le_bytes(b[SEG_CRC_OFFSET..][..4].try_into().expect("4")),
        crc32fast::hash(&b[..SEG_CRC_OFFSET])
    );
}

#[test]
fn frame_header_table_matches_the_code() {
    let rows = table(&doc(), "Frame header fields");
    contiguous(&rows, FRAME_HEADER_LEN);
    let want = [
        ("seq", FRAME_SEQ_OFFSET),
        ("kind", FRAME_KIND_OFFSET),
        ("flags", FRAME_FLAGS_OFFSET),
        ("meta_len", FRAME_META_LEN_OFFSET),
        ("blob_len", FRAME_BLOB_LEN_OFFSET),
        ("payload_crc", FRAME_PAYLOAD_CRC_OFFSET),
        ("header_crc", FRAME_HEADER_CRC_OFFSET),
    ];
    assert_eq!(
        offsets(&rows),
        want.map(|(f, o)| (f.to_string(), o)).to_vec()
    );
    let h = FrameHeader {
        seq: 9,
        kind: 0x8001,
        meta_len: 3,
        blob_len: 1 << 40,
        payload_crc: 0x1234_5678,
    };
    let b = h.encode();
    assert_eq!(b[FRAME_SEQ_OFFSET], 9);
    assert_eq!(b[FRAME_KIND_OFFSET..][..2], [0x01, 0x80]);
    assert_eq!(b[FRAME_META_LEN_OFFSET], 3);
    assert_eq!(b[FRAME_BLOB_LEN_OFFSET + 5], 1);
    assert_eq!(b[FRAME_PAYLOAD_CRC_OFFSET..][..4], [0x78, 0x56, 0x34, 0x12]);
    assert_eq!(
        u32::from_le_bytes(b[FRAME_HEADER_CRC_OFFSET..][..4].try_into().expect("4")),
        crc32fast::hash(&b[..FRAME_HEADER_CRC_OFFSET])
    );
    assert_eq!(
        MAX_META_LEN,
        1 << 20,
        "FORMAT.md says meta_len is at most 1 MiB"
    );
}

#[test]
fn index_history_and_restart_tables_match_the_code() {
    let doc = doc();
    let idx = table(&doc, "Index header fields");
    contiguous(&idx, INDEX_HEADER_LEN);
    assert_eq!(
        offsets(&idx),
        vec![
            ("magic".into(), IDX_MAGIC_OFFSET),
            ("first_seq".into(), IDX_FIRST_SEQ_OFFSET)
        ]
    );
    assert_eq!(INDEX_ENTRY_LEN, 8);
    let b = encode_index_header(42);
    assert_eq!(b[..8], INDEX_MAGIC);
    assert_eq!(b[IDX_FIRST_SEQ_OFFSET], 42);

    let history = table(&doc, "History file fields");
    contiguous(&history, HISTORY_FILE_LEN);
    assert_eq!(history[1].0, HISTORY_ID_OFFSET);
    assert_eq!(history[2].0, HISTORY_CRC_OFFSET);
    assert_eq!(
        encode_sealed(&HISTORY_MAGIC, &[7; 16]).len(),
        HISTORY_FILE_LEN
    );

    let restart = table(&doc, "Restart file fields");
    contiguous(&restart, RESTART_FILE_LEN);
    assert_eq!(restart[1].0, RESTART_NEXT_OFFSET);
    assert_eq!(restart[2].0, RESTART_CRC_OFFSET);
    assert_eq!(
        encode_sealed(&RESTART_MAGIC, &5u64.to_le_bytes()).len(),
        RESTART_FILE_LEN
    );
}

#[test]
fn truncate_table_matches_the_code() {
    let rows = table(&doc(), "Truncate file fields");
    contiguous(&rows, TRUNCATE_FILE_LEN);
    assert_eq!(
        offsets(&rows),
        vec![
            ("magic".into(), 0),
            ("head".into(), TRUNCATE_HEAD_OFFSET),
            ("segment".into(), TRUNCATE_SEGMENT_OFFSET),
            ("end".into(), TRUNCATE_END_OFFSET),
            ("crc".into(), TRUNCATE_CRC_OFFSET),
        ]
    );
    assert_eq!(
        encode_sealed(&TRUNCATE_MAGIC, &[0; 24]).len(),
        TRUNCATE_FILE_LEN
    );
}

#[test]
fn documented_magics_and_names_are_the_code_s() {
    let doc = doc();
    for (magic, escaped) in [
        (SEGMENT_MAGIC, r"\x89TWL\r\n\x1a\n"),
        (INDEX_MAGIC, r"\x89TWI\r\n\x1a\n"),
        (HISTORY_MAGIC, r"\x89TWH\r\n\x1a\n"),
        (RESTART_MAGIC, r"\x89TWR\r\n\x1a\n"),
        (TRUNCATE_MAGIC, r"\x89TWT\r\n\x1a\n"),
    ] {
        assert!(doc.contains(escaped), "FORMAT.md names magic {escaped}");
        assert_eq!(magic[0], 0x89);
        assert_eq!(&magic[4..], b"\r\n\x1a\n");
    }
    assert_eq!(segment_name(7), "00000000000000000007.log");
    assert_eq!(index_name(7), "00000000000000000007.idx");
    for name in [LOCK_FILE, HISTORY_FILE, RESTART_FILE, TRUNCATE_FILE] {
        assert!(doc.contains(&format!("`{name}`")), "FORMAT.md names {name}");
    }
}

#[test]
fn documented_kind_values_are_the_code_s() {
    use twinlog::log::Kind;
    let doc = doc();
    for kind in [
        Kind::RepoStore,
        Kind::Pack,
        Kind::Refs,
        Kind::LfsPut,
        Kind::LfsDelete,
        Kind::ControlDoc,
        Kind::Redacted,
        Kind::Erase,
        Kind::Record,
        Kind::StoreSkip,
        Kind::DocDelete,
        Kind::Once,
    ] {
        let name = format!("{kind:?}");
        let row = format!("| {} | {name}", kind.as_u16());
        assert!(doc.contains(&row), "FORMAT.md row '{row}'");
    }
    assert_eq!(twinlog::log::APP_KIND_FIRST, 0x8000);
    let first_reserved = Kind::Once.as_u16() + 1;
    assert!(
        doc.contains(&format!(
            "| {first_reserved}..=0x7fff | reserved for twinlog"
        )),
        "FORMAT.md's reserved range starts past the last named kind"
    );
    assert_eq!(twinlog::log::once::ONCE_PREFIX_LEN, 27);
    assert!(doc.contains("| 27 | .. | the application's meta |"));
}

#[test]
fn archive_record_table_matches_the_code() {
    use twinlog::store::archive::{ARCHIVE_MAGIC, RECORD_HEADER_LEN};
    let d = doc();
    let rows = table(&d, "Archive record fields");
    contiguous(&rows, RECORD_HEADER_LEN as usize);
    let fields: Vec<&str> = rows.iter().map(|(_, _, f)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "seq",
            "body_len",
            "objects",
            "body_crc",
            "kind",
            "header_crc",
            "reserved"
        ]
    );
    assert!(d.contains("89 54 57 50 0D 0A 1A 0A"));
    assert_eq!(ARCHIVE_MAGIC, *b"\x89TWP\r\n\x1a\n");
}

#[test]
fn push_log_envelope_table_matches_the_code() {
    use twinlog::pushlog::{
        encode_frame, Push, RefUpdate, ENVELOPE_LEN, ENV_CRC_OFFSET, ENV_HEADER_CRC_OFFSET,
        ENV_LEN_OFFSET, ENV_MAGIC_OFFSET, ENV_VERSION_OFFSET, FRAME_MAGIC, PUSHLOG_VERSION,
    };
    let d = doc();
    let rows = table(&d, "Push log frame envelope fields");
    contiguous(&rows, ENVELOPE_LEN);
    let want = [
        ("magic", ENV_MAGIC_OFFSET),
        ("version", ENV_VERSION_OFFSET),
        ("len", ENV_LEN_OFFSET),
        ("crc", ENV_CRC_OFFSET),
        ("header_crc", ENV_HEADER_CRC_OFFSET),
    ];
    assert_eq!(
        offsets(&rows),
        want.map(|(f, o)| (f.to_string(), o)).to_vec()
    );
    assert!(d.contains("89 54 57 55 0D 0A 1A 0A"));
    assert!(d.contains(r"\x89TWU\r\n\x1a\n"));
    assert_eq!(FRAME_MAGIC, *b"\x89TWU\r\n\x1a\n");
    assert!(d.contains(&format!("push log format version is **{PUSHLOG_VERSION}**")));

    let frame = encode_frame(&Push {
        seq: 5,
        at_ms: 6,
        updates: vec![RefUpdate {
            name: "refs/heads/main".into(),
            old: None,
            new: Some([7; 20]),
        }],
    })
    .expect("encode");
    let u32_at = |at: usize| u32::from_le_bytes(frame[at..][..4].try_into().expect("4"));
    assert_eq!(frame[ENV_MAGIC_OFFSET..][..8], FRAME_MAGIC);
    assert_eq!(u32_at(ENV_VERSION_OFFSET), PUSHLOG_VERSION);
    let ipc = &frame[ENVELOPE_LEN..];
    assert_eq!(u32_at(ENV_LEN_OFFSET) as usize, ipc.len());
    assert_eq!(
        u32_at(ENV_CRC_OFFSET),
        crc32fast::hash(ipc),
        "the stream only"
    );
    assert_eq!(
        u32_at(ENV_HEADER_CRC_OFFSET),
        crc32fast::hash(&frame[..ENV_HEADER_CRC_OFFSET])
    );
    assert_eq!(
        ipc[..4],
        [0xff; 4],
        "the Arrow IPC stream follows the envelope unchanged"
    );
    assert_eq!(ipc[ipc.len() - 8..], [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
}
