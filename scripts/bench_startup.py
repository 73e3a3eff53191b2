#!/usr/bin/env python3
"""Benchmark: what `edge-agent` pays at start, against a bare `python -c pass`, in fresh processes run
side by side (rounds interleaved: a noisy stretch of this shared box hits every contender alike).

    .venv/bin/python scripts/bench_startup.py [--rounds 15] [--daemon-rounds 7] [--no-daemon]
        [--no-compile] [--repo DIR] [--against DIR] [--json out.json]

Contenders, each a fresh process, timed from its start to its exit (the CLI) or to its first result
on MQTT (the daemon):
- bare: `python -c pass` (the interpreter's own start, the floor of every command);
- help: `edge-agent --help`;
- status: `edge-agent status -c CONFIG`, answered by a running daemon (one pipeline at 2 fps, idle
  most of the time; with --no-daemon: the answer that none runs);
- validate: `edge-agent config validate configs/agent.example.yaml`;
- daemon: `edge-agent run -c CONFIG` on a restart (model stored, backend decision cached by a first
  run), to its first result on a real mosquitto on loopback (the PP-OCR text direction classifier
  on the backend the first run chose, a looping 640x360 clip at 2 fps).
Goals (issue 34 item 14): help and status within 0.3 s of bare, validate within 0.5 s, the daemon's
first result within 0.6 s. Figures: the median of each (and its min-max), minus bare's median; and
the CPU seconds each used (the daemon's by its first result), which a busy box inflates far less.

By default agent/ and providers/ are compiled to bytecode first, as scripts/install.sh installs
them; --no-compile removes their bytecode and runs with PYTHONDONTWRITEBYTECODE=1, as a checkout
runs in this box's shell: each start then compiles the agent's modules from source. --repo DIR times
another tree's agent/ and providers/ (e.g. an older commit: `git archive COMMIT agent providers |
tar -x -C DIR`) with this interpreter and its packages; --against DIR times one more tree in the
same rounds, side by side (before and after a change). Every command starts as
`python -c "from agent.cli import main; main()"` with PYTHONPATH=DIR, as the console script does.
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import importlib.util
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mosquitto import Mosquitto, Subscriber  # noqa: E402

# The console script's own code (`from agent.cli import main`), run with PYTHONPATH = the tree timed.
EDGE_AGENT = [
    sys.executable,
    "-c",
    "import sys; sys.argv[0] = 'edge-agent'; from agent.cli import main; main()",
]
EXAMPLE = ROOT / "configs" / "agent.example.yaml"
GOALS_S = {"help": 0.3, "status": 0.3, "validate": 0.5, "daemon": 0.6}
MODEL, VERSION = "text-direction", "1"
FIRST_RESULT_TIMEOUT_S = 120.0


def cls_model() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("rapidocr_onnxruntime is not installed (scripts/setup.sh installs it)")
    return Path(next(iter(spec.submodule_search_locations)), "models", "ch_ppocr_mobile_v2.0_cls_infer.onnx")


def make_clip(path: Path, frames: int = 20, fps: int = 10) -> None:
    import cv2
    import numpy as np

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (640, 360))
    try:
        for i in range(frames):
            image = np.full((360, 640, 3), 255, np.uint8)
            cv2.putText(image, f"SIGN {i}", (60, 200), cv2.FONT_HERSHEY_SIMPLEX, 3, (0, 0, 0), 6)
            writer.write(image)
    finally:
        writer.release()


def tree(env: dict[str, str]) -> str:
    """The tree timed: the first entry of PYTHONPATH, also the working dir (`-c` puts that first)."""
    return env["PYTHONPATH"].split(os.pathsep)[0]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str], expect: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """Seconds from the start of a fresh process to its exit, and the CPU seconds it used (which a
    busy box inflates less than the wall time)."""
    cpu = children_cpu_s()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env, cwd=tree(env), timeout=120, check=False)
    took = time.perf_counter() - start
    if done.returncode not in expect:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.decode()[-2000:]}")
    return took, children_cpu_s() - cpu


def process_cpu_s(pid: int) -> float:
    """The CPU seconds a running process has used (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class Daemon:
    """`edge-agent run` on one pipeline (the clip, looping at 2 fps) with a real broker."""

    def __init__(
        self, work: Path, broker: Mosquitto, env: dict[str, str], device: str = "bench-startup"
    ) -> None:
        self.work, self.env = work, env
        self.state_dir = work / "state"
        registry = work / "registry"
        subprocess.run(
            [*EDGE_AGENT, "registry", "publish", str(cls_model()), "--name", MODEL, "--version", VERSION,
             "--registry", f"file://{registry}"],
            check=True, capture_output=True, timeout=120, env=env, cwd=tree(env),
        )  # fmt: skip
        clip = work / "clip.mp4"
        make_clip(clip)
        config = {
            "device": {"id": device},
            "state_dir": str(self.state_dir),
            "mqtt": {"host": broker.host, "port": broker.port, "reconnect_min_s": 0.2},
            "registry": {"url": f"file://{registry}"},
            "pipelines": [
                {
                    "name": "signs",
                    "model": {"name": MODEL, "version": VERSION},
                    "source": {"type": "video", "uri": str(clip), "loop": True, "fps": 2},
                    "preprocess": {
                        "resize": {"width": 192, "height": 48},
                        "color": "bgr",
                        "mean": [0.5] * 3,
                        "std": [0.5] * 3,
                    },
                    "postprocess": {"type": "classification", "softmax": False, "top_k": 2},
                }
            ],
        }
        self.config = work / "agent.yaml"
        self.config.write_text(json.dumps(config))
        self.results = Subscriber(broker.host, broker.port, f"edge/{device}/results/#")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = work / "daemon.log"

    def _last_seq(self) -> int:
        return max((json.loads(m.payload)["seq"] for m in self.results.messages), default=0)

    def start(self) -> tuple[float, float]:
        """Start it; seconds to its first result of this run on MQTT (a seq above the last run's), and
        the CPU seconds it had used by then."""
        after = self._last_seq()
        with self.log.open("ab") as log:
            start = time.perf_counter()
            self.proc = subprocess.Popen(
                [*EDGE_AGENT, "run", "-c", str(self.config)],
                stdout=log, stderr=log, env=self.env, cwd=tree(self.env),
            )  # fmt: skip
        fresh: Callable[[list[Any]], bool] = lambda got: any(  # noqa: E731
            json.loads(m.payload)["seq"] > after for m in got
        )
        try:
            self.results.wait_until(fresh, timeout=FIRST_RESULT_TIMEOUT_S)
        except AssertionError:
            self.stop()
            raise SystemExit(f"edge-agent run gave no result in time; see {self.log}") from None
        took = time.perf_counter() - start
        assert self.proc is not None
        return took, process_cpu_s(self.proc.pid)

    def decision_cached(self) -> bool:
        path = self.state_dir / "decisions" / "pipelines" / "signs.json"
        try:
            return bool(json.loads(path.read_text())["decision"]["checked"])
        except (OSError, ValueError, KeyError):
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def close(self) -> None:
        self.stop()
        self.results.close()


def summary(values: list[float], bare: float) -> dict[str, float]:
    median = statistics.median(values)
    return {
        "median_s": round(median, 3),
        "min_s": round(min(values), 3),
        "max_s": round(max(values), 3),
        "over_bare_s": round(median - bare, 3),
    }


def prepare(repo: Path, no_compile: bool) -> dict[str, str]:
    """The environment that runs `repo`'s agent, its bytecode compiled (or removed)."""
    for package in ("agent", "providers"):
        if no_compile:  # as a fresh checkout: no bytecode, and none written (below)
            for cache in (repo / package).rglob("__pycache__"):
                shutil.rmtree(cache)
        else:
            compileall.compile_dir(str(repo / package), quiet=1)
    # The example config reads these: keep the host's values out.
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_DEVICE_ID", "MQTT_HOST")}
    env["PYTHONPATH"] = str(repo.resolve())  # and the working dir: `-c` puts it first on sys.path
    if no_compile:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["COLUMNS"] = "100"
    return env


def alternating(items: list[Any], round_: int) -> list[Any]:
    return items if round_ % 2 == 0 else items[::-1]  # A B C D, D C B A, ...


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the CLI contenders")
    parser.add_argument("--daemon-rounds", type=int, default=7, help="daemon restarts timed")
    parser.add_argument("--no-daemon", action="store_true", help="skip the daemon (status: none running)")
    parser.add_argument(
        "--no-compile", action="store_true", help="remove agent/'s and providers/' bytecode first (see above)"
    )
    parser.add_argument("--repo", type=Path, default=ROOT, help="the tree whose agent/ is timed")
    parser.add_argument(
        "--against", type=Path, help="another tree (e.g. an older commit), timed in the same rounds"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    trees = {"now": args.repo, **({"against": args.against} if args.against else {})}
    envs = {label: prepare(repo, args.no_compile) for label, repo in trees.items()}
    names = ("bare", "help", "status", "validate", "daemon", "daemon_bare")
    times = {label: {key: [] for name in names for key in (name, f"{name}_cpu")} for label in trees}

    def record(label: str, name: str, took_cpu: tuple[float, float]) -> None:
        times[label][name].append(took_cpu[0])
        times[label][f"{name}_cpu"].append(took_cpu[1])

    with (
        tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp,
        Mosquitto(Path(tmp) / "broker") as broker,
    ):
        work = Path(tmp)
        daemons: dict[str, Daemon] = {}
        none_runs = work / "no-daemon.yaml"
        none_runs.write_text(json.dumps({"device": {"id": "x"}, "state_dir": str(work / "none")}))
        try:
            for label in [] if args.no_daemon else list(trees):
                (work / label).mkdir()
                daemon = daemons[label] = Daemon(work / label, broker, envs[label], f"bench-{label}")
                first, _ = daemon.start()  # a first run proves the backend and caches the decision
                deadline = time.monotonic() + FIRST_RESULT_TIMEOUT_S
                while not daemon.decision_cached():
                    if time.monotonic() > deadline:
                        raise SystemExit(f"no cached decision in time; see {daemon.log}")
                    time.sleep(0.1)
                daemon.stop()
                print(f"{label}: first run (nothing cached), first result after {first:.2f} s", flush=True)
            for round_ in range(0 if args.no_daemon else args.daemon_rounds):
                for label in alternating(list(trees), round_):
                    record(label, "daemon_bare", timed([sys.executable, "-c", "pass"], envs[label]))
                    record(label, "daemon", daemons[label].start())
                    if round_ < args.daemon_rounds - 1:
                        daemons[label].stop()  # the last ones run on, for status
                    print(f"{label} restart {round_ + 1}: {times[label]['daemon'][-1]:.3f} s", flush=True)
            contenders: list[tuple[str, str, list[str], tuple[int, ...]]] = []
            for label in trees:
                status_config = daemons[label].config if label in daemons else none_runs
                contenders += [
                    (label, "bare", [sys.executable, "-c", "pass"], (0,)),
                    (label, "help", [*EDGE_AGENT, "--help"], (0,)),
                    (
                        label,
                        "status",
                        [*EDGE_AGENT, "status", "-c", str(status_config)],
                        (0,) if daemons else (1,),
                    ),
                    (label, "validate", [*EDGE_AGENT, "config", "validate", str(EXAMPLE)], (0,)),
                ]
            for label, _, argv, expect in contenders:  # once each, unmeasured: the page cache
                timed(argv, envs[label], expect)
            for round_ in range(args.rounds):
                for label, name, argv, expect in alternating(contenders, round_):
                    record(label, name, timed(argv, envs[label], expect))
        finally:
            for daemon in daemons.values():
                daemon.close()

    figures: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "box": f"{os.cpu_count()} logical cores; {platform.platform()}; Python {platform.python_version()}",
        "compiled": not args.no_compile,
        "rounds": args.rounds,
        "daemon_rounds": 0 if args.no_daemon else args.daemon_rounds,
    }
    print(f"\n{figures['date']}; {figures['box']}; bytecode compiled: {figures['compiled']}")
    for label, repo in trees.items():
        figures[label] = {"repo": str(repo), **summaries(times[label])}
        print(f"\n{label}: {repo}")
        print(
            "| contender | median s | min-max s | over bare s | CPU s | CPU over bare s | goal (over bare) |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, f in summaries(times[label]).items():
            goal = GOALS_S.get(name)
            verdict = "" if goal is None else f"≤ {goal} {'met' if f['over_bare_s'] <= goal else 'NOT met'}"
            over = "" if name == "bare" else f"{f['over_bare_s']:.3f}"
            cpu_over = "" if name == "bare" else f"{f['cpu_over_bare_s']:.3f}"
            print(
                f"| {name} | {f['median_s']:.3f} | {f['min_s']:.3f}-{f['max_s']:.3f} | {over} "
                f"| {f['cpu_s']:.3f} | {cpu_over} | {verdict} |"
            )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def summaries(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    found = {}
    for name in ("bare", "help", "status", "validate", "daemon"):
        if not times[name]:
            continue
        bare = "daemon_bare" if name == "daemon" else "bare"  # each against the bare runs beside it
        cpu, bare_cpu = statistics.median(times[f"{name}_cpu"]), statistics.median(times[f"{bare}_cpu"])
        found[name] = {
            **summary(times[name], statistics.median(times[bare])),
            "cpu_s": round(cpu, 3),
            "cpu_over_bare_s": round(cpu - bare_cpu, 3),
        }
    return found


if __name__ == "__main__":
    if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists():
        print("note: mosquitto is needed for the daemon part (apt-get install mosquitto)", file=sys.stderr)
    sys.exit(main())
