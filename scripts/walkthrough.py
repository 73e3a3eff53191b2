#!/usr/bin/env python3
"""The README's "Using it" commands, walked in order as a new user would, each checked for its exit
status and its key output: a private mosquitto on a free loopback port, a file registry, the demo's
model and video, a running agent (reloaded with SIGHUP), then the fleet commands against it.

Run by scripts/walkthrough.sh (on a clean clone, after the quick start); alone:
    .venv/bin/python scripts/walkthrough.py [--work DIR]
tests/test_walkthrough.py holds WALKED and NOT_WALKED to the README: every command the README shows is
walked here or named with the reason it is not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# The README's commands (their first words) this walk runs, and those it does not, with why.
WALKED = {
    "config validate", "config schema", "registry keygen", "registry publish", "registry sign",
    "models pull", "models list", "models verify", "models gc", "models rm", "models validate", "run",
    "systemctl reload", "config diff", "status", "watch", "doctor", "providers", "source", "models check",
    "models inspect", "explain", "bench", "infer", "fleet deploy", "fleet status", "fleet rollback",
    "fleet cmd",
}  # fmt: skip
NOT_WALKED = {
    "registry publish --registry oci://": "needs an OCI registry server (tests/test_oci_registry.py runs "
    "the CNCF distribution registry for it)",
}
DEVICE = "walk-box"
MODEL_NAME, MODEL_VERSION = "pp-ocr-text-direction", "2.0"


class Walk:
    def __init__(self, work: Path, edge_agent: Sequence[str]) -> None:
        self.work = work
        self.edge_agent = list(edge_agent)
        self.steps = 0

    def run(
        self,
        *args: str,
        exit_codes: Sequence[int] = (0,),
        expect: str | None = None,
        check: Callable[[str], object] | None = None,
        timeout: float = 300,
    ) -> str:
        """One command: its exit status must be one of `exit_codes`, its output must match `expect`
        and pass `check`. Prints a line per step; stops the walk at the first that does not."""
        self.steps += 1
        began = time.monotonic()
        done = subprocess.run(
            [*self.edge_agent, *args], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "COLUMNS": "160"},
        )  # fmt: skip
        output = done.stdout + done.stderr
        took = time.monotonic() - began
        problem = None
        if done.returncode not in exit_codes:
            problem = f"exit {done.returncode}, expected {' or '.join(map(str, exit_codes))}"
        elif expect is not None and not re.search(expect, output, re.S):
            problem = f"its output does not match {expect!r}"
        elif check is not None:
            try:
                check(done.stdout)
            except Exception as exc:  # the check names what is wrong
                problem = f"{type(exc).__name__}: {exc}"
        line = f"{self.steps:2}. edge-agent {' '.join(args)}"
        if problem is not None:
            print(
                f"FAIL {line}\n     {problem}\n" + "\n".join(f"     | {x}" for x in output.splitlines()[-25:])
            )
            raise SystemExit(1)
        print(f"ok   {line}  ({took:.1f} s)")
        return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAIL timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _frame_as_input(video: Path, model: Path, out: Path) -> None:
    """Test data for `models validate`: the video's first frame as the model's input (the demo's
    preprocessing: 192x48, BGR, scaled to -1..1, channels first)."""
    import cv2
    import numpy as np
    import onnx

    ok, frame = cv2.VideoCapture(str(video)).read()
    assert ok, f"cannot read a frame of {video}"
    x = (cv2.resize(frame, (192, 48)).astype(np.float32) / 255.0 - 0.5) / 0.5
    name = onnx.load(str(model), load_external_data=False).graph.input[0].name
    np.savez(out, **{name: x.transpose(2, 0, 1)[None]})


def _zone_config(path: Path, video: Path, demo_config: Path) -> None:
    """A user's config with a zone: the demo's settings and a detector pipeline (nudenet's YOLOv8n, from
    its wheel) on the demo's video, a zone off the grid's lines (0.55 to 0.85 across)."""
    settings = yaml.safe_load(demo_config.read_text())
    detector = Path(importlib.util.find_spec("nudenet").submodule_search_locations[0]) / "320n.onnx"  # type: ignore[union-attr,index]
    settings["pipelines"] = [{
        "name": "door",
        "model": {"path": str(detector)},
        "source": {"type": "video", "uri": str(video)},
        "postprocess": {"type": "detection"},
        "zones": [{"name": "counter", "points": [[0.55, 0.1], [0.85, 0.1], [0.85, 0.9], [0.55, 0.9]]}],
    }]  # fmt: skip
    path.write_text(yaml.safe_dump(settings, sort_keys=False))


def _zone_drawn(frame: Path, video: Path) -> Callable[[str], None]:
    """`source --save`'s check: a JPEG of the video's first frame with the zone's left edge drawn
    where --json says its pixels are."""

    def check(stdout: str) -> None:
        import cv2
        import numpy as np

        saved = json.loads(stdout)["saved"]
        (zone,) = saved["zones"]
        assert frame.read_bytes()[:3] == b"\xff\xd8\xff", f"{frame} is not a JPEG"
        picture = cv2.imread(str(frame))
        ok, first = cv2.VideoCapture(str(video)).read()
        assert ok and picture is not None and picture.shape == first.shape, "not the video's frame"
        (x, top), (_, bottom) = zone["pixels"][0], zone["pixels"][3]
        rows = slice(top + 12, bottom - 2)  # below its label
        edge = np.abs(picture[rows, x - 1 : x + 2].astype(int) - first[rows, x - 1 : x + 2]).max(axis=2)
        assert (edge > 40).any(axis=1).mean() > 0.9, f"the zone's edge is not drawn at x={x}"

    return check


def json_with(*keys: str) -> Callable[[str], None]:
    def check(stdout: str) -> None:
        data = json.loads(stdout)
        missing = [k for k in keys if k not in data]
        assert not missing, f"--json output lacks {missing}"

    return check


def _config_naming(path: Path, label: str, port: int, work: Path) -> None:
    """A user's own tracking config: the tracking quick start's (configs/demo-tracking.yaml, its
    lines kept, so file:line points at the user's line), the detector's file from its wheel, and
    `label` where the quick start names the faces the detector finds."""
    detector = Path(importlib.util.find_spec("nudenet").submodule_search_locations[0]) / "320n.onnx"  # type: ignore[union-attr,index]
    text = (ROOT / "configs/demo-tracking.yaml").read_text()
    text = text.replace("@WORK@/320n.onnx", str(detector)).replace("@PORT@", str(port))
    path.write_text(text.replace("@WORK@", str(work)).replace("[FACE_FEMALE, FACE_MALE]", f"[{label}]"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="Folder for the walk's files (default: a new temp dir).")
    args = parser.parse_args(argv)
    work = (args.work or Path(tempfile.mkdtemp(prefix="edge-agent-walk-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    venv_bin = Path(sys.executable).parent
    walk = Walk(work, [str(venv_bin / "edge-agent")])
    print(f"walking the README's commands in {work}")

    model = (
        Path(importlib.util.find_spec("rapidocr_onnxruntime").submodule_search_locations[0])  # type: ignore[union-attr,index]
        / "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
    )
    video = work / "signs.mp4"
    subprocess.run([sys.executable, str(ROOT / "scripts/make_demo_video.py"), str(video),
                    "--truth", str(work / "truth.json")], check=True, capture_output=True)  # fmt: skip
    port = free_port()
    (work / "mosquitto.conf").write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
    )
    log = (work / "mosquitto.log").open("wb")
    broker = subprocess.Popen(["mosquitto", "-c", str(work / "mosquitto.conf")], stdout=log, stderr=log)
    agent: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: port_open(port), "mosquitto to listen", 10)
        config = work / "agent.yaml"
        text = (
            (ROOT / "configs/demo.yaml").read_text().replace("@PORT@", str(port)).replace("@WORK@", str(work))
        )
        config.write_text(text.replace("id: demo-box", f"id: {DEVICE}"))
        registry = f"file://{work}/registry"
        ref = f"{MODEL_NAME}@{MODEL_VERSION}"
        c = ("-c", str(config))

        walk.run("config", "validate", str(config), expect=r"OK")
        schema = walk.run("config", "schema", check=lambda out: json.loads(out)["$defs"])
        (work / "agent.schema.json").write_text(schema)
        key = work / "release.key"
        walk.run("registry", "keygen", str(key), expect=r"release\.key\.pub")
        assert key.with_name("release.key.pub").is_file()
        walk.run("registry", "publish", str(model), "--name", MODEL_NAME, "--version", MODEL_VERSION,
                 "--registry", registry, "--sign", str(key), expect=MODEL_NAME)  # fmt: skip
        walk.run("registry", "sign", ref, "--registry", registry, "--key", str(key), expect=MODEL_NAME)
        walk.run("models", "pull", *c, expect=MODEL_NAME)
        walk.run("models", "list", *c, "--json", check=lambda out: next(
            m for m in json.loads(out) if m["name"] == MODEL_NAME))  # fmt: skip
        walk.run("models", "verify", *c, "--json", check=lambda out: next(
            m for m in json.loads(out) if m["name"] == MODEL_NAME))  # fmt: skip
        walk.run("models", "gc", *c, "--dry-run", expect=r".")
        walk.run("models", "rm", ref, *c, exit_codes=(1,), expect=r"is used by a pipeline")
        inputs = work / "inputs.npz"
        _frame_as_input(video, model, inputs)
        walk.run("models", "validate", MODEL_NAME, *c, "--test-data", str(inputs), "--json",
                 check=json_with("candidates", "decision"))  # fmt: skip

        agent_log = (work / "agent.log").open("wb")
        agent = subprocess.Popen([*walk.edge_agent, "run", *c, "--duration", "600"], stdout=agent_log,
                                 stderr=agent_log)  # fmt: skip
        print("     edge-agent run -c agent.yaml  (in the background)")
        walk.steps += 1

        def serving() -> bool:
            done = subprocess.run([*walk.edge_agent, "status", *c, "--json"], capture_output=True, text=True)
            if done.returncode != 0:
                return False
            pipelines = json.loads(done.stdout).get("pipelines", {})
            return any(p.get("state") == "running" for p in pipelines.values())

        wait_for(serving, "the agent to serve sign-orientation", 180)
        edited = yaml.safe_load(config.read_text())
        edited["pipelines"][0]["source"]["fps"] = 3
        config.write_text(yaml.safe_dump(edited, sort_keys=False))
        walk.run("config", "diff", str(config), expect=r"sign-orientation")
        agent.send_signal(signal.SIGHUP)  # what `systemctl reload edge-agent` sends
        wait_for(lambda: b"reload" in (work / "agent.log").read_bytes().lower(), "the reload in the log", 60)
        print("     kill -HUP <agent>  (systemctl reload edge-agent)")
        walk.steps += 1
        wait_for(serving, "the agent to serve again after the reload", 180)
        walk.run("status", *c, "--json", check=json_with("pipelines"))
        walk.run("watch", *c, "--json", "--count", "1", "--seconds", "60",
                 check=lambda out: json.loads(out.splitlines()[0]))  # fmt: skip
        walk.run("doctor", *c, "--json", exit_codes=(0, 1), check=json_with("checks"))
        walk.run("providers", "--json", check=json_with("backends", "hardware"))
        walk.run("source", str(video), "--seconds", "3", "--json", check=json_with("received", "per_second"))
        # A zone set-up from a saved frame (docs/analytics.md, "Finding your zone's coordinates").
        zones_config, frame = work / "zones.yaml", work / "frame.jpg"
        _zone_config(zones_config, video, config)
        walk.run("source", str(video), "--save", str(frame), "-c", str(zones_config), "--pipeline", "door",
                 "--json", check=_zone_drawn(frame, video))  # fmt: skip
        walk.run("models", "check", str(model), "--json", check=json_with("backends"))
        walk.run("models", "inspect", str(model), "--json", check=json_with("models"))
        walk.run("explain", "sign-orientation", *c, expect=r"onnxruntime|openvino")
        walk.run("bench", str(model), "--runs", "5", "--json", check=json_with("results", "choice"))
        walk.run("infer", MODEL_NAME, str(video), "--pipeline", "sign-orientation", *c, "--json",
                 check=json_with("output"))  # fmt: skip

        broker_opt = ("--broker", f"127.0.0.1:{port}")
        spec = work / "spec.yaml"
        pipeline = yaml.safe_load(config.read_text())["pipelines"][0]
        pipeline["source"]["fps"] = 1
        spec.write_text(yaml.safe_dump({"pipelines": [pipeline], "health": {"window_s": 2, "min_frames": 1}}))
        walk.run("fleet", "deploy", str(spec), "--device", DEVICE, *broker_opt, "--timeout", "300",
                 "--json", check=json_with("status"), timeout=400)  # fmt: skip
        walk.run("fleet", "status", *broker_opt, "--json", check=lambda out: json.loads(out),
                 expect=DEVICE)  # fmt: skip
        walk.run("fleet", "rollback", "--device", DEVICE, *broker_opt, "--timeout", "300",
                 "--json", check=json_with("status"), timeout=400)  # fmt: skip
        walk.run("fleet", "cmd", DEVICE, "ping", *broker_opt, "--json", check=json_with("ok", "result"))
        # A user's own tracking config naming a label the detector lacks (`person`, as Frigate's
        # detectors have it; this one finds faces) is refused with its file and line.
        mine = work / "my-shop.yaml"
        _config_naming(mine, "person", port, work)
        refused = r"my-shop\.yaml:\d+: pipelines\[0\]\.(zones|lines)\[0\]\.labels\[0\]: 'person'"
        walk.run("config", "validate", str(mine), exit_codes=(1,), expect=refused)
    finally:
        if agent is not None:
            agent.terminate()
            try:
                agent.wait(60)
            except subprocess.TimeoutExpired:
                agent.kill()
        broker.terminate()
        broker.wait(10)
    print(f"the walk is done: {walk.steps} steps, every one as the README says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
