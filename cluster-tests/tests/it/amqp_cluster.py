# Drives a Tributary cluster's AMQP front end with the released azure-eventhub SDK,
# unchanged: its default pyamqp transport, or uamqp with `"transport": "uamqp"`.
#
# Usage: amqp_cluster.py '<json settings>'. The settings name the scenario and what it
# needs (ports, keys, hub). Prints JSON lines on stdout: `{"progress": ...}` while a long
# scenario runs (the Rust test acts on them), then one summary, which the Rust test
# (amqp_cluster.rs) asserts. An unexpected SDK failure raises, so stderr has the trace.
import datetime
import json
import os
import sys
import threading
import time

from azure.eventhub import (
    EventData,
    EventHubConsumerClient,
    EventHubProducerClient,
    TransportType,
)
from azure.eventhub.exceptions import AuthenticationError, EventHubError

SETTINGS = json.loads(sys.argv[1])
HUB = SETTINGS["hub"]
RECEIVE_TIMEOUT_S = SETTINGS.get("receive_timeout_s", 30)
LOG = os.environ.get("AMQP_SDK_LOG") == "1"
if LOG:
    import logging

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)


def emit(value):
    print(json.dumps(value), flush=True)


def options(sends=False, **extra):
    result = dict(logging_enable=LOG, retry_total=SETTINGS.get("retry_total", 3))
    # azure-eventhub 5.15.1's uamqp transport cannot open a send link (it hands uamqp's
    # SendClient its desired capabilities as a Python list, which uamqp refuses): with
    # uamqp, everything but sending uses it, and sends go through pyamqp.
    if SETTINGS.get("transport") == "uamqp" and not sends:
        result["uamqp_transport"] = True
    result.update(extra)
    return result


def connection_string(port=None, rule=None, key=None, tls=False):
    rule = rule or SETTINGS["rule"]
    key = key or SETTINGS["key"]
    if tls:
        # With TLS the SDK always dials 5671 on the endpoint's host: the test's port goes
        # in custom_endpoint_address (see tls_options).
        return (
            f"Endpoint=sb://127.0.0.1/;SharedAccessKeyName={rule};SharedAccessKey={key};"
            f"EntityPath={HUB}"
        )
    port = port or SETTINGS["port"]
    return (
        f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessKeyName={rule};SharedAccessKey={key};"
        f"EntityPath={HUB};UseDevelopmentEmulator=true"
    )


def tls_options(sends=False, **extra):
    # A custom endpoint alone means web sockets to the SDK: AMQP over TLS is asked for.
    return options(
        sends=sends,
        custom_endpoint_address=f"sb://127.0.0.1:{SETTINGS['amqps_port']}",
        transport_type=TransportType.Amqp,
        connection_verify=SETTINGS["ca"],
        **extra,
    )


def producer(sends=True, rule=None, key=None):
    """A producer client; one that only reads properties uses the chosen transport even
    when it is uamqp."""
    if SETTINGS.get("tls"):
        return EventHubProducerClient.from_connection_string(
            connection_string(tls=True, rule=rule, key=key), **tls_options(sends=sends)
        )
    return EventHubProducerClient.from_connection_string(
        connection_string(rule=rule, key=key), **options(sends=sends)
    )


def consumer(**extra):
    if SETTINGS.get("tls"):
        return EventHubConsumerClient.from_connection_string(
            connection_string(tls=True), consumer_group="$Default", **tls_options(**extra)
        )
    return EventHubConsumerClient.from_connection_string(
        connection_string(), consumer_group="$Default", **options(**extra)
    )


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def ms(moment):
    return int(moment.timestamp() * 1000) if moment is not None else None


def event_summary(event):
    return {
        "body": event.body_as_str(),
        "properties": {text(k): text(v) for k, v in (event.properties or {}).items()},
        "partition_key": text(event.partition_key),
        "sequence_number": event.sequence_number,
        "offset": event.offset,
        "offset_type": type(event.offset).__name__,
        "enqueued_time_ms": ms(event.enqueued_time),
    }


def partition_summary(properties):
    return {
        "id": properties["id"],
        "eventhub_name": properties["eventhub_name"],
        "beginning_sequence_number": properties["beginning_sequence_number"],
        "last_enqueued_sequence_number": properties["last_enqueued_sequence_number"],
        "last_enqueued_offset": properties["last_enqueued_offset"],
        "last_enqueued_time_ms": ms(properties["last_enqueued_time_utc"]),
        "is_empty": properties["is_empty"],
    }


