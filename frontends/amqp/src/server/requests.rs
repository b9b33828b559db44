//! `$cbs` put-token (WIRE-PROTOCOLS A6) and `$management` READ (A7): a request message in,
//! a reply message out. Replies carry the request's message-id as correlation-id with the
//! same AMQP type, an int `status-code` and a string `status-description`.

use super::address::entity_path;
use super::backend::{
    Backend, BackendError, BackendErrorKind, HubProperties, PartitionProperties, Right, TokenGrant,
};
use super::grants::{Grants, TooManyGrants};
use super::metrics;
use crate::message::{Body, Message, Properties};
use crate::types::{Array, Value, ValueKind};

/// The token type of a shared access signature.
pub const SAS_TOKEN_TYPE: &str = "servicebus.windows.net:sastoken";
/// The token type of an Entra ID token.
pub const JWT_TOKEN_TYPE: &str = "jwt";

/// What a request needs from the connection besides the backend.
pub(crate) struct RequestContext<'a> {
    pub(crate) backend: &'a dyn Backend,
    pub(crate) grants: &'a mut Grants,
    pub(crate) grants_max: usize,
    /// The namespace host the client named (open or sasl-init hostname), for the audience of
    /// a `security_token`.
    pub(crate) hostname: &'a str,
}

/// Answers a `$cbs` request.
pub(crate) async fn put_token(context: RequestContext<'_>, request: &Message) -> Message {
    let outcome = async {
        let operation = app_string(request, "operation")?;
        if operation != "put-token" {
            return Err(BackendError::invalid_argument(format!(
                "$cbs supports the operation put-token, not {operation:?}"
            )));
        }
        let audience = app_string(request, "name")?;
        let token_type = app_string(request, "type")?;
        let Body::Value(Value::String(token)) = &request.body else {
            return Err(BackendError::invalid_argument(
                "the put-token body must be an amqp-value string holding the token",
            ));
        };
        let grant = checked_grant(context.backend, audience, token_type, token).await?;
        let now = context.backend.now_unix_ms();
        context
            .grants
            .insert(entity_path(audience), grant, now, context.grants_max)
            .map_err(|TooManyGrants| {
                BackendError::new(
                    BackendErrorKind::QuotaExceeded,
                    format!(
                        "this connection already holds tokens for {} audiences",
                        context.grants_max
                    ),
                )
            })
    }
    .await;
    match outcome {
        Ok(()) => reply(request, 202, "Accepted", None),
        // No `error-condition` here: pyamqp's CBS handler stops reading a reply that has
        // one before it takes the status code and description, and then tells its user only
        // "Status code: None" instead of why the token was refused.
        Err(error) => {
            metrics::error_sent(error.kind.condition());
            reply(request, error.kind.status_code(), &error.description, None)
        }
    }
}

/// Answers a `$management` request.
pub(crate) async fn read(context: RequestContext<'_>, request: &Message) -> Message {
    let outcome = async {
        let operation = app_string(request, "operation")?;
        if operation != "READ" {
            return Err(BackendError::invalid_argument(format!(
                "$management supports the operation READ, not {operation:?}"
            )));
        }
        let entity_type = app_string(request, "type")?;
        let hub = app_string(request, "name")?;
        let grant = authorize(&context, request, hub).await?;
        match entity_type {
            "com.microsoft:eventhub" => {
                let properties = context.backend.hub_properties(&grant, hub).await?;
                Ok(hub_value(&properties))
            }
            "com.microsoft:partition" => {
                let partition = app_string(request, "partition")?;
                let properties = context
                    .backend
                    .partition_properties(&grant, hub, partition)
                    .await?;
                Ok(partition_value(&properties))
            }
            other => Err(BackendError::invalid_argument(format!(
                "READ supports the types com.microsoft:eventhub and com.microsoft:partition, \
                 not {other:?}"
            ))),
        }
    }
    .await;
    match outcome {
        Ok(body) => Message {
            body: Body::Value(body),
            ..reply(request, 200, "OK", None)
        },
        Err(error) => error_reply(request, &error),
    }
}

