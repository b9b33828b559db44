# Drives a Tributary cluster's Blob checkpoint endpoint with the released
# azure-eventhub-checkpointstoreblob 1.2.0, unchanged: as the checkpoint store of the
# azure-eventhub SDK's load-balancing EventHubConsumerClient, and called directly.
#
# Usage: blob_checkpoints.py '<json settings>'. The settings name the scenario and what it
# needs (ports, keys, hub). Prints JSON lines on stdout: a processor prints one line per
# event, partition opened or closed, and checkpoint, until it is killed; the other
# scenarios print one summary, which the Rust test (blob_checkpoints.rs) asserts.
import datetime
import json
import os
import sys
import threading

from azure.eventhub import EventHubConsumerClient
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
from azure.eventhub.extensions.checkpointstoreblob._vendor.storage.blob import (
    BlobClient,
    generate_account_sas,
)

SETTINGS = json.loads(sys.argv[1])
HUB = SETTINGS["hub"]
CONTAINER = "checkpoints"
LOG = os.environ.get("BLOB_SDK_LOG") == "1"
if LOG:
    import logging

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
LOCK = threading.Lock()


def emit(value):
    with LOCK:
        print(json.dumps(value), flush=True)


def scheme():
    return "https" if SETTINGS.get("ca") else "http"


def blob_connection_string(rule=None, key=None, sas=None):
    rule = rule or SETTINGS["rule"]
    endpoint = f"{scheme()}://127.0.0.1:{SETTINGS['blob_port']}/{rule}"
    if sas is not None:
        return f"BlobEndpoint={endpoint};SharedAccessSignature={sas}"
    key = key or SETTINGS["key"]
    return (
        f"DefaultEndpointsProtocol={scheme()};AccountName={rule};AccountKey={key};"
        f"BlobEndpoint={endpoint};"
    )


def transport_options():
    return {"connection_verify": SETTINGS["ca"]} if SETTINGS.get("ca") else {}


def store(**kwargs):
    return BlobCheckpointStore.from_connection_string(
        blob_connection_string(**kwargs), CONTAINER, **transport_options()
    )


def amqp_connection_string():
    return (
        f"Endpoint=sb://127.0.0.1:{SETTINGS['amqp_port']}/;"
        f"SharedAccessKeyName={SETTINGS['rule']};SharedAccessKey={SETTINGS['key']};"
        f"EntityPath={HUB};UseDevelopmentEmulator=true"
    )


def processor():
    """A load-balancing consumer checkpointing after every event, until killed."""
    client = EventHubConsumerClient.from_connection_string(
        amqp_connection_string(),
        consumer_group=SETTINGS["group"],
        checkpoint_store=store(),
        load_balancing_interval=SETTINGS.get("load_balancing_interval", 1.0),
        partition_ownership_expiration_interval=SETTINGS.get("ownership_expiration", 6.0),
        logging_enable=LOG,
    )

    def on_event(context, event):
        if event is None:
            return
        emit({"event": {"p": int(context.partition_id), "seq": event.sequence_number}})
        context.update_checkpoint(event)
        emit({"checkpointed": {"p": int(context.partition_id), "seq": event.sequence_number}})

    def on_partition_initialize(context):
        emit({"opened": int(context.partition_id)})

    def on_partition_close(context, reason):
        emit({"closed": int(context.partition_id), "reason": str(reason)})

    def on_error(context, error):
        emit({"error": f"{type(error).__name__}: {error}",
              "p": None if context is None else context.partition_id})

    emit({"started": True})
    with client:
        client.receive(
            on_event=on_event,
            on_partition_initialize=on_partition_initialize,
            on_partition_close=on_partition_close,
            on_error=on_error,
            starting_position="-1",
        )


