//! The budget of one small append: the marks `twinlog::budget` wrote in
//! the client's, the primary's and the twin's processes, merged on their
//! one clock and cut into appends at each `client_send`. Each stage is
//! reported as its mean time after the append's `client_send`, and the
//! stages sorted by it: the difference between neighbours is what each
//! step of the way costs (the local sync runs beside the twin's way, so
//! it shows where it ends).

#![allow(dead_code)] // each bench runs its own cases

use std::collections::BTreeMap;
use std::path::Path;

use twinlog::budget::Stage;

/// Mean µs after `client_send` of each stage seen, over `appends` whole
/// appends (those with a `client_received`).
pub struct Budget {
    pub appends: u64,
    pub at_us: Vec<(Stage, f64)>,
}

impl Budget {
    /// Read every `<prefix>.<pid>` file in `dir`.
    pub fn read(dir: &Path, prefix: &str) -> Budget {
        let mut marks: Vec<(u64, Stage)> = Vec::new();
        for entry in std::fs::read_dir(dir).expect("the budget's dir").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&format!("{prefix}.")) {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).expect("a budget file");
            for line in text.lines() {
                let Some((stage, ns)) = line.split_once(' ') else {
                    continue;
                };
                if let (Some(stage), Ok(ns)) = (Stage::from_name(stage), ns.parse()) {
                    marks.push((ns, stage));
                }
            }
        }
        marks.sort();
        Self::of(&marks)
    }

    fn of(marks: &[(u64, Stage)]) -> Budget {
        let mut sums: BTreeMap<Stage, (f64, u64)> = BTreeMap::new();
        let mut appends = 0;
        let mut window: Option<(u64, BTreeMap<Stage, u64>)> = None;
        for &(ns, stage) in marks {
            if stage == Stage::ClientSend {
                window = Some((ns, BTreeMap::new()));
                continue;
            }
            let Some((sent, seen)) = window.as_mut() else {
                continue;
            };
            // The first of each stage in the window: with one client the
            // append's own.
            seen.entry(stage).or_insert(ns - *sent);
            if stage == Stage::ClientReceived {
                appends += 1;
                for (&s, &after) in seen.iter() {
                    let e = sums.entry(s).or_default();
                    e.0 += after as f64 / 1e3;
                    e.1 += 1;
                }
                window = None;
            }
        }
        let mut at_us: Vec<(Stage, f64)> = sums
            .into_iter()
            .map(|(s, (sum, n))| (s, sum / n as f64))
            .collect();
        at_us.insert(0, (Stage::ClientSend, 0.0));
        at_us.sort_by(|a, b| a.1.total_cmp(&b.1));
        Budget { appends, at_us }
    }

    /// The end-to-end mean, µs.
    pub fn total_us(&self) -> f64 {
        self.at_us
            .iter()
            .find(|(s, _)| *s == Stage::ClientReceived)
            .map_or(f64::NAN, |(_, us)| *us)
    }

    /// A table for people, on stderr.
    pub fn print_table(&self) {
        eprintln!("  {:<20} {:>9} {:>9}", "stage", "at µs", "+µs");
        let mut before = 0.0;
        for (stage, at) in &self.at_us {
            eprintln!("  {:<20} {:>9.1} {:>9.1}", stage.name(), at, at - before);
            before = *at;
        }
    }
}

/// A check of the cutting, run by the bench before it trusts it: two
/// appends, the second with a stage the first lacks.
pub fn self_check() {
    let m = [
        (100, Stage::ClientSend),
        (150, Stage::PrimaryReceived),
        (1100, Stage::ClientReceived),
        (2000, Stage::ClientSend),
        (2250, Stage::PrimaryReceived),
        (2400, Stage::LocalSynced),
        (3000, Stage::ClientReceived),
        (3100, Stage::PrimaryReceived),
    ];
    let b = Budget::of(&m);
    assert_eq!(b.appends, 2);
    let at = |s| b.at_us.iter().find(|(x, _)| *x == s).map(|(_, v)| *v);
    assert_eq!(at(Stage::PrimaryReceived), Some(0.15));
    assert_eq!(at(Stage::LocalSynced), Some(0.4));
    assert_eq!(at(Stage::ClientReceived), Some(1.0));
}
