//! From a request to the [`Credential`] the broker checks: Shared Key (`Authorization:
//! SharedKey {account}:{signature}`) or an account shared access signature (`sig=` and its
//! fields in the query). Either way the account is a rule's name and the key one of its
//! keys; this module rebuilds the string the client signed, checks the request's time,
//! and leaves the signature to the broker, which knows the keys.

use std::time::{Duration, SystemTime};

use hyper::{HeaderMap, Method};
use tributary_broker::auth::Credential;
use tributary_types::sas::SignedRequest;
use tributary_types::time_format::parse_rfc3339_ms;

use crate::error::BlobError;
use crate::request::{Target, header};

/// How far a Shared Key request's `x-ms-date` may be from the server's time (Azure's).
pub const CLOCK_SKEW_MAX: Duration = Duration::from_secs(15 * 60);

/// What a request may do, for an account SAS's `sp` permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    List,
    Write,
    Create,
}

impl Access {
    /// The `sp` letters any of which allows this access.
    fn letters(self) -> &'static str {
        match self {
            Access::Read => "r",
            Access::List => "l",
            Access::Write => "wa",
            Access::Create => "cw",
        }
    }
}

/// The request's credential; `None` when it carries none (refused unless authorization
/// is off).
pub fn credential(
    method: &Method,
    target: &Target,
    headers: &HeaderMap,
    access: Access,
    container_call: bool,
    now: SystemTime,
) -> Result<Credential, BlobError> {
    let authorization = header(headers, "authorization");
    if let Some(rest) = authorization.strip_prefix("SharedKey ") {
        let (account, signature) = rest.split_once(':').ok_or_else(|| {
            BlobError::authentication(
                "the Authorization header is not 'SharedKey account:signature'",
            )
        })?;
        check_date(headers, now)?;
        return Ok(Credential::Signed(SignedRequest {
            rule: account.to_string(),
            string_to_sign: shared_key_string(method, target, headers, account),
            signature: signature.to_string(),
        }));
    }
    if !authorization.is_empty() {
        return Err(BlobError::authentication(
            "only Shared Key (an AccountKey in the connection string) and account shared \
             access signatures are accepted here",
        ));
    }
    if target.param("sig").is_some() {
        return account_sas(target, access, container_call, now).map(Credential::Signed);
    }
    Ok(Credential::None)
}

fn check_date(headers: &HeaderMap, now: SystemTime) -> Result<(), BlobError> {
    let text = match header(headers, "x-ms-date") {
        "" => header(headers, "date"),
        text => text,
    };
    let date = httpdate::parse_http_date(text).map_err(|_| {
        BlobError::authentication(format!(
            "the request's x-ms-date '{text}' is not an RFC 1123 date"
        ))
    })?;
    let skew = now
        .duration_since(date)
        .or_else(|_| date.duration_since(now))
        .unwrap_or_default();
    if skew > CLOCK_SKEW_MAX {
        return Err(BlobError::authentication(format!(
            "the request's x-ms-date '{text}' is {} s from this server's time (at most {} s \
             allowed): check the client's clock",
            skew.as_secs(),
            CLOCK_SKEW_MAX.as_secs()
        )));
    }
    Ok(())
}

/// The string a Shared Key client signs: the verb, twelve standard headers, the `x-ms-*`
/// headers and the resource (the account, then the path as sent, then the query decoded).
pub fn shared_key_string(
    method: &Method,
    target: &Target,
    headers: &HeaderMap,
    account: &str,
) -> String {
    let content_length = match header(headers, "content-length") {
        "0" => "",
        other => other,
    };
    let mut out = format!("{}\n", method.as_str());
    for value in [
        header(headers, "content-encoding"),
        header(headers, "content-language"),
        content_length,
        header(headers, "content-md5"),
        header(headers, "content-type"),
        header(headers, "date"),
        header(headers, "if-modified-since"),
        header(headers, "if-match"),
        header(headers, "if-none-match"),
        header(headers, "if-unmodified-since"),
        header(headers, "range"),
    ] {
        out.push_str(value);
        out.push('\n');
    }
    let mut ms_headers: Vec<(String, String)> = Vec::new();
    for (name, value) in headers {
        let name = name.as_str();
        if !name.starts_with("x-ms-") {
            continue;
        }
        let value = value.to_str().unwrap_or_default().trim().to_string();
        match ms_headers.iter_mut().find(|(n, _)| n == name) {
            Some((_, existing)) => {
                existing.push(',');
                existing.push_str(&value);
            }
            None => ms_headers.push((name.to_string(), value)),
        }
    }
    // Azure's collation ignores '-' (for the headers clients send, byte order agrees).
    ms_headers.sort_by(|(a, _), (b, _)| {
        let key = |s: &str| s.replace('-', "");
        key(a).cmp(&key(b)).then_with(|| a.cmp(b))
    });
    for (name, value) in ms_headers {
        out.push_str(&format!("{name}:{value}\n"));
    }
    out.push('/');
    out.push_str(account);
    out.push_str(&target.raw_path);
    let mut params: Vec<(String, Vec<&str>)> = Vec::new();
    for (name, value) in &target.query {
        let name = name.to_lowercase();
        match params.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => params.push((name, vec![value])),
        }
    }
    params.sort_by(|(a, _), (b, _)| a.cmp(b));
    for (name, mut values) in params {
        values.sort();
        out.push_str(&format!("\n{name}:{}", values.join(",")));
    }
    out
}

