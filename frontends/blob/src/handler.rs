//! The operations the checkpoint stores call, on the broker's [`Service`]: Create Container
//! and Get Container Properties (any container is the cluster's one namespace), List Blobs,
//! Put Blob, Set Blob Metadata and Get Blob Properties over the consumer groups' ownership
//! records and checkpoints.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use tributary_broker::auth::Credential;
use tributary_broker::service::{BlobCondition, BlobPut, BlobView, BlobWrite, Service};

use crate::auth::{self, Access};
use crate::error::BlobError;
use crate::names;
use crate::request::{BlobName, NAME_LAYOUT, Target, bare_etag, header, kind_segment, metadata};
use crate::xml;

/// The largest request body read (the stores send none; a Put Blob's content is refused).
const BODY_BYTES_MAX: usize = 64 * 1024;
/// The version answered when a request names none (the Python store's default).
const VERSION_DEFAULT: &str = "2019-07-07";
/// A listing's page at most, and by default (Azure's).
const PAGE_MAX: usize = 5000;
/// A container's ETag: containers are not records here.
const CONTAINER_ETAG: &str = "\"0x8D000000000000C\"";

/// The operations, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    CreateContainer,
    ContainerProperties,
    ListBlobs,
    PutBlob,
    SetMetadata,
    BlobProperties,
}

impl Operation {
    fn label(self) -> &'static str {
        match self {
            Operation::CreateContainer => "create_container",
            Operation::ContainerProperties => "container_properties",
            Operation::ListBlobs => "list_blobs",
            Operation::PutBlob => "put_blob",
            Operation::SetMetadata => "set_metadata",
            Operation::BlobProperties => "blob_properties",
        }
    }

    fn access(self) -> Access {
        match self {
            Operation::CreateContainer => Access::Create,
            Operation::ContainerProperties | Operation::BlobProperties => Access::Read,
            Operation::ListBlobs => Access::List,
            Operation::PutBlob | Operation::SetMetadata => Access::Write,
        }
    }
}

/// Serves Blob requests from a node's [`Service`]. Cheap to clone.
#[derive(Clone)]
pub struct BlobEndpoint {
    service: Service,
}