class Recorder:
    """Every response's status and error code, through azure-core's raw_response_hook."""

    def __init__(self):
        self.lock = threading.Lock()
        self.responses = []

    def __call__(self, response):
        http = response.http_response
        with self.lock:
            self.responses.append({
                "method": http.request.method,
                "url": http.request.url,
                "status": http.status_code,
                "code": http.headers.get("x-ms-error-code"),
                "thread": threading.current_thread().name,
            })

    def of(self, thread):
        with self.lock:
            return [r for r in self.responses if r["thread"] == thread]


def claim(s, partition, owner, etag=None):
    item = {
        "fully_qualified_namespace": "127.0.0.1",
        "eventhub_name": HUB,
        "consumer_group": SETTINGS["group"],
        "partition_id": str(partition),
        "owner_id": owner,
    }
    if etag is not None:
        item["etag"] = etag
    return s.claim_ownership([item])


def race():
    """Two claims of one partition at once, with the same ETag (or both first claims)."""
    recorder = Recorder()
    s = BlobCheckpointStore.from_connection_string(
        blob_connection_string(), CONTAINER, raw_response_hook=recorder, **transport_options()
    )
    rounds = []
    for round_ in range(SETTINGS["rounds"]):
        partition = round_ % SETTINGS["partitions"]
        owned = s.list_ownership("127.0.0.1", HUB, SETTINGS["group"])
        current = [o["etag"] for o in owned if o["partition_id"] == str(partition)]
        etag = current[0] if current else None
        barrier = threading.Barrier(2)
        results = {}

        def contend(owner):
            barrier.wait()
            results[owner] = claim(s, partition, owner, etag)

        threads = [
            threading.Thread(target=contend, args=(f"r{round_}-{who}",), name=f"r{round_}-{who}")
            for who in ("a", "b")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rounds.append({
            "partition": partition,
            "etag": etag,
            "won": {owner: [c["owner_id"] for c in won] for owner, won in results.items()},
            "responses": {t.name: recorder.of(t.name) for t in threads},
            "owner_after": [
                o["owner_id"]
                for o in s.list_ownership("127.0.0.1", HUB, SETTINGS["group"])
                if o["partition_id"] == str(partition)
            ],
        })
    emit({"summary": {"rounds": rounds}})


def outcome(call):
    try:
        value = call()
        return {"ok": True, "value": value}
    except Exception as error:  # the refusal's shape is what the test checks
        return {
            "ok": False,
            "type": type(error).__name__,
            "status": getattr(error, "status_code", None),
            "code": getattr(error, "error_code", None),
            "message": str(error).splitlines()[0] if str(error) else "",
        }


def refusals():
    """What wrong keys, weak rules, SAS tokens and names outside the layout get."""
    group = SETTINGS["group"]
    checkpoint = {
        "fully_qualified_namespace": "127.0.0.1",
        "eventhub_name": HUB,
        "consumer_group": group,
        "partition_id": "0",
        "offset": "0",
        "sequence_number": 0,
    }
    summary = {}
    summary["wrong_key"] = outcome(
        lambda: store(key=SETTINGS["wrong_key"]).list_ownership("127.0.0.1", HUB, group)
    )
    sender = store(rule=SETTINGS["send_rule"], key=SETTINGS["send_key"])
    summary["send_only_list"] = outcome(lambda: sender.list_checkpoints("127.0.0.1", HUB, group))
    summary["send_only_checkpoint"] = outcome(lambda: sender.update_checkpoint(checkpoint))
    blob = BlobClient.from_connection_string(
        blob_connection_string(), CONTAINER, "pictures/cat.jpg", **transport_options()
    )
    summary["outside_layout"] = outcome(lambda: blob.upload_blob(b"", overwrite=True))
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    sas = generate_account_sas(
        SETTINGS["listen_rule"], SETTINGS["listen_key"], resource_types="co",
        permission="rwlc", expiry=expiry,
    )
    by_sas = store(rule=SETTINGS["listen_rule"], sas=sas)
    summary["sas_checkpoint"] = outcome(lambda: by_sas.update_checkpoint(checkpoint) or "done")
    summary["sas_list"] = outcome(lambda: by_sas.list_checkpoints("127.0.0.1", HUB, group))
    read_only = generate_account_sas(
        SETTINGS["listen_rule"], SETTINGS["listen_key"], resource_types="co",
        permission="rl", expiry=expiry,
    )
    summary["read_only_sas_checkpoint"] = outcome(
        lambda: store(rule=SETTINGS["listen_rule"], sas=read_only).update_checkpoint(checkpoint)
    )
    forged = generate_account_sas(
        SETTINGS["listen_rule"], SETTINGS["wrong_key"], resource_types="co",
        permission="rwlc", expiry=expiry,
    )
    summary["forged_sas_list"] = outcome(
        lambda: store(rule=SETTINGS["listen_rule"], sas=forged).list_checkpoints("127.0.0.1", HUB, group)
    )
    summary["after"] = outcome(lambda: store().list_checkpoints("127.0.0.1", HUB, group))
    emit({"summary": summary})


def aio():
    """The asyncio store (azure-eventhub-checkpointstoreblob-aio, on aiohttp, which sends `$`
    unencoded in paths and prefixes): claims run concurrently, renewals, a stale claim, a
    checkpoint; then an asyncio processor checkpointing every event until it has `events`."""
    import asyncio

    from azure.eventhub.aio import EventHubConsumerClient as AsyncConsumer
    from azure.eventhub.extensions.checkpointstoreblobaio import (
        BlobCheckpointStore as AsyncStore,
    )

    group = SETTINGS["group"]
    partitions = SETTINGS["partitions"]

    def claims(owner, etags=None):
        items = []
        for p in range(partitions):
            item = {
                "fully_qualified_namespace": "127.0.0.1",
                "eventhub_name": HUB,
                "consumer_group": group,
                "partition_id": str(p),
                "owner_id": owner,
            }
            if etags is not None:
                item["etag"] = etags[str(p)]
            items.append(item)
        return items

    async def run():
        summary = {}
        store = AsyncStore.from_connection_string(
            blob_connection_string(), CONTAINER, **transport_options()
        )
        async with store:
            first = await store.claim_ownership(claims("aio-a"))
            summary["first"] = sorted(c["partition_id"] for c in first)
            etags = {c["partition_id"]: c["etag"] for c in first}
            renewed = await store.claim_ownership(claims("aio-a", etags))
            summary["renewed"] = sorted(c["partition_id"] for c in renewed)
            summary["etags_changed"] = all(
                c["etag"] != etags[c["partition_id"]] for c in renewed
            )
            stale = await store.claim_ownership(claims("aio-b", etags))
            summary["stale"] = [c["partition_id"] for c in stale]
            owned = await store.list_ownership("127.0.0.1", HUB, group)
            summary["owners"] = sorted({o["owner_id"] for o in owned})
            # Released, as a stopping processor releases them, for the processor below.
            current = {o["partition_id"]: o["etag"] for o in owned}
            await store.claim_ownership(claims("", current))
        received = []
        done = asyncio.Event()
        client = AsyncConsumer.from_connection_string(
            amqp_connection_string(),
            consumer_group=group,
            checkpoint_store=AsyncStore.from_connection_string(
                blob_connection_string(), CONTAINER, **transport_options()
            ),
            load_balancing_interval=1.0,
        )

        checkpointed = []

        async def on_event(context, event):
            received.append([int(context.partition_id), event.sequence_number])
            await context.update_checkpoint(event)
            # Done once every event's checkpoint is written, not just received.
            checkpointed.append(event.sequence_number)
            if len(checkpointed) >= SETTINGS["events"]:
                done.set()

        async with client:
            task = asyncio.ensure_future(client.receive(on_event=on_event, starting_position="-1"))
            try:
                await asyncio.wait_for(done.wait(), 120)
            finally:
                await client.close()
                await task
        summary["received"] = sorted(received)
        emit({"summary": summary})

    asyncio.run(run())


SCENARIOS = {"processor": processor, "race": race, "refusals": refusals, "aio": aio}
SCENARIOS[SETTINGS["scenario"]]()
