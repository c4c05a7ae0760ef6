//! The golden `--help` check both binaries' tests run
//! (`primary/tests/help.rs`, `twin/tests/help.rs`): every command's help,
//! compared byte for byte with a reviewed file.

use std::path::Path;
use std::process::Command;

/// `--help` of the command at `path` (below the binary).
fn help(bin: &str, path: &[String]) -> String {
    let out = Command::new(bin)
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

/// Walk every command of `bin` from its top `--help` down, and compare
/// each one's help with `dir/<bin>_<command>_....txt` (rewritten instead
/// under `UPDATE_GOLDEN`); fail on a changed text, a command without a
/// file, a file without a command, or fewer than `at_least` commands.
pub fn check(bin: &str, dir: &Path, at_least: usize) {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let name = Path::new(bin)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("binary name")
        .to_owned();
    let mut todo = vec![Vec::<String>::new()];
    let mut seen = Vec::new();
    let mut differ = Vec::new();
    while let Some(path) = todo.pop() {
        let text = help(bin, &path);
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
    assert!(seen.len() >= at_least, "commands found: {seen:?}");
    let stale: Vec<String> = std::fs::read_dir(dir)
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
