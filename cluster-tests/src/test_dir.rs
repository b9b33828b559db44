//! A scratch directory per test, kept when the test fails so its node logs can be read.

use std::path::Path;

use tempfile::TempDir;

pub struct TestDir {
    dir: Option<TempDir>,
}

impl TestDir {
    /// A fresh directory named after the test, in the system's temporary directory.
    pub fn new(test: &str) -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tributary-{test}-"))
            .tempdir()
            .expect("a temporary directory can be created");
        eprintln!("{test}: test directory {}", dir.path().display());
        TestDir { dir: Some(dir) }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("present until dropped").path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take()
            && std::thread::panicking()
        {
            eprintln!("test failed: kept {} for inspection", dir.keep().display());
        }
    }
}
