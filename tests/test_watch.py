"""`edge-agent watch` (agent/cli/watch.py, agent/tools/watch.py, agent/cli/render/watch.py), run as a
user runs it: the real console script against a real mosquitto on loopback, with messages published
on the device's topics by a plain paho client, as the agent publishes them.

- --json: one JSON object per line, the retained status first, then a result; --count stops it.
- A pipeline named: only its results; readable lines, each flushed as it comes (read through a pipe
  while the command still runs); Ctrl-C (SIGINT) ends it cleanly.
- --events: the tracking events alone, each line with its zone or line (and direction) first, the
  object's id as `#4` and the message's seq as `[seq 48]`.
- README's mosquitto_sub line subscribes to what watch does and gets the box's messages.
- --seconds stops it with nothing published; the config's login is used (a password broker refuses a
  wrong password with a clear error and takes the right one); a broker that is down is a clear error
  and exit 1, quickly.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from tests.agent_process import EDGE_AGENT
from tests.mosquitto import Mosquitto
from tests.pki import run_tool, tool
from tests.waits import free_port, wait_until

README = Path(__file__).resolve().parent.parent / "README.md"
DEVICE = "watch-box"
STATUS = {
    "status": "online",
    "device": DEVICE,
    "agent_version": "9.9",
    "pipelines": {"cam": {"state": "running"}},
}


def result(pipeline: str, seq: int, label: str) -> dict[str, Any]:
    top = [{"index": 1, "label": label, "score": 0.98}]
    return {"device": DEVICE, "pipeline": pipeline, "seq": seq, "output": {"top": top}}


def write_config(tmp_path: Path, port: int, **mqtt_settings: Any) -> Path:
    config = {
        "device": {"id": DEVICE},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": port, **mqtt_settings},
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def publish(broker: Mosquitto, topic: str, payload: dict[str, Any], retain: bool = False) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        client.publish(topic, json.dumps(payload).encode(), qos=1, retain=retain).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


class Watching:
    """`edge-agent watch ...` running, its stdout lines collected as they come, stderr in a file."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.stderr_path = tmp_path / f"watch-{time.monotonic_ns()}.err"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [EDGE_AGENT, "watch", *args], stdout=subprocess.PIPE, stderr=err, text=True
            )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            self.lines.append(text.rstrip("\n"))

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def subscribed(self) -> None:
        """Wait for the line saying it subscribed (after the broker's SUBACK)."""
        wait_until(lambda: "watching " in self.stderr() or self.proc.poll() is not None, "watch subscribed")
        assert self.proc.poll() is None, self.stderr()

    def finish(self, timeout: float = 20.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return code


def test_json_lines_of_the_status_and_a_result(tmp_path: Path, mosquitto: Mosquitto) -> None:
    config = write_config(tmp_path, mosquitto.port)
    publish(mosquitto, f"edge/{DEVICE}/status", STATUS, retain=True)
    watching = Watching(tmp_path, "-c", str(config), "--json", "--count", "2")
    watching.subscribed()
    publish(mosquitto, f"edge/{DEVICE}/results/cam", result("cam", 7, "upside-down"))
    assert watching.finish() == 0, watching.stderr()
    assert len(watching.lines) == 2, watching.lines
    status, cam = (json.loads(text) for text in watching.lines)
    keys = ("topic", "kind", "pipeline", "retained", "payload")
    assert {k: status[k] for k in keys} == {
        "topic": f"edge/{DEVICE}/status", "kind": "status", "pipeline": None, "retained": True,
        "payload": STATUS,
    }  # fmt: skip
    assert {k: cam[k] for k in keys} == {
        "topic": f"edge/{DEVICE}/results/cam", "kind": "result", "pipeline": "cam", "retained": False,
        "payload": result("cam", 7, "upside-down"),
    }  # fmt: skip
    assert cam["received_at"].endswith("Z") and cam["bytes"] == len(json.dumps(cam["payload"]))


def test_one_pipeline_readable_lines_as_they_come_and_ctrl_c(tmp_path: Path, mosquitto: Mosquitto) -> None:
    config = write_config(tmp_path, mosquitto.port)
    watching = Watching(tmp_path, "cam", "-c", str(config))
    watching.subscribed()
    assert f"edge/{DEVICE}/results/cam" in watching.stderr()
    publish(mosquitto, f"edge/{DEVICE}/results/yard", result("yard", 1, "person"))  # not watched
    publish(mosquitto, f"edge/{DEVICE}/results/cam", result("cam", 3, "upright"))
    event = {
        "device": DEVICE,
        "pipeline": "cam",
        "seq": 4,
        "output": {"active": True, "score": 0.9, "event": "start"},
    }
    publish(mosquitto, f"edge/{DEVICE}/results/cam", event)
    # A tracking pipeline's event (docs/results.md), on its own topic.
    crossed = {"device": DEVICE, "pipeline": "cam", "seq": 9, "type": "cross", "line": "gate",
               "direction": "in", "object": {"id": 12, "label": "person"}, "count": 3}  # fmt: skip
    publish(mosquitto, f"edge/{DEVICE}/events/yard", {**crossed, "pipeline": "yard"})  # not watched
    publish(mosquitto, f"edge/{DEVICE}/events/cam", crossed)
    # Each line reaches the pipe while the command still runs: flushed per message.
    wait_until(lambda: len(watching.lines) >= 3, "three lines through the pipe", timeout=20)
    assert watching.proc.poll() is None
    assert watching.lines[0].split(" ", 1)[1] == "result cam: upright 0.98 [seq 3]", watching.lines
    assert watching.lines[1].split(" ", 1)[1] == "event  cam: start active 0.90 [seq 4]", watching.lines
    assert watching.lines[2].split(" ", 1)[1] == (
        "event  cam: line gate in: cross person #12 (count 3) [seq 9]"
    ), watching.lines
    watching.proc.send_signal(signal.SIGINT)
    assert watching.finish(timeout=15) == 0, watching.stderr()
    assert "Traceback" not in watching.stderr() and len(watching.lines) == 3


def test_events_alone_where_first_and_seq_apart_from_the_objects_id(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    config = write_config(tmp_path, mosquitto.port)
    publish(mosquitto, f"edge/{DEVICE}/status", STATUS, retain=True)  # retained: not shown with --events
    watching = Watching(tmp_path, "-c", str(config), "--events")
    watching.subscribed()
    assert f"watching edge/{DEVICE}/events/+ on " in watching.stderr()
    publish(mosquitto, f"edge/{DEVICE}/results/door-cam", result("door-cam", 47, "person"))  # not shown
    person = {"id": 4, "label": "person"}
    base = {"device": DEVICE, "pipeline": "door-cam"}
    events = [
        {"seq": 1, "type": "new", "object": {**person, "score": 0.812}},
        {"seq": 48, "type": "cross", "line": "door", "direction": "in", "object": person, "count": 3},
        {"seq": 49, "type": "enter", "zone": "counter", "object": person},
        {"seq": 50, "type": "dwell", "zone": "counter", "object": person, "stayed_s": 7.46},
        {"seq": 51, "type": "exit", "zone": "counter", "object": person, "stayed_s": 9.3, "reason": "left"},
        {"seq": 52, "type": "overcrowded", "zone": "counter", "state": "start", "count": 5, "max_objects": 4},
        {"seq": 53, "type": "end", "reason": "lost", "object": person},
    ]
    for event in events:
        publish(mosquitto, f"edge/{DEVICE}/events/door-cam", {**base, **event})
    wait_until(lambda: len(watching.lines) >= len(events), "a line per event", timeout=20)
    watching.proc.send_signal(signal.SIGINT)
    assert watching.finish(timeout=15) == 0, watching.stderr()
    assert [text.split(" ", 1)[1] for text in watching.lines] == [
        "event  door-cam: new person #4 (score 0.81) [seq 1]",
        "event  door-cam: line door in: cross person #4 (count 3) [seq 48]",
        "event  door-cam: zone counter: enter person #4 [seq 49]",
        "event  door-cam: zone counter: dwell person #4 (inside 7.5 s) [seq 50]",
        "event  door-cam: zone counter: exit person #4 (stayed 9.3 s) [seq 51]",
        "event  door-cam: zone counter: overcrowded start (5 inside, max 4) [seq 52]",
        "event  door-cam: end person #4 (lost) [seq 53]",
    ]


def test_seconds_ends_it_with_nothing_published(tmp_path: Path, mosquitto: Mosquitto) -> None:
    config = write_config(tmp_path, mosquitto.port)
    started = time.monotonic()
    watching = Watching(tmp_path, "-c", str(config), "--seconds", "1")
    assert watching.finish() == 0, watching.stderr()
    assert watching.lines == [] and time.monotonic() - started < 15


def test_the_configs_login_is_used(tmp_path: Path) -> None:
    password_file = tmp_path / "passwd"
    run_tool(
        [tool("mosquitto_passwd", "mosquitto"), "-b", "-c", str(password_file), "viewer", "s3cret"], tmp_path
    )
    os.chmod(password_file, 0o600)
    broker = Mosquitto(
        tmp_path / "mosquitto", allow_anonymous=False, extra_config=f"password_file {password_file}"
    )
    broker.start()
    try:
        secret = tmp_path / "mqtt.pass"
        secret.write_text("wrong\n")
        config = write_config(tmp_path, broker.port, username="viewer", password_file=str(secret))
        refused = Watching(tmp_path, "-c", str(config), "--count", "1")
        assert refused.finish() == 1
        assert f"error: 127.0.0.1:{broker.port} refused the login of 'viewer'" in refused.stderr()
        assert "hint: check mqtt.username and mqtt.password_file" in refused.stderr()
        secret.write_text("s3cret\n")
        watching = Watching(tmp_path, "-c", str(config), "--count", "1")
        watching.subscribed()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        client.username_pw_set("viewer", "s3cret")
        client.connect(broker.host, broker.port, keepalive=10)
        client.loop_start()
        client.publish(
            f"edge/{DEVICE}/results/cam", json.dumps(result("cam", 1, "upright")), qos=1
        ).wait_for_publish(10)
        client.disconnect()
        client.loop_stop()
        assert watching.finish() == 0, watching.stderr()
        assert watching.lines[0].endswith("result cam: upright 0.98 [seq 1]"), watching.lines
    finally:
        broker.close()


def test_a_broker_that_is_down_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port)
    for extra in ((), ("--json",)):
        started = time.monotonic()
        watching = Watching(tmp_path, "-c", str(config), *extra)
        assert watching.finish(timeout=30) == 1
        assert time.monotonic() - started < 20
        if extra:
            reply = json.loads("\n".join(watching.lines))
            refused = f"cannot reach MQTT broker 127.0.0.1:{port}: [Errno 111] Connection refused"
            assert reply["ok"] is False and reply["errors"] == [refused]
        else:
            assert f"error: cannot reach MQTT broker 127.0.0.1:{port}" in watching.stderr()
            assert "hint: check mqtt.host and mqtt.port" in watching.stderr()
            assert watching.lines == [] and "Traceback" not in watching.stderr()


def test_the_readmes_mosquitto_sub_line_reads_what_watch_reads(tmp_path: Path, mosquitto: Mosquitto) -> None:
    """README's "Using it" shows `edge-agent watch` and its mosquitto_sub equivalent: the same topic
    filters as watch subscribes to (state topics on), and run as written it gets the box's messages."""
    using = README.read_text().split("## Using it", 1)[1].split("\n## ", 1)[0]
    assert "edge-agent watch [PIPELINE] -c CONFIG [--events] [--json] [--seconds N] [--count N]" in using
    (command,) = [ln.split("  #", 1)[0] for ln in using.splitlines() if ln.startswith("mosquitto_sub ")]
    args = shlex.split(
        command.replace("DEVICE", DEVICE).replace("BROKER", f"{mosquitto.host} -p {mosquitto.port}")
    )
    documented = {args[i + 1] for i, arg in enumerate(args) if arg == "-t"}
    config = write_config(tmp_path, mosquitto.port)
    data = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**data, "state_topics": {"enabled": True}}))
    watching = Watching(tmp_path, "-c", str(config), "--seconds", "0.5")
    assert watching.finish() == 0, watching.stderr()
    subscribed = watching.stderr().split("watching ", 1)[1].split(" on ", 1)[0].split(", ")
    assert documented == set(subscribed)
    publish(mosquitto, f"edge/{DEVICE}/status", STATUS, retain=True)
    publish(mosquitto, f"edge/{DEVICE}/results/cam", result("cam", 2, "upright"), retain=True)
    shown = subprocess.run([*args, "-C", "2", "-W", "20"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    lines = sorted(shown.stdout.splitlines())
    assert [ln.split(" ", 1)[0] for ln in lines] == [f"edge/{DEVICE}/results/cam", f"edge/{DEVICE}/status"]