/// An account SAS: its fields, times and permissions checked here, its signature by the
/// broker. The account is the path's.
fn account_sas(
    target: &Target,
    access: Access,
    container_call: bool,
    now: SystemTime,
) -> Result<SignedRequest, BlobError> {
    let field = |name: &'static str| target.param(name).unwrap_or_default();
    if !field("sr").is_empty() {
        return Err(BlobError::authentication(
            "service shared access signatures (sr=...) are not accepted here: sign an account \
             SAS (ss=b) with an authorization rule's key, the rule's name as the account",
        ));
    }
    let now_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64;
    let time = |name: &'static str| -> Result<Option<i64>, BlobError> {
        match field(name) {
            "" => Ok(None),
            text => parse_rfc3339_ms(text).map(Some).map_err(|_| {
                BlobError::authentication(format!(
                    "the signature's {name} '{text}' is not an ISO 8601 UTC time"
                ))
            }),
        }
    };
    let expiry = time("se")?.ok_or_else(|| {
        BlobError::authentication("the shared access signature has no expiry (se)")
    })?;
    if expiry <= now_ms {
        return Err(BlobError::authentication(format!(
            "the shared access signature expired at {}; sign a new one",
            field("se")
        )));
    }
    if time("st")?.is_some_and(|start| start > now_ms + CLOCK_SKEW_MAX.as_millis() as i64) {
        return Err(BlobError::authentication(format!(
            "the shared access signature is not valid before {}",
            field("st")
        )));
    }
    if !field("ss").contains('b') {
        return Err(BlobError::new(
            hyper::StatusCode::FORBIDDEN,
            "AuthorizationServiceMismatch",
            "the shared access signature does not grant the blob service (ss must include b)",
        ));
    }
    let resource_type = if container_call { 'c' } else { 'o' };
    if !field("srt").contains(resource_type) {
        return Err(BlobError::new(
            hyper::StatusCode::FORBIDDEN,
            "AuthorizationResourceTypeMismatch",
            format!(
                "the shared access signature does not grant this resource type (srt must \
                 include {resource_type})"
            ),
        ));
    }
    if !access.letters().chars().any(|l| field("sp").contains(l)) {
        return Err(BlobError::new(
            hyper::StatusCode::FORBIDDEN,
            "AuthorizationPermissionMismatch",
            format!(
                "the shared access signature's permissions '{}' do not allow this call (it \
                 needs one of '{}')",
                field("sp"),
                access.letters()
            ),
        ));
    }
    let mut string_to_sign = [
        target.account.as_str(),
        field("sp"),
        field("ss"),
        field("srt"),
        field("st"),
        field("se"),
        field("sip"),
        field("spr"),
        field("sv"),
    ]
    .join("\n");
    string_to_sign.push('\n');
    // Versions from 2020-12-06 sign the encryption scope too.
    if field("sv") >= "2020-12-06" {
        string_to_sign.push_str(field("ses"));
        string_to_sign.push('\n');
    }
    Ok(SignedRequest {
        rule: target.account.clone(),
        string_to_sign,
        signature: field("sig").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    /// The string to sign recorded from azure-eventhub-checkpointstoreblob 1.2.0's claim
    /// with `If-Match` (the emulator account, path-style, so the account appears twice).
    #[test]
    fn the_recorded_claim_signs_the_same_string() {
        let target = Target::parse(
            "/devstoreaccount1/checkpoints/myns.servicebus.windows.net/myhub/%24default/ownership/0",
            Some("comp=metadata"),
        )
        .unwrap();
        let headers = headers(&[
            ("user-agent", "azsdk-python-storage-blob/12.25.0b1"),
            ("x-ms-meta-ownerid", "owner-B"),
            ("if-match", "\"0x8DC0000000001002\""),
            ("x-ms-version", "2019-07-07"),
            ("x-ms-date", "Fri, 27 Nov 2026 01:45:18 GMT"),
            (
                "x-ms-client-request-id",
                "3324f972-ea04-11f1-a1fc-02fc00000001",
            ),
            ("content-length", "0"),
        ]);
        let expected = "PUT\n\n\n\n\n\n\n\n\"0x8DC0000000001002\"\n\n\n\n\
            x-ms-client-request-id:3324f972-ea04-11f1-a1fc-02fc00000001\n\
            x-ms-date:Fri, 27 Nov 2026 01:45:18 GMT\n\
            x-ms-meta-ownerid:owner-B\n\
            x-ms-version:2019-07-07\n\
            /devstoreaccount1/devstoreaccount1/checkpoints/myns.servicebus.windows.net/myhub/%24default/ownership/0\n\
            comp:metadata";
        assert_eq!(
            shared_key_string(&Method::PUT, &target, &headers, "devstoreaccount1"),
            expected
        );
    }

    #[test]
    fn a_listing_signs_its_decoded_query_sorted() {
        let target = Target::parse(
            "/devstoreaccount1/checkpoints",
            Some("restype=container&comp=list&prefix=myns.servicebus.windows.net%2Fmyhub%2F%24default%2Fownership%2F&include=metadata"),
        )
        .unwrap();
        let text = shared_key_string(&Method::GET, &target, &HeaderMap::new(), "devstoreaccount1");
        assert!(text.ends_with(
            "/devstoreaccount1/devstoreaccount1/checkpoints\ncomp:list\ninclude:metadata\nprefix:myns.servicebus.windows.net/myhub/$default/ownership/\nrestype:container"
        ), "{text}");
    }

    #[test]
    fn shared_key_requests_need_a_current_date() {
        let target = Target::parse("/a/c", Some("restype=container")).unwrap();
        let now = httpdate::parse_http_date("Fri, 27 Nov 2026 01:45:18 GMT").unwrap();
        let signed = |date: &str| {
            credential(
                &Method::GET,
                &target,
                &headers(&[("authorization", "SharedKey a:c2ln"), ("x-ms-date", date)]),
                Access::Read,
                true,
                now,
            )
        };
        let Credential::Signed(request) = signed("Fri, 27 Nov 2026 01:50:00 GMT").unwrap() else {
            panic!("a signed request")
        };
        assert_eq!(
            (request.rule.as_str(), request.signature.as_str()),
            ("a", "c2ln")
        );
        let err = signed("Fri, 27 Nov 2026 02:45:18 GMT").unwrap_err();
        assert_eq!(err.code, "AuthenticationFailed");
        assert!(err.message.contains("3600 s"), "{}", err.message);
    }

    #[test]
    fn account_sas_fields_are_checked_and_signed() {
        let now = httpdate::parse_http_date("Fri, 27 Nov 2026 01:45:18 GMT").unwrap();
        let sas = "sv=2019-07-07&ss=b&srt=sco&sp=rwdlacup&se=2030-01-01T00%3A00%3A00Z&st=2020-01-01T00%3A00%3A00Z&spr=https%2Chttp&sig=AbC%2BdEf%2FgH%3D";
        let target = Target::parse(
            "/listen/checkpoints/ns/h/g/ownership/0",
            Some(&format!("comp=metadata&{sas}")),
        )
        .unwrap();
        let request = account_sas(&target, Access::Write, false, now).unwrap();
        assert_eq!(request.rule, "listen");
        assert_eq!(request.signature, "AbC+dEf/gH=");
        assert_eq!(
            request.string_to_sign,
            "listen\nrwdlacup\nb\nsco\n2020-01-01T00:00:00Z\n2030-01-01T00:00:00Z\n\nhttps,http\n2019-07-07\n"
        );
        let read_only = Target::parse(
            "/listen/checkpoints/ns/h/g/ownership/0",
            Some("sv=2019-07-07&ss=b&srt=o&sp=r&se=2030-01-01T00:00:00Z&sig=x"),
        )
        .unwrap();
        let err = account_sas(&read_only, Access::Write, false, now).unwrap_err();
        assert_eq!(err.code, "AuthorizationPermissionMismatch");
        let expired = Target::parse(
            "/listen/checkpoints",
            Some("sv=2019-07-07&ss=b&srt=c&sp=l&se=2020-01-01T00:00:00Z&sig=x"),
        )
        .unwrap();
        let err = account_sas(&expired, Access::List, true, now).unwrap_err();
        assert!(err.message.contains("expired"), "{}", err.message);
    }
}
