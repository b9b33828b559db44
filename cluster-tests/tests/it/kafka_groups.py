# One Kafka consumer group, used in turn by confluent-kafka (librdkafka), kafka-python 3 and
# aiokafka consumers against a Tributary cluster's Kafka front end, unchanged.
#
# Usage: kafka_groups.py '<json settings>'. Prints one JSON summary line, which the Rust test
# (kafka_groups.rs) asserts. Records are keyed (`key-<i mod keys>`), their values
# `<phase>-<i>`; every record a producer was told it stored is listed as
# [partition, offset, key, value], and so is every record a consumer read. Every wait is for
# a condition, bounded by a deadline.
import asyncio
import json
import sys
import time

SETTINGS = json.loads(sys.argv[1])
TOPIC = SETTINGS["topic"]
PARTITIONS = SETTINGS["partitions"]
GROUP = SETTINGS["group"]
PHASE = SETTINGS["phase"]
DEADLINE_S = 150
# How long a consumer that has read everything it expects goes on polling, so that a record
# delivered twice or one it should not have read shows up in its list.
EXTRA_POLL_S = 1.0


def servers():
    return [f"127.0.0.1:{port}" for port in SETTINGS["kafka_ports"]]


def keyed(i):
    return f"key-{i % SETTINGS['keys']}", f"{PHASE}-{i}"


def summary(**fields):
    print(json.dumps({"summary": fields}), flush=True)


def timeout(what, **state):
    summary(timeout=what, **state)
    raise SystemExit(1)


# confluent-kafka (librdkafka)

def confluent_config(**extra):
    result = {
        "bootstrap.servers": ",".join(servers()),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "$ConnectionString",
        "sasl.password": SETTINGS["connection_string"],
    }
    result.update(extra)
    return result


def error(who, e):
    """A KafkaError as the Rust test reads it."""
    return {"who": who, "code": e.name(), "fatal": e.fatal(), "text": e.str()}


class Member:
    """A confluent-kafka consumer of the group: what it was assigned and what it read."""

    def __init__(self, name, errors):
        from confluent_kafka import Consumer

        self.name = name
        self.errors = errors
        self.assigned = set()
        self.assignments = []
        self.read = []
        self.consumer = Consumer(confluent_config(**{
            "group.id": GROUP,
            "client.id": name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
            "error_cb": lambda e: errors.append(error(name, e)),
        }))
        self.consumer.subscribe([TOPIC], on_assign=self.on_assign, on_revoke=self.on_revoke)

    def on_assign(self, consumer, partitions):
        self.assigned = {p.partition for p in partitions}
        self.assignments.append(sorted(self.assigned))

    def on_revoke(self, consumer, partitions):
        # What was read so far is committed before another member takes the partitions.
        if self.read:
            try:
                consumer.commit(asynchronous=False)
            except Exception as e:  # nothing consumed on some partition: nothing to commit
                if "NO_OFFSET" not in str(e):
                    self.errors.append({"who": self.name, "code": "COMMIT_ON_REVOKE", "text": str(e)})
        self.assigned = set()

    def poll(self):
        for message in self.consumer.consume(500, 0.2):
            if message.error():
                self.errors.append(error(self.name, message.error()))
                continue
            self.read.append([message.partition(), message.offset(), message.key().decode(),
                              message.value().decode()])

    def commit(self):
        """Commits what was read; nothing to commit (everything read is committed already,
        by the revoke handler of a rebalance) is no error."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as e:
            if e.args[0].code() != KafkaError._NO_OFFSET:
                raise

    def committed(self):
        from confluent_kafka import TopicPartition

        found = self.consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 30)
        return {str(tp.partition): tp.offset for tp in found}


def until(condition, members, what):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            timeout(what, members=[{"name": m.name, "assigned": sorted(m.assigned),
                                    "read": len(m.read)} for m in members])
        for member in members:
            member.poll()


def poll_on(members):
    """Polls a little longer after everything expected was read."""
    end = time.monotonic() + EXTRA_POLL_S
    while time.monotonic() < end:
        for member in members:
            member.poll()


def confluent_produce(first, count, errors):
    """`count` keyed records with acks=all and idempotence; what the producer was told."""
    from confluent_kafka import Producer

    delivered = []

    def on_delivery(err, msg):
        if err is None:
            delivered.append([msg.partition(), msg.offset(), msg.key().decode(),
                              msg.value().decode()])
        else:
            errors.append({"who": "producer", "code": err.name(), "fatal": err.fatal(),
                           "text": err.str()})

    producer = Producer(confluent_config(**{
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "error_cb": lambda e: errors.append(error("producer", e)),
    }))
    for i in range(first, first + count):
        key, value = keyed(i)
        while True:
            try:
                producer.produce(TOPIC, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: serve delivery reports
                producer.poll(0.05)
    left = producer.flush(120)
    if left:
        errors.append({"who": "producer", "code": "UNDELIVERED", "text": f"{left} records"})
    return delivered


def pair():
    """Two members share the partitions and read each record once; one leaves and the other
    takes every partition, reading on from the leaver's commits."""
    errors = []
    a = Member("consumer-a", errors)
    b = Member("consumer-b", errors)
    until(lambda: a.assigned and b.assigned and len(a.assigned | b.assigned) == PARTITIONS,
          [a, b], "both members assigned")
    first_assignment = {"a": sorted(a.assigned), "b": sorted(b.assigned)}
    count, later = SETTINGS["count"], SETTINGS["later_count"]
    delivered = confluent_produce(0, count, errors)
    until(lambda: len(a.read) + len(b.read) >= len(delivered), [a, b], "the first records read")
    poll_on([a, b])
    a.commit()
    b.commit()
    first_a, first_b = list(a.read), list(b.read)
    b.consumer.close()  # LeaveGroup
    until(lambda: len(a.assigned) == PARTITIONS, [a], "the survivor assigned every partition")
    delivered_later = confluent_produce(count, later, errors)
    until(lambda: len(a.read) >= len(first_a) + len(delivered_later), [a],
          "the later records read")
    poll_on([a])
    a.commit()
    committed = a.committed()
    a.consumer.close()
    summary(errors=errors, first_assignment=first_assignment,
            assignments={"a": a.assignments, "b": b.assignments}, delivered=delivered,
            first_a=first_a, first_b=first_b, delivered_later=delivered_later,
            after_leave=a.read[len(first_a):], committed=committed)


