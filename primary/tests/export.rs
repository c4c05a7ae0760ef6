//! `primary tail --to N --format json|raw`: frames exported whole, then the
//! command ends with success.

use twinlog::node::Status;

mod support;
use support::{exits, stdout, Primary};

/// Standard base64, as the export writes it.
fn decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut out = Vec::new();
    for q in s.trim_end_matches('=').as_bytes().chunks(4) {
        let n = q
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | u32::from(val(c)) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..q.len()]);
    }
    out
}

#[test]
fn tail_exports_frames_whole_through_the_last_asked() {
    let p = Primary::init();
    let _d = p.serve();
    let big: Vec<u8> = (0..700_000u32).map(|i| (i * 13) as u8).collect();
    let big_path = p.path("big.bin");
    std::fs::write(&big_path, &big).expect("write");
    exits(&p.run(&["append", "--text", "one"]), 0, "append");
    exits(
        &p.run(&["append", "--file", big_path.to_str().expect("utf-8")]),
        0,
        "append",
    );
    exits(&p.run(&["append", "--text", "three"]), 0, "append");

    let o = p.run(&["tail", "--from", "1", "--to", "3", "--format", "json"]);
    exits(&o, 0, "tail --format json");
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 3, "{}", stdout(&o));
    let blob = |i: usize| decode(lines[i]["blob"].as_str().expect("blob"));
    assert_eq!(lines[0]["seq"], 1);
    assert_eq!(blob(0), b"one");
    assert_eq!(blob(1), big);
    assert_eq!(lines[1]["blob_len"], big.len());
    assert_eq!(blob(2), b"three");

    let o = p.run(&["tail", "--from", "2", "--to", "3", "--format", "raw"]);
    exits(&o, 0, "tail --format raw");
    assert_eq!(o.stdout, [&big[..], b"three"].concat());

    // Exported as any answer is: nothing is left held.
    testkit::until_blocking(
        "every charge given back",
        std::time::Duration::from_secs(10),
        || {
            let (_, s) = twinlog::daemon::fetch_status::<Status>(p.metrics).ok()?;
            (s.memory_held == 0).then_some(())
        },
    );
}
