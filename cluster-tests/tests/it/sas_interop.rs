//! Shared access signatures against a reference no one here wrote: the Event Hubs Python
//! SDK (azure-eventhub, from `scripts/python-test-deps`). Its tokens must pass our
//! verification, and ours must be the same text, byte for byte; a node with `--auth sas`
//! accepts its token on a real send.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tokio::time::Instant;
use tributary_client::{Client, ConnectOptions, EventData, SendTarget};
use tributary_cluster_tests::python_tools::python_deps;
use tributary_cluster_tests::{NodePorts, NodeProcess, TestDir, eventually};
use tributary_types::{AuthError, AuthorizationRule, ConnectionString, Credential, Rights};
use tributary_types::{authorize, parse_token, sign};

/// The SDK's own helpers: `generate_sas_token` (what its shared-key credential calls, with
/// the expiry given), `EventHubSharedKeyCredential.get_token` (the SDK's whole path, expiry
/// one hour from now) and `parse_connection_string`. Reads one request per line
/// (`token|credential|connection-string`, tab-separated arguments) and prints one answer per
/// line.
const SDK_SCRIPT: &str = r#"
import sys
from azure.eventhub import EventHubSharedKeyCredential, parse_connection_string
from azure.eventhub._pyamqp.utils import generate_sas_token

for line in sys.stdin:
    kind, *args = line.rstrip("\n").split("\t")
    if kind == "token":
        uri, rule, key, expiry = args
        print(generate_sas_token(uri, rule, key, int(expiry)))
    elif kind == "credential":
        uri, rule, key = args
        print(EventHubSharedKeyCredential(rule, key).get_token(uri).token)
    elif kind == "connection-string":
        parsed = parse_connection_string(args[0])
        print("\t".join([
            parsed.fully_qualified_namespace,
            parsed.eventhub_name or "",
            parsed.shared_access_key_name or "",
            parsed.shared_access_key or "",
        ]))
"#;

/// Runs [`SDK_SCRIPT`] on `requests`, one answer per request.
fn ask_sdk(venv: &Path, requests: &[Vec<&str>]) -> Vec<String> {
    let input: String = requests
        .iter()
        .map(|request| request.join("\t") + "\n")
        .collect();
    let mut child = Command::new(venv.join("bin/python"))
        .args(["-c", SDK_SCRIPT])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the azure-eventhub helper failed (if it is missing, run scripts/python-test-deps \
         again):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answers: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(answers.len(), requests.len(), "{answers:?}");
    answers
}

fn rule(name: &str, primary_key: &str, rights: Rights) -> AuthorizationRule {
    AuthorizationRule {
        name: name.to_owned(),
        primary_key: primary_key.to_owned(),
        secondary_key: "an-unrelated-secondary-key".to_owned(),
        rights,
    }
}

fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Inputs that exercise the encoding: characters `quote_plus` keeps, `/` and `:` it encodes,
/// a space (`+`), non-ASCII text, a key that looks like base64 (used as text, not decoded),
/// rule names of every character Event Hubs allows in them.
const CASES: &[(&str, &str, &str)] = &[
    (
        "sb://ns.example.net/orders",
        "RootManageSharedAccessKey",
        "c2VjcmV0LWtleS1mb3ItdGVzdHM=",
    ),
    ("sb://ns.example.net/", "send-only_1.a", "plain text key"),
    (
        "amqps://NS.Example.net/Orders/Publishers/device 7",
        "listen",
        "kéy/with+symbols=&",
    ),
    ("sb://localhost/hub-é~x", "r", "k"),
];

#[test]
fn sdk_tokens_match_ours_byte_for_byte() {
    let Some(venv) = python_deps() else { return };
    let expiry = "1900000000";
    let requests: Vec<Vec<&str>> = CASES
        .iter()
        .map(|(uri, name, key)| vec!["token", uri, name, key, expiry])
        .collect();
    let answers = ask_sdk(&venv, &requests);
    for ((uri, name, key), sdk_token) in CASES.iter().zip(answers) {
        assert_eq!(
            sign(uri, name, key, 1_900_000_000),
            sdk_token,
            "{uri} {name}"
        );
    }
}

