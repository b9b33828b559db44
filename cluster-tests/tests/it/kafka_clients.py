# Drives a Tributary cluster's Kafka front end with confluent-kafka (librdkafka), unchanged.
#
# Usage: kafka_clients.py '<json settings>'. Prints one JSON summary line, which the Rust
# test (kafka_produce.rs) asserts.
import json
import sys

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

SETTINGS = json.loads(sys.argv[1])


def config(password=None, **extra):
    result = {
        "bootstrap.servers": f"127.0.0.1:{SETTINGS['kafka_port']}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "$ConnectionString",
        "sasl.password": password or SETTINGS["connection_string"],
    }
    result.update(extra)
    return result


def produce():
    """Keyed records with headers to every partition, acks=all, with each codec."""
    delivered = []
    errors = []

    def on_delivery(err, msg):
        delivered.append({
            "error": None if err is None else str(err),
            "partition": msg.partition(),
            "offset": msg.offset(),
            "key": msg.key().decode(),
            "codec": msg.value().decode().split("/")[0],
        })

    for codec in SETTINGS["codecs"]:
        producer = Producer(config(
            acks="all",
            **{"compression.type": codec, "linger.ms": 5, "error_cb": lambda e: errors.append(str(e))},
        ))
        for i in range(SETTINGS["count"]):
            producer.produce(
                SETTINGS["topic"],
                key=f"{codec}-key-{i}",
                value=f"{codec}/value-{i}",
                partition=i % SETTINGS["partitions"],
                headers=[("codec", codec.encode()), ("index", str(i).encode())],
                timestamp=SETTINGS.get("timestamp_base", 0) + i,
                on_delivery=on_delivery,
            )
        left = producer.flush(60)
        if left:
            errors.append(f"{left} records of {codec} not delivered in 60 s")
    print(json.dumps({"summary": {"delivered": delivered, "errors": errors}}), flush=True)


def wrong_password():
    """A producer whose connection string has a wrong key: its login is refused."""
    errors = []
    delivered = []
    producer = Producer(config(
        password=SETTINGS["wrong_connection_string"],
        **{"error_cb": lambda e: errors.append({"code": e.name(), "text": e.str()}),
           "message.timeout.ms": 5000},
    ))
    producer.produce(SETTINGS["topic"], value=b"never", partition=0,
                     on_delivery=lambda err, msg: delivered.append(None if err is None else err.name()))
    producer.flush(15)
    print(json.dumps({"summary": {"errors": errors, "delivered": delivered}}), flush=True)


def admin():
    """CreateTopics and DescribeConfigs through AdminClient, and ListOffsets by time."""
    client = AdminClient(config())
    outcome = {}
    name = SETTINGS["new_topic"]
    topics = [
        NewTopic(name, num_partitions=3, replication_factor=3,
                 config={"retention.ms": "7200000", "cleanup.policy": "delete"}),
        NewTopic(name + "-bad", num_partitions=2, replication_factor=3,
                 config={"min.insync.replicas": "2"}),
    ]
    for topic, future in client.create_topics(topics, request_timeout=30).items():
        try:
            future.result()
            outcome[topic] = "created"
        except KafkaException as err:
            outcome[topic] = err.args[0].name()
    again = client.create_topics([NewTopic(name, num_partitions=3, replication_factor=3)])
    try:
        again[name].result()
        outcome["again"] = "created"
    except KafkaException as err:
        outcome["again"] = err.args[0].name()
    configs = {}
    for resource, future in client.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, name)]).items():
        configs = {key: entry.value for key, entry in future.result().items()}
    consumer = Consumer(config(**{"group.id": "offsets-for-times"}))
    wanted = [TopicPartition(SETTINGS["topic"], p, t) for p, t in SETTINGS["times"]]
    found = consumer.offsets_for_times(wanted, timeout=30)
    consumer.close()
    print(json.dumps({"summary": {
        "created": outcome,
        "configs": configs,
        "offsets": [[tp.partition, tp.offset] for tp in found],
    }}), flush=True)


{"produce": produce, "wrong_password": wrong_password, "admin": admin}[SETTINGS["scenario"]]()
