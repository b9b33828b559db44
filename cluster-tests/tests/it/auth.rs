//! Authorization through the real binary: a node with `--auth sas` writes its root
//! connection string, and the CLI works with `--connection-string` or
//! `TRIBUTARY_CONNECTION_STRING`, and without one is refused; `auth rule keys` prints the
//! connection strings of this SDK, of the Azure SDKs over AMQP, and of their Blob checkpoint
//! store (which the node's Blob endpoint accepts, and refuses once the key is rotated).

use std::net::SocketAddr;
use std::process::Output;
use std::time::SystemTime;

use serde_json::Value;
use tributary_cluster_tests::{
    BlobResponse, CLI_TIMEOUT, NodeProcess, TestDir, amqp_answers, blob_answers, blob_get,
    describe_output, http_get, output_within, root_connection_string, tributary_command,
};
use tributary_types::sas::storage_signature;

/// `tributary [--endpoint <endpoint>] <args>` with `env` set.
async fn cli(endpoint: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = tributary_command();
    if !endpoint.is_empty() {
        command.arg("--endpoint").arg(endpoint);
    }
    command.args(args).envs(env.iter().copied());
    output_within(command, CLI_TIMEOUT).await
}

/// No `--endpoint`: the connection string's is used.
const NO_ENDPOINT: &str = "";

async fn cli_ok(endpoint: &str, env: &[(&str, &str)], args: &[&str]) -> String {
    let output = cli(endpoint, env, args).await;
    assert!(
        output.status.success(),
        "`tributary {}` failed: {}",
        args.join(" "),
        describe_output(&output)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The command fails, saying `expected` on stderr.
async fn cli_refused(endpoint: &str, env: &[(&str, &str)], args: &[&str], expected: &str) {
    let output = cli(endpoint, env, args).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains(expected),
        "`tributary {}` should fail saying {expected:?}: {}",
        args.join(" "),
        describe_output(&output)
    );
}

/// `auth rule keys` also prints, per key, the connection strings of the Azure Event Hubs
/// SDKs over AMQP, naming the host of the CLI's endpoint: in plain text on port 5672 (or
/// `--amqp-port`), over TLS with no port (the SDKs dial 5671). `keys` is its JSON output for
/// rule `sender` of hub `orders`.
async fn check_amqp_connection_strings(node: &NodeProcess, as_root: &[(&str, &str)], keys: &Value) {
    let credential = |key: &str| {
        let key = keys[key].as_str().unwrap();
        format!("SharedAccessKeyName=sender;SharedAccessKey={key};EntityPath=orders")
    };
    let plain_text = |port: u16, key: &str| {
        format!(
            "Endpoint=sb://127.0.0.1:{port}/;{};UseDevelopmentEmulator=true",
            credential(key)
        )
    };
    let tls = |key: &str| format!("Endpoint=sb://127.0.0.1/;{}", credential(key));
    assert_eq!(
        keys["primary_amqp_connection_string"],
        plain_text(5672, "primary_key")
    );
    assert_eq!(
        keys["secondary_amqp_connection_string"],
        plain_text(5672, "secondary_key")
    );
    assert_eq!(keys["primary_amqps_connection_string"], tls("primary_key"));
    assert_eq!(
        keys["secondary_amqps_connection_string"],
        tls("secondary_key")
    );

    // The table, for this node's AMQP port: its plain-text string leads to the listener.
    let amqp = node.amqp_addr();
    let table = cli_ok(
        &node.endpoint(),
        as_root,
        &[
            "auth",
            "rule",
            "keys",
            "sender",
            "--hub",
            "orders",
            "--amqp-port",
            &amqp.port().to_string(),
        ],
    )
    .await;
    for (field, value) in [
        (
            "primary AMQP connection string:",
            plain_text(amqp.port(), "primary_key"),
        ),
        (
            "secondary AMQP connection string:",
            plain_text(amqp.port(), "secondary_key"),
        ),
        ("primary AMQPS connection string:", tls("primary_key")),
        ("secondary AMQPS connection string:", tls("secondary_key")),
    ] {
        let line = table.lines().find(|line| line.starts_with(field));
        assert_eq!(
            line.map(|line| line[field.len()..].trim()),
            Some(value.as_str()),
            "{table}"
        );
    }
    amqp_answers(amqp, None)
        .await
        .unwrap_or_else(|e| panic!("the AMQP listener the string names: {e}"));
}

/// The checkpoint-store connection string of rule `sender` with `key` on `port`, as the CLI
/// talks to the node over plain text.
fn checkpoint_string(port: u16, key: &str) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName=sender;AccountKey={key};\
         BlobEndpoint=http://127.0.0.1:{port}/sender;"
    )
}