/// A successful answer: status, headers, body.
struct Answer {
    status: StatusCode,
    headers: Vec<(String, String)>,
    body: Option<(String, &'static str)>,
}

impl Answer {
    fn new(status: StatusCode) -> Answer {
        Answer {
            status,
            headers: Vec::new(),
            body: None,
        }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Answer {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

impl BlobEndpoint {
    pub fn new(service: Service) -> BlobEndpoint {
        BlobEndpoint { service }
    }

    /// Answers one request; never fails (errors are Azure error answers).
    pub async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = request.into_parts();
        let version = match header(&parts.headers, "x-ms-version") {
            "" => VERSION_DEFAULT.to_string(),
            v => v.to_string(),
        };
        let head = parts.method == Method::HEAD;
        let body = Limited::new(body, BODY_BYTES_MAX).collect().await;
        let (operation, outcome) = match body {
            Ok(body) => {
                let body = body.to_bytes();
                let target = Target::parse(parts.uri.path(), parts.uri.query());
                match target.and_then(|t| operation(&parts.method, &t).map(|op| (t, op))) {
                    Ok((target, op)) => {
                        let outcome = self
                            .run(op, &parts.method, &target, &parts.headers, body)
                            .await;
                        (Some(op), outcome)
                    }
                    Err(err) => (None, Err(err)),
                }
            }
            Err(_) => (
                None,
                Err(BlobError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "RequestBodyTooLarge",
                    format!("request bodies here are at most {BODY_BYTES_MAX} bytes"),
                )),
            ),
        };
        let label = operation.map_or("unknown", Operation::label);
        let request_id = request_id();
        let response = match outcome {
            Ok(answer) => {
                metrics::counter!("tributary_blob_requests_total", "operation" => label, "code" => "ok")
                    .increment(1);
                answer_response(answer, head)
            }
            Err(err) => {
                metrics::counter!("tributary_blob_requests_total", "operation" => label, "code" => err.code)
                    .increment(1);
                if err.status.is_server_error() || err.code == "AuthenticationFailed" {
                    tracing::info!(operation = label, code = err.code, message = %err.message, "a Blob request failed");
                } else {
                    tracing::debug!(operation = label, code = err.code, message = %err.message, "a Blob request was refused");
                }
                error_response(&err, &request_id, head)
            }
        };
        finish(response, &request_id, &version)
    }

    async fn run(
        &self,
        op: Operation,
        method: &Method,
        target: &Target,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Answer, BlobError> {
        let container_call = target.blob.is_empty();
        let credential = auth::credential(
            method,
            target,
            headers,
            op.access(),
            container_call,
            SystemTime::now(),
        )?;
        match op {
            Operation::CreateContainer => {
                self.service.authenticated(&credential)?;
                Ok(container_answer(StatusCode::CREATED))
            }
            Operation::ContainerProperties => {
                self.service.authenticated(&credential)?;
                Ok(container_answer(StatusCode::OK)
                    .header("x-ms-lease-status", "unlocked")
                    .header("x-ms-lease-state", "available")
                    .header("x-ms-has-immutability-policy", "false")
                    .header("x-ms-has-legal-hold", "false"))
            }
            Operation::ListBlobs => self.list(&credential, target).await,
            Operation::BlobProperties => self.properties(&credential, target).await,
            Operation::SetMetadata | Operation::PutBlob => {
                let create = op == Operation::PutBlob;
                if create {
                    check_put_blob(headers, &body)?;
                }
                self.write(&credential, target, headers, create).await
            }
        }
    }

    async fn list(&self, credential: &Credential, target: &Target) -> Result<Answer, BlobError> {
        let prefix = target.param("prefix").unwrap_or_default();
        let segments: Vec<&str> = prefix.splitn(4, '/').collect();
        let [namespace, hub, group, _] = segments[..] else {
            return Err(BlobError::invalid_query(format!(
                "list with a prefix naming a consumer group, \
                 {{namespace}}/{{eventhub}}/{{consumergroup}}/ (got '{prefix}'): this endpoint \
                 keeps only checkpoint store records, named {NAME_LAYOUT}"
            )));
        };
        let page = match target.param("maxresults") {
            None => PAGE_MAX,
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=PAGE_MAX).contains(n))
                .ok_or_else(|| {
                    BlobError::invalid_query(format!(
                        "maxresults '{text}' is not a number from 1 to {PAGE_MAX}"
                    ))
                })?,
        };
        let include_metadata = target
            .param("include")
            .is_some_and(|v| v.split(',').any(|i| i == "metadata"));
        let marker = target.param("marker").unwrap_or_default();
        let resolved = names::resolve(&self.service, credential, hub, group)?;
        let mut blobs: Vec<(String, BlobView)> = self
            .service
            .list_blobs(credential, &resolved.hub, &resolved.group)
            .await?
            .into_iter()
            .map(|blob| {
                let name = format!(
                    "{namespace}/{hub}/{group}/{}/{}",
                    kind_segment(blob.kind),
                    blob.partition
                );
                (name, blob)
            })
            .filter(|(name, _)| name.starts_with(prefix))
            .filter(|(name, _)| name.as_str() >= marker)
            .collect();
        blobs.sort_by(|(a, _), (b, _)| a.cmp(b));
        let next_marker = blobs.get(page).map(|(name, _)| name.clone());
        blobs.truncate(page);
        let endpoint = format!("/{}/", target.account);
        let body = xml::list_blobs(
            &endpoint,
            &target.container,
            prefix,
            target.param("marker"),
            target.param("maxresults"),
            &blobs,
            include_metadata,
            next_marker.as_deref(),
        );
        let mut answer = Answer::new(StatusCode::OK);
        answer.body = Some((body, "application/xml"));
        Ok(answer)
    }

    async fn properties(
        &self,
        credential: &Credential,
        target: &Target,
    ) -> Result<Answer, BlobError> {
        let name = BlobName::parse(&target.blob)?;
        let group = names::resolve(&self.service, credential, name.hub, name.group)?;
        let blob = self
            .service
            .list_blobs(credential, &group.hub, &group.group)
            .await?
            .into_iter()
            .find(|b| b.kind == name.kind && b.partition == name.partition)
            .ok_or_else(BlobError::blob_not_found)?;
        let mut answer = blob_answer(StatusCode::OK, &blob)
            .header("content-length", "0")
            .header("content-type", "application/octet-stream")
            .header("x-ms-blob-type", "BlockBlob")
            .header("x-ms-lease-status", "unlocked")
            .header("x-ms-lease-state", "available")
            .header("x-ms-server-encrypted", "false")
            .header("accept-ranges", "bytes");
        for (key, value) in &blob.metadata {
            answer = answer.header(&format!("x-ms-meta-{key}"), value.clone());
        }
        Ok(answer)
    }

