//! The Helm chart matches the binary: the test renders the chart with its default values
//! (TLS, the cluster key and authorization on), and starts its StatefulSet's three pods as
//! containers of the project's image on a private Docker network, taking every container's
//! command, args, environment, ports, volume mounts, probes and security settings from the
//! rendered manifests, as a kubelet would:
//!
//! - `$(VAR)` references are expanded as Kubernetes does; downward-API values (pod name,
//!   ordinal label, pod IP, namespace) and secret keys are substituted;
//! - the certificate init container runs first, with the pod's volumes;
//! - pods get their DNS names under the headless Service, and the client Service's name
//!   resolves to every pod, as Network aliases;
//! - volumes are host directories with Kubernetes' ownership and modes (`fsGroup`,
//!   `defaultMode`); the root filesystem is read-only and every capability dropped.
//!
//! Then the cluster must form (every pod answers its probes' paths, AMQP on its `amqp`
//! and `amqps` ports, the Blob API on its `blob` port, over HTTPS, and Kafka's ApiVersions
//! on its `kafka` and `kafka-tls` ports), serve (the chart's own helm test pod creates a hub, sends and reads
//! back through the client Service name, over TLS with the root key), and a pod's preStop
//! hook must drain it so that it stops cleanly and undrains itself when it starts again.
//! The drain is refused from another machine.
//!
//! A second run renders `ci/insecure-values.yaml` (no TLS, no authorization): the cluster
//! key alone must then let the pods start and form a cluster on the network, the Blob
//! endpoint answers in plain text, and every pod's Metadata lists the three pods as Kafka
//! brokers at their own DNS names.
//!
//! Needs Docker, the `tributary:test` image (`scripts/docker-image`) and helm (installed by
//! `scripts/helm-check`), so it runs from `scripts/chart-check`, which sets
//! `TRIBUTARY_CHART_CHECK=1`; without that variable it says so and passes at once.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde_norway::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tributary_cluster_tests::containers::{IMAGE_DEFAULT, create_network, docker, image_exists};
use tributary_cluster_tests::{
    REQUIRED_VALUE, TestDir, TlsTrust, amqp_answers, binary_path, blob_answers, eventually,
    http_get, http_post, is_required, kafka_answers, kafka_brokers, poll_until, require_tool,
};

/// Set to `1` by scripts/chart-check, which provides what this test needs.
const CHART_CHECK_ENV: &str = "TRIBUTARY_CHART_CHECK";
const RELEASE: &str = "tributary";
const NAMESPACE: &str = "default";
/// How long pods may take to pass their probes (the cluster forms meanwhile).
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The rendered manifests.
struct Rendered {
    docs: Vec<Value>,
}

