//! Kafka clients for the Kafka front end's tests: Debian's `kcat` (`scripts/kafka-tools`
//! installs it); confluent-kafka comes with the Python test environment
//! ([`crate::python_tools::python_deps`]).

use std::path::PathBuf;

use crate::require_tool;

/// Makes a missing `kcat` fail a test instead of skipping it (CI sets it).
pub const REQUIRE_KAFKA_TOOLS_ENV: &str = "TRIBUTARY_REQUIRE_KAFKA_TOOLS";

/// The path of `kcat`, or `None` (the caller skips, saying so) when it is missing and
/// `TRIBUTARY_REQUIRE_KAFKA_TOOLS` is not `1`.
#[track_caller]
pub fn kcat() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("kcat"))
        .find(|candidate| candidate.is_file());
    require_tool(
        "kcat (on PATH or in /usr/bin)",
        found,
        "run scripts/kafka-tools first (it installs Debian's kcat package)",
        REQUIRE_KAFKA_TOOLS_ENV,
    )
}