class Reader:
    """A consumer client receiving one partition on a thread until stopped."""

    def __init__(self, partition_id, starting_position, inclusive=False, **extra):
        self.client = consumer(**{k: v for k, v in extra.items() if k not in ("owner_level", "track_last_enqueued_event_properties")})
        self.events, self.errors, self.contexts = [], [], []
        self.lock = threading.Lock()
        self.started = threading.Event()
        kwargs = dict(
            on_event=self.on_event,
            on_error=self.on_error,
            on_partition_initialize=lambda context: self.started.set(),
            partition_id=partition_id,
            starting_position=starting_position,
            starting_position_inclusive=inclusive,
            max_wait_time=1,
        )
        for name in ("owner_level", "track_last_enqueued_event_properties"):
            if name in extra:
                kwargs[name] = extra[name]
        self.worker = threading.Thread(target=self.client.receive, kwargs=kwargs, daemon=True)
        self.worker.start()

    def on_event(self, context, event):
        with self.lock:
            if event is None:
                return
            self.events.append(event_summary(event))
            properties = context.last_enqueued_event_properties
            if properties:
                self.contexts.append({
                    "sequence_number": properties.get("sequence_number"),
                    "offset": properties.get("offset"),
                    "enqueued_time_ms": ms(properties.get("enqueued_time")),
                    "retrieval_time_set": properties.get("retrieval_time") is not None,
                })

    def on_error(self, context, error):
        with self.lock:
            self.errors.append({"type": type(error).__name__, "message": str(error)})

    def wait_for(self, count, timeout=RECEIVE_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.events) >= count:
                    return True
            time.sleep(0.05)
        return False

    def wait_for_error(self, timeout=RECEIVE_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.errors:
                    return True
            time.sleep(0.05)
        return False

    def close(self):
        self.client.close()
        self.worker.join(RECEIVE_TIMEOUT_S)
        with self.lock:
            return list(self.events), list(self.errors)


def receive_all(partition_id, count, starting_position="-1", inclusive=False):
    reader = Reader(partition_id, starting_position, inclusive)
    complete = reader.wait_for(count)
    events, errors = reader.close()
    if not complete or errors:
        raise RuntimeError(f"partition {partition_id}: got {len(events)} of {count}, errors {errors}")
    return events


def publish():
    """Properties, then sends of every kind, then everything read back."""
    summary = {}
    with producer(sends=False) as client:
        hub = client.get_eventhub_properties()
        summary["hub"] = {
            "name": hub["eventhub_name"],
            "partition_ids": hub["partition_ids"],
            "created_at_ms": ms(hub["created_at"]),
        }
        summary["partitions_before"] = [
            partition_summary(client.get_partition_properties(p)) for p in hub["partition_ids"]
        ]
    with producer() as client:
        keyed = client.create_batch(partition_key="customer-7")
        for i in range(3):
            event = EventData(f"keyed-{i}")
            event.properties = {"index": i, "kind": "keyed", "ratio": 0.5, "flag": True}
            keyed.add(event)
        client.send_batch(keyed)
        by_id = client.create_batch(partition_id="1")
        for i in range(2):
            by_id.add(EventData(f"to-1-{i}"))
        client.send_batch(by_id)
        single = EventData("single")
        single.properties = {"kind": "single"}
        client.send_event(single, partition_id="2")
    with producer(sends=False) as client:
        summary["partitions_after"] = [
            partition_summary(client.get_partition_properties(p)) for p in hub["partition_ids"]
        ]
    summary["received"] = {
        p["id"]: receive_all(p["id"], p["last_enqueued_sequence_number"] + 1)
        for p in summary["partitions_after"]
        if not p["is_empty"]
    }
    return summary


def positions():
    """Five events to one partition, then a reader from every kind of starting position."""
    partition = SETTINGS["partition"]
    with producer() as client:
        for i in range(5):
            client.send_event(EventData(f"position-{i}"), partition_id=partition)
            time.sleep(0.01)  # distinct enqueued times
        last = client.get_partition_properties(partition)["last_enqueued_sequence_number"]
    events = receive_all(partition, last + 1)
    third = events[-3]
    when = datetime.datetime.fromtimestamp(third["enqueued_time_ms"] / 1000, datetime.timezone.utc)
    starts = {
        "earliest": ("-1", False),
        "offset_inclusive": (str(third["offset"]), True),
        "offset_exclusive": (str(third["offset"]), False),
        "sequence_inclusive": (third["sequence_number"], True),
        "sequence_exclusive": (third["sequence_number"], False),
        "time_inclusive": (when, True),
        "time_exclusive": (when, False),
    }
    received = {}
    for name, (position, inclusive) in starts.items():
        expected = sum(
            1 for e in events
            if e["sequence_number"] > third["sequence_number"]
            or (inclusive and e["sequence_number"] == third["sequence_number"])
        ) if name != "earliest" else len(events)
        reader = Reader(partition, position, inclusive)
        reader.wait_for(expected)
        time.sleep(0.5)  # anything beyond what is expected would show now
        got, errors = reader.close()
        received[name] = {"sequence_numbers": [e["sequence_number"] for e in got], "errors": errors}
    # @latest: only what is sent after the reader starts.
    reader = Reader(partition, "@latest")
    reader.started.wait(RECEIVE_TIMEOUT_S)
    time.sleep(1)
    with producer() as client:
        client.send_event(EventData("after-latest"), partition_id=partition)
    reader.wait_for(1)
    got, errors = reader.close()
    received["latest"] = {"bodies": [e["body"] for e in got], "errors": errors}
    return {"events": events, "received": received}


def owner_level():
    partition = SETTINGS["partition"]
    with producer() as client:
        client.send_event(EventData("owned"), partition_id=partition)
    first = Reader(partition, "-1", owner_level=1)
    first_got = first.wait_for(1)
    second = Reader(partition, "-1", owner_level=2)
    second_got = second.wait_for(1)
    first.wait_for_error(timeout=60)
    first_events, first_errors = first.close()
    second_events, second_errors = second.close()
    return {
        "first_received": first_got,
        "second_received": second_got,
        "first_errors": first_errors,
        "second_errors": second_errors,
    }


def last_enqueued():
    partition = SETTINGS["partition"]
    with producer() as client:
        for i in range(3):
            client.send_event(EventData(f"tracked-{i}"), partition_id=partition)
    with producer(sends=False) as client:
        properties = partition_summary(client.get_partition_properties(partition))
    reader = Reader(partition, "-1", track_last_enqueued_event_properties=True)
    reader.wait_for(properties["last_enqueued_sequence_number"] + 1)
    contexts = list(reader.contexts)
    events, errors = reader.close()
    return {"partition": properties, "contexts": contexts, "errors": errors}


def refused_send():
    """A send with another rule's key (or a wrong one): the SDK's error."""
    try:
        with producer(rule=SETTINGS["send_rule"], key=SETTINGS["send_key"]) as client:
            client.send_event(EventData("refused"), partition_id="0")
    except EventHubError as error:
        return {"error": type(error).__name__, "message": str(error)}
    return {"error": None}


def wrong_key():
    try:
        with producer(sends=False, key=SETTINGS["wrong_key"]) as client:
            client.get_eventhub_properties()
    except AuthenticationError as error:
        return {"error": type(error).__name__, "message": str(error)}
    return {"error": None}


def failover():
    """Keeps sending to one partition while reading it from the start. At each progress mark
    it waits until the reader has that many events and says so, so the test can kill the
    partition's leader mid-stream; it ends once the reader has everything the partition
    holds after the last send."""
    partition = SETTINGS["partition"]
    total = SETTINGS["events"]
    marks = set(SETTINGS["progress_marks"])
    reader = Reader(partition, "-1")
    reader.started.wait(RECEIVE_TIMEOUT_S)
    acknowledged, failed = [], []
    with producer() as client:
        for i in range(total):
            body = f"failover-{i}"
            try:
                client.send_event(EventData(body), partition_id=partition)
                acknowledged.append(body)
            except EventHubError as error:
                failed.append({"body": body, "error": type(error).__name__, "message": str(error)})
            if i + 1 in marks:
                reader.wait_for(i + 1)
                emit({"progress": i + 1})
            time.sleep(SETTINGS.get("send_pause_s", 0.01))
    with producer(sends=False) as client:
        last = client.get_partition_properties(partition)["last_enqueued_sequence_number"]
    reader.wait_for(last + 1, timeout=60)
    events, errors = reader.close()
    return {
        "acknowledged": acknowledged,
        "failed": failed,
        "last_sequence_number": last,
        "received": [[e["sequence_number"], e["body"]] for e in events],
        "errors": errors,
    }


SCENARIOS = {
    "publish": publish,
    "positions": positions,
    "owner-level": owner_level,
    "last-enqueued": last_enqueued,
    "refused-send": refused_send,
    "wrong-key": wrong_key,
    "failover": failover,
}

emit({"summary": SCENARIOS[SETTINGS["scenario"]]()})