impl Rendered {
    /// Renders the chart with its default values and then the files `values` (relative to
    /// the chart).
    fn render(helm: &Path, values: &[&str]) -> Rendered {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/tributary");
        let output = std::process::Command::new(helm)
            .args(["template", RELEASE])
            .arg(&chart)
            .args(["--namespace", NAMESPACE, "--kube-version", "1.32.0"])
            .args(values.iter().flat_map(|v| ["-f".into(), chart.join(v)]))
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", helm.display()));
        assert!(
            output.status.success(),
            "helm template failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).unwrap();
        let docs = serde_norway::Deserializer::from_str(&text)
            .map(|doc| serde::Deserialize::deserialize(doc).expect("helm renders YAML"))
            .filter(|doc: &Value| !doc.is_null())
            .collect();
        Rendered { docs }
    }

    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &Value> {
        self.docs.iter().filter(move |d| str_of(&d["kind"]) == kind)
    }

    fn named(&self, kind: &str, name: &str) -> Option<&Value> {
        self.of_kind(kind)
            .find(|d| str_of(&d["metadata"]["name"]) == name)
    }
}

fn str_of(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn seq(value: &Value) -> &[Value] {
    value.as_sequence().map(Vec::as_slice).unwrap_or_default()
}

/// Kubernetes' `$(VAR)` expansion: a reference to a variable defined before is replaced,
/// `$$` is a literal `$`, anything else stays as written.
fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(inner) = rest.strip_prefix("$(")
            && let Some(end) = inner.find(')')
            && let Some((_, value)) = env.iter().rev().find(|(k, _)| *k == inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}

/// A Secret's keys, decoded.
fn secret_data(secret: &Value) -> BTreeMap<String, Vec<u8>> {
    let mut data = BTreeMap::new();
    if let Some(map) = secret["data"].as_mapping() {
        for (k, v) in map {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(str_of(v))
                .expect("Secret data is base64");
            data.insert(str_of(k).to_owned(), bytes);
        }
    }
    if let Some(map) = secret["stringData"].as_mapping() {
        for (k, v) in map {
            data.insert(str_of(k).to_owned(), str_of(v).as_bytes().to_vec());
        }
    }
    data
}

/// One pod of the StatefulSet (or the helm test pod), emulated.
struct Pod {
    name: String,
    index: usize,
    ip: Option<Ipv4Addr>,
    /// Host directories of its volumes.
    dir: PathBuf,
}

/// What the kubelet would do for the chart, with Docker.
struct Kubelet {
    rendered: Rendered,
    image: String,
    network: String,
    /// Secrets the chart expects to exist (the CA), plus the rendered ones.
    secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    containers: Vec<String>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for container in &self.containers {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", "-v", container])
                .output();
        }
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

impl Kubelet {
    /// The pod spec's security context: the user and group it runs as, and `fsGroup`.
    fn ids(pod_spec: &Value) -> (u32, u32, Option<u32>) {
        let context = &pod_spec["securityContext"];
        let id = |v: &Value| v.as_u64().map(|n| n as u32);
        (
            id(&context["runAsUser"]).unwrap_or(0),
            id(&context["runAsGroup"]).unwrap_or(0),
            id(&context["fsGroup"]),
        )
    }

    /// The container's environment, as the kubelet resolves it for `pod`.
    fn env(&self, container: &Value, pod: &Pod) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        for var in seq(&container["env"]) {
            let name = str_of(&var["name"]).to_owned();
            let value = if let Some(value) = var["value"].as_str() {
                expand(value, &env)
            } else if let Some(path) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match path {
                    "metadata.name" => pod.name.clone(),
                    "metadata.namespace" => NAMESPACE.to_owned(),
                    "status.podIP" => pod.ip.expect("a pod IP").to_string(),
                    "metadata.labels['apps.kubernetes.io/pod-index']" => pod.index.to_string(),
                    "metadata.labels['statefulset.kubernetes.io/pod-name']" => pod.name.clone(),
                    other => panic!(
                        "env {name} uses fieldRef {other}, which this test does not emulate yet"
                    ),
                }
            } else if let Some(reference) = var["valueFrom"]["secretKeyRef"].as_mapping() {
                let secret = str_of(&reference[&Value::from("name")]);
                let key = str_of(&reference[&Value::from("key")]);
                let bytes = self
                    .secrets
                    .get(secret)
                    .and_then(|s| s.get(key))
                    .unwrap_or_else(|| panic!("env {name}: secret {secret} has no key {key}"));
                String::from_utf8(bytes.clone()).unwrap()
            } else {
                panic!("env {name}: {var:?} is not emulated by this test");
            };
            env.push((name, value));
        }
        env
    }

    /// `docker` arguments for the container's volume mounts, making each volume's host
    /// directory under the pod's directory (shared by the pod's containers, kept across
    /// restarts) as Kubernetes would populate it.
    fn mounts(
        &self,
        pod_spec: &Value,
        claims: &[String],
        container: &Value,
        pod: &Pod,
    ) -> Vec<String> {
        let (user, _, fs_group) = Self::ids(pod_spec);
        let group = fs_group.unwrap_or(0);
        let mut args = Vec::new();
        for mount in seq(&container["volumeMounts"]) {
            let name = str_of(&mount["name"]);
            let path = str_of(&mount["mountPath"]);
            let host = pod.dir.join(format!("volume-{name}"));
            if !host.exists() {
                std::fs::create_dir_all(&host).unwrap();
                let volume = seq(&pod_spec["volumes"])
                    .iter()
                    .find(|v| str_of(&v["name"]) == name);
                match volume {
                    // A persistent volume claim or an emptyDir: an empty directory the pod's
                    // group may write.
                    None if claims.iter().any(|c| c == name) => {
                        own(&host, user, group, 0o2770);
                    }
                    None => panic!("volume mount {name} names no volume nor claim"),
                    Some(volume) if !volume["emptyDir"].is_null() => {
                        own(&host, user, group, 0o2770);
                    }
                    Some(volume) if !volume["configMap"].is_null() => {
                        let map = str_of(&volume["configMap"]["name"]);
                        let config = self
                            .rendered
                            .named("ConfigMap", map)
                            .unwrap_or_else(|| panic!("no ConfigMap {map}"));
                        for (key, value) in config["data"].as_mapping().unwrap() {
                            let file = host.join(str_of(key));
                            std::fs::write(&file, str_of(value)).unwrap();
                            own(&file, 0, group, 0o644);
                        }
                        own(&host, 0, group, 0o755);
                    }
                    Some(volume) if !volume["secret"].is_null() => {
                        let secret = &volume["secret"];
                        let secret_name = str_of(&secret["secretName"]);
                        let data = self
                            .secrets
                            .get(secret_name)
                            .unwrap_or_else(|| panic!("no Secret {secret_name}"));
                        let mode = secret["defaultMode"].as_u64().unwrap_or(0o644) as u32;
                        let items: Vec<(String, String)> = if secret["items"].is_null() {
                            data.keys().map(|k| (k.clone(), k.clone())).collect()
                        } else {
                            seq(&secret["items"])
                                .iter()
                                .map(|i| {
                                    (str_of(&i["key"]).to_owned(), str_of(&i["path"]).to_owned())
                                })
                                .collect()
                        };
                        for (key, file) in items {
                            let bytes = data
                                .get(&key)
                                .unwrap_or_else(|| panic!("Secret {secret_name} has no key {key}"));
                            let file = host.join(file);
                            std::fs::write(&file, bytes).unwrap();
                            own(&file, 0, group, mode);
                        }
                        own(&host, 0, group, 0o755);
                    }
                    Some(other) => panic!("volume {other:?} is not emulated by this test"),
                }
            }
            let read_only = mount["readOnly"].as_bool().unwrap_or(false);
            args.push("--volume".to_owned());
            args.push(format!(
                "{}:{path}{}",
                host.display(),
                if read_only { ":ro" } else { "" }
            ));
        }
        args
    }

    /// `docker run` arguments for a container of `pod_spec` (everything but the network).
    fn run_args(
        &self,
        pod_spec: &Value,
        claims: &[String],
        container: &Value,
        pod: &Pod,
    ) -> Vec<String> {
        let (user, group, fs_group) = Self::ids(pod_spec);
        let mut args = vec!["--user".to_owned(), format!("{user}:{group}")];
        if let Some(fs_group) = fs_group {
            args.extend(["--group-add".to_owned(), fs_group.to_string()]);
        }
        let security = &container["securityContext"];
        if security["readOnlyRootFilesystem"].as_bool() == Some(true) {
            args.push("--read-only".to_owned());
        }
        if security["allowPrivilegeEscalation"].as_bool() == Some(false) {
            args.extend(["--security-opt".to_owned(), "no-new-privileges".to_owned()]);
        }
        for capability in seq(&security["capabilities"]["drop"]) {
            args.extend(["--cap-drop".to_owned(), str_of(capability).to_owned()]);
        }
        let env = self.env(container, pod);
        for (name, value) in &env {
            args.extend(["--env".to_owned(), format!("{name}={value}")]);
        }
        args.extend(self.mounts(pod_spec, claims, container, pod));
        let command: Vec<String> = seq(&container["command"])
            .iter()
            .map(|c| expand(str_of(c), &env))
            .collect();
        if let Some(entrypoint) = command.first() {
            args.extend(["--entrypoint".to_owned(), entrypoint.clone()]);
        }
        args.push(self.image_of(container));
        args.extend(command.into_iter().skip(1));
        args.extend(
            seq(&container["args"])
                .iter()
                .map(|a| expand(str_of(a), &env)),
        );
        args
    }

    fn image_of(&self, container: &Value) -> String {
        let image = str_of(&container["image"]);
        assert_eq!(
            image, IMAGE_DEFAULT,
            "the chart's default image is the one scripts/docker-image builds"
        );
        self.image.clone()
    }

    /// Runs a container to completion (an init container, a test step); panics with its
    /// output unless it exits 0. Returns its stdout.
    async fn run_to_completion(&self, name: &str, network: &str, args: Vec<String>) -> String {
        let mut all = vec![
            "run".to_owned(),
            "--rm".to_owned(),
            "--name".to_owned(),
            name.to_owned(),
            "--network".to_owned(),
            network.to_owned(),
        ];
        all.extend(args);
        let output = tokio::process::Command::new("docker")
            .args(&all)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "container {name} failed ({}): stdout {stdout} stderr {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }
}

/// Sets a path's owner and mode (the test runs as root, as the kubelet does).
fn own(path: &Path, user: u32, group: u32, mode: u32) {
    std::os::unix::fs::chown(path, Some(user), Some(group)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The container port a probe or Service names (by name or number).
fn port_of(container: &Value, port: &Value) -> u16 {
    if let Some(number) = port.as_u64() {
        return number as u16;
    }
    let name = str_of(port);
    seq(&container["ports"])
        .iter()
        .find(|p| str_of(&p["name"]) == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("the container has no port named {name}")) as u16
}

/// Waits until `GET path` answers 200; panics with the container's last log lines if it
/// does not within [`READY_TIMEOUT`].
async fn await_ok(addr: SocketAddr, path: &str, what: &str, container: &str) {
    let answered = poll_until(READY_TIMEOUT, async || match http_get(addr, path).await {
        Ok(r) if r.status == 200 => Ok(()),
        response => Err(format!("{response:?}")),
    })
    .await;
    if let Err(timed_out) = answered {
        panic!(
            "{what}: GET {addr}{path} answering 200: {timed_out}; log:\n{}",
            logs(container).await
        );
    }
}

async fn logs(container: &str) -> String {
    let output = tokio::process::Command::new("docker")
        .args(["logs", "--tail", "30", container])
        .output()
        .await
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn kubernetes_expansion_replaces_defined_variables_only() {
    let env = vec![
        ("POD_NAME".to_owned(), "t-0".to_owned()),
        ("POD_INDEX".to_owned(), "0".to_owned()),
    ];
    assert_eq!(expand("1$(POD_INDEX)", &env), "10");
    assert_eq!(
        expand("$(POD_NAME).h.ns.svc:7401", &env),
        "t-0.h.ns.svc:7401"
    );
    assert_eq!(
        expand("$(MISSING)/$$(POD_NAME)/$", &env),
        "$(MISSING)/$(POD_NAME)/$"
    );
    assert_eq!(expand("$(POD_NAME", &env), "$(POD_NAME");
}

/// The chart's StatefulSet rendered with `values`, its pods started as containers and past
/// their probes; `None` when the test is not opted in (see [`CHART_CHECK_ENV`]).
struct StartedChart {
    kubelet: Kubelet,
    pods: Vec<Pod>,
    /// The pods' node container, as rendered.
    node: Value,
    run_name: String,
    /// The pod's termination grace period, seconds.
    grace: u64,
    dir: TestDir,
}

impl StartedChart {
    fn container_name(&self, pod: &Pod, container: &str) -> String {
        format!("{}-{}-{container}", self.run_name, pod.name)
    }

    /// A value of the node's TOML file, as rendered into the chart's ConfigMap.
    fn config_line(&self, key: &str) -> Option<String> {
        self.kubelet.rendered.of_kind("ConfigMap").find_map(|map| {
            map["data"]["tributary.toml"]
                .as_str()?
                .lines()
                .find(|line| line.starts_with(&format!("{key} = ")))
                .map(str::to_owned)
        })
    }

    /// The node container's AMQP ports are `expected` (by name), and on every pod each
    /// answers AMQP: in plain text on `amqp`, over TLS with the pod's certificate (from the
    /// cluster CA, valid for the pod's IP) on `amqps`.
    async fn check_amqp(&self, expected: &[&str]) {
        let names: Vec<&str> = seq(&self.node["ports"])
            .iter()
            .map(|port| str_of(&port["name"]))
            .filter(|name| name.starts_with("amqp"))
            .collect();
        assert_eq!(names, expected, "the node container's AMQP ports");
        let ca_pem = self.dir.path().join("ca").join("ca.pem");
        for pod in &self.pods {
            let ip = pod.ip.unwrap();
            let server_name = ip.to_string();
            for name in expected {
                let addr = SocketAddr::from((ip, port_of(&self.node, &Value::from(*name))));
                let tls = (*name == "amqps").then_some(TlsTrust {
                    ca_pem: &ca_pem,
                    server_name: &server_name,
                });
                let what = format!("{} answering AMQP on its {name} port ({addr})", pod.name);
                eventually(READY_TIMEOUT, what, async || amqp_answers(addr, tls).await).await;
            }
        }
    }

    /// The node listens for the Blob API on all interfaces at container port 10000, named
    /// `blob`, and every pod answers there the unsigned call of the probe as the Blob API
    /// does: over TLS with the pod's certificate (from the cluster CA, valid for the pod's
    /// IP) when `tls`, refused for want of a credential when `authorization`.
    async fn check_blob(&self, tls: bool, authorization: bool) {
        assert_eq!(
            self.config_line("blob_addr").as_deref(),
            Some("blob_addr = \"0.0.0.0:10000\"")
        );
        let port = port_of(&self.node, &Value::from("blob"));
        assert_eq!(port, 10000, "the node container's blob port");
        let ca_pem = self.dir.path().join("ca").join("ca.pem");
        for pod in &self.pods {
            let ip = pod.ip.unwrap();
            let server_name = ip.to_string();
            let addr = SocketAddr::from((ip, port));
            let trust = tls.then_some(TlsTrust {
                ca_pem: &ca_pem,
                server_name: &server_name,
            });
            let what = format!(
                "{} answering the Blob API on its blob port ({addr})",
                pod.name
            );
            eventually(READY_TIMEOUT, what, async || {
                blob_answers(addr, trust, authorization).await
            })
            .await;
        }
    }

    /// The node listens for Kafka on all interfaces at container port 9092 (`kafka`) and,
    /// when `tls`, 9093 (`kafka-tls`), advertising the pod's DNS name under the headless
    /// Service; every pod answers ApiVersions on each (over TLS with the pod's certificate,
    /// from the cluster CA, valid for the pod's IP, on `kafka-tls`). Without
    /// `authorization` (Metadata needs no SASL login) every pod lists the three pods as
    /// brokers: node 1N at pod N's DNS name, port 9092, as rendered.
    async fn check_kafka(&self, tls: bool, authorization: bool) {
        assert_eq!(
            self.config_line("kafka_addr").as_deref(),
            Some("kafka_addr = \"0.0.0.0:9092\"")
        );
        assert_eq!(
            self.config_line("kafka_tls_addr"),
            tls.then(|| "kafka_tls_addr = \"0.0.0.0:9093\"".to_owned())
        );
        let names: Vec<&str> = seq(&self.node["ports"])
            .iter()
            .map(|port| str_of(&port["name"]))
            .filter(|name| name.starts_with("kafka"))
            .collect();
        let expected: &[&str] = if tls {
            &["kafka", "kafka-tls"]
        } else {
            &["kafka"]
        };
        assert_eq!(names, expected, "the node container's Kafka ports");
        assert_eq!(port_of(&self.node, &Value::from("kafka")), 9092);
        let advertised = |variable: &str| {
            seq(&self.node["env"])
                .iter()
                .find(|env| str_of(&env["name"]) == variable)
                .map(|env| str_of(&env["value"]).to_owned())
        };
        let plain_advertised = advertised("TRIBUTARY_ADVERTISE_KAFKA_ADDR")
            .expect("the node container advertises its Kafka address");
        assert!(
            plain_advertised.starts_with("$(POD_NAME).") && plain_advertised.ends_with(".svc:9092"),
            "the advertised Kafka address names the pod: {plain_advertised}"
        );
        if tls {
            assert_eq!(port_of(&self.node, &Value::from("kafka-tls")), 9093);
            assert_eq!(
                advertised("TRIBUTARY_ADVERTISE_KAFKA_TLS_ADDR"),
                Some(plain_advertised.replace(":9092", ":9093"))
            );
        } else {
            assert_eq!(advertised("TRIBUTARY_ADVERTISE_KAFKA_TLS_ADDR"), None);
        }
        let brokers: Vec<(i32, String)> = self
            .pods
            .iter()
            .map(|pod| {
                let node_id = format!("1{}", pod.index).parse().unwrap();
                (node_id, plain_advertised.replace("$(POD_NAME)", &pod.name))
            })
            .collect();
        let ca_pem = self.dir.path().join("ca").join("ca.pem");
        for pod in &self.pods {
            let ip = pod.ip.unwrap();
            let server_name = ip.to_string();
            let mut listeners = vec![(SocketAddr::from((ip, 9092)), None)];
            if tls {
                let trust = TlsTrust {
                    ca_pem: &ca_pem,
                    server_name: &server_name,
                };
                listeners.push((SocketAddr::from((ip, 9093)), Some(trust)));
            }
            for (addr, trust) in listeners {
                let what = format!("{} answering Kafka's ApiVersions on {addr}", pod.name);
                eventually(READY_TIMEOUT, what, async || {
                    kafka_answers(addr, trust).await
                })
                .await;
            }
            if !authorization {
                let addr = SocketAddr::from((ip, 9092));
                let what = format!("{} listing every pod as a Kafka broker", pod.name);
                eventually(READY_TIMEOUT, what, async || {
                    let mut listed: Vec<(i32, String)> = kafka_brokers(addr, None)
                        .await?
                        .iter()
                        .map(|broker| (broker.node_id, broker.addr()))
                        .collect();
                    listed.sort();
                    if listed == brokers {
                        Ok(())
                    } else {
                        Err(format!("Metadata lists {listed:?}, not {brokers:?}"))
                    }
                })
                .await;
            }
        }
    }

    /// Node `i`'s `/metrics`.
    async fn metrics(&self, i: usize) -> String {
        let http = port_of(&self.node, &Value::from("http"));
        let addr = SocketAddr::from((self.pods[i].ip.unwrap(), http));
        let response = http_get(addr, "/metrics").await.unwrap();
        assert_eq!(response.status, 200, "{response:?}");
        response.body
    }
}

async fn start_chart(test: &str, values: &[&str]) -> Option<StartedChart> {
    // Only scripts/chart-check runs this test; with its variable set, whatever the test
    // needs must be there.
    let chart_check = &format!("{CHART_CHECK_ENV}={REQUIRED_VALUE}");
    let how_to_run = &format!(
        "scripts/chart-check provides Docker, the {IMAGE_DEFAULT} image and helm, and runs \
         this test with it"
    );
    let opted_in = is_required(CHART_CHECK_ENV).then_some(());
    require_tool(chart_check, opted_in, how_to_run, CHART_CHECK_ENV)?;
    let helm = std::env::var_os("TRIBUTARY_HELM").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/helm-tools/bin/helm"),
        PathBuf::from,
    );
    let helm = require_tool(
        &helm.display().to_string(),
        helm.exists().then_some(helm.clone()),
        "scripts/helm-check installs it",
        CHART_CHECK_ENV,
    )?;
    let image = std::env::var("TRIBUTARY_IMAGE").unwrap_or_else(|_| IMAGE_DEFAULT.to_owned());
    require_tool(
        &format!("the image {image}"),
        image_exists(&image).await.then_some(()),
        "build it with scripts/docker-image",
        CHART_CHECK_ENV,
    )?;
    let dir = TestDir::new(test);
    let rendered = Rendered::render(&helm, values);

    let statefulset = rendered
        .of_kind("StatefulSet")
        .next()
        .cloned()
        .expect("the chart renders a StatefulSet");
    let set_name = str_of(&statefulset["metadata"]["name"]).to_owned();
    let spec = &statefulset["spec"];
    let replicas = spec["replicas"].as_u64().expect("replicas") as usize;
    assert_eq!(replicas, 3, "the default values run three nodes");
    let headless = str_of(&spec["serviceName"]).to_owned();
    let service = rendered
        .named("Service", &headless)
        .expect("the StatefulSet's headless Service is rendered");
    assert_eq!(str_of(&service["spec"]["clusterIP"]), "None");
    let pod_spec = &spec["template"]["spec"];
    let pod_labels = spec["template"]["metadata"]["labels"].as_mapping().unwrap();
    let claims: Vec<String> = seq(&spec["volumeClaimTemplates"])
        .iter()
        .map(|c| str_of(&c["metadata"]["name"]).to_owned())
        .collect();
    let [node] = seq(&pod_spec["containers"]) else {
        panic!("one container per pod");
    };
    let grace = pod_spec["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);

    // Client Services that select the pods: their names resolve to every pod.
    let mut service_names = Vec::new();
    for service in rendered.of_kind("Service") {
        let name = str_of(&service["metadata"]["name"]);
        if name == headless {
            continue;
        }
        let selector = service["spec"]["selector"].as_mapping().unwrap();
        if selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)) {
            for port in seq(&service["spec"]["ports"]) {
                assert_eq!(
                    port["port"].as_u64().map(|p| p as u16),
                    Some(port_of(node, &port["targetPort"])),
                    "Service {name} maps its port to another: names alone cannot emulate it"
                );
            }
            service_names.extend([
                name.to_owned(),
                format!("{name}.{NAMESPACE}"),
                format!("{name}.{NAMESPACE}.svc"),
                format!("{name}.{NAMESPACE}.svc.cluster.local"),
            ]);
        }
    }
    assert!(
        !service_names.is_empty(),
        "a client Service selects the pods"
    );

    // The Secrets: the rendered ones, and the CA the chart expects the operator to create.
    let mut secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>> = rendered
        .of_kind("Secret")
        .map(|s| (str_of(&s["metadata"]["name"]).to_owned(), secret_data(s)))
        .collect();
    let ca_dir = dir.path().join("ca");
    let made = std::process::Command::new(binary_path())
        .args(["cert", "ca", "--out"])
        .arg(&ca_dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    for volume in seq(&pod_spec["volumes"]) {
        let name = str_of(&volume["secret"]["secretName"]);
        if !name.is_empty() && !secrets.contains_key(name) {
            let read = |f: &str| std::fs::read(ca_dir.join(f)).unwrap();
            secrets.insert(
                name.to_owned(),
                BTreeMap::from([
                    ("ca.pem".to_owned(), read("ca.pem")),
                    ("ca.key".to_owned(), read("ca.key")),
                ]),
            );
        }
    }

    let run_name = format!("{test}-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let network = format!("{run_name}-net");
    let subnet = create_network(&network).await.unwrap();
    let mut kubelet = Kubelet {
        rendered,
        image,
        network: network.clone(),
        secrets,
        containers: Vec::new(),
    };
    let pods: Vec<Pod> = (0..replicas)
        .map(|index| Pod {
            name: format!("{set_name}-{index}"),
            index,
            ip: Some(Ipv4Addr::new(
                subnet[0],
                subnet[1],
                subnet[2],
                10 + index as u8,
            )),
            dir: dir.path().join(format!("pod-{index}")),
        })
        .collect();
    let container_name =
        |pod: &Pod, container: &str| format!("{run_name}-{}-{container}", pod.name);

    // Every pod: its init containers in order, then the node, as the StatefulSet's
    // Parallel policy starts them.
    for pod in &pods {
        for init in seq(&pod_spec["initContainers"]) {
            let name = container_name(pod, str_of(&init["name"]));
            let args = kubelet.run_args(pod_spec, &claims, init, pod);
            // Init containers share the pod's network; this one only writes files.
            kubelet.run_to_completion(&name, "none", args).await;
        }
        let name = container_name(pod, "node");
        let mut args = vec![
            "run".to_owned(),
            "--detach".to_owned(),
            "--name".to_owned(),
            name.clone(),
            "--hostname".to_owned(),
            pod.name.clone(),
            "--network".to_owned(),
            network.clone(),
            "--ip".to_owned(),
            pod.ip.unwrap().to_string(),
            "--stop-timeout".to_owned(),
            grace.to_string(),
        ];
        for alias in [
            format!("{}.{headless}.{NAMESPACE}.svc", pod.name),
            format!("{}.{headless}.{NAMESPACE}.svc.cluster.local", pod.name),
        ]
        .iter()
        .chain(&service_names)
        {
            args.extend(["--network-alias".to_owned(), alias.clone()]);
        }
        args.extend(kubelet.run_args(pod_spec, &claims, node, pod));
        kubelet.containers.push(name.clone());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args).await.unwrap();
    }

    // The probes' paths, on the ports they name: startup and liveness (alive), then
    // readiness (joined and serving), which needs the cluster to have formed.
    for pod in &pods {
        let name = container_name(pod, "node");
        for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
            let get = &node[probe]["httpGet"];
            assert!(!get.is_null(), "{probe} is an HTTP GET");
            let addr = SocketAddr::from((pod.ip.unwrap(), port_of(node, &get["port"])));
            let what = format!("{} {probe}", pod.name);
            await_ok(addr, str_of(&get["path"]), &what, &name).await;
        }
        println!("{} ({}) passes its probes", pod.name, pod.ip.unwrap());
    }
    Some(StartedChart {
        kubelet,
        pods,
        node: node.clone(),
        run_name,
        grace,
        dir,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_statefulset_forms_a_cluster_that_serves_and_answers_its_probes() {
    let Some(chart) = start_chart("chart", &[]).await else {
        return;
    };
    let StartedChart {
        kubelet,
        pods,
        node,
        grace,
        dir,
        ..
    } = &chart;
    let network = &kubelet.network;
    let container_name = |pod: &Pod, container: &str| chart.container_name(pod, container);
    // The peer port faces the pods' network behind mutual TLS and the cluster key, which
    // the node read (it would not have started otherwise).
    assert!(chart.config_line("cluster_key_file").is_some());
    assert!(chart.config_line("peer_ca").is_some());
    assert!(chart.metrics(0).await.contains("tributary_peer_insecure 0"));
    // AMQP for the Azure SDKs: plain text and, with TLS on, AMQPS.
    chart.check_amqp(&["amqp", "amqps"]).await;
    // The Blob checkpoint endpoint: HTTPS, refusing calls without a credential.
    chart.check_blob(true, true).await;
    // Kafka: plain text and TLS, each pod advertising its own name.
    chart.check_kafka(true, true).await;

    // The chart's helm test pod: create a hub, send, read back, through the client
    // Service's name, over TLS with the root key. Its containers run in order.
    let test_pod = kubelet
        .rendered
        .of_kind("Pod")
        .find(|p| str_of(&p["metadata"]["annotations"]["helm.sh/hook"]) == "test")
        .expect("the chart renders a helm test pod")
        .clone();
    let tester = Pod {
        name: str_of(&test_pod["metadata"]["name"]).to_owned(),
        index: 0,
        ip: None,
        dir: dir.path().join("helm-test"),
    };
    let test_spec = &test_pod["spec"];
    let steps: Vec<Value> = seq(&test_spec["initContainers"])
        .iter()
        .chain(seq(&test_spec["containers"]))
        .cloned()
        .collect();
    for step in &steps {
        let name = container_name(&tester, str_of(&step["name"]));
        let args = kubelet.run_args(test_spec, &[], step, &tester);
        let out = kubelet.run_to_completion(&name, network, args).await;
        println!("helm test step {}: {}", str_of(&step["name"]), out.trim());
    }

    // The cluster as a client sees it, with the test pod's credentials: three nodes up,
    // pod N as node 1N.
    let cluster_status = || async {
        let mut step = steps[0].clone();
        step["name"] = Value::from("status");
        step["args"] = Value::from(vec!["cluster", "status", "--output", "json"]);
        let name = container_name(&tester, &format!("status-{:04x}", rand::random::<u16>()));
        let args = kubelet.run_args(test_spec, &[], &step, &tester);
        let out = kubelet.run_to_completion(&name, network, args).await;
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
    };
    let status = cluster_status().await;
    let mut ids: Vec<u64> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["up"] == true)
        .map(|n| n["id"].as_u64().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec![10, 11, 12], "{status}");

    // The preStop hook drains pod 0 for its restart; from another machine (this host) a
    // drain is refused.
    let pod = &pods[0];
    let name = container_name(pod, "node");
    let http = SocketAddr::from((pod.ip.unwrap(), port_of(node, &Value::from("http"))));
    let refused = http_post(http, "/drain").await.unwrap();
    assert_eq!(refused.status, 403, "{refused:?}");
    let hook: Vec<String> = seq(&node["lifecycle"]["preStop"]["exec"]["command"])
        .iter()
        .map(|c| str_of(c).to_owned())
        .collect();
    assert!(!hook.is_empty(), "the node has a preStop exec hook");
    let mut exec = vec!["exec".to_owned(), name.clone()];
    exec.extend(hook);
    let exec: Vec<&str> = exec.iter().map(String::as_str).collect();
    let drained = docker(&exec).await.unwrap();
    assert!(drained.contains("is drained"), "{drained}");
    assert!(
        drained.contains("undrains itself when it next starts"),
        "{drained}"
    );
    let ready = http_get(http, "/readyz").await.unwrap();
    assert_eq!(ready.status, 503, "a drained pod is not ready: {ready:?}");

    // SIGTERM (as the kubelet sends after the hook): a clean stop within the grace period.
    docker(&["stop", "--time", &grace.to_string(), &name])
        .await
        .unwrap();
    let exit = docker(&["inspect", "--format", "{{.State.ExitCode}}", &name])
        .await
        .unwrap();
    assert_eq!(
        exit,
        "0",
        "the drained node stops cleanly: {}",
        logs(&name).await
    );

    // Back with the same volumes: ready again, and no longer drained.
    docker(&["start", &name]).await.unwrap();
    let readiness = &node["readinessProbe"]["httpGet"];
    await_ok(
        SocketAddr::from((pod.ip.unwrap(), port_of(node, &readiness["port"]))),
        str_of(&readiness["path"]),
        "pod 0 after its restart",
        &name,
    )
    .await;
    let what = "pod 0 up and undrained by itself after its restart";
    eventually(READY_TIMEOUT, what, async || {
        let status = cluster_status().await;
        let node10 = status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == 10)
            .cloned()
            .unwrap();
        if node10["up"] == true && node10["draining"] == false {
            Ok(())
        } else {
            Err(node10)
        }
    })
    .await;
    println!("pod 0 drained, stopped, restarted and undrained itself");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tls_the_cluster_key_alone_lets_the_pods_form_a_cluster() {
    // The development values: plain text on every port, no authorization; the peer port
    // keeps the cluster key, without which a node on the network refuses to start.
    let Some(chart) = start_chart("chart-key", &["ci/insecure-values.yaml"]).await else {
        return;
    };
    assert!(chart.config_line("cluster_key_file").is_some());
    assert_eq!(chart.config_line("peer_ca"), None, "no mutual TLS");
    // AMQP in plain text only: AMQPS needs the client port's certificate.
    assert_eq!(chart.config_line("amqps_addr"), None);
    chart.check_amqp(&["amqp"]).await;
    // The Blob checkpoint endpoint in plain text, answering without a credential.
    chart.check_blob(false, false).await;
    // Kafka in plain text only, every pod listing every pod as a broker at its own name.
    chart.check_kafka(false, false).await;
    // Every pod is ready: the cluster formed over peer connections the key admitted.
    for i in 0..chart.pods.len() {
        let metrics = chart.metrics(i).await;
        assert!(metrics.contains("tributary_peer_insecure 0"), "pod {i}");
    }
    // A caller without the key (this host) is refused before any peer call.
    let peer = SocketAddr::from((
        chart.pods[0].ip.unwrap(),
        port_of(&chart.node, &Value::from("peer")),
    ));
    let mut stream = tokio::net::TcpStream::connect(peer).await.unwrap();
    let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(READY_TIMEOUT, stream.read_to_end(&mut answer)).await;
    let refused = "tributary_peer_refused_total{reason=\"no_key\"}";
    eventually(
        READY_TIMEOUT,
        "the keyless connection counted",
        async || {
            let metrics = chart.metrics(0).await;
            match metrics.lines().find(|line| line.starts_with(refused)) {
                Some(line) => Ok(line.to_owned()),
                None => Err(format!("no {refused} in /metrics")),
            }
        },
    )
    .await;
    println!("three pods without TLS formed a cluster with the cluster key");
}
