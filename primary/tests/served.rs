//! The `primary` commands against a running `primary serve` (a child
//! process on loopback, no twin: twin appends fall back to local
//! durability): output files, the git import, pushes, appends from stdin,
//! and the exit code and message of each runtime failure.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

use twinlog::daemon::config::Policy;
use twinlog::store::frames::{hex, PackBuilder};

mod support;
use support::{exits, files_named, primary_stdin, stderr, stdout, Primary};

#[test]
fn a_failed_read_leaves_an_existing_output_file_untouched() {
    let p = Primary::init();
    let _d = p.serve();
    exits(&p.run(&["repo", "create", "acme/widgets"]), 0, "create");
    exits(&p.run(&["append", "--text", "frame one"]), 0, "append");
    let keep = p.path("keep.txt");
    let keep_s = keep.to_str().expect("utf-8");
    std::fs::write(&keep, "precious\n").expect("write");
    let missing = "0".repeat(64);
    let failures: [&[&str]; 5] = [
        &["repo", "lfs-get", "acme/widgets", &missing, "--out", keep_s],
        &["repo", "lfs-get", "acme/nothing", &missing, "--out", keep_s],
        &["read", "99", "--out", keep_s],
        &["doc", "get", "nothing", "--out", keep_s],
        &[
            "repo",
            "cat",
            "acme/widgets",
            &"1".repeat(40),
            "--out",
            keep_s,
        ],
    ];
    for args in failures {
        let o = p.run(args);
        exits(&o, 1, &args.join(" "));
        assert_eq!(
            std::fs::read_to_string(&keep).expect("read"),
            "precious\n",
            "{args:?} left the file as it was"
        );
        assert!(
            files_named(p.dir.path(), "tmp").is_empty(),
            "{args:?} left no temporary file: {:?}",
            files_named(p.dir.path(), "tmp")
        );
    }

    // Success replaces the file whole, and says so.
    let big = p.path("big.bin");
    let content: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&big, &content).expect("write");
    let o = p.run(&[
        "repo",
        "lfs-put",
        "acme/widgets",
        big.to_str().expect("utf-8"),
    ]);
    exits(&o, 0, "lfs-put");
    let oid = stdout(&o)
        .split_whitespace()
        .next()
        .expect("the oid")
        .to_owned();
    let o = p.run(&["repo", "lfs-get", "acme/widgets", &oid, "--out", keep_s]);
    exits(&o, 0, "lfs-get");
    assert!(stdout(&o).contains(keep_s), "{}", stdout(&o));
    assert!(std::fs::read(&keep).expect("read") == content, "the object");
    let o = p.run(&["read", "2", "--out", keep_s]);
    exits(&o, 0, "read --out");
    assert_eq!(std::fs::read_to_string(&keep).expect("read"), "frame one");
    let o = p.run(&["repo", "lfs-put", "acme/widgets", "/nonexistent/file"]);
    exits(&o, 1, "lfs-put of a missing file");
    assert!(stderr(&o).contains("/nonexistent/file"), "{}", stderr(&o));
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn commit(dir: &Path, n: usize) {
    std::fs::write(dir.join(format!("f{n}.txt")), format!("file {n}\n")).expect("write");
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", &format!("commit {n}")]);
}

fn line_with<'a>(text: &'a str, part: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(part))
        .unwrap_or_else(|| panic!("no line with {part:?} in {text:?}"))
}