/// Get Container Properties on the Blob endpoint a checkpoint-store connection string
/// names, signed with Shared Key as the Azure Storage SDKs sign it: the string's account,
/// key and endpoint (path-style, `http://host:port/{account}`).
async fn signed_container_call(connection_string: &str) -> BlobResponse {
    let field = |name: &str| {
        connection_string
            .split(';')
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {connection_string}"))
    };
    let (account, key) = (field("AccountName"), field("AccountKey"));
    let endpoint = field("BlobEndpoint")
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not an http:// BlobEndpoint: {connection_string}"));
    let (host_port, account_path) = endpoint.split_once('/').unwrap();
    assert_eq!(account_path, account, "the endpoint's path is the account");
    let addr: SocketAddr = host_port.parse().unwrap();
    let path = format!("/{account}/checkpoints");
    let date = httpdate::fmt_http_date(SystemTime::now());
    let version = "2019-07-07";
    // The verb, eleven empty standard headers, the x-ms- headers, the resource.
    let string_to_sign = format!(
        "GET\n{}x-ms-date:{date}\nx-ms-version:{version}\n/{account}{path}\nrestype:container",
        "\n".repeat(11)
    );
    let signature = storage_signature(key, &string_to_sign).expect("a base64 key");
    let authorization = format!("SharedKey {account}:{signature}");
    blob_get(
        addr,
        None,
        &format!("{path}?restype=container"),
        &[
            ("x-ms-date", &date),
            ("x-ms-version", version),
            ("Authorization", &authorization),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("the Blob endpoint of {connection_string}: {e}"))
}

/// `auth rule keys` also prints, per key, the connection string of the Azure SDKs'
/// checkpoint store: the rule as the account, the Blob endpoint on the host of the CLI's
/// endpoint, port 10000 (or `--blob-port`). `keys` is its JSON output for rule `sender` of
/// hub `orders`. With `--blob-port` naming the node's, each key's string leads to the node's
/// Blob endpoint, which accepts requests it signs and refuses unsigned ones.
async fn check_checkpoint_connection_strings(
    node: &NodeProcess,
    as_root: &[(&str, &str)],
    keys: &Value,
) {
    let key = |name: &str| keys[name].as_str().unwrap().to_owned();
    assert_eq!(
        keys["primary_checkpoint_connection_string"],
        checkpoint_string(10000, &key("primary_key"))
    );
    assert_eq!(
        keys["secondary_checkpoint_connection_string"],
        checkpoint_string(10000, &key("secondary_key"))
    );

    let blob = node.blob_addr();
    let table = cli_ok(
        &node.endpoint(),
        as_root,
        &[
            "auth",
            "rule",
            "keys",
            "sender",
            "--hub",
            "orders",
            "--blob-port",
            &blob.port().to_string(),
        ],
    )
    .await;
    for (field, key_name) in [
        ("primary checkpoint connection string:", "primary_key"),
        ("secondary checkpoint connection string:", "secondary_key"),
    ] {
        let line = table.lines().find(|line| line.starts_with(field));
        let value = line.map(|line| line[field.len()..].trim());
        let expected = checkpoint_string(blob.port(), &key(key_name));
        assert_eq!(value, Some(expected.as_str()), "{table}");
        let answer = signed_container_call(&expected).await;
        assert_eq!(
            (answer.status, answer.header("x-ms-error-code")),
            (200, None),
            "a call signed with the {key_name}'s checkpoint string: {answer:?}"
        );
    }
    blob_answers(blob, None, true)
        .await
        .unwrap_or_else(|e| panic!("the Blob endpoint refusing an unsigned call: {e}"));
}

#[tokio::test]
async fn cli_with_connection_strings() {
    let dir = TestDir::new("auth_cli");
    let data_dir = dir.path().join("node");
    let node = NodeProcess::start_with_args(&data_dir, &["--auth", "sas"]).await;
    let endpoint = node.endpoint();
    let endpoint = endpoint.as_str();
    let root = root_connection_string(&data_dir).await;
    assert!(
        root.starts_with("Endpoint=sb://127.0.0.1:")
            && root.contains(";SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey="),
        "{root}"
    );
    let metrics = http_get(node.http_addr(), "/metrics").await.unwrap().body;
    assert!(metrics.contains("tributary_auth_enabled 1"), "{metrics}");

    // Without a credential every command is refused, saying what to do.
    cli_refused(
        endpoint,
        &[],
        &["hub", "list"],
        "carries no shared access signature",
    )
    .await;

    // The root connection string on its own supplies the endpoint too.
    let created = cli_ok(
        NO_ENDPOINT,
        &[],
        &[
            "--connection-string",
            &root,
            "hub",
            "create",
            "orders",
            "--partitions",
            "1",
        ],
    )
    .await;
    assert!(created.contains("created event hub 'orders'"), "{created}");

    // From the environment; explicit --endpoint wins over the string's.
    let as_root = [("TRIBUTARY_CONNECTION_STRING", root.as_str())];
    let made = cli_ok(
        endpoint,
        &as_root,
        &[
            "auth", "rule", "create", "sender", "--rights", "send", "--hub", "orders",
        ],
    )
    .await;
    assert!(
        made.contains("created rule 'sender' of event hub 'orders' with rights Send"),
        "{made}"
    );
    let listed = cli_ok(
        endpoint,
        &as_root,
        &["auth", "rule", "list", "--hub", "orders"],
    )
    .await;
    assert!(
        listed.contains("sender") && listed.contains("Send"),
        "{listed}"
    );
    let namespace_rules = cli_ok(endpoint, &as_root, &["auth", "rule", "list"]).await;
    assert!(
        namespace_rules.contains("RootManageSharedAccessKey  Manage"),
        "{namespace_rules}"
    );
    assert!(!namespace_rules.contains("sender"), "{namespace_rules}");

    let keys: Value = serde_json::from_str(
        &cli_ok(
            endpoint,
            &as_root,
            &[
                "auth", "rule", "keys", "sender", "--hub", "orders", "--output", "json",
            ],
        )
        .await,
    )
    .unwrap();
    let sender = keys["primary_connection_string"]
        .as_str()
        .unwrap()
        .to_owned();
    let sender_secondary = keys["secondary_connection_string"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(sender.ends_with(";EntityPath=orders"), "{sender}");
    check_amqp_connection_strings(&node, &as_root, &keys).await;
    check_checkpoint_connection_strings(&node, &as_root, &keys).await;

    // The sender may send to its hub, and nothing else.
    let as_sender = [("TRIBUTARY_CONNECTION_STRING", sender.as_str())];
    cli_ok(endpoint, &as_sender, &["send", "orders", "--body", "hello"]).await;
    cli_refused(
        endpoint,
        &as_sender,
        &["receive", "orders", "--partition", "0", "--count", "1"],
        "grants Send but not Listen",
    )
    .await;
    cli_refused(
        endpoint,
        &as_sender,
        &["hub", "create", "other", "--partitions", "1"],
        "does not cover",
    )
    .await;

    // Rotating the primary key shuts its tokens out; the secondary key goes on working.
    // Rotation prints the new keys' checkpoint strings: the new primary's is accepted, the
    // old one's refused.
    let blob_port = node.blob_addr().port().to_string();
    let rotated: Value = serde_json::from_str(
        &cli_ok(
            endpoint,
            &as_root,
            &[
                "auth",
                "rule",
                "rotate",
                "sender",
                "--key",
                "primary",
                "--hub",
                "orders",
                "--blob-port",
                &blob_port,
                "--output",
                "json",
            ],
        )
        .await,
    )
    .unwrap();
    let new_primary = rotated["primary_key"].as_str().unwrap();
    assert_ne!(new_primary, keys["primary_key"].as_str().unwrap());
    let port = node.blob_addr().port();
    assert_eq!(
        rotated["primary_checkpoint_connection_string"],
        checkpoint_string(port, new_primary)
    );
    assert_eq!(
        rotated["secondary_checkpoint_connection_string"],
        checkpoint_string(port, keys["secondary_key"].as_str().unwrap())
    );
    let answer = signed_container_call(&checkpoint_string(port, new_primary)).await;
    assert_eq!(
        answer.status, 200,
        "signed with the new primary key: {answer:?}"
    );
    let old_primary = checkpoint_string(port, keys["primary_key"].as_str().unwrap());
    let answer = signed_container_call(&old_primary).await;
    assert_eq!(
        (answer.status, answer.header("x-ms-error-code")),
        (403, Some("AuthenticationFailed")),
        "signed with the rotated-out primary key: {answer:?}"
    );
    cli_refused(
        endpoint,
        &as_sender,
        &["send", "orders", "--body", "late"],
        "may have been rotated",
    )
    .await;
    cli_ok(
        endpoint,
        &[],
        &[
            "--connection-string",
            &sender_secondary,
            "send",
            "orders",
            "--body",
            "again",
        ],
    )
    .await;

    // The root reads what was sent; then the rule is deleted and its tokens stop working.
    let received = cli_ok(
        endpoint,
        &as_root,
        &[
            "receive",
            "orders",
            "--partition",
            "0",
            "--count",
            "2",
            "--from",
            "earliest",
        ],
    )
    .await;
    assert!(
        received.contains("hello") && received.contains("again"),
        "{received}"
    );
    cli_ok(
        endpoint,
        &as_root,
        &["auth", "rule", "delete", "sender", "--hub", "orders"],
    )
    .await;
    cli_refused(
        endpoint,
        &[],
        &[
            "--connection-string",
            &sender_secondary,
            "send",
            "orders",
            "--body",
            "gone",
        ],
        "signed with rule \"sender\", which is not",
    )
    .await;
    cli_refused(
        endpoint,
        &as_root,
        &["auth", "rule", "delete", "RootManageSharedAccessKey"],
        "last rule with Manage",
    )
    .await;
}
