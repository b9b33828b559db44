use std::pin::Pin;
use std::sync::Mutex;

use futures::{Stream, StreamExt};
use prost::Message;
use tributary_proto::v1 as proto;
use tributary_proto::v1::consumer_server::{Consumer, ConsumerServer};
use tributary_proto::v1::management_server::{Management, ManagementServer};
use tributary_proto::v1::producer_server::{Producer, ProducerServer};

#[derive(Default)]
struct Mock {
    events: Mutex<Vec<proto::ReceivedEvent>>,
}

#[tonic::async_trait]
impl Producer for Mock {
    async fn send(&self, request: tonic::Request<proto::SendRequest>) -> Result<tonic::Response<proto::SendResponse>, tonic::Status> {
        let r = request.into_inner();
        let mut events = self.events.lock().unwrap();
        let first = events.len() as i64;
        let mut offsets = vec![];
        let key = match &r.target { Some(proto::send_request::Target::PartitionKey(k)) => k.clone(), _ => String::new() };
        for e in r.events {
            let seq = events.len() as i64;
            offsets.push((seq * 100).to_string());
            events.push(proto::ReceivedEvent { body: e.body, properties: e.properties, sequence_number: seq, offset: (seq * 100).to_string(), enqueued_time_ms: 1_714_564_800_000 + seq, partition_key: key.clone() });
        }
        Ok(tonic::Response::new(proto::SendResponse { partition_id: "0".into(), first_sequence_number: first, offsets, enqueued_time_ms: 1_714_564_800_000 }))
    }
}

#[tonic::async_trait]
impl Consumer for Mock {
    type ReceiveStream = Pin<Box<dyn Stream<Item = Result<proto::ReceiveResponse, tonic::Status>> + Send>>;
    async fn receive(&self, request: tonic::Request<proto::ReceiveRequest>) -> Result<tonic::Response<Self::ReceiveStream>, tonic::Status> {
        let r = request.into_inner();
        println!("receive request: {r:?}");
        let events = self.events.lock().unwrap().clone();
        let batches: Vec<Result<proto::ReceiveResponse, tonic::Status>> = events.chunks(2).map(|c| Ok(proto::ReceiveResponse { events: c.to_vec(), last_enqueued_sequence_number: 9 })).collect();
        let s = futures::stream::iter(batches).chain(futures::stream::pending());
        Ok(tonic::Response::new(Box::pin(s)))
    }
}

fn err(reason: proto::ErrorReason, code: tonic::Code, msg: &str) -> tonic::Status {
    let d = proto::ErrorDetail { reason: reason as i32, message: msg.into(), retry_after_ms: 0, leader_hint: String::new() };
    tonic::Status::with_details(code, msg, d.encode_to_vec().into())
}

