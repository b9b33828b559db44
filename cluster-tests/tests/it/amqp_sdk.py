# Drives the AMQP front end with azure-eventhub (default pyamqp transport), unchanged.
# Usage: amqp_sdk.py <port> <key> roundtrip|wrong-key. Prints one JSON summary on stdout;
# the Rust test (amqp_sdk.rs) asserts it. Any SDK failure raises, so stderr has the trace.
import json
import os
import sys
import threading

from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError

port, key, mode = sys.argv[1:4]
CONNECTION_STRING = (
    f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessKeyName=root;SharedAccessKey={key};"
    "EntityPath=orders;UseDevelopmentEmulator=true"
)
# Fail fast instead of retrying against a broken server.
OPTIONS = dict(
    retry_total=1,
    retry_backoff_factor=0.1,
    logging_enable=os.environ.get("AMQP_SDK_LOG") == "1",
)
RECEIVE_TIMEOUT_S = 20
if OPTIONS["logging_enable"]:
    import logging

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def partition_summary(properties):
    return {
        "id": properties["id"],
        "eventhub_name": properties["eventhub_name"],
        "beginning_sequence_number": properties["beginning_sequence_number"],
        "last_enqueued_sequence_number": properties["last_enqueued_sequence_number"],
        "last_enqueued_offset": properties["last_enqueued_offset"],
        "is_empty": properties["is_empty"],
    }


def receive(partition_id, count):
    """The first `count` events of a partition, from the start ("-1")."""
    if count == 0:
        return []
    client = EventHubConsumerClient.from_connection_string(
        CONNECTION_STRING, consumer_group="$Default", **OPTIONS
    )
    events, errors, done = [], [], threading.Event()

    def on_event(context, event):
        if event is None:
            return
        events.append({
            "partition": context.partition_id,
            "body": event.body_as_str(),
            "properties": {text(k): text(v) for k, v in (event.properties or {}).items()},
            "partition_key": text(event.partition_key),
            "sequence_number": event.sequence_number,
            "offset": event.offset,
            "offset_type": type(event.offset).__name__,
            "enqueued_time_set": event.enqueued_time is not None,
        })
        if len(events) >= count:
            done.set()

    def on_error(context, error):
        errors.append(repr(error))
        done.set()

    worker = threading.Thread(
        target=client.receive,
        kwargs=dict(
            on_event=on_event,
            on_error=on_error,
            partition_id=partition_id,
            starting_position="-1",
        ),
        daemon=True,
    )
    worker.start()
    done.wait(RECEIVE_TIMEOUT_S)
    client.close()
    worker.join(RECEIVE_TIMEOUT_S)
    if errors or len(events) < count:
        raise RuntimeError(
            f"partition {partition_id}: got {len(events)} of {count} events, errors {errors}"
        )
    return events[:count]


def roundtrip():
    summary = {}
    with EventHubProducerClient.from_connection_string(CONNECTION_STRING, **OPTIONS) as producer:
        hub = producer.get_eventhub_properties()
        summary["hub"] = {"name": hub["eventhub_name"], "partition_ids": hub["partition_ids"]}
        summary["partition_0_before"] = partition_summary(producer.get_partition_properties("0"))

        batch = producer.create_batch(partition_key="k")
        for i in range(3):
            event = EventData(f"keyed-{i}")
            event.properties = {"index": i, "kind": "keyed"}
            batch.add(event)
        producer.send_batch(batch)

        single = EventData("direct")
        single.properties = {"kind": "direct"}
        producer.send_event(single, partition_id="1")

        summary["partitions_after"] = [
            partition_summary(producer.get_partition_properties(p)) for p in hub["partition_ids"]
        ]

    summary["received"] = {
        p["id"]: receive(p["id"], p["last_enqueued_sequence_number"] + 1)
        for p in summary["partitions_after"]
    }
    return summary


def wrong_key():
    with EventHubProducerClient.from_connection_string(CONNECTION_STRING, **OPTIONS) as producer:
        try:
            producer.get_eventhub_properties()
        except AuthenticationError as error:
            return {"error": type(error).__name__, "message": str(error)}
    return {"error": None}


print(json.dumps(roundtrip() if mode == "roundtrip" else wrong_key()))
