//! Where capture files go: a local directory or an S3-compatible object store, behind one
//! interface ([`Sink`]) over `object_store`.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::capture::CaptureError;
pub use tributary_controller::capture::CaptureDestination;
use tributary_controller::capture::http_allowed_by_default;

/// Parses a destination as people write it:
///
/// - `file:///abs/dir` or `/abs/dir`: a local directory (taken literally, not
///   percent-decoded);
/// - `s3://bucket/prefix?region=us-east-1&endpoint=http://127.0.0.1:9000`: an S3 bucket;
///   `region` is required, `endpoint` only for servers other than Amazon S3 (plain HTTP is
///   allowed when the endpoint is `http://`, or set `allow_http=true|false` explicitly).
///
/// The error says what is wrong and what to write instead.
pub fn parse_destination(text: &str) -> Result<CaptureDestination, String> {
    const FORMS: &str = "write file:///absolute/dir, /absolute/dir or \
                         s3://bucket/prefix?region=REGION[&endpoint=http://HOST:PORT]";
    if let Some(path) = text.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(format!(
                "invalid capture destination {text:?}: a file URL needs an absolute path after \
                 \"file://\", e.g. file:///var/lib/capture (three slashes)"
            ));
        }
        return directory(text, path);
    }
    if text.starts_with('/') {
        return directory(text, text);
    }
    if let Some(rest) = text.strip_prefix("s3://") {
        return parse_s3(text, rest);
    }
    if text.is_empty() {
        return Err(format!("the capture destination is empty; {FORMS}"));
    }
    Err(format!(
        "unsupported capture destination {text:?}: {FORMS} (a local path must be absolute)"
    ))
}

/// Capture files written to and listed from one [`CaptureDestination`].
#[derive(Debug, Clone)]
pub struct Sink {
    store: Arc<dyn ObjectStore>,
    destination: CaptureDestination,
}

impl Sink {
    /// Opens `destination`, creating a local directory if it is missing; S3 credentials
    /// come from the process environment. Does not contact an object store.
    pub fn open(destination: &CaptureDestination) -> Result<Sink, CaptureError> {
        let env = std::env::vars_os()
            .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)));
        Self::open_with_env(destination, env)
    }

    /// As [`Sink::open`], with the environment given: of `env`, the `AWS_*` variables
    /// configure an S3 destination as the AWS tools read them (what the destination itself
    /// says wins).
    pub fn open_with_env(
        destination: &CaptureDestination,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Sink, CaptureError> {
        let store: Arc<dyn ObjectStore> = match destination {
            CaptureDestination::Directory { path } => {
                std::fs::create_dir_all(path).map_err(|source| CaptureError::CreateDirectory {
                    path: path.clone(),
                    source,
                })?;
                let local = LocalFileSystem::new_with_prefix(path)
                    .map_err(|source| open_error(destination, source))?;
                Arc::new(local)
            }
            CaptureDestination::S3 {
                endpoint,
                bucket,
                region,
                prefix,
                allow_http,
            } => {
                // As AmazonS3Builder::from_env reads the process environment.
                let mut builder = AmazonS3Builder::new();
                for (key, value) in env {
                    if key.starts_with("AWS_")
                        && let Ok(config_key) = key.to_ascii_lowercase().parse()
                    {
                        builder = builder.with_config(config_key, value);
                    }
                }
                builder = builder
                    .with_bucket_name(bucket)
                    .with_region(region)
                    .with_allow_http(*allow_http);
                if let Some(endpoint) = endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                let s3 = builder
                    .build()
                    .map_err(|source| open_error(destination, source))?;
                if prefix.is_empty() {
                    Arc::new(s3)
                } else {
                    Arc::new(PrefixStore::new(s3, object_path(prefix)?))
                }
            }
        };
        Ok(Sink {
            store,
            destination: destination.clone(),
        })
    }

    /// The destination this sink writes to.
    pub fn destination(&self) -> &CaptureDestination {
        &self.destination
    }

    /// Writes `bytes` as the file at `path` (relative, '/'-separated), replacing any file
    /// already there: writing a window's file again after a failover leaves one file. A
    /// reader never sees a partial file: a local file is written beside its place and
    /// renamed into it, and an S3 object appears whole when its upload completes.
    pub async fn put(&self, path: &str, bytes: Vec<u8>) -> Result<(), CaptureError> {
        let location = object_path(path)?;
        self.store
            .put(&location, PutPayload::from(bytes))
            .await
            .map_err(|source| CaptureError::Put {
                destination: self.destination.to_string(),
                path: path.to_owned(),
                source: Box::new(source),
            })?;
        Ok(())
    }

    /// The paths of every file under the directory `prefix` (whole '/'-separated segments,
    /// empty for all), at any depth, sorted.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, CaptureError> {
        let list_error = |source| CaptureError::List {
            destination: self.destination.to_string(),
            prefix: prefix.to_owned(),
            source: Box::new(source),
        };
        let prefix_path = match prefix.trim_matches('/') {
            "" => None,
            trimmed => Some(object_path(trimmed)?),
        };
        let mut paths: Vec<String> = self
            .store
            .list(prefix_path.as_ref())
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .map_err(list_error)?;
        paths.sort();
        Ok(paths)
    }
}

