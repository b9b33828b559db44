//! How much disk the node's data takes and how much its filesystem has left, for the
//! `tributary_storage_*_bytes` gauges.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes the files under `dir` take on disk (allocated blocks, so sparse and preallocated
/// files count as they are stored), recursively. Unreadable entries count as 0.
pub fn used_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => used_bytes(&entry.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// The filesystem holding `dir`: (bytes available to this process, total bytes).
pub fn filesystem_bytes(dir: &Path) -> Option<(u64, u64)> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    let fragment = stat.fragment_size() as u64;
    Some((
        stat.blocks_available() as u64 * fragment,
        stat.blocks() as u64 * fragment,
    ))
}

/// Sets the storage gauges for the data directory `dir`.
pub fn record(dir: &Path) {
    metrics::gauge!("tributary_storage_data_bytes").set(used_bytes(dir) as f64);
    if let Some((free, total)) = filesystem_bytes(dir) {
        metrics::gauge!("tributary_storage_disk_free_bytes").set(free as f64);
        metrics::gauge!("tributary_storage_disk_total_bytes").set(total as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_bytes_counts_files_in_subdirectories_and_free_space_is_known() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![1u8; 100_000]).unwrap();
        let used = used_bytes(dir.path());
        assert!(used >= 110_000, "{used}");
        assert!(used < 200_000, "{used}");
        std::fs::remove_file(dir.path().join("sub/b")).unwrap();
        assert!(used_bytes(dir.path()) < 100_000);
        let (free, total) = filesystem_bytes(dir.path()).unwrap();
        assert!(total > 0 && free <= total, "{free} of {total}");
    }
}