#[tonic::async_trait]
impl Management for Mock {
    async fn create_event_hub(&self, r: tonic::Request<proto::CreateEventHubRequest>) -> Result<tonic::Response<proto::EventHubProperties>, tonic::Status> {
        let r = r.into_inner();
        Ok(tonic::Response::new(proto::EventHubProperties { name: r.name, partition_count: r.partition_count, retention_ms: r.retention_ms, created_at_ms: 1_714_564_800_000, partition_ids: (0..r.partition_count).map(|p| p.to_string()).collect() }))
    }
    async fn get_event_hub(&self, r: tonic::Request<proto::GetEventHubRequest>) -> Result<tonic::Response<proto::EventHubProperties>, tonic::Status> {
        let r = r.into_inner();
        if r.name != "orders" { return Err(err(proto::ErrorReason::NotFound, tonic::Code::NotFound, &format!("event hub '{}' does not exist", r.name))); }
        Ok(tonic::Response::new(proto::EventHubProperties { name: r.name, partition_count: 2, retention_ms: 86_400_000, created_at_ms: 1_714_564_800_000, partition_ids: vec!["0".into(), "1".into()] }))
    }
    async fn list_event_hubs(&self, _r: tonic::Request<proto::ListEventHubsRequest>) -> Result<tonic::Response<proto::ListEventHubsResponse>, tonic::Status> {
        Ok(tonic::Response::new(proto::ListEventHubsResponse { event_hubs: vec![proto::EventHubProperties { name: "orders".into(), partition_count: 2, retention_ms: 86_400_000, created_at_ms: 1_714_564_800_000, partition_ids: vec!["0".into(), "1".into()] }] }))
    }
    async fn delete_event_hub(&self, _r: tonic::Request<proto::DeleteEventHubRequest>) -> Result<tonic::Response<proto::DeleteEventHubResponse>, tonic::Status> { Ok(tonic::Response::new(proto::DeleteEventHubResponse {})) }
    async fn create_consumer_group(&self, _r: tonic::Request<proto::CreateConsumerGroupRequest>) -> Result<tonic::Response<proto::ConsumerGroupProperties>, tonic::Status> { Err(err(proto::ErrorReason::AlreadyExists, tonic::Code::AlreadyExists, "consumer group 'a' already exists")) }
    async fn list_consumer_groups(&self, _r: tonic::Request<proto::ListConsumerGroupsRequest>) -> Result<tonic::Response<proto::ListConsumerGroupsResponse>, tonic::Status> {
        Ok(tonic::Response::new(proto::ListConsumerGroupsResponse { consumer_groups: vec![proto::ConsumerGroupProperties { event_hub: "orders".into(), name: "$Default".into(), created_at_ms: 1_714_564_800_000 }] }))
    }
    async fn delete_consumer_group(&self, _r: tonic::Request<proto::DeleteConsumerGroupRequest>) -> Result<tonic::Response<proto::DeleteConsumerGroupResponse>, tonic::Status> { Ok(tonic::Response::new(proto::DeleteConsumerGroupResponse {})) }
    async fn get_partition_properties(&self, r: tonic::Request<proto::GetPartitionPropertiesRequest>) -> Result<tonic::Response<proto::PartitionProperties>, tonic::Status> {
        let r = r.into_inner();
        Ok(tonic::Response::new(proto::PartitionProperties { event_hub: r.event_hub, partition_id: r.partition_id.clone(), begin_sequence_number: 0, last_enqueued_sequence_number: if r.partition_id == "0" { 9 } else { -1 }, last_enqueued_offset: if r.partition_id == "0" { "900".into() } else { "-1".into() }, last_enqueued_time_ms: if r.partition_id == "0" { 1_714_564_800_009 } else { 0 }, is_empty: r.partition_id != "0" }))
    }
}

#[tokio::test]
async fn scratch() {
    use std::sync::Arc;
    let mock = Arc::new(Mock::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tonic::transport::Server::builder()
        .add_service(ProducerServer::from_arc(mock.clone()))
        .add_service(ConsumerServer::from_arc(mock.clone()))
        .add_service(ManagementServer::from_arc(mock.clone()))
        .serve_with_incoming(tokio_stream_shim(listener)));
    use clap::Parser;
    #[derive(Parser)]
    struct Cli { #[command(flatten)] g: tributary_client::cli::CliGlobals, #[command(subcommand)] c: tributary_client::cli::CliCommand }
    let ep = format!("http://{addr}");
    for args in [
        vec!["hub", "list"], vec!["hub", "list", "--output", "json"], vec!["hub", "show", "orders"], vec!["hub", "show", "orders", "--output", "json"],
        vec!["hub", "create", "x", "--partitions", "3", "--retention", "2d"],
        vec!["group", "list", "orders"],
        vec!["send", "orders", "--body", "hello", "--partition-key", "k"],
        vec!["send", "orders", "--body", "hello", "--output", "json"],
        vec!["send", "orders", "--count", "5", "--size", "10", "--batch-size", "2"],
        vec!["receive", "orders", "--partition", "0", "--count", "3"],
        vec!["receive", "orders", "--partition", "0", "--output", "json", "--timeout", "300ms", "--from", "time:2024-05-01T12:00:00Z"],
    ] {
        let mut full = vec!["tributary", "--endpoint", &ep];
        full.extend(args.iter());
        println!("\n$ {}", args.join(" "));
        let cli = Cli::parse_from(full);
        tributary_client::cli::run(cli.g, cli.c).await.unwrap();
    }
    for args in [vec!["hub", "show", "nope"], vec!["group", "create", "orders", "a"]] {
        let mut full = vec!["tributary", "--endpoint", &ep];
        full.extend(args.iter());
        let cli = Cli::parse_from(full);
        let e = tributary_client::cli::run(cli.g, cli.c).await.unwrap_err();
        println!("\n$ {}\nerror: {e:#}", args.join(" "));
    }
}

fn tokio_stream_shim(l: tokio::net::TcpListener) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(l, |l| async move { let r = l.accept().await.map(|(s, _)| s); Some((r, l)) })
}
