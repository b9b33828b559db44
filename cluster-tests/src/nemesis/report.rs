//! The summary table of one or more nemesis runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::RunReport;

/// One row per run, then per fault kind the faults injected and the longest time from a
/// heal to full availability over all runs.
pub fn summary_table(reports: &[RunReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<4} {:>20} {:<28} {:>7} {:>6} {:>8} {:>8} {:>5} {:>5} {:>9} {:>10} {:>9}  result",
        "run",
        "seed",
        "nemesis",
        "time s",
        "faults",
        "acked",
        "indeterm",
        "lost",
        "dup",
        "reordered",
        "violations",
        "incidents"
    );
    let mut recovery: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (i, report) in reports.iter().enumerate() {
        let check = &report.check;
        let faults: u64 = check.faults.values().sum();
        let _ = writeln!(
            out,
            "{:<4} {:>20} {:<28} {:>7.0} {:>6} {:>8} {:>8} {:>5} {:>5} {:>9} {:>10} {:>9}  {}",
            i + 1,
            report.seed,
            truncate(&report.nemesis_names(), 28),
            report.elapsed.as_secs_f64(),
            faults,
            check.acked_events,
            check.indeterminate_events,
            check.lost,
            check.duplicated,
            check.reordered,
            check.violations.len(),
            report.incidents.len(),
            if report.passed() { "ok" } else { "FAILED" }
        );
        for (kind, count) in &check.faults {
            let entry = recovery.entry(kind.clone()).or_default();
            entry.0 += count;
            if let Some(ms) = check.max_recovery_ms.get(kind) {
                entry.1 = entry.1.max(*ms);
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<12} {:>7} {:>28}",
        "fault kind", "faults", "max unavailability after heal"
    );
    for (kind, (count, max_ms)) in &recovery {
        // u64::MAX: some fault of this kind was never followed by full availability.
        let max = if *max_ms == u64::MAX {
            "never".to_owned()
        } else {
            format!("{:.1} s", *max_ms as f64 / 1000.0)
        };
        let _ = writeln!(out, "{kind:<12} {count:>7} {max:>28}");
    }
    out
}

/// What went wrong in a run, for the person reading the output.
pub fn failure_details(report: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run with seed {} ({}), files in {}:",
        report.seed,
        report.nemesis_names(),
        report.run_dir.display()
    );
    for incident in &report.incidents {
        let _ = writeln!(out, "  incident: {incident}");
    }
    if !report.check.is_valid() {
        out.push_str(&report.check.render(40));
    }
    out
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut short: String = text.chars().take(width - 1).collect();
        short.push('…');
        short
    }
}
