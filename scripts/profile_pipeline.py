#!/usr/bin/env python3
"""Profile the daemon serving one saturated 720p pipeline with py-spy, and say where its CPU goes.

Starts `edge-agent run` (this checkout, or the one in --repo: `git worktree add /tmp/before REV`
profiles an older version with this venv) on a 1000 fps H.264 clip with no fps cap (the source is
faster than any model here), the backend fixed, no broker; once results come, py-spy samples it
for --seconds and the script prints the share of samples per thread role and the hottest
functions (self time; a Python function calling into a runtime counts the runtime's time). py-spy
samples threads that are running: idle waits are left out.

    .venv/bin/pip install -e .[bench]   # py-spy
    .venv/bin/python scripts/profile_pipeline.py [--model yolo] [--backend openvino/CPU]
        [--seconds 20] [--repo PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_pipeline import EDGE_AGENT, MODELS, free_port, make_video, publish, results_stored  # noqa: E402

PY_SPY = str(Path(sys.executable).parent / "py-spy")
# The function at the bottom of a thread's stack says what the thread is for.
ROLES = {
    "_prepare_loop": "pipeline: prepare",
    "_infer_loop": "pipeline: inference",
    "_report_loop": "pipeline: report (postprocess, outbox)",
    "_run": "pipeline worker (one thread before issue 15) / source",
}


def role_of(frames: list[str]) -> str:
    for frame in frames:
        name = frame.split(" (", 1)[0].rsplit(".", 1)[-1]  # "Pipeline._infer_loop" -> "_infer_loop"
        if name in ROLES and name != "_run":
            return ROLES[name]
    for frame in frames:
        if "sources/video.py" in frame or "sources/base.py" in frame:
            return "source: decode"
        if "agent/pipeline.py" in frame:
            return "pipeline worker (all steps, one thread)"
        if "outbox.py" in frame or "connection.py" in frame:
            return "outbox / MQTT"
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="yolo", choices=sorted(MODELS))
    parser.add_argument("--backend", default="openvino/CPU")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--repo", type=Path, default=None, help="run the agent from this checkout")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--every-frame", action="store_true", help="the source with realtime: false (not in old checkouts)"
    )
    args = parser.parse_args()
    case = MODELS[args.model]
    env = dict(os.environ)
    if args.repo is not None:
        env["PYTHONPATH"] = str(args.repo.resolve())
    with tempfile.TemporaryDirectory(prefix="profile-") as tmp:
        work = Path(tmp)
        make_video(work / "clip.mp4", frames=240, fps=1000)
        registry = publish(work, args.model, case.path())
        state = work / "state"
        config = {
            "device": {"id": "profile"},
            "state_dir": str(state),
            "mqtt": {"host": "127.0.0.1", "port": free_port()},
            "registry": {"url": registry},
            "pipelines": [
                {
                    "name": args.model,
                    "model": {"name": args.model, "version": "1"},
                    "source": {"type": "video", "uri": str(work / "clip.mp4"), "loop": True}
                    | ({"realtime": False} if args.every_frame else {}),
                    "preprocess": case.preprocess,
                    "postprocess": case.postprocess,
                    "backend": {"fixed": args.backend},
                }
            ],
        }
        (work / "agent.yaml").write_text(json.dumps(config))
        log = (work / "agent.log").open("wb")
        agent = subprocess.Popen(
            [EDGE_AGENT, "run", "-c", str(work / "agent.yaml")], stdout=log, stderr=log, env=env
        )
        try:
            deadline = time.monotonic() + 120
            while results_stored(state) == 0:
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((work / "agent.log").read_text()[-3000:])
                time.sleep(0.05)
            before = results_stored(state)
            raw = work / "profile.txt"
            subprocess.run(
                [PY_SPY, "record", "--pid", str(agent.pid), "--duration", str(args.seconds), "--rate", "100",
                 "--format", "raw", "--threads", "--output", str(raw), "--nonblocking"],
                check=True, capture_output=True, timeout=args.seconds + 120,
            )  # fmt: skip
            results = results_stored(state) - before
        finally:
            agent.terminate()
            agent.wait(timeout=60)
            log.close()
        by_role: collections.Counter[str] = collections.Counter()
        by_leaf: collections.Counter[str] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            frames = stack.split(";")[1:][::-1]  # leaf first, thread id dropped
            by_role[role_of(frames[::-1])] += int(samples)
            by_leaf[frames[0] if frames else "?"] += int(samples)
    total = sum(by_role.values()) or 1
    origin = f"checkout {args.repo}" if args.repo else "this checkout"
    print(f"{args.model} on {args.backend}, {origin}: {results / args.seconds:.1f} results/s while sampled")
    print(f"{total} samples at 100 Hz over {args.seconds} s ({total / args.seconds / 100:.2f} cores busy)")
    print("\nshare of samples by thread role:")
    for role, count in by_role.most_common():
        print(f"  {count / total:6.1%}  {role}")
    print(f"\nhottest functions (self time), top {args.top}:")
    for leaf, count in by_leaf.most_common(args.top):
        print(f"  {count / total:6.1%}  {leaf[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