# kafka-python 3, with its defaults (idempotent producer, auto commit)

def python_client_options():
    """kafka-python's and aiokafka's settings, which share their names."""
    return dict(
        bootstrap_servers=servers(),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="$ConnectionString",
        sasl_plain_password=SETTINGS["connection_string"],
    )


def kafka_python():
    """kafka-python's producer sends keyed records; its consumer, joining the group, resumes
    from the committed offsets and reads exactly those."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    errors = []
    producer = KafkaProducer(**python_client_options())
    futures = []
    for i in range(SETTINGS["count"]):
        key, value = keyed(i)
        futures.append(producer.send(TOPIC, key=key.encode(), value=value.encode()))
    producer.flush(60)
    delivered = []
    for i, future in enumerate(futures):
        try:
            metadata = future.get(timeout=10)
            key, value = keyed(i)
            delivered.append([metadata.partition, metadata.offset, key, value])
        except Exception as e:  # reported to the test, which fails on any
            errors.append({"who": "producer", "code": type(e).__name__, "text": repr(e)})
    idempotent = producer.config.get("enable_idempotence")
    producer.close(10)

    consumer = KafkaConsumer(TOPIC, group_id=GROUP, client_id="kafka-python",
                             **python_client_options())
    read = []

    def poll():
        for records in consumer.poll(timeout_ms=200).values():
            read.extend([r.partition, r.offset, r.key.decode(), r.value.decode()] for r in records)

    deadline = time.monotonic() + DEADLINE_S
    while len(read) < len(delivered):
        if time.monotonic() > deadline:
            timeout("kafka-python read the records", read=len(read), delivered=len(delivered))
        poll()
    end = time.monotonic() + EXTRA_POLL_S
    while time.monotonic() < end:
        poll()
    consumer.commit()
    committed = {str(p): consumer.committed(TopicPartition(TOPIC, p)) for p in range(PARTITIONS)}
    consumer.close()
    summary(errors=errors, idempotent=idempotent, delivered=delivered, read=read,
            committed=committed)


# aiokafka, with its defaults

async def aiokafka_run():
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    errors = []
    producer = AIOKafkaProducer(**python_client_options())
    await producer.start()
    delivered = []
    try:
        sends = []
        for i in range(SETTINGS["count"]):
            key, value = keyed(i)
            sends.append(await producer.send(TOPIC, key=key.encode(), value=value.encode()))
        for i, sent in enumerate(sends):
            try:
                metadata = await sent
                key, value = keyed(i)
                delivered.append([metadata.partition, metadata.offset, key, value])
            except Exception as e:  # reported to the test, which fails on any
                errors.append({"who": "producer", "code": type(e).__name__, "text": repr(e)})
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(TOPIC, group_id=GROUP, client_id="aiokafka",
                                **python_client_options())
    await consumer.start()
    read = []
    try:
        async def poll():
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                read.extend([r.partition, r.offset, r.key.decode(), r.value.decode()]
                            for r in records)

        deadline = time.monotonic() + DEADLINE_S
        while len(read) < len(delivered):
            if time.monotonic() > deadline:
                timeout("aiokafka read the records", read=len(read), delivered=len(delivered))
            await poll()
        end = time.monotonic() + EXTRA_POLL_S
        while time.monotonic() < end:
            await poll()
        await consumer.commit()
        committed = {str(p): await consumer.committed(TopicPartition(TOPIC, p))
                     for p in range(PARTITIONS)}
    finally:
        await consumer.stop()
    summary(errors=errors, delivered=delivered, read=read, committed=committed)


{
    "pair": pair,
    "kafka_python": kafka_python,
    "aiokafka": lambda: asyncio.run(aiokafka_run()),
}[SETTINGS["scenario"]]()