#[test]
fn import_brings_an_existing_repository_up_to_date_sending_only_what_it_lacks_and_history_dates_each_push(
) {
    let p = Primary::init();
    let _d = p.serve();
    let g = p.path("widgets");
    std::fs::create_dir_all(&g).expect("mkdir");
    git(&g, &["init", "-q"]);
    commit(&g, 0);
    let g_s = g.to_str().expect("utf-8");

    // The README's order: create, then import.
    exits(&p.run(&["repo", "create", "acme/widgets"]), 0, "create");
    let o = p.run(&["repo", "import", "acme/widgets", "--git", g_s]);
    exits(&o, 0, "import into the created repository");
    assert!(
        stdout(&o).contains("imported 3 objects") && stdout(&o).contains("moved 1 refs"),
        "{}",
        stdout(&o)
    );

    // Two commits later: only their objects go, the ref moves on.
    let first_head = git(&g, &["rev-parse", "HEAD"]);
    commit(&g, 1);
    commit(&g, 2);
    git(&g, &["tag", "v1"]);
    let o = p.run(&["repo", "import", "acme/widgets", "--git", g_s]);
    exits(&o, 0, "import again");
    let out = stdout(&o);
    assert!(
        line_with(&out, "imported").starts_with("imported 6 objects")
            && line_with(&out, "imported").ends_with("3 held already"),
        "{out}"
    );
    assert!(
        out.contains("moved 2 refs; 0 already"),
        "main moved, v1 created: {out}"
    );
    let refs = stdout(&p.run(&["repo", "refs", "acme/widgets"]));
    let head = git(&g, &["rev-parse", "HEAD"]);
    assert!(refs.contains(&format!("{head} refs/heads/main")), "{refs}");
    assert!(refs.contains("refs/tags/v1"), "{refs}");

    // Nothing new: nothing sent, nothing moved.
    let o = p.run(&["repo", "import", "acme/widgets", "--git", g_s]);
    exits(&o, 0, "import of nothing new");
    assert!(
        stdout(&o).contains("imported 0 objects") && stdout(&o).contains("moved 0 refs; 2 already"),
        "{}",
        stdout(&o)
    );
    let history = stdout(&p.run(&["repo", "history", "acme/widgets"]));
    assert!(
        history.contains(&format!("{first_head} {head} refs/heads/main")),
        "main moved from where it was: {history}"
    );
    // Each push is dated in RFC 3339 UTC, `push 7 at 2026-11-30T05:12:03Z`.
    let dates: Vec<&str> = history
        .lines()
        .filter_map(|l| l.strip_prefix("push ")?.split_once(" at "))
        .map(|(_, at)| at)
        .collect();
    assert!(!dates.is_empty(), "{history}");
    for at in dates {
        let b = at.as_bytes();
        assert!(
            b.len() == 20 && b[4] == b'-' && b[10] == b'T' && b[19] == b'Z' && at.starts_with("20"),
            "not an RFC 3339 UTC date: {at:?} in {history}"
        );
    }

    // A new repository is created by the import itself.
    let o = p.run(&["repo", "import", "acme/fresh", "--git", g_s]);
    exits(&o, 0, "import into a new repository");
    assert!(stdout(&o).contains("imported 9 objects"), "{}", stdout(&o));
}

#[test]
fn repo_push_sends_a_pack_file_and_moves_refs_from_where_they_are() {
    let p = Primary::init();
    let _d = p.serve();
    exits(&p.run(&["repo", "create", "acme/widgets"]), 0, "create");
    let mut pack = PackBuilder::new();
    let blob = pack
        .add(twinlog::objects::ObjType::Blob, b"hello\n")
        .expect("add");
    let file = p.path("objects.pack");
    std::fs::write(&file, pack.into_bytes()).expect("write");
    let blob_hex = hex(&blob);
    let o = p.run(&[
        "repo",
        "push",
        "acme/widgets",
        file.to_str().expect("utf-8"),
        "--ref",
        &format!("refs/heads/main=..{blob_hex}"),
    ]);
    exits(&o, 0, "push");
    assert!(
        stdout(&o).contains("pushed 1 objects") && stdout(&o).contains("1 ref updates"),
        "{}",
        stdout(&o)
    );
    let have = stdout(&p.run(&["repo", "have", "acme/widgets", &blob_hex]));
    assert_eq!(have.trim(), format!("{blob_hex} yes"));
    let refs = stdout(&p.run(&["repo", "refs", "acme/widgets"]));
    assert_eq!(refs.trim(), format!("{blob_hex} refs/heads/main"));

    // A ref that is not where the push says is refused, nothing moved.
    let o = p.run(&[
        "repo",
        "push",
        "acme/widgets",
        "--ref",
        &format!("refs/heads/main=..{blob_hex}"),
    ]);
    exits(&o, 1, "a ref that moved");
    assert!(stderr(&o).contains("refs/heads/main"), "{}", stderr(&o));
    // Deleting it from where it is works.
    let o = p.run(&[
        "repo",
        "push",
        "acme/widgets",
        "--ref",
        &format!("refs/heads/main={blob_hex}.."),
    ]);
    exits(&o, 0, "delete the ref");
    assert_eq!(stdout(&p.run(&["repo", "refs", "acme/widgets"])), "");
    exits(
        &p.run(&["repo", "push", "acme/widgets"]),
        2,
        "a push of nothing",
    );
}

