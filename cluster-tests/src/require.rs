//! One way for a test to need something from outside the workspace (a tool, a Python
//! environment, a Docker engine, an image): [`require_tool`]. Without it the test is skipped
//! and says why and how to get it; when an environment variable says the tool is required
//! (`TRIBUTARY_REQUIRE_PROMETHEUS=1` in CI, say), its absence fails the test instead.
//!
//! The variable is named by `require_env`: `"NAME"` means the tool is required when `NAME`
//! is `1` (the `TRIBUTARY_REQUIRE_*` and `TRIBUTARY_*_CHECK` variables); `"NAME=value"` when
//! `NAME` is `value` (e.g. `"CI=true"`).

use std::fmt;

/// The value of a `require_env` variable given without one that makes a tool required.
pub const REQUIRED_VALUE: &str = "1";

/// What to do about something a test needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It is there: run.
    Run,
    /// It is missing and not required: skip, saying this.
    Skip(String),
    /// It is missing and required: fail, saying this.
    Fail(String),
}

/// The variable and value of a `require_env`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RequireEnv<'a> {
    name: &'a str,
    value: &'a str,
}

impl<'a> RequireEnv<'a> {
    fn parse(require_env: &'a str) -> RequireEnv<'a> {
        let (name, value) = require_env
            .split_once('=')
            .unwrap_or((require_env, REQUIRED_VALUE));
        RequireEnv { name, value }
    }

    fn holds(self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        lookup(self.name).as_deref() == Some(self.value)
    }
}

impl fmt::Display for RequireEnv<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// Whether the environment says what `require_env` names is required (e.g. whether
/// `TRIBUTARY_COMPOSE_CHECK` is `1`).
pub fn is_required(require_env: &str) -> bool {
    RequireEnv::parse(require_env).holds(env_var)
}

/// What to do about `what` (available or not), reading `require_env` from the environment;
/// for callers that neither print nor panic (a binary that exits with a status). The
/// messages are [`require_tool`]'s.
pub fn verdict(what: &str, available: bool, how_to_get: &str, require_env: &str) -> Verdict {
    verdict_with(what, available, how_to_get, require_env, env_var)
}

/// `found` (a tool's path, say) when it is `Some`. Otherwise prints
/// `skipped: <what> is missing; <how_to_get>` and returns `None` (the test returns at once
/// and passes), or, when `require_env` says it is required, panics with
/// `<what> is missing and <NAME>=<value>: <how_to_get>`.
///
/// ```no_run
/// # use tributary_cluster_tests::require_tool;
/// # fn find(_: &str) -> Option<std::path::PathBuf> { None }
/// let Some(promtool) = require_tool(
///     "promtool",
///     find("promtool"),
///     "run scripts/prometheus-tools",
///     "TRIBUTARY_REQUIRE_PROMETHEUS",
/// ) else {
///     return;
/// };
/// ```
#[track_caller]
pub fn require_tool<T>(
    what: &str,
    found: Option<T>,
    how_to_get: &str,
    require_env: &str,
) -> Option<T> {
    require_tool_with(what, found, how_to_get, require_env, env_var)
}

#[track_caller]
fn require_tool_with<T>(
    what: &str,
    found: Option<T>,
    how_to_get: &str,
    require_env: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Option<T> {
    match verdict_with(what, found.is_some(), how_to_get, require_env, lookup) {
        Verdict::Run => found,
        Verdict::Skip(message) => {
            println!("{message}");
            None
        }
        Verdict::Fail(message) => panic!("{message}"),
    }
}

fn verdict_with(
    what: &str,
    available: bool,
    how_to_get: &str,
    require_env: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Verdict {
    let require_env = RequireEnv::parse(require_env);
    if available {
        Verdict::Run
    } else if require_env.holds(lookup) {
        Verdict::Fail(format!("{what} is missing and {require_env}: {how_to_get}"))
    } else {
        Verdict::Skip(format!("skipped: {what} is missing; {how_to_get}"))
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment where only `set` is set (to `value`).
    fn env(set: &'static str, value: &'static str) -> impl Fn(&str) -> Option<String> {
        move |name| (name == set).then(|| value.to_owned())
    }

    #[test]
    fn an_available_tool_runs_required_or_not() {
        for value in ["1", "0"] {
            assert_eq!(
                verdict_with("promtool", true, "install it", "REQ", env("REQ", value)),
                Verdict::Run
            );
            assert_eq!(
                require_tool_with("promtool", Some(5), "install it", "REQ", env("REQ", value)),
                Some(5)
            );
        }
    }

    #[test]
    fn a_missing_tool_is_skipped_unless_required() {
        for (name, value) in [("OTHER", "1"), ("REQ", "0"), ("REQ", ""), ("REQ", "true")] {
            assert_eq!(
                verdict_with("promtool", false, "install it", "REQ", env(name, value)),
                Verdict::Skip("skipped: promtool is missing; install it".to_owned()),
                "{name}={value}"
            );
            assert_eq!(
                require_tool_with::<()>("promtool", None, "install it", "REQ", env(name, value)),
                None
            );
        }
    }

    #[test]
    fn a_missing_required_tool_fails_naming_the_variable() {
        assert_eq!(
            verdict_with("promtool", false, "install it", "REQ", env("REQ", "1")),
            Verdict::Fail("promtool is missing and REQ=1: install it".to_owned())
        );
    }

    #[test]
    #[should_panic(expected = "the Python test environment is missing and REQ=1: run the script")]
    fn require_tool_panics_when_a_missing_tool_is_required() {
        require_tool_with::<()>(
            "the Python test environment",
            None,
            "run the script",
            "REQ",
            env("REQ", "1"),
        );
    }

    #[test]
    fn a_variable_may_name_the_value_that_requires() {
        assert_eq!(
            verdict_with("docker", false, "start it", "CI=true", env("CI", "true")),
            Verdict::Fail("docker is missing and CI=true: start it".to_owned())
        );
        assert!(matches!(
            verdict_with("docker", false, "start it", "CI=true", env("CI", "1")),
            Verdict::Skip(_)
        ));
    }

    /// A variable no one sets: the real environment's answer is a skip.
    const UNSET: &str = "TRIBUTARY_REQUIRE_NOTHING_UNIT_TEST";

    #[test]
    fn the_real_environment_is_read() {
        assert!(!is_required(UNSET));
        assert!(matches!(
            verdict("a tool", false, "get it", UNSET),
            Verdict::Skip(_)
        ));
        assert_eq!(require_tool::<()>("a tool", None, "get it", UNSET), None);
        assert_eq!(
            require_tool("a tool", Some("/bin/tool"), "get it", UNSET),
            Some("/bin/tool")
        );
        // PATH is set everywhere the tests run, never to "1".
        assert!(is_required(&format!(
            "PATH={}",
            std::env::var("PATH").unwrap()
        )));
    }

    /// Run by [`require_tool_reads_the_variable_from_the_environment`] in a child process
    /// with the variable set; ignored otherwise.
    #[test]
    #[ignore = "run by require_tool_reads_the_variable_from_the_environment"]
    fn child_requires_a_missing_tool() {
        require_tool::<()>("the child's tool", None, "no way", CHILD_ENV);
    }

    const CHILD_ENV: &str = "TRIBUTARY_REQUIRE_CHILD_TOOL_UNIT_TEST";

    #[test]
    fn require_tool_reads_the_variable_from_the_environment() {
        let run = |value: &str| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "require::tests::child_requires_a_missing_tool",
                    "--ignored",
                    "--nocapture",
                ])
                .env(CHILD_ENV, value)
                .output()
                .unwrap()
        };
        let required = run("1");
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&required.stdout),
            String::from_utf8_lossy(&required.stderr)
        );
        assert!(!required.status.success(), "{output}");
        assert!(
            output.contains(&format!(
                "the child's tool is missing and {CHILD_ENV}=1: no way"
            )),
            "{output}"
        );
        let skipped = run("0");
        let output = String::from_utf8_lossy(&skipped.stdout);
        assert!(skipped.status.success(), "{output}");
        assert!(
            output.contains("skipped: the child's tool is missing; no way"),
            "{output}"
        );
    }
}
