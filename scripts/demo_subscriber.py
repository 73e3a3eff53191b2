#!/usr/bin/env python3
"""The demo's MQTT subscriber: prints what edge-agent publishes and checks it against the truth.

Prints every status and result message as it arrives (topic, then the payload's key fields),
and at the end says, for each result, what the video showed and what the agent found.
Exits 0 when results arrived and every one agrees with the video, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo_video import truth_at


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--truth", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=120, help="Give up after this many seconds.")
    parser.add_argument("--ready-file", type=Path, help="Touched once subscribed.")
    args = parser.parse_args()
    truth = json.loads(args.truth.read_text())

    results: list[dict] = []
    offline = threading.Event()
    subscribed = threading.Event()

    def on_connect(client: mqtt.Client, _u: object, _f: object, reason: object, _p: object) -> None:
        client.subscribe([("edge/+/results/#", 1), ("edge/+/status", 1)])

    def on_subscribe(*_args: object) -> None:
        subscribed.set()
        if args.ready_file:
            args.ready_file.touch()

    def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        payload = json.loads(msg.payload)
        if msg.topic.endswith("/status"):
            states = ", ".join(f"{k}={v['state']}" for k, v in payload.get("pipelines", {}).items())
            flag = " (retained)" if msg.retain else ""
            print(f"[{msg.topic}]{flag} {payload['status']} {states}", flush=True)
            if payload["status"] == "offline" and not msg.retain:
                offline.set()
            return
        results.append(payload)
        top = payload["output"]["top"][0]
        print(
            f"[{msg.topic}] seq={payload['seq']} video t={payload['source']['position_s']:.1f}s -> "
            f"{top['label']} ({top['score']:.3f}) in {payload['latency_ms']['inference']:.1f} ms "
            f"on {payload['backend']}, model {payload['model']['name']}@{payload['model']['version']}",
            flush=True,
        )

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="edge-agent-demo-subscriber")
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.connect(args.host, args.port)
    client.loop_start()
    offline.wait(args.timeout)
    time.sleep(0.5)
    client.loop_stop()
    client.disconnect()

    print("\nWhat the video showed vs what the agent found:")
    agree = 0
    for r in results:
        shown = truth_at(truth, r["source"]["position_s"])
        found = r["output"]["top"][0]["label"]
        ok = shown is not None and shown["orientation"] == found
        agree += ok
        sign = f"'{shown['text']}' {shown['orientation']}" if shown else "nothing"
        verdict = "OK" if ok else "WRONG"
        print(f"  t={r['source']['position_s']:4.1f}s  video: {sign:<32} agent: {found:<12} {verdict}")
    print(f"\n{agree}/{len(results)} results agree with the video.")
    return 0 if results and agree == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
