//! `<data dir>/root-connection-string`: the connection string of the namespace's root rule
//! (`RootManageSharedAccessKey`), written by a node with `--auth sas` once the rule is in
//! its view, and again whenever its primary key changes, so an operator of a new cluster
//! has a credential to start from. Readable by the node's user only.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tributary_broker::Broker;
use tributary_controller::rules::ROOT_RULE;

/// The file's name inside the data directory.
pub const FILE_NAME: &str = "root-connection-string";

/// The root rule's connection string for a node serving clients on `client_addr`.
pub fn connection_string(client_addr: &str, primary_key: &str) -> String {
    format!(
        "Endpoint=sb://{client_addr}/;SharedAccessKeyName={ROOT_RULE};SharedAccessKey={primary_key}"
    )
}

/// Writes the file whenever the root rule's primary key in the view differs from what was
/// last written; runs until the node stops.
pub async fn keep_written(broker: Arc<Broker>, data_dir: PathBuf) {
    let path = data_dir.join(FILE_NAME);
    let client_addr = broker.runtime().me.client_addr.clone();
    let mut view = broker.runtime().view();
    let mut written: Option<String> = None;
    loop {
        let key = view
            .borrow_and_update()
            .rules
            .iter()
            .find(|rule| rule.name == ROOT_RULE)
            .map(|rule| rule.primary_key.clone());
        if let Some(key) = key
            && written.as_ref() != Some(&key)
        {
            match write_private(&path, &connection_string(&client_addr, &key)) {
                Ok(()) => {
                    tracing::info!(
                        path = %path.display(),
                        "wrote the root rule's connection string (RootManageSharedAccessKey)"
                    );
                    written = Some(key);
                }
                Err(err) => tracing::warn!(
                    path = %path.display(),
                    %err,
                    "cannot write the root rule's connection string"
                ),
            }
        }
        if view.changed().await.is_err() {
            return;
        }
    }
}

/// Replaces `path` with `text`, readable and writable by the owner only (0600), through a
/// temporary file so a reader never sees half of it.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = path.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_file_for_the_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write_private(&path, "one").unwrap();
        write_private(&path, &connection_string("127.0.0.1:7400", "k")).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "Endpoint=sb://127.0.0.1:7400/;SharedAccessKeyName=RootManageSharedAccessKey;\
             SharedAccessKey=k\n"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