    async fn write(
        &self,
        credential: &Credential,
        target: &Target,
        headers: &HeaderMap,
        create: bool,
    ) -> Result<Answer, BlobError> {
        let name = BlobName::parse(&target.blob)?;
        let condition = condition(headers)?;
        let metadata = metadata(headers)?;
        let group = names::resolve(&self.service, credential, name.hub, name.group)?;
        let put = BlobPut {
            partition: name.partition,
            kind: name.kind,
            metadata,
            condition,
            create,
        };
        match self
            .service
            .put_blob(credential, &group.hub, &group.group, put)
            .await?
        {
            BlobWrite::Written(blob) => {
                let status = if create {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                };
                Ok(blob_answer(status, &blob)
                    .header("x-ms-request-server-encrypted", "false")
                    .header("content-length", "0"))
            }
            BlobWrite::NotFound => Err(BlobError::blob_not_found()),
            BlobWrite::ConditionNotMet => Err(BlobError::condition_not_met()),
            BlobWrite::AlreadyExists => Err(BlobError::blob_exists()),
        }
    }
}

/// Which operation a request is.
fn operation(method: &Method, target: &Target) -> Result<Operation, BlobError> {
    let restype = target.param("restype").unwrap_or_default();
    let comp = target.param("comp").unwrap_or_default();
    let container_call = target.blob.is_empty();
    let op = match (method.as_str(), container_call, restype, comp) {
        ("PUT", true, "container", "") => Operation::CreateContainer,
        ("GET" | "HEAD", true, "container", "") => Operation::ContainerProperties,
        ("GET", true, "container", "list") => Operation::ListBlobs,
        ("PUT", false, "", "metadata") => Operation::SetMetadata,
        ("PUT", false, "", "") => Operation::PutBlob,
        ("GET" | "HEAD", false, "", "") => Operation::BlobProperties,
        _ => {
            return Err(BlobError::unsupported(format!(
                "{method} {} (restype '{restype}', comp '{comp}') is not served here: this \
                 endpoint is the Event Hubs checkpoint store, which answers the calls the \
                 SDKs' BlobCheckpointStore makes (create and get a container, list blobs, \
                 put a blob, set and get its metadata)",
                target.raw_path
            )));
        }
    };
    Ok(op)
}

fn condition(headers: &HeaderMap) -> Result<BlobCondition, BlobError> {
    let if_match = header(headers, "if-match");
    let if_none_match = header(headers, "if-none-match");
    match (if_match, if_none_match) {
        ("", "") => Ok(BlobCondition::None),
        // Any existing blob: Set Metadata needs one anyway; Put Blob then replaces.
        ("*", "") => Ok(BlobCondition::None),
        (etag, "") => Ok(BlobCondition::IfMatch(bare_etag(etag).to_string())),
        ("", "*") => Ok(BlobCondition::IfNoneMatchAny),
        ("", other) => Err(BlobError::invalid_header(format!(
            "If-None-Match '{other}': only '*' (the blob must not exist) is supported here"
        ))),
        _ => Err(BlobError::invalid_header(
            "If-Match and If-None-Match together are not supported here",
        )),
    }
}

fn check_put_blob(headers: &HeaderMap, body: &Bytes) -> Result<(), BlobError> {
    match header(headers, "x-ms-blob-type") {
        "BlockBlob" => {}
        "" => {
            return Err(BlobError::new(
                StatusCode::BAD_REQUEST,
                "MissingRequiredHeader",
                "Put Blob needs x-ms-blob-type: BlockBlob",
            ));
        }
        other => {
            return Err(BlobError::invalid_header(format!(
                "x-ms-blob-type '{other}': only BlockBlob is served here"
            )));
        }
    }
    if !body.is_empty() {
        return Err(BlobError::new(
            StatusCode::BAD_REQUEST,
            "InvalidInput",
            format!(
                "a blob here is a checkpoint store record, kept in its metadata: its content is \
                 empty, not {} bytes",
                body.len()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn http_date(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    httpdate::fmt_http_date(at)
}

fn container_answer(status: StatusCode) -> Answer {
    Answer::new(status)
        .header("etag", CONTAINER_ETAG)
        .header("last-modified", http_date(0))
}

fn blob_answer(status: StatusCode, blob: &BlobView) -> Answer {
    Answer::new(status)
        .header("etag", format!("\"{}\"", blob.etag))
        .header("last-modified", http_date(blob.last_modified_ms))
}

fn request_id() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn answer_response(answer: Answer, head: bool) -> Response<Full<Bytes>> {
    let (body, content_type) = match answer.body {
        Some((body, content_type)) if !head => (Bytes::from(body), Some(content_type)),
        _ => (Bytes::new(), None),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = answer.status;
    let headers = response.headers_mut();
    for (name, value) in answer.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.append(name, value);
        }
    }
    if let Some(content_type) = content_type {
        headers.insert("content-type", HeaderValue::from_static(content_type));
    }
    response
}

fn error_response(err: &BlobError, request_id: &str, head: bool) -> Response<Full<Bytes>> {
    let body = if head {
        Bytes::new()
    } else {
        Bytes::from(xml::error(
            err.code,
            &err.message,
            request_id,
            &http_date(now_ms()),
        ))
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = err.status;
    let headers = response.headers_mut();
    headers.insert("x-ms-error-code", HeaderValue::from_static(err.code));
    if !head {
        headers.insert("content-type", HeaderValue::from_static("application/xml"));
    }
    response
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64
}

/// The headers every answer carries.
fn finish(
    mut response: Response<Full<Bytes>>,
    request_id: &str,
    version: &str,
) -> Response<Full<Bytes>> {
    let headers = response.headers_mut();
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    };
    set("x-ms-request-id", request_id);
    set("x-ms-version", version);
    set("date", &http_date(now_ms()));
    set("server", "Tributary-Blob");
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path: &str, query: &str) -> Target {
        Target::parse(path, Some(query)).unwrap()
    }

    #[test]
    fn requests_map_to_the_store_operations() {
        let cases = [
            (
                Method::PUT,
                "/a/c",
                "restype=container",
                Operation::CreateContainer,
            ),
            (
                Method::GET,
                "/a/c",
                "restype=container",
                Operation::ContainerProperties,
            ),
            (
                Method::HEAD,
                "/a/c",
                "restype=container",
                Operation::ContainerProperties,
            ),
            (
                Method::GET,
                "/a/c",
                "restype=container&comp=list&prefix=x",
                Operation::ListBlobs,
            ),
            (
                Method::PUT,
                "/a/c/n/h/g/ownership/0",
                "comp=metadata",
                Operation::SetMetadata,
            ),
            (
                Method::PUT,
                "/a/c/n/h/g/ownership/0",
                "",
                Operation::PutBlob,
            ),
            (
                Method::HEAD,
                "/a/c/n/h/g/ownership/0",
                "",
                Operation::BlobProperties,
            ),
        ];
        for (method, path, query, expected) in cases {
            assert_eq!(
                operation(&method, &target(path, query)).unwrap(),
                expected,
                "{method} {path}?{query}"
            );
        }
        let err = operation(&Method::DELETE, &target("/a/c/n/h/g/ownership/0", "")).unwrap_err();
        assert_eq!(err.status, StatusCode::METHOD_NOT_ALLOWED);
        let err = operation(&Method::PUT, &target("/a/c/x", "comp=block")).unwrap_err();
        assert!(err.message.contains("checkpoint store"), "{}", err.message);
    }

    #[test]
    fn conditions_come_from_if_match_and_if_none_match() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in pairs {
                map.insert(*k, HeaderValue::from_static(v));
            }
            map
        };
        assert_eq!(condition(&headers(&[])).unwrap(), BlobCondition::None);
        assert_eq!(
            condition(&headers(&[("if-match", "\"0x8DC1\"")])).unwrap(),
            BlobCondition::IfMatch("0x8DC1".into())
        );
        assert_eq!(
            condition(&headers(&[("if-none-match", "*")])).unwrap(),
            BlobCondition::IfNoneMatchAny
        );
        assert!(condition(&headers(&[("if-none-match", "\"x\"")])).is_err());
        assert!(condition(&headers(&[("if-match", "x"), ("if-none-match", "*")])).is_err());
    }

    #[test]
    fn put_blob_needs_a_block_blob_without_content() {
        let mut headers = HeaderMap::new();
        let err = check_put_blob(&headers, &Bytes::new()).unwrap_err();
        assert_eq!(err.code, "MissingRequiredHeader");
        headers.insert("x-ms-blob-type", HeaderValue::from_static("PageBlob"));
        assert_eq!(
            check_put_blob(&headers, &Bytes::new()).unwrap_err().code,
            "InvalidHeaderValue"
        );
        headers.insert("x-ms-blob-type", HeaderValue::from_static("BlockBlob"));
        check_put_blob(&headers, &Bytes::new()).unwrap();
        let err = check_put_blob(&headers, &Bytes::from_static(b"cat")).unwrap_err();
        assert!(err.message.contains("not 3 bytes"), "{}", err.message);
    }

    #[test]
    fn errors_carry_their_code_in_a_header_and_the_body_except_for_head() {
        let err = BlobError::condition_not_met();
        let response = error_response(&err, "id", false);
        assert_eq!(response.status(), StatusCode::PRECONDITION_FAILED);
        assert_eq!(response.headers()["x-ms-error-code"], "ConditionNotMet");
        assert_eq!(response.headers()["content-type"], "application/xml");
        let head = error_response(&BlobError::blob_not_found(), "id", true);
        assert_eq!(head.headers()["x-ms-error-code"], "BlobNotFound");
        assert!(head.headers().get("content-type").is_none());
    }
}
