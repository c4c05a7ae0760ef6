//! The `--help` of every command, compared byte for byte with the files
//! under `tests/help/`, so a change to the help text is seen in review.
//! `UPDATE_GOLDEN=1 cargo test -p primary --test help` rewrites them.

#[path = "../../tests/support/golden_help.rs"]
mod golden_help;

#[test]
fn every_command_s_help_is_the_reviewed_text() {
    golden_help::check(
        env!("CARGO_BIN_EXE_primary"),
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/help"),
        11,
    );
}
