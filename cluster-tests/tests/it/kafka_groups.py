# A Kafka consumer group of confluent-kafka (librdkafka) consumers against a Tributary
# cluster's Kafka front end, unchanged.
#
# Usage: kafka_groups.py '<json settings>'. Prints one JSON summary line, which the Rust test
# (kafka_groups.rs) asserts. Every wait is for a condition, bounded by a deadline.
import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

SETTINGS = json.loads(sys.argv[1])
TOPIC = SETTINGS["topic"]
PARTITIONS = SETTINGS["partitions"]
DEADLINE_S = 90


def config(**extra):
    result = {
        "bootstrap.servers": f"127.0.0.1:{SETTINGS['kafka_port']}",
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
    """A consumer of the group: what it was assigned and what it read."""

    def __init__(self, name, errors, **extra):
        self.name = name
        self.errors = errors
        self.assigned = set()
        self.read = []
        self.eof = set()
        self.consumer = Consumer(config(**{
            "group.id": SETTINGS["group"],
            "client.id": name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
            "error_cb": lambda e: errors.append(error(name, e)),
            **extra,
        }))
        self.consumer.subscribe([TOPIC], on_assign=self.on_assign, on_revoke=self.on_revoke)

    def on_assign(self, consumer, partitions):
        self.assigned = {p.partition for p in partitions}
        self.eof -= self.assigned

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
        message = self.consumer.poll(0.2)
        if message is None:
            return
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                self.eof.add(message.partition())
            else:
                self.errors.append(error(self.name, message.error()))
            return
        self.read.append([message.partition(), message.offset(), message.value().decode()])

    def commit(self):
        self.consumer.commit(asynchronous=False)

    def committed(self):
        found = self.consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 30)
        return {str(tp.partition): tp.offset for tp in found}


def until(condition, members, what):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(json.dumps({"summary": {"timeout": what, "members": [
                {"name": m.name, "assigned": sorted(m.assigned), "read": len(m.read)}
                for m in members]}}))
        for member in members:
            member.poll()


def produce(first, count, errors):
    """`count` records to every partition, values `p<partition>-<index>` from `first`."""
    producer = Producer(config(acks="all", error_cb=lambda e: errors.append(error("producer", e))))
    for p in range(PARTITIONS):
        for i in range(first, first + count):
            producer.produce(TOPIC, value=f"p{p}-{i}", partition=p)
    left = producer.flush(60)
    if left:
        errors.append({"who": "producer", "code": "UNDELIVERED", "text": f"{left} records"})


def pair():
    """Two members share the partitions and read each record once; one leaves and the other
    takes every partition, reading on from the leaver's commits."""
    errors = []
    a = Member("consumer-a", errors)
    b = Member("consumer-b", errors)
    until(lambda: a.assigned and b.assigned and len(a.assigned | b.assigned) == PARTITIONS,
          [a, b], "both members assigned")
    first_assignment = {"a": sorted(a.assigned), "b": sorted(b.assigned)}
    count = SETTINGS["count"]
    produce(0, count, errors)
    until(lambda: len(a.read) + len(b.read) >= PARTITIONS * count, [a, b], "the first records read")
    a.commit()
    b.commit()
    first_a, first_b = list(a.read), list(b.read)
    b.consumer.close()  # LeaveGroup
    until(lambda: len(a.assigned) == PARTITIONS, [a], "the survivor assigned every partition")
    produce(count, count, errors)
    until(lambda: len(a.read) >= len(first_a) + PARTITIONS * count, [a], "the later records read")
    a.commit()
    committed = a.committed()
    a.consumer.close()
    print(json.dumps({"summary": {
        "errors": errors,
        "first_assignment": first_assignment,
        "first_a": first_a,
        "first_b": first_b,
        "after_leave": a.read[len(first_a):],
        "committed": committed,
    }}), flush=True)


def restart():
    """A member of the group started later reads from the committed offsets to the end."""
    errors = []
    c = Member("consumer-c", errors, **{"enable.partition.eof": True})
    until(lambda: len(c.assigned) == PARTITIONS and c.eof >= c.assigned, [c],
          "every partition read to its end")
    c.commit()
    committed = c.committed()
    c.consumer.close()
    print(json.dumps({"summary": {"errors": errors, "read": c.read, "committed": committed}}),
          flush=True)


{"pair": pair, "restart": restart}[SETTINGS["scenario"]]()
