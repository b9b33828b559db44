# Drives a Tributary cluster's Kafka front end with confluent-kafka (librdkafka), unchanged.
#
# Usage: kafka_clients.py '<json settings>'. Prints one JSON summary line, which the Rust
# test (kafka_produce.rs) asserts.
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

SETTINGS = json.loads(sys.argv[1])


def config(password=None, **extra):
    ports = SETTINGS.get("kafka_ports") or [SETTINGS["kafka_port"]]
    result = {
        "bootstrap.servers": ",".join(f"127.0.0.1:{port}" for port in ports),
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


def idempotent():
    """An idempotent producer (enable.idempotence, acks=all) sending numbered records to one
    partition, paced so that the test can kill the partition's leader while records are in
    flight; every node is a bootstrap server, so the client can reconnect through another.
    Prints each acknowledged record's number and offset."""
    acked = []
    failed = []
    fatal = []

    def on_delivery(err, msg):
        if err is None:
            acked.append([int(msg.value()), msg.offset()])
        else:
            failed.append([int(msg.value()), err.name()])

    def on_error(err):
        if err.fatal():
            fatal.append({"code": err.name(), "text": err.str()})

    producer = Producer(config(**{
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": SETTINGS["message_timeout_ms"],
        "error_cb": on_error,
    }))
    count, chunk = SETTINGS["count"], SETTINGS["chunk"]
    for start in range(0, count, chunk):
        for i in range(start, min(count, start + chunk)):
            while True:
                try:
                    producer.produce(SETTINGS["topic"], value=str(i).encode(),
                                     partition=SETTINGS["partition"], on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(SETTINGS["pause_s"])
    left = producer.flush(SETTINGS["flush_s"])
    print(json.dumps({"summary": {"acked": acked, "failed": failed, "fatal": fatal, "left": left}}),
          flush=True)


def pipelined():
    """Numbered records to one partition, handed over one by one and sent without lingering
    (acks=all, not idempotent), so that librdkafka has many small Produce requests in flight
    on its connection at once. One record is sent and acknowledged first: the partition's
    leader is known before the numbered ones go. Prints each numbered record's number and
    offset, in the order their acknowledgements came."""
    acked = []
    errors = []

    def on_delivery(err, msg):
        if err is None:
            acked.append([int(msg.value()), msg.offset()])
        else:
            errors.append(f"record {msg.value()}: {err}")

    producer = Producer(config(**{
        "acks": "all",
        "linger.ms": 0,
        "error_cb": lambda e: errors.append(str(e)),
    }))
    producer.produce(SETTINGS["topic"], value=b"-1", partition=SETTINGS["partition"])
    producer.flush(60)
    for i in range(SETTINGS["count"]):
        producer.produce(SETTINGS["topic"], value=str(i).encode(),
                         partition=SETTINGS["partition"], on_delivery=on_delivery)
        producer.poll(0)
        time.sleep(SETTINGS["pause_s"])
    left = producer.flush(60)
    if left:
        errors.append(f"{left} records not delivered in 60 s")
    print(json.dumps({"summary": {"acked": acked, "errors": errors}}), flush=True)


def kafka_python_idempotent():
    """kafka-python 3 with its defaults (idempotence on: it calls InitProducerId), sending
    numbered records to one partition."""
    import logging
    from kafka import KafkaProducer

    # The client's own account of its retries and metadata, on stderr, which a failing
    # test prints.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ports = SETTINGS.get("kafka_ports") or [SETTINGS["kafka_port"]]
    producer = KafkaProducer(
        bootstrap_servers=[f"127.0.0.1:{port}" for port in ports],
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="$ConnectionString",
        sasl_plain_password=SETTINGS["connection_string"],
    )
    futures = [
        producer.send(SETTINGS["topic"], value=str(i).encode(), partition=SETTINGS["partition"])
        for i in range(SETTINGS["count"])
    ]
    producer.flush(60)
    acked = []
    errors = []
    for i, future in enumerate(futures):
        try:
            acked.append([i, future.get(timeout=10).offset])
        except Exception as err:  # reported to the test, which fails on any
            errors.append(f"{i}: {err!r}")
    idempotent = producer.config.get("enable_idempotence")
    producer.close(10)
    print(json.dumps({"summary": {"acked": acked, "errors": errors, "idempotent": idempotent}}),
          flush=True)


{
    "produce": produce,
    "wrong_password": wrong_password,
    "admin": admin,
    "idempotent": idempotent,
    "kafka_python_idempotent": kafka_python_idempotent,
    "pipelined": pipelined,
}[SETTINGS["scenario"]]()
