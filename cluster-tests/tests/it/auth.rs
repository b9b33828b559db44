//! Authorization through the real binary: a node with `--auth sas` writes its root
//! connection string, and the CLI works with `--connection-string` or
//! `TRIBUTARY_CONNECTION_STRING`, and without one is refused.

use std::process::Output;

use serde_json::Value;
use tributary_cluster_tests::{
    CLI_TIMEOUT, NodeProcess, TestDir, describe_output, http_get, output_within,
    root_connection_string, tributary_command,
};

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
    cli_ok(
        endpoint,
        &as_root,
        &[
            "auth", "rule", "rotate", "sender", "--key", "primary", "--hub", "orders",
        ],
    )
    .await;
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
