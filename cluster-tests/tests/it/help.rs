//! `--help` documents every flag: each one has a description.

use std::time::Duration;

use tributary_cluster_tests::{describe_output, output_within, tributary_command};

const HELP_TIMEOUT: Duration = Duration::from_secs(30);
/// Flag lines are indented by at most this much (clap: 2 with a short flag, 6 without);
/// description lines, including continuations that happen to start with `--`, by more.
const FLAG_INDENT_MAX: usize = 6;

/// Each command, with flags its help must show (so the check cannot pass vacuously).
const COMMANDS: &[(&[&str], &[&str])] = &[
    (
        &["serve"],
        &[
            "--data-dir",
            "--client-addr",
            "--advertise-client-addr",
            "--advertise-peer-addr",
            "--http-addr",
            "--node-id",
            "--cluster-id",
            "--config",
            "--auth",
            "--tls-cert",
            "--tls-key",
            "--peer-ca",
            "--peer-cert",
            "--peer-key",
            "--cluster-key-file",
            "--peer-insecure",
            "--rebuild-bytes-per-second",
        ],
    ),
    (
        &["send"],
        &[
            "--partition",
            "--partition-key",
            "--body",
            "--file",
            "--count",
            "--size",
            "--batch-size",
            "--endpoint",
            "--ca-cert",
        ],
    ),
    (
        &["receive"],
        &[
            "--partition",
            "--group",
            "--from",
            "--count",
            "--timeout",
            "--base64",
        ],
    ),
    (
        &["bench"],
        &[
            "--partitions",
            "--producers",
            "--event-size",
            "--batch-size",
            "--duration",
            "--metrics-url",
            "--breakdown",
        ],
    ),
    (
        &["bench", "retention"],
        &[
            "--nodes",
            "--partitions",
            "--retention",
            "--retention-interval",
            "--segment-bytes",
            "--duration",
            "--rate",
            "--event-bytes",
            "--producers",
            "--sample-interval",
            "--dir",
        ],
    ),
    (
        &["bench", "rebuild"],
        &[
            "--gigabytes",
            "--event-bytes",
            "--kill-mid-install",
            "--rebuild-bytes-per-second",
            "--baseline",
            "--raft-log-keep-entries",
            "--data-dir",
            "--keep-data",
        ],
    ),
    (&["cert", "ca"], &["--out", "--name", "--days", "--force"]),
    (
        &["auth", "rule", "create"],
        &["--rights", "--hub", "--connection-string", "--endpoint"],
    ),
    (&["auth", "rule", "list"], &["--hub", "--connection-string"]),
    (
        &["auth", "rule", "keys"],
        &["--hub", "--amqp-port", "--blob-port"],
    ),
    (
        &["auth", "rule", "rotate"],
        &["--key", "--hub", "--amqp-port", "--blob-port"],
    ),
    (&["auth", "rule", "delete"], &["--hub"]),
    (
        &["cert", "node"],
        &[
            "--ca",
            "--out",
            "--name",
            "--dns",
            "--ip",
            "--node-id",
            "--days",
            "--force",
        ],
    ),
    (&["cert", "cluster-key"], &["--out", "--force"]),
];

#[tokio::test]
async fn help_documents_every_flag() {
    for (command, expected) in COMMANDS {
        let mut help = tributary_command();
        help.args(*command).arg("--help");
        let output = output_within(help, HELP_TIMEOUT).await;
        let name = command.join(" ");
        assert!(
            output.status.success(),
            "tributary {name} --help: {}",
            describe_output(&output)
        );
        let text = String::from_utf8(output.stdout).expect("help is UTF-8");
        let flags = documented_flags(&text)
            .unwrap_or_else(|problem| panic!("tributary {name} --help: {problem}\n{text}"));
        for flag in *expected {
            assert!(
                flags.iter().any(|f| f == flag),
                "tributary {name} --help lacks {flag}:\n{text}"
            );
        }
    }
}

/// The long flags of a help text, or the first flag line without a description: text after
/// the flag on the same line, or an indented non-flag line right below.
fn documented_flags(help: &str) -> Result<Vec<String>, String> {
    let lines: Vec<&str> = help.lines().collect();
    let mut flags = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = line.len() - body.len();
        if indent == 0 || indent > FLAG_INDENT_MAX || !body.starts_with('-') {
            continue;
        }
        // "-h, --help  Print help" or "--data-dir <DATA_DIR>  Directory ...": the flag part
        // ends at the first run of two spaces.
        let (spec, description) = body.split_once("  ").unwrap_or((body, ""));
        let described_here = !description.trim().is_empty();
        let described_below = lines.get(i + 1).is_some_and(|next| {
            let next_body = next.trim_start();
            let next_indent = next.len() - next_body.len();
            next_indent > indent && !next_body.is_empty()
        });
        if !described_here && !described_below {
            return Err(format!("flag line without a description: '{line}'"));
        }
        flags.extend(
            spec.split([',', ' '])
                .filter(|word| word.starts_with("--"))
                .map(str::to_owned),
        );
    }
    if flags.is_empty() {
        return Err("no flags found".into());
    }
    Ok(flags)
}

#[test]
fn documented_flags_spots_a_missing_description() {
    let good = "Options:\n      --a <A>  Does a\n      --b\n          Does b,\n          --with c\n  -h, --help  Print help\n";
    assert_eq!(documented_flags(good).unwrap(), ["--a", "--b", "--help"]);
    let bad = "Options:\n      --a <A>  Does a\n      --b <B>\n      --c  Does c\n";
    assert_eq!(
        documented_flags(bad).unwrap_err(),
        "flag line without a description: '      --b <B>'"
    );
}