/// A READ is authorized by its `security_token` when it carries one, else by a CBS grant
/// for the hub; Manage or Listen is needed.
async fn authorize(
    context: &RequestContext<'_>,
    request: &Message,
    hub: &str,
) -> Result<TokenGrant, BackendError> {
    let now = context.backend.now_unix_ms();
    let grant = match app_value(request, "security_token").and_then(Value::as_str) {
        Some(token) => {
            let audience = format!("sb://{}/{hub}", context.hostname);
            checked_grant(context.backend, &audience, token_type_of(token), token).await?
        }
        None => context
            .grants
            .covering(&entity_path(hub), Right::ManageOrListen, now)
            .map(|(_, grant)| grant.clone())
            .ok_or_else(|| {
                BackendError::unauthorized(format!(
                    "no token for the hub '{hub}': put one on $cbs first, or send the \
                     security_token application property"
                ))
            })?,
    };
    if !grant.rights.allow(Right::ManageOrListen) {
        return Err(BackendError::unauthorized(
            "reading hub properties needs the Manage or Listen right",
        ));
    }
    Ok(grant)
}

/// Asks the backend and refuses a grant that has already expired.
async fn checked_grant(
    backend: &dyn Backend,
    audience: &str,
    token_type: &str,
    token: &str,
) -> Result<TokenGrant, BackendError> {
    let grant = backend.put_token(audience, token_type, token).await?;
    if grant.expires_at_unix_ms <= backend.now_unix_ms() {
        return Err(BackendError::unauthorized(format!(
            "the token for '{audience}' has expired"
        )));
    }
    Ok(grant)
}

fn token_type_of(token: &str) -> &'static str {
    if token.starts_with("SharedAccessSignature") {
        SAS_TOKEN_TYPE
    } else {
        JWT_TOKEN_TYPE
    }
}

fn app_value<'a>(message: &'a Message, key: &str) -> Option<&'a Value> {
    message
        .application_properties
        .iter()
        .flatten()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

fn app_string<'a>(message: &'a Message, key: &'static str) -> Result<&'a str, BackendError> {
    app_value(message, key)
        .and_then(Value::as_str)
        .ok_or_else(|| {
            BackendError::invalid_argument(format!(
                "the request lacks the string application property '{key}'"
            ))
        })
}

/// A reply without a body.
fn reply(request: &Message, status_code: i32, description: &str, error: Option<&str>) -> Message {
    let correlation_id = request
        .properties
        .as_ref()
        .and_then(|p| p.message_id.clone().or_else(|| p.correlation_id.clone()));
    let mut application_properties = vec![
        ("status-code".to_owned(), Value::Int(status_code)),
        (
            "status-description".to_owned(),
            Value::String(description.to_owned()),
        ),
    ];
    if let Some(condition) = error {
        application_properties.push(("error-condition".to_owned(), Value::symbol(condition)));
    }
    Message {
        properties: Some(Properties {
            correlation_id,
            ..Properties::default()
        }),
        application_properties: Some(application_properties),
        ..Message::default()
    }
}

fn error_reply(request: &Message, error: &BackendError) -> Message {
    let condition = error.kind.condition();
    metrics::error_sent(condition);
    reply(
        request,
        error.kind.status_code(),
        &error.description,
        Some(condition),
    )
}

fn string_map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(key, value)| (Value::String(key.to_owned()), value))
            .collect(),
    )
}

/// The READ eventhub body: string keys; partition_ids an array of strings (.NET casts it to
/// `string[]`, so a list would break it).
pub(crate) fn hub_value(hub: &HubProperties) -> Value {
    let ids = hub
        .partition_ids
        .iter()
        .map(|id| Value::String(id.clone()))
        .collect();
    let partition_ids = match Array::new(ValueKind::String, ids) {
        Ok(array) => Value::Array(array),
        // Unreachable: every item was built as a string.
        Err(_) => Value::Null,
    };
    let partition_count = i32::try_from(hub.partition_ids.len()).unwrap_or(i32::MAX);
    string_map(vec![
        ("name", Value::String(hub.name.clone())),
        ("created_at", Value::Timestamp(hub.created_at_unix_ms)),
        ("partition_count", Value::Int(partition_count)),
        ("partition_ids", partition_ids),
    ])
}

/// The READ partition body, each value of the type .NET unboxes it as.
pub(crate) fn partition_value(partition: &PartitionProperties) -> Value {
    string_map(vec![
        ("name", Value::String(partition.hub.clone())),
        ("partition", Value::String(partition.partition_id.clone())),
        (
            "begin_sequence_number",
            Value::Long(partition.begin_sequence_number),
        ),
        (
            "last_enqueued_sequence_number",
            Value::Long(partition.last_enqueued_sequence_number),
        ),
        (
            "last_enqueued_offset",
            Value::String(partition.last_enqueued_offset.clone()),
        ),
        (
            "last_enqueued_time_utc",
            Value::Timestamp(partition.last_enqueued_time_unix_ms),
        ),
        ("is_partition_empty", Value::Boolean(partition.is_empty)),
    ])
}
