//! The data directory's identity: which cluster and node it belongs to. A node refuses to
//! start on a directory that belongs to another cluster or node.

use std::path::Path;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tributary_types::format;

const IDENTITY_FILE: &str = "identity.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Unknown until the node has joined (or formed) its cluster.
    pub cluster_id: Option<String>,
    pub node_id: u64,
    pub format_version: u32,
    /// Random, made when the directory is first used: tells the cluster whether a node
    /// came back with its data or with an empty directory.
    #[serde(default)]
    pub data_id: u64,
    /// The highest cluster feature level this directory has seen its cluster run, and the
    /// first release that supports it: a node of an older release refuses to start on it
    /// (release 0.1.0 wrote no level: 1).
    #[serde(default = "level_one")]
    pub feature_level: u32,
    #[serde(default)]
    pub feature_release: String,
}

fn level_one() -> u32 {
    1
}

const FORMAT_VERSION: u32 = 1;

/// Reads the directory's identity, or claims an empty directory for this node. Also proves
/// the directory is writable.
pub fn load_or_create(
    data_dir: &Path,
    node_id: u64,
    cluster_id: Option<&str>,
) -> anyhow::Result<Identity> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
    let probe = data_dir.join(".write-probe");
    std::fs::write(&probe, b"ok").with_context(|| {
        format!(
            "data directory {} is not writable; choose another with --data-dir or fix its permissions",
            data_dir.display()
        )
    })?;
    std::fs::remove_file(&probe).ok();
    let path = data_dir.join(IDENTITY_FILE);
    if path.exists() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let identity: Identity = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid identity file", path.display()))?;
        if let (Some(expected), Some(stored)) = (cluster_id, &identity.cluster_id)
            && expected != stored
        {
            bail!(
                "data directory {} belongs to cluster '{stored}', not '{expected}'; use an empty data directory or the matching --cluster-id",
                data_dir.display(),
            );
        }
        if identity.node_id != node_id {
            bail!(
                "data directory {} belongs to node {}, not node {}; start with --node-id {} or use an empty data directory",
                data_dir.display(),
                identity.node_id,
                node_id,
                identity.node_id
            );
        }
        if identity.format_version != FORMAT_VERSION {
            bail!(
                "data directory {} has format version {}, this build reads version {}",
                data_dir.display(),
                identity.format_version,
                FORMAT_VERSION
            );
        }
        if identity.feature_level > format::supported_level() {
            let release = if identity.feature_release.is_empty() {
                format::release_for_level(identity.feature_level)
            } else {
                identity.feature_release.clone()
            };
            bail!(
                "data directory {} belongs to a cluster that runs feature level {}, which needs release {release} or later; this is release {} (feature levels up to {}): start this node with release {release} or later (a cluster never returns to an older release once its level is raised)",
                data_dir.display(),
                identity.feature_level,
                format::running_release(),
                format::supported_level(),
            );
        }
        let mut identity = identity;
        if identity.data_id == 0 {
            identity.data_id = new_data_id();
            write(data_dir, &identity)?;
        }
        return Ok(identity);
    }
    let identity = Identity {
        cluster_id: cluster_id.map(str::to_string),
        node_id,
        format_version: FORMAT_VERSION,
        data_id: new_data_id(),
        feature_level: 1,
        feature_release: String::new(),
    };
    write(data_dir, &identity)?;
    Ok(identity)
}

fn new_data_id() -> u64 {
    rand::random::<u64>().max(1)
}

fn write(data_dir: &Path, identity: &Identity) -> anyhow::Result<()> {
    let tmp = data_dir.join(format!("{IDENTITY_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(identity)?)?;
    std::fs::rename(&tmp, data_dir.join(IDENTITY_FILE))?;
    Ok(())
}

/// Records the cluster this directory now belongs to; refuses a different one.
pub fn record_cluster(
    data_dir: &Path,
    identity: &mut Identity,
    cluster_id: &str,
) -> anyhow::Result<()> {
    match &identity.cluster_id {
        Some(stored) if stored == cluster_id => Ok(()),
        Some(stored) => bail!(
            "data directory {} belongs to cluster '{stored}', but the seeds belong to cluster '{cluster_id}'",
            data_dir.display()
        ),
        None => {
            identity.cluster_id = Some(cluster_id.to_string());
            write(data_dir, identity)
        }
    }
}

/// Records that the directory's cluster runs `level` (first supported by `release`), when
/// that is higher than what the directory holds.
pub fn record_feature_level(
    data_dir: &Path,
    identity: &mut Identity,
    level: u32,
    release: &str,
) -> anyhow::Result<()> {
    if level <= identity.feature_level {
        return Ok(());
    }
    identity.feature_level = level;
    identity.feature_release = release.to_string();
    write(data_dir, identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_another_clusters_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = load_or_create(dir.path(), 1, None).unwrap();
        record_cluster(dir.path(), &mut first, "alpha").unwrap();
        assert!(record_cluster(dir.path(), &mut first, "beta").is_err());
        assert_eq!(load_or_create(dir.path(), 1, None).unwrap(), first);
        let err = load_or_create(dir.path(), 1, Some("beta")).unwrap_err();
        assert!(
            err.to_string().contains("belongs to cluster 'alpha'"),
            "{err}"
        );
        let err = load_or_create(dir.path(), 2, None).unwrap_err();
        assert!(err.to_string().contains("belongs to node 1"), "{err}");
    }

    #[test]
    fn a_directory_of_a_later_level_is_refused_naming_the_release() {
        let dir = tempfile::tempdir().unwrap();
        let mut identity = load_or_create(dir.path(), 1, None).unwrap();
        assert_eq!(identity.feature_level, 1);
        record_feature_level(dir.path(), &mut identity, format::FEATURE_LEVEL, "0.2.0").unwrap();
        assert_eq!(load_or_create(dir.path(), 1, None).unwrap(), identity);
        record_feature_level(dir.path(), &mut identity, 1, "0.1.0").unwrap();
        assert_eq!(
            identity.feature_level,
            format::FEATURE_LEVEL,
            "never lowered"
        );
        record_feature_level(
            dir.path(),
            &mut identity,
            format::FEATURE_LEVEL + 1,
            "9.1.0",
        )
        .unwrap();
        let err = load_or_create(dir.path(), 1, None).unwrap_err().to_string();
        assert!(
            err.contains("needs release 9.1.0 or later") && err.contains(format::RELEASE),
            "{err}"
        );
    }

    #[test]
    fn a_release_0_1_0_identity_reads_as_level_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(IDENTITY_FILE),
            r#"{"cluster_id":"c","node_id":1,"format_version":1,"data_id":7}"#,
        )
        .unwrap();
        let identity = load_or_create(dir.path(), 1, None).unwrap();
        assert_eq!((identity.data_id, identity.feature_level), (7, 1));
    }
}
