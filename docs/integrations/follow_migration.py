"""Follow a Switchyard migration as CloudEvents, with nats-py.

Every record of the migration log is published as a CloudEvent (structured
JSON) on switchyard.events.<noun>.<verb> and kept in the JetStream stream
SWITCHYARD_EVENTS. This prints one JSON line per event: its log sequence,
time, type, subject, correlation id and trace id.

    pip install nats-py==2.16.0
    python follow_migration.py --server nats://127.0.0.1:4222 \
        --subject 'switchyard.events.handover.>' --all

--all replays what the stream holds before following live; without it only
new events arrive. --count N stops after N events. On a secured bus pass an
operator's NKey seed file with --nkey.
"""

import argparse
import asyncio
import json

import nats
from nats.js.api import DeliverPolicy

STREAM = "SWITCHYARD_EVENTS"


async def follow(args):
    options = {"servers": [args.server]}
    if args.nkey:
        options["nkeys_seed"] = args.nkey
    client = await nats.connect(**options)
    done = asyncio.Event()
    seen = 0

    async def on_event(message):
        nonlocal seen
        event = json.loads(message.data)
        trace = event.get("traceparent", "")
        print(
            json.dumps(
                {
                    "sequence": int(event["sequence"]),
                    "time": event["time"],
                    "type": event["type"],
                    "subject": event["subject"],
                    "correlationid": event.get("correlationid", ""),
                    "trace_id": trace.split("-")[1] if trace else "",
                }
            ),
            flush=True,
        )
        seen += 1
        if args.count and seen >= args.count:
            done.set()

    if args.all:
        jetstream = client.jetstream()
        await jetstream.subscribe(
            args.subject,
            stream=STREAM,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            cb=on_event,
        )
    else:
        await client.subscribe(args.subject, cb=on_event)
    await done.wait()
    await client.drain()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="nats://127.0.0.1:4222")
    parser.add_argument("--subject", default="switchyard.events.>")
    parser.add_argument("--all", action="store_true", help="replay the stream first")
    parser.add_argument("--count", type=int, default=0, help="stop after N events")
    parser.add_argument("--nkey", help="an operator's NKey seed file")
    asyncio.run(follow(parser.parse_args()))


if __name__ == "__main__":
    main()
