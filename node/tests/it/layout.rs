//! The workspace's shape, read from `cargo metadata`: dependencies point one way (front ends
//! reach the cluster only through the broker's `Service`; the broker knows no front end; no
//! server crate needs the benchmark), and no crate outgrows what a reader can hold.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library crates of the server: what runs inside `tributary serve`.
const SERVER_CRATES: &[&str] = &[
    "tributary-node",
    "tributary-net",
    "tributary-broker",
    "tributary-partition",
    "tributary-controller",
    "tributary-raft",
    "tributary-storage",
];
/// What front ends never touch directly.
const BELOW_THE_BROKER: &[&str] = &[
    "tributary-partition",
    "tributary-raft",
    "tributary-storage",
    "tributary-controller",
];

struct Workspace {
    /// Package name → (manifest directory, names of its normal and build dependencies).
    packages: BTreeMap<String, (PathBuf, BTreeSet<String>)>,
}

fn workspace() -> Workspace {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| {
            let name = package["name"].as_str().expect("name").to_owned();
            let manifest = PathBuf::from(package["manifest_path"].as_str().expect("manifest"));
            let dependencies = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                // Tests may use anything; what ships may not.
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().expect("dependency name").to_owned())
                .collect();
            (
                name,
                (
                    manifest.parent().expect("a directory").to_owned(),
                    dependencies,
                ),
            )
        })
        .collect();
    Workspace { packages }
}

impl Workspace {
    fn frontends(&self) -> Vec<&str> {
        self.packages
            .iter()
            .filter(|(_, (dir, _))| dir.parent().is_some_and(|p| p.ends_with("frontends")))
            .map(|(name, _)| name.as_str())
            .collect()
    }

    fn dependencies(&self, package: &str) -> &BTreeSet<String> {
        &self
            .packages
            .get(package)
            .unwrap_or_else(|| panic!("the workspace has no package {package}"))
            .1
    }
}

/// Dependency rules broken in a workspace, one line each.
fn violations(workspace: &Workspace) -> Vec<String> {
    let mut found = Vec::new();
    let frontends = workspace.frontends();
    for frontend in &frontends {
        for below in BELOW_THE_BROKER {
            if workspace.dependencies(frontend).contains(*below) {
                found.push(format!(
                    "front end {frontend} depends on {below}: front ends go through the broker's Service"
                ));
            }
        }
    }
    for frontend in &frontends {
        if workspace
            .dependencies("tributary-broker")
            .contains(*frontend)
        {
            found.push(format!("the broker depends on the front end {frontend}"));
        }
    }
    for server in SERVER_CRATES
        .iter()
        .copied()
        .chain(frontends.iter().copied())
    {
        if workspace.dependencies(server).contains("tributary-bench") {
            found.push(format!("server crate {server} depends on tributary-bench"));
        }
    }
    found
}

#[test]
fn dependencies_point_one_way() {
    let workspace = workspace();
    let frontends = workspace.frontends();
    assert!(
        frontends.contains(&"tributary-grpc"),
        "the gRPC front end lives under frontends/: {frontends:?}"
    );
    let found = violations(&workspace);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_front_end_reaching_below_the_broker_is_caught() {
    let mut workspace = workspace();
    workspace
        .packages
        .get_mut("tributary-grpc")
        .expect("the gRPC front end")
        .1
        .insert("tributary-storage".into());
    workspace
        .packages
        .get_mut("tributary-broker")
        .expect("the broker")
        .1
        .insert("tributary-grpc".into());
    workspace
        .packages
        .get_mut("tributary-controller")
        .expect("the controller")
        .1
        .insert("tributary-bench".into());
    let found = violations(&workspace);
    assert_eq!(found.len(), 3, "{found:#?}");
}

/// Lines of a crate's Rust sources up to each file's `#[cfg(test)] mod tests`; test modules
/// of their own (declared under `#[cfg(test)]`: files named `*_tests.rs` or
/// `test_support.rs`, and everything in a `tests/` folder under `src/`) count nothing.
fn non_test_lines(dir: &Path) -> usize {
    let mut total = 0;
    let mut pending = vec![dir.join("src")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.as_deref().unwrap_or_default();
            if path.is_dir() {
                if name != "tests" {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && !name.ends_with("_tests.rs")
                && name != "test_support.rs"
            {
                let text = std::fs::read_to_string(&path).expect("a source file");
                let lines: Vec<&str> = text.lines().collect();
                let end = lines
                    .windows(2)
                    .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].starts_with("mod tests"))
                    .unwrap_or(lines.len());
                total += end;
            }
        }
    }
    total
}

#[test]
fn crates_stay_small_enough_to_read() {
    let workspace = workspace();
    let sizes: BTreeMap<&str, usize> = workspace
        .packages
        .iter()
        .map(|(name, (dir, _))| (name.as_str(), non_test_lines(dir)))
        .collect();
    // node/ (the library and the binary's main) is the composition root: wiring, not
    // logic.
    let node = sizes["tributary-node"] + sizes["tributary"];
    assert!(
        node < 4_000,
        "node/ has {node} lines of non-test code; move logic into the crate it belongs to: {sizes:#?}"
    );
    for (name, lines) in &sizes {
        assert!(
            *lines <= 9_000,
            "{name} has {lines} lines of non-test code; split it along a seam: {sizes:#?}"
        );
    }
}