#[test]
fn append_reads_stdin_and_refuses_an_empty_blob_unless_asked() {
    let p = Primary::init();
    let _d = p.serve();
    let o = p.run_stdin(&["append"], b"from stdin");
    exits(&o, 0, "append from stdin");
    assert!(
        stdout(&o).starts_with("appended frame 1 (10 bytes)"),
        "{}",
        stdout(&o)
    );
    let o = p.run(&["read", "1"]);
    assert_eq!(o.stdout, b"from stdin");

    let o = p.run_stdin(&["append", "--file", "-"], b"dash");
    exits(&o, 0, "append --file -");
    assert_eq!(p.run(&["read", "2"]).stdout, b"dash");

    let o = p.run_stdin(&["append"], b"");
    exits(&o, 2, "an empty stdin");
    assert!(
        stderr(&o).contains("empty") && stderr(&o).contains("--empty"),
        "{}",
        stderr(&o)
    );
    let o = p.run_stdin(&["append", "--empty"], b"");
    exits(&o, 0, "an empty frame, asked for");
    assert!(
        stdout(&o).contains("appended frame 3 (0 bytes)"),
        "{}",
        stdout(&o)
    );
    let o = p.run(&["append", "--file", "/nonexistent/blob"]);
    exits(&o, 1, "a missing file");
    assert!(stderr(&o).contains("/nonexistent/blob"), "{}", stderr(&o));
}

#[test]
fn runtime_failures_exit_1_saying_what_failed() {
    let p = Primary::init();
    let mut d = p.serve();
    exits(&p.run(&["repo", "create", "acme/widgets"]), 0, "create");
    let o = p.run(&["repo", "create", "acme/widgets"]);
    exits(&o, 1, "a repository that exists");
    assert!(stderr(&o).contains("exists"), "{}", stderr(&o));
    let o = p.run(&["doc", "get", "nothing"]);
    exits(&o, 1, "no document");
    assert!(stderr(&o).contains("no document"), "{}", stderr(&o));
    let o = p.run(&["read", "99"]);
    exits(&o, 1, "a read past the head");
    assert!(stderr(&o).contains("past the head"), "{}", stderr(&o));
    let o = p.run(&["repo", "refs", "acme/nothing"]);
    exits(&o, 1, "no repository");
    let o = p.run(&["retain", "--from", "2"]);
    exits(&o, 1, "retain past the twin's position");
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));

    // A tail whose daemon goes away: the connection is lost.
    let mut tail = support::command()
        .args(["tail", "--from", "1", "--config", p.config_s()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tail");
    let mut first = String::new();
    std::io::BufReader::new(tail.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a first line");
    assert!(first.starts_with("1 "), "{first}");
    let stopped = Command::new("kill")
        .args(["-TERM", &d.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(stopped.success());
    let o = tail.wait_with_output().expect("tail ends");
    exits(&o, 1, "a tail whose connection is lost");
    assert!(stderr(&o).contains("tail"), "{}", stderr(&o));
    d.kill();

    let o = p.run(&["append", "--text", "x"]);
    exits(&o, 1, "no daemon running");
}

#[test]
fn a_twin_that_does_not_acknowledge_under_the_fail_policy_exits_1() {
    let p = Primary::init_with(Policy::Fail);
    p.edit(|c| c.twin_fingerprint = Some(twinlog::net::Fingerprint([7; 32])));
    let _d = p.serve();
    let o = p.run(&["append", "--text", "x"]);
    exits(&o, 1, "a twin timeout");
    assert!(
        stderr(&o).contains("durable locally") && stderr(&o).contains("twin"),
        "{}",
        stderr(&o)
    );
    let o = p.run(&["append", "--text", "x", "--durability", "local"]);
    exits(&o, 0, "a local append");
    assert!(stdout(&o).contains("durable on this box"), "{}", stdout(&o));
}

#[test]
fn daemons_take_hostnames_and_log_the_history_id_in_hex() {
    let p = Primary::init();
    p.edit(|c| {
        c.listen = format!("localhost:{}", p.listen.port())
            .parse()
            .expect("address");
        c.metrics = format!("localhost:{}", p.metrics.port())
            .parse()
            .expect("address");
    });
    let d = p.serve();
    let o = p.run(&["append", "--text", "through a name"]);
    exits(&o, 0, "append through localhost");
    let log = d.log_text();
    let mut seen = 0;
    for part in log.split("history").skip(1) {
        let id: String = part
            .trim_start_matches(['=', ':', ' '])
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        assert!(
            id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
            "a history id in hex: {part:?}"
        );
        seen += 1;
    }
    assert!(seen > 0, "the log names its history: {log}");
    drop(d);
    let o = primary_stdin(&["status", "--config", p.config_s()], b"");
    exits(&o, 1, "no daemon after the drop");
}
