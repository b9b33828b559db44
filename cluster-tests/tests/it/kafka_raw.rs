//! Kafka requests that client libraries never send on purpose, written with kafka-protocol's
//! codecs: a Produce or a Fetch sent to a node that does not lead the partition (clients
//! send them there only while their Metadata is out of date).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse, RequestHeader,
    ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// How long one answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Produce's version: v8, the last before flexible encodings.
const PRODUCE_VERSION: i16 = 8;
/// Fetch's version: v11, the last before flexible encodings.
const FETCH_VERSION: i16 = 11;

/// One connection to a Kafka listener, logged in.
pub struct RawKafka {
    stream: TcpStream,
    correlation_id: i32,
}

/// A partition's part of an answer: its error code (0, or e.g. 6 NOT_LEADER_OR_FOLLOWER)
/// and the offset it tells (a Produce's base offset, a Fetch's high watermark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionAnswer {
    pub error_code: i16,
    pub offset: i64,
}

/// A Produce's answer for its partition, with the error message the node gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceAnswer {
    pub partition: PartitionAnswer,
    pub error_message: Option<String>,
}

/// Kafka's NOT_LEADER_OR_FOLLOWER.
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;

impl RawKafka {
    /// Connects to `port` on 127.0.0.1 and logs in with SASL PLAIN as Event Hubs takes it.
    pub async fn login(port: u16, connection_string: &str) -> RawKafka {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut kafka = RawKafka {
            stream,
            correlation_id: 0,
        };
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str("PLAIN");
        let answer: SaslHandshakeResponse = kafka.call(ApiKey::SaslHandshake, 1, &handshake).await;
        assert_eq!(answer.error_code, 0, "{answer:?}");
        let mut authenticate = SaslAuthenticateRequest::default();
        authenticate.auth_bytes = Bytes::from(format!("\0$ConnectionString\0{connection_string}"));
        let answer: SaslAuthenticateResponse =
            kafka.call(ApiKey::SaslAuthenticate, 2, &authenticate).await;
        assert_eq!(answer.error_code, 0, "{answer:?}");
        kafka
    }

    async fn call<Q: Encodable, A: Decodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        request: &Q,
    ) -> A {
        self.correlation_id += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = api as i16;
        header.request_api_version = version;
        header.correlation_id = self.correlation_id;
        header.client_id = Some(StrBytes::from_static_str("raw-test"));
        let mut frame = BytesMut::new();
        header
            .encode(&mut frame, api.request_header_version(version))
            .unwrap();
        request.encode(&mut frame, version).unwrap();
        let length = i32::try_from(frame.len()).unwrap().to_be_bytes();
        self.stream.write_all(&length).await.unwrap();
        self.stream.write_all(&frame).await.unwrap();
        let body = tokio::time::timeout(ANSWER_TIMEOUT, async {
            let mut length = [0u8; 4];
            self.stream.read_exact(&mut length).await?;
            let mut body = vec![0u8; usize::try_from(i32::from_be_bytes(length)).unwrap()];
            self.stream.read_exact(&mut body).await?;
            std::io::Result::Ok(body)
        })
        .await
        .unwrap_or_else(|_| panic!("no answer to {api:?} within {ANSWER_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("the connection closed instead of answering {api:?}: {e}"));
        let mut body = Bytes::from(body);
        let header = ResponseHeader::decode(&mut body, api.response_header_version(version))
            .expect("a response header");
        assert_eq!(header.correlation_id, self.correlation_id);
        A::decode(&mut body, version).expect("a response body")
    }

    /// Produces one record (acks=all) to `topic`'s `partition`.
    pub async fn produce(&mut self, topic: &str, partition: i32, value: &str) -> ProduceAnswer {
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: IndexMap::new(),
        };
        let mut records = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut records,
            [record].iter(),
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        let mut data = PartitionProduceData::default();
        data.index = partition;
        data.records = Some(records.freeze());
        let mut topic_data = TopicProduceData::default();
        topic_data.name = TopicName(StrBytes::from_string(topic.to_owned()));
        topic_data.partition_data = vec![data];
        let mut request = ProduceRequest::default();
        request.acks = -1;
        request.timeout_ms = 30_000;
        request.topic_data = vec![topic_data];
        let answer: ProduceResponse = self.call(ApiKey::Produce, PRODUCE_VERSION, &request).await;
        let partition = &answer.responses[0].partition_responses[0];
        ProduceAnswer {
            partition: PartitionAnswer {
                error_code: partition.error_code,
                offset: partition.base_offset,
            },
            error_message: partition.error_message.as_ref().map(|m| m.to_string()),
        }
    }

    /// Fetches `topic`'s `partition` from offset 0 without waiting.
    pub async fn fetch(&mut self, topic: &str, partition: i32) -> PartitionAnswer {
        let mut wanted = FetchPartition::default();
        wanted.partition = partition;
        wanted.fetch_offset = 0;
        wanted.partition_max_bytes = 1 << 20;
        let mut fetch_topic = FetchTopic::default();
        fetch_topic.topic = TopicName(StrBytes::from_string(topic.to_owned()));
        fetch_topic.partitions = vec![wanted];
        let mut request = FetchRequest::default();
        request.replica_id = (-1).into();
        request.max_wait_ms = 0;
        request.min_bytes = 1;
        request.max_bytes = 1 << 20;
        request.topics = vec![fetch_topic];
        let answer: FetchResponse = self.call(ApiKey::Fetch, FETCH_VERSION, &request).await;
        let partition = &answer.responses[0].partitions[0];
        PartitionAnswer {
            error_code: partition.error_code,
            offset: partition.high_watermark,
        }
    }
}
