//! The `--help` of every command, compared byte for byte with the files
//! under `tests/help/`, so a change to the help text is seen in review.
//! `UPDATE_GOLDEN=1 cargo test -p primary --test help` rewrites them.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_primary");

/// `--help` of the command at `path` (below the binary).
fn help(path: &[String]) -> String {
    let out = Command::new(BIN)
        .args(path)
        .arg("--help")
        .env_remove("TWINLOG_CONFIG")
        .output()
        .expect("run");
    assert!(out.status.success(), "{path:?} --help: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// The subcommands a help text lists, `help` aside.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/help")
}

#[test]
fn every_command_s_help_is_the_reviewed_text() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let dir = golden_dir();
    let name = Path::new(BIN)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("binary name")
        .to_owned();
    let mut todo = vec![Vec::<String>::new()];
    let mut seen = Vec::new();
    let mut differ = Vec::new();
    while let Some(path) = todo.pop() {
        let text = help(&path);
        for sub in subcommands(&text) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        let file = format!(
            "{}.txt",
            [name.clone()]
                .iter()
                .chain(&path)
                .cloned()
                .collect::<Vec<_>>()
                .join("_")
        );
        let at = dir.join(&file);
        if update {
            std::fs::write(&at, &text).expect("write golden");
        } else if std::fs::read_to_string(&at).ok().as_deref() != Some(text.as_str()) {
            differ.push(file.clone());
        }
        seen.push(file);
    }
    assert!(seen.len() > 10, "commands found: {seen:?}");
    let stale: Vec<String> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| !seen.contains(f))
        .collect();
    if update {
        for f in &stale {
            std::fs::remove_file(dir.join(f)).expect("remove stale golden");
        }
        return;
    }
    assert!(
        differ.is_empty() && stale.is_empty(),
        "help text changed for {differ:?}, no command for {stale:?}: review, then UPDATE_GOLDEN=1 cargo test -p {name} --test help"
    );
}
