//! The binary itself: it starts, names itself and lists its subcommands. (Cargo also builds
//! `target/debug/tributary` for this test, which the cluster tests run.)

use std::process::Command;

#[test]
fn the_binary_names_its_version_and_subcommands() {
    let binary = env!("CARGO_BIN_EXE_tributary");
    let version = Command::new(binary).arg("--version").output().unwrap();
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("tributary {}", env!("CARGO_PKG_VERSION"))
    );
    let help = Command::new(binary).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for subcommand in ["serve", "bench", "cert", "drain"] {
        assert!(
            help.lines()
                .any(|line| line.trim_start().starts_with(subcommand)),
            "`tributary --help` lists {subcommand}: {help}"
        );
    }
}