#[test]
fn sdk_credential_tokens_pass_verification() {
    let Some(venv) = python_deps() else { return };
    let requests: Vec<Vec<&str>> = CASES
        .iter()
        .map(|(uri, name, key)| vec!["credential", uri, name, key])
        .collect();
    let answers = ask_sdk(&venv, &requests);
    let now = now_unix_s();
    for ((uri, name, key), sdk_token) in CASES.iter().zip(answers) {
        let token = parse_token(&sdk_token).unwrap();
        assert_eq!(token.resource(), *uri);
        assert_eq!(token.key_name(), *name);
        // The SDK's default lifetime: one hour.
        assert!(
            token.expiry_unix_s().abs_diff(now + 3600) < 120,
            "{sdk_token}"
        );

        let rules = [rule(name, key, Rights::SEND)];
        let grant = authorize(&sdk_token, &rules, uri, Rights::SEND, now).unwrap();
        assert_eq!(grant.rule, *name);
        // The same token is refused, each for its own reason, when something is off.
        let rotated = [rule(name, "the-new-primary-key", Rights::SEND)];
        assert_eq!(
            authorize(&sdk_token, &rotated, uri, Rights::SEND, now),
            Err(AuthError::BadSignature {
                rule: name.to_string()
            })
        );
        assert!(matches!(
            authorize(&sdk_token, &rules, uri, Rights::LISTEN, now),
            Err(AuthError::MissingRight { .. })
        ));
        assert!(matches!(
            authorize(&sdk_token, &rules, uri, Rights::SEND, now + 7200),
            Err(AuthError::Expired { .. })
        ));
        assert!(matches!(
            authorize(
                &sdk_token,
                &rules,
                "sb://other.example.net/orders",
                Rights::SEND,
                now
            ),
            Err(AuthError::WrongResource { .. })
        ));
    }
}

#[test]
fn sdk_parses_connection_strings_as_we_do() {
    let Some(venv) = python_deps() else { return };
    let texts = [
        "Endpoint=sb://ns.example.net/;SharedAccessKeyName=RootManageSharedAccessKey;\
         SharedAccessKey=c2VjcmV0PQ==;EntityPath=orders",
        "Endpoint=sb://localhost;SharedAccessKeyName=r;SharedAccessKey=k;\
         UseDevelopmentEmulator=true;",
    ];
    let requests: Vec<Vec<&str>> = texts
        .iter()
        .map(|text| vec!["connection-string", text])
        .collect();
    let answers = ask_sdk(&venv, &requests);
    for (text, sdk) in texts.iter().zip(answers) {
        let ours = ConnectionString::parse(text).unwrap();
        let Credential::SharedAccessKey { key_name, key } = ours.credential() else {
            panic!("{text} has a key")
        };
        let ours = [ours.host(), ours.entity_path().unwrap_or(""), key_name, key].join("\t");
        assert_eq!(ours, sdk, "{text}");
    }
}

#[tokio::test]
async fn a_node_accepts_a_token_the_sdk_made() {
    let Some(venv) = python_deps() else { return };
    const ROOT_KEY: &str = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    let dir = TestDir::new("sas_interop_node");
    let mut node = NodeProcess::launch_with_env(
        &dir.path().join("node"),
        NodePorts::free(),
        &["--auth".to_owned(), "sas".to_owned()],
        &[("TRIBUTARY_ROOT_KEY", ROOT_KEY)],
    );
    node.wait_ready().await;
    let connect = |text: String| {
        let endpoint = node.endpoint();
        async move {
            let options = ConnectOptions {
                endpoint: Some(endpoint),
                ..ConnectOptions::default()
            };
            Client::from_connection_string_with(&text, options)
                .await
                .unwrap()
        }
    };
    let root = connect(format!(
        "Endpoint=sb://ns.example.net/;SharedAccessKeyName=RootManageSharedAccessKey;\
         SharedAccessKey={ROOT_KEY}"
    ))
    .await;
    // The root rule is made just after the node is ready: retry until it is in force.
    let deadline = Instant::now() + Duration::from_secs(30);
    eventually(deadline, "the root rule in force", async || {
        // Bounded too: a call that hangs must not outlast the deadline.
        match tokio::time::timeout_at(deadline, root.create_event_hub("orders", 1, None)).await {
            Ok(Ok(hub)) => Ok(hub),
            Ok(Err(err)) if err.to_string().contains("not an authorization rule") => {
                Err(err.to_string())
            }
            Ok(Err(err)) => panic!("{err}"),
            Err(_elapsed) => Err("the call did not return".to_owned()),
        }
    })
    .await;

    // The SDK's whole path: EventHubSharedKeyCredential.get_token for the hub.
    let answers = ask_sdk(
        &venv,
        &[vec![
            "credential",
            "sb://ns.example.net/orders",
            "RootManageSharedAccessKey",
            ROOT_KEY,
        ]],
    );
    let sdk_token = &answers[0];
    let with_sdk_token = connect(format!(
        "Endpoint=sb://ns.example.net/;SharedAccessSignature={sdk_token}"
    ))
    .await;
    let sent = with_sdk_token
        .producer()
        .send(
            "orders",
            SendTarget::PartitionId("0".into()),
            [EventData::from_body("signed in python")],
        )
        .await
        .unwrap();
    assert_eq!(sent.first_sequence_number, 0);
    // The same token does not cover another hub.
    root.create_event_hub("other", 1, None).await.unwrap();
    let refused = with_sdk_token
        .producer()
        .send(
            "other",
            SendTarget::PartitionId("0".into()),
            [EventData::from_body("x")],
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("does not cover"), "{refused}");
}