fn directory(text: &str, path: &str) -> Result<CaptureDestination, String> {
    let normalized = path.trim_end_matches('/');
    if normalized.is_empty() {
        return Err(format!(
            "invalid capture destination {text:?}: the root directory cannot hold capture \
             files; name a directory below it, e.g. /var/lib/capture"
        ));
    }
    Ok(CaptureDestination::Directory {
        path: normalized.to_owned(),
    })
}

fn parse_s3(text: &str, rest: &str) -> Result<CaptureDestination, String> {
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
    validate_bucket(bucket)
        .map_err(|why| format!("invalid capture destination {text:?}: {why}"))?;
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        Path::parse(prefix).map_err(|err| {
            format!(
                "invalid capture destination {text:?}: the prefix {prefix:?} is not a valid \
                 object path ({err}); use segments separated by single '/'"
            )
        })?;
    }
    let mut endpoint = None;
    let mut region = None;
    let mut allow_http = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let duplicate = match key {
            "endpoint" => endpoint.replace(value.to_owned()).is_some(),
            "region" => region.replace(value.to_owned()).is_some(),
            "allow_http" => {
                let allowed = match value {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(format!(
                            "invalid capture destination {text:?}: allow_http must be true or \
                             false, not {value:?}"
                        ));
                    }
                };
                allow_http.replace(allowed).is_some()
            }
            _ => {
                return Err(format!(
                    "invalid capture destination {text:?}: unknown parameter {key:?}; the \
                     parameters are region, endpoint and allow_http"
                ));
            }
        };
        if duplicate {
            return Err(format!(
                "invalid capture destination {text:?}: {key} is given twice"
            ));
        }
    }
    if let Some(endpoint) = &endpoint {
        let host = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"));
        if host.is_none_or(|host| host.is_empty() || host.contains(['?', '&', '#'])) {
            return Err(format!(
                "invalid capture destination {text:?}: the endpoint {endpoint:?} must be an \
                 http:// or https:// URL, e.g. endpoint=http://127.0.0.1:9000"
            ));
        }
    }
    let region = match region {
        Some(region) if !region.is_empty() => region,
        _ => {
            return Err(format!(
                "invalid capture destination {text:?}: the region is missing; add \
                 ?region=REGION (the bucket's region, e.g. us-east-1; any for most \
                 S3-compatible servers)"
            ));
        }
    };
    let allow_http = allow_http.unwrap_or(http_allowed_by_default(endpoint.as_deref()));
    Ok(CaptureDestination::S3 {
        endpoint,
        bucket: bucket.to_owned(),
        region,
        prefix: prefix.to_owned(),
        allow_http,
    })
}

/// S3's bucket naming rules, so a typo is refused when the destination is set rather than
/// when the first file is written.
fn validate_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("the bucket name is missing: write s3://bucket/prefix?region=REGION".into());
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let well_formed = (3..=63).contains(&bucket.len())
        && bucket.chars().all(allowed)
        && bucket.starts_with(alphanumeric)
        && bucket.ends_with(alphanumeric);
    if well_formed {
        Ok(())
    } else {
        Err(format!(
            "{bucket:?} is not a valid bucket name: 3 to 63 lowercase letters, digits, '-' or \
             '.', starting and ending with a letter or digit"
        ))
    }
}

fn object_path(path: &str) -> Result<Path, CaptureError> {
    let invalid = |reason: String| CaptureError::InvalidPath {
        path: path.to_owned(),
        reason,
    };
    let parsed = Path::parse(path).map_err(|err| invalid(err.to_string()))?;
    if parsed.parts_count() == 0 {
        return Err(invalid("the path is empty".to_owned()));
    }
    Ok(parsed)
}

fn open_error(destination: &CaptureDestination, source: object_store::Error) -> CaptureError {
    CaptureError::Open {
        destination: destination.to_string(),
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(
        endpoint: Option<&str>,
        bucket: &str,
        prefix: &str,
        allow_http: bool,
    ) -> CaptureDestination {
        CaptureDestination::S3 {
            endpoint: endpoint.map(str::to_owned),
            bucket: bucket.to_owned(),
            region: "us-east-1".to_owned(),
            prefix: prefix.to_owned(),
            allow_http,
        }
    }

    #[test]
    fn parses_directories() {
        let expected = CaptureDestination::Directory {
            path: "/var/lib/capture".to_owned(),
        };
        assert_eq!(
            parse_destination("file:///var/lib/capture"),
            Ok(expected.clone())
        );
        assert_eq!(parse_destination("/var/lib/capture"), Ok(expected.clone()));
        assert_eq!(parse_destination("/var/lib/capture/"), Ok(expected));
    }

    #[test]
    fn parses_s3_buckets() {
        assert_eq!(
            parse_destination(
                "s3://captures/tributary/prod?endpoint=http://127.0.0.1:9000&region=us-east-1"
            ),
            Ok(s3(
                Some("http://127.0.0.1:9000"),
                "captures",
                "tributary/prod",
                true
            ))
        );
        assert_eq!(
            parse_destination("s3://captures?region=us-east-1"),
            Ok(s3(None, "captures", "", false))
        );
        assert_eq!(
            parse_destination("s3://captures/?region=us-east-1"),
            Ok(s3(None, "captures", "", false))
        );
        assert_eq!(
            parse_destination(
                "s3://my.captures/a/?region=us-east-1&endpoint=https://s3.example.com"
            ),
            Ok(s3(
                Some("https://s3.example.com"),
                "my.captures",
                "a",
                false
            ))
        );
        assert_eq!(
            parse_destination(
                "s3://captures?region=us-east-1&endpoint=http://minio:9000&allow_http=false"
            ),
            Ok(s3(Some("http://minio:9000"), "captures", "", false))
        );
    }

    #[test]
    fn refuses_bad_destinations_saying_what_to_write() {
        let cases = [
            ("", "empty"),
            ("relative/dir", "must be absolute"),
            ("file://relative/dir", "three slashes"),
            ("file:///", "root directory"),
            ("/", "root directory"),
            ("gs://bucket/x", "write file:///absolute/dir"),
            ("s3://captures/x", "region is missing"),
            ("s3://captures/x?region=", "region is missing"),
            ("s3://?region=us-east-1", "bucket name is missing"),
            ("s3://Captures?region=us-east-1", "not a valid bucket name"),
            ("s3://ab?region=us-east-1", "not a valid bucket name"),
            ("s3://bucket-?region=us-east-1", "not a valid bucket name"),
            (
                "s3://bucket/a//b?region=us-east-1",
                "not a valid object path",
            ),
            (
                "s3://bucket/a/../b?region=us-east-1",
                "not a valid object path",
            ),
            (
                "s3://bucket?region=us-east-1&bucket=x",
                "unknown parameter \"bucket\"",
            ),
            ("s3://bucket?region=a&region=b", "region is given twice"),
            (
                "s3://bucket?region=a&endpoint=127.0.0.1:9000",
                "http:// or https:// URL",
            ),
            (
                "s3://bucket?region=a&endpoint=http://",
                "http:// or https:// URL",
            ),
            (
                "s3://bucket?region=a&allow_http=yes",
                "allow_http must be true or false",
            ),
        ];
        for (text, why) in cases {
            let err = parse_destination(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn display_round_trips_through_parse() {
        let destinations = [
            CaptureDestination::Directory {
                path: "/var/lib/capture".to_owned(),
            },
            CaptureDestination::Directory {
                path: "/tmp/with space/and?mark".to_owned(),
            },
            s3(
                Some("http://127.0.0.1:9000"),
                "captures",
                "tributary/prod",
                true,
            ),
            s3(Some("http://127.0.0.1:9000"), "captures", "", false),
            s3(Some("https://s3.example.com"), "captures", "x", true),
            s3(Some("https://s3.example.com"), "captures", "x", false),
            s3(None, "captures", "a/b", false),
            s3(None, "captures", "", true),
        ];
        for destination in destinations {
            let text = destination.to_string();
            assert_eq!(parse_destination(&text), Ok(destination), "{text}");
        }
        assert_eq!(
            s3(Some("http://127.0.0.1:9000"), "captures", "p", true).to_string(),
            "s3://captures/p?region=us-east-1&endpoint=http://127.0.0.1:9000"
        );
    }

    #[test]
    fn survives_postcard() {
        let destination = s3(Some("http://127.0.0.1:9000"), "captures", "p", true);
        let bytes = postcard::to_allocvec(&destination).unwrap();
        assert_eq!(
            postcard::from_bytes::<CaptureDestination>(&bytes).unwrap(),
            destination
        );
    }

    #[tokio::test]
    async fn directory_sink_puts_overwrites_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("not-yet-created");
        let destination = CaptureDestination::Directory {
            path: root.to_str().unwrap().to_owned(),
        };
        let sink = Sink::open(&destination).unwrap();
        assert!(root.is_dir());
        assert_eq!(sink.list("").await.unwrap(), Vec::<String>::new());

        let first = "ns/hub/0/2019/01/02/03/04/05.avro";
        let second = "ns/hub/0/2019/01/02/03/04/06.avro";
        let other_hub = "ns/other/0/2019/01/02/03/04/05.avro";
        sink.put(second, b"second".to_vec()).await.unwrap();
        sink.put(first, b"first, long version".to_vec())
            .await
            .unwrap();
        sink.put(other_hub, b"other".to_vec()).await.unwrap();
        // Overwriting with shorter contents leaves exactly the new contents.
        sink.put(first, b"again".to_vec()).await.unwrap();

        assert_eq!(std::fs::read(root.join(first)).unwrap(), b"again");
        assert_eq!(std::fs::read(root.join(second)).unwrap(), b"second");
        assert_eq!(sink.list("").await.unwrap(), [first, second, other_hub]);
        assert_eq!(sink.list("ns/hub").await.unwrap(), [first, second]);
        assert_eq!(sink.list("ns/hub/").await.unwrap(), [first, second]);
        // Prefixes are whole segments.
        assert!(sink.list("ns/hu").await.unwrap().is_empty());
        assert!(sink.list("elsewhere").await.unwrap().is_empty());
        // No temporary files are left beside the written ones.
        let names: Vec<_> = std::fs::read_dir(root.join("ns/hub/0/2019/01/02/03/04"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[tokio::test]
    async fn refuses_paths_that_escape_the_destination() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Sink::open(&CaptureDestination::Directory {
            path: dir.path().to_str().unwrap().to_owned(),
        })
        .unwrap();
        for path in ["../outside.avro", "a//b.avro", ""] {
            let err = sink.put(path, vec![1]).await.unwrap_err();
            assert!(
                matches!(err, CaptureError::InvalidPath { .. }),
                "{path:?}: {err}"
            );
        }
    }

    #[test]
    fn reports_a_directory_it_cannot_create() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let err = Sink::open(&CaptureDestination::Directory {
            path: file.join("capture").to_str().unwrap().to_owned(),
        })
        .unwrap_err();
        assert!(matches!(err, CaptureError::CreateDirectory { .. }), "{err}");
        assert!(err.to_string().contains("may create and write it"), "{err}");
    }
}
