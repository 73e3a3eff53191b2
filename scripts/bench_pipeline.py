#!/usr/bin/env python3
"""Benchmark: the agent's pipeline against the loops it must beat, per model and backend, in one run
with the rounds interleaved (a noisy stretch of this shared box hits every contender alike).

    .venv/bin/python scripts/bench_pipeline.py [--models cls,det,yolo] [--backends ort,ov]
        [--seconds 6] [--rounds 3] [--out docs/benchmarks-pipeline.md] [--plots docs/img]

Contenders, on the same model, backend, input and postprocessing:
- bare: `session.run` on inputs prepared once (the inference-only ceiling);
- pipeline/memory: the real `agent.pipeline.Pipeline` (three threads, real report rules, real
  outbox writer into SQLite) fed 1280x720 frames already in memory (a source that costs nothing);
- naive: one Python loop reading a 720p H.264 file with OpenCV, then preprocess, run, postprocess,
  JSON and one SQLite transaction per result;
- pipeline/video: the pipeline on the same file through the agent's video source with `realtime:
  false` (every frame, as the naive loop; decoded in the source's thread just ahead of the model);
- paced: bare and pipeline/memory both at a camera's pace, for CPU per result;
- swap: the model stage swapped mid-stream at a camera's pace: results lost, longest gap;
- daemon: the real `edge-agent run` (its own process, the clip looping at the model's camera pace):
  start-up to its first result on a first run (default selection, nothing cached) and on a restart
  (model stored, decision cached), and its peak RSS against a bare process that only imports the
  runtime, loads the model and runs it (`--no-daemon` skips this part).
Plots need matplotlib (`pip install -e .[bench]`).
MQTT publishing is left out of every contender (the daemon publishes from its own thread; here its
broker is away, so results wait in its outbox, where this script sees them).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib.util
import json
import platform
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig, PipelineConfig  # noqa: E402
from agent.mqtt.outbox import Outbox  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.processing.judge import report_judge  # noqa: E402
from agent.processing.preprocess import keep_opencv_serial  # noqa: E402
from agent.results import ResultWriter  # noqa: E402
from agent.sources import Frame  # noqa: E402
from agent.stage import LoadedModel, Stage  # noqa: E402
from providers import ModelArtifact, SelectionPolicy, Session, decide, get_backend  # noqa: E402
from providers.select import serving_options  # noqa: E402

WIDTH, HEIGHT = 1280, 720
BACKENDS = {"ort": "onnxruntime/CPUExecutionProvider", "ov": "openvino/CPU"}


def _package_file(package: str, *parts: str) -> Path:
    """A model file inside an installed wheel (located, not imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed (scripts/setup.sh installs it)")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


@dataclass(frozen=True)
class ModelCase:
    title: str
    path: Callable[[], Path]
    preprocess: dict[str, Any]
    postprocess: dict[str, Any]
    pace_fps: float  # the camera's pace for the paced contenders


MODELS: dict[str, ModelCase] = {
    "cls": ModelCase(
        "PP-OCR text direction classifier (48x192)",
        lambda: _package_file("rapidocr_onnxruntime", "models", "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
        {"resize": {"width": 192, "height": 48}, "color": "bgr", "mean": [0.5] * 3, "std": [0.5] * 3},
        {"type": "classification", "softmax": False, "top_k": 2, "labels": ["upright", "upside-down"]},
        30.0,
    ),
    "det": ModelCase(
        "PP-OCRv4 text detector (256x640)",
        lambda: _package_file("rapidocr_onnxruntime", "models", "ch_PP-OCRv4_det_infer.onnx"),
        {
            "resize": {"width": 640, "height": 256},
            "color": "bgr",
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
        },
        {"type": "regions", "threshold": 0.3, "unclip_ratio": 1.5},
        10.0,
    ),
    "yolo": ModelCase(
        "YOLOv8n (nudenet 320n, 320x320 letterbox)",
        lambda: _package_file("nudenet", "320n.onnx"),
        {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
        {"type": "detection", "score_threshold": 0.25},
        10.0,
    ),
}


def photo_720p(shift: int = 0) -> np.ndarray:
    """scikit-image's astronaut photo (in its wheel) on a 1280x720 canvas, moved `shift` pixels."""
    from skimage import data as skimage_data

    photo = cv2.cvtColor(skimage_data.astronaut(), cv2.COLOR_RGB2BGR)
    canvas = np.full((HEIGHT, WIDTH, 3), 90, np.uint8)
    x = 100 + shift % (WIDTH - 612)
    canvas[100:612, x : x + 512] = photo
    cv2.putText(canvas, "EDGE CAMERA 42", (40, 680), cv2.FONT_HERSHEY_SIMPLEX, 2.0, (255, 255, 255), 4)
    return canvas


def make_video(path: Path, frames: int, fps: int) -> None:
    """A 720p H.264 clip of the photo panning (real content, a real decoder's work per frame)."""
    command = [
        "ffmpeg", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24",
        "-s", f"{WIDTH}x{HEIGHT}", "-r", str(fps), "-i", "-",
        "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", str(path),
    ]  # fmt: skip
    with subprocess.Popen(command, stdin=subprocess.PIPE) as ffmpeg:
        assert ffmpeg.stdin is not None
        for i in range(frames):
            ffmpeg.stdin.write(photo_720p(shift=4 * i).tobytes())
        ffmpeg.stdin.close()
        if ffmpeg.wait(timeout=300) != 0:
            raise SystemExit("ffmpeg could not encode the benchmark clip")


class MemorySource:
    """Frames already in memory, handed out as fast as they are asked for, or at a camera's pace:
    both the source and the slot a Pipeline takes (their interfaces are small)."""

    kind = "memory"
    display_uri = "memory"
    outages = 0
    last_outage_s = None
    dropped = 0

    def __init__(self, frames: list[np.ndarray], count: int, fps: float | None = None) -> None:
        self.frames, self.count, self.fps = frames, count, fps
        self.served = 0
        self.start_at: float | None = None
        self._stop = threading.Event()

    @property
    def closed(self) -> bool:
        return self.served >= self.count or self._stop.is_set()

    def get(self, timeout: float) -> Frame | None:
        if self.closed:
            return None
        now = time.monotonic()
        if self.start_at is None:
            self.start_at = now
        if self.fps:
            due = self.start_at + self.served / self.fps
            if due - now > timeout:
                time.sleep(timeout)
                return None
            if due > now:
                time.sleep(due - now)
            elif now - due > 1.0 / self.fps:  # the consumer fell a frame behind: a camera drops it
                missed = int((now - due) * self.fps)
                self.served += missed
                self.dropped += missed
                if self.closed:
                    return None
        self.served += 1
        return Frame(self.frames[self.served % len(self.frames)], self.served, time.time())

    def __len__(self) -> int:
        return 0

    def start(self) -> None:
        pass

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()

    def stats(self) -> dict[str, Any]:
        return {"state": "finished" if self.closed else "streaming", "error": None, "uri": "memory"}


def pipeline_config(name: str, case: ModelCase, source: dict[str, Any]) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": name,
            "model": {"name": name, "version": "1"},
            "source": source,
            "preprocess": case.preprocess,
            "postprocess": case.postprocess,
        }
    )


@dataclass
class Run:
    results: int
    wall_s: float
    cpu_s: float
    extra: dict[str, Any]

    @property
    def rate(self) -> float:
        return self.results / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms_per_result(self) -> float:
        return self.cpu_s / self.results * 1000 if self.results else float("nan")


@contextlib.contextmanager
def measured() -> Iterator[dict[str, float]]:
    """Wall and CPU seconds (this process, every thread) of the block."""
    taken: dict[str, float] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    yield taken
    taken["wall"], taken["cpu"] = time.perf_counter() - wall, time.process_time() - cpu


class Bench:
    def __init__(self, key: str, case: ModelCase, backend: str, work: Path, seconds: float) -> None:
        self.key, self.case, self.backend, self.work, self.seconds = key, case, backend, work, seconds
        path = case.path()
        self.artifact = ModelArtifact(path, "onnx", "0" * 64)
        self.session: Session = get_backend(backend).load(self.artifact)
        self.config = pipeline_config(key, case, {"type": "video", "uri": str(work / "clip.mp4")})
        # The clip analysed as fast as the model takes frames, every frame (as the naive loop does):
        # decoded just ahead of the model, overlapping it.
        clip = {"type": "video", "uri": str(work / "clip.mp4"), "realtime": False, "loop": True}
        self.video_config = pipeline_config(key, case, clip)
        self.frames = [photo_720p(shift=8 * i) for i in range(16)]
        self.stage = Stage(self.config, LoadedModel(key, "1", "0" * 64, self.session))
        self.stage.warm_up()
        feeds, _ = self.stage.prepare(self.frames[0])
        self.feeds = feeds
        self.per_s = max(1.0, 1000.0 / self._probe_ms())  # a rough rate, to size each run
        # The pipelines run the session as the agent would load it: its trial (in a child process, as
        # the daemon's) may give the runtime one core fewer (backends.spare_core, docs/backends.md).
        # Judged on the reports, as the daemon judges a pipeline's candidates (bf16 moves boxes a little).
        policy = SelectionPolicy(fixed=backend, max_trials=1)
        judge = report_judge(self.config.postprocess, self.session.outputs)
        decision = decide([self.artifact], policy, feeds, judge=judge)
        chosen = next(c for c in decision.candidates if c.verdict == "chosen")
        self.agent_options = serving_options(policy, chosen)
        self.threads = chosen.threads
        self.agent_session = get_backend(backend).load(self.artifact, self.agent_options)

    def _probe_ms(self) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            self.session.run(self.feeds)
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    def close(self) -> None:
        self.session.close()
        self.agent_session.close()

    # --- contenders -------------------------------------------------------------------------

    def contenders(self) -> list[tuple[str, Callable[[], Run]]]:
        pace = self.case.pace_fps
        return [
            ("bare", self.bare),
            ("pipeline_memory", self.pipeline),
            ("naive", self.naive),
            ("pipeline_video", lambda: self.pipeline(video=True)),
            ("bare_paced", lambda: self.bare(fps=pace)),
            ("pipeline_paced", lambda: self.pipeline(fps=pace)),
        ]

    def bare(self, fps: float | None = None) -> Run:
        count = int(self.seconds * (fps or self.per_s))
        latencies = []
        with measured() as took:
            start = time.monotonic()
            for i in range(count):
                t0 = time.perf_counter()
                self.session.run(self.feeds)
                latencies.append((time.perf_counter() - t0) * 1000)
                if fps:
                    time.sleep(max(0.0, start + (i + 1) / fps - time.monotonic()))
        return Run(count, took["wall"], took["cpu"], {"latency_ms": latencies})

    def _writer(self, name: str) -> tuple[ResultWriter, Outbox]:
        state = self.work / f"state-{name}-{time.monotonic_ns()}"
        state.mkdir()
        mqtt = AgentConfig.model_validate({"device": {"id": "bench"}, "state_dir": str(state)}).mqtt
        outbox = Outbox(state / "outbox.sqlite")
        writer = ResultWriter("bench", mqtt.topic_prefix, mqtt.max_payload_bytes, outbox, lambda: None)
        return writer, outbox

    def pipeline(self, fps: float | None = None, video: bool = False, swap_at: float | None = None) -> Run:
        writer, outbox = self._writer("pipeline")
        stage = Stage(self.config, LoadedModel(self.key, "1", "0" * 64, self.agent_session))
        extra: dict[str, Any] = {}
        memory = None
        if video:
            pipeline = Pipeline(self.video_config, stage, writer)
        else:
            count = int(self.seconds * (fps or self.per_s * 1.5))
            memory = MemorySource(self.frames, count, fps)
            pipeline = Pipeline(self.config, stage, writer, source=(memory, memory))  # type: ignore[arg-type]
        done_at: list[float] = []
        submit = writer.submit

        latencies: list[float] = []

        def timed_submit(name: str, result: dict[str, Any]) -> None:
            latencies.append(result["latency_ms"]["capture_to_result"])
            submit(name, result)
            done_at.append(time.monotonic())

        writer.submit = timed_submit  # type: ignore[method-assign,assignment]
        try:
            with measured() as took:
                pipeline.start()
                if swap_at is not None:
                    time.sleep(swap_at)
                    extra["build_started_at"] = time.monotonic()
                    fresh = get_backend(self.backend).load(self.artifact, self.agent_options)
                    new = Stage(self.config, LoadedModel(self.key, "2", "0" * 64, fresh))
                    new.warm_up()
                    swapped_at = time.monotonic()
                    extra["swapped"] = pipeline.stages.swap_in(new, timeout=10)
                    extra["swapped_at"] = swapped_at
                limit = time.monotonic() + self.seconds * 4 + 30
                while not pipeline.finished and time.monotonic() < limit:
                    if video and len(done_at) >= self.seconds * self.per_s:
                        pipeline.request_stop()
                    time.sleep(0.02)
                pipeline.stop(timeout=10)
        finally:
            outbox.close()
        if memory is not None:
            extra["offered"], extra["source_dropped"] = memory.served, memory.dropped
        extra["done_at"] = done_at
        extra["latency_ms"] = latencies
        extra["errors"] = pipeline.errors
        return Run(pipeline.results, took["wall"], took["cpu"], extra)

    def naive(self) -> Run:
        """Decode, prepare, run, postprocess, JSON, one SQLite transaction: one frame at a time."""
        db = sqlite3.connect(self.work / f"naive-{time.monotonic_ns()}.sqlite")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE results (id INTEGER PRIMARY KEY, topic TEXT, payload BLOB)")
        capture = cv2.VideoCapture(str(self.work / "clip.mp4"), cv2.CAP_FFMPEG)
        count = int(self.seconds * self.per_s)
        results = 0
        with measured() as took:
            while results < count:
                ok, image = capture.read()
                if not ok:
                    capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                    continue
                feeds, geometry = self.stage.prepare(image)
                outputs = self.session.run(feeds)
                output = self.stage.postprocess(outputs, geometry)
                payload = json.dumps({"captured_at": time.time(), "output": output}).encode()
                with db:
                    db.execute("INSERT INTO results (topic, payload) VALUES (?, ?)", ("r", payload))
                results += 1
        capture.release()
        db.close()
        return Run(results, took["wall"], took["cpu"], {})


# --- the daemon as a whole: start-up and memory -------------------------------------------------

EDGE_AGENT = str(Path(sys.executable).parent / "edge-agent")
BARE_PROCESS = """
import json, sys, time
import numpy as np
path, backend, shape, seconds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
x = np.random.default_rng(0).random(shape, dtype=np.float32)
if backend.startswith("onnxruntime/"):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(path, options, providers=[backend.split("/")[1]])
    name = session.get_inputs()[0].name
    run = lambda: session.run(None, {name: x})
else:
    import openvino as ov
    compiled = ov.Core().compile_model(path, backend.split("/")[1])
    request = compiled.create_infer_request()
    run = lambda: request.infer([x])
end = time.monotonic() + seconds
while time.monotonic() < end:
    run()
    time.sleep(0.05)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"hwm_mb": int(status["VmHWM"].split()[0]) / 1024}))
"""


def compile_as_installed() -> None:
    """The daemon starts as installed: scripts/install.sh compiles every module's bytecode. An editable
    checkout run with PYTHONDONTWRITEBYTECODE=1 (as on the machine these figures come from) would
    compile agent/ and providers/ from source at each start instead (~0.35 s more to a first result)."""
    for package in ("agent", "providers"):
        compileall.compile_dir(str(ROOT / package), quiet=1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def results_stored(state_dir: Path) -> int:
    path = state_dir / "outbox.sqlite"
    if not path.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as db:
            row = db.execute("SELECT COUNT(*) FROM messages WHERE topic LIKE '%/results/%'").fetchone()
            return int(row[0])
    except sqlite3.Error:  # not created yet
        return 0


def decision_proven(state_dir: Path, pipeline: str) -> bool:
    path = state_dir / "decisions" / "pipelines" / f"{pipeline}.json"
    try:
        return bool(json.loads(path.read_text())["decision"]["checked"])
    except (OSError, ValueError, KeyError):
        return False


class Daemon:
    """One `edge-agent run` on a config with one pipeline: the clip, looping at the camera pace."""

    def __init__(
        self, work: Path, key: str, case: ModelCase, registry: str, fixed: str | None, cameras: int = 1
    ) -> None:
        self.work, self.key = work, key
        self.state_dir = work / f"daemon-{key}-{(fixed or 'auto').replace('/', '-')}-{cameras}"
        clip = {"type": "video", "uri": str(work / "clip.mp4"), "loop": True, "fps": case.pace_fps}
        pipelines: list[dict[str, Any]] = []
        for camera in range(cameras):
            pipeline: dict[str, Any] = {
                "name": key if camera == 0 else f"{key}-{camera + 1}",
                "model": {"name": key, "version": "1"},
                "source": clip,
                "preprocess": case.preprocess,
                "postprocess": case.postprocess,
            }
            if fixed:
                pipeline["backend"] = {"fixed": fixed}
            pipelines.append(pipeline)
        config = {
            "device": {"id": "bench"},
            "state_dir": str(self.state_dir),
            "mqtt": {"host": "127.0.0.1", "port": free_port()},  # no broker: results stay in the outbox
            "registry": {"url": registry},
            "pipelines": pipelines,
        }
        self.config = work / f"{self.state_dir.name}.yaml"
        self.config.write_text(json.dumps(config))

    def run(self, seconds_after_first: float = 0.0, until_proven: bool = False) -> dict[str, float]:
        """Start it; time to its first stored result; optionally keep it running, then stop it."""
        log = (self.work / f"{self.state_dir.name}.log").open("ab")
        before = results_stored(self.state_dir)  # a restart finds the last run's results still queued
        start = time.monotonic()
        proc = subprocess.Popen([EDGE_AGENT, "run", "-c", str(self.config)], stdout=log, stderr=log)
        figures: dict[str, float] = {}
        try:
            deadline = start + 180
            while results_stored(self.state_dir) <= before:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"edge-agent run gave no result; see {log.name}")
                time.sleep(0.01)
            figures["first_result_s"] = time.monotonic() - start
            end = time.monotonic() + seconds_after_first
            while time.monotonic() < end or (until_proven and not decision_proven(self.state_dir, self.key)):
                if time.monotonic() > deadline:
                    raise SystemExit(f"no proven decision in time; see {log.name}")
                time.sleep(0.1)
            figures["peak_rss_mb"] = peak_rss_mb(proc.pid)
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            figures["shared_libraries"] = len(
                {line.split()[-1] for line in maps.splitlines() if ".so" in line}
            )
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()
        return figures


def bare_rss_mb(path: Path, backend: str, shape: tuple[int, ...], seconds: float) -> float:
    out = subprocess.run(
        [sys.executable, "-c", BARE_PROCESS, str(path), backend, json.dumps(list(shape)), str(seconds)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1])["hwm_mb"])


def publish(work: Path, key: str, path: Path) -> str:
    registry = work / "registry"
    subprocess.run(
        [EDGE_AGENT, "registry", "publish", str(path), "--name", key, "--version", "1",
         "--registry", f"file://{registry}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return f"file://{registry}"


def daemon_rounds(
    work: Path, key: str, case: ModelCase, backends: list[str], shape: tuple[int, ...], rounds: int
) -> dict[str, list[float]]:
    """Start-up (first run with the default selection, then restarts with it cached) and peak RSS
    of the daemon with each backend fixed against a bare process, rounds interleaved."""
    registry = publish(work, key, case.path())
    figures: dict[str, list[float]] = {}
    for backend in backends:  # memory is measured on restarts: the first run's proof is a passing peak
        for cameras in (1, 2):
            Daemon(work, key, case, registry, backend, cameras=cameras).run(until_proven=True)
    for round_ in range(rounds):
        auto = Daemon(work, f"{key}", case, registry, None)
        shutil.rmtree(auto.state_dir, ignore_errors=True)  # a first run each round: nothing cached
        first = auto.run(until_proven=True)
        figures.setdefault("first_run_s", []).append(first["first_result_s"])
        again = auto.run()
        figures.setdefault("restart_s", []).append(again["first_result_s"])
        for backend in backends:
            fixed = Daemon(work, key, case, registry, backend)
            held = fixed.run(seconds_after_first=8.0)
            bare = bare_rss_mb(case.path(), backend, shape, 8.0)
            tag = backend.split("/")[0]
            figures.setdefault(f"rss_{tag}", []).append(held["peak_rss_mb"])
            figures.setdefault(f"bare_rss_{tag}", []).append(bare)
            figures.setdefault(f"rss_over_bare_{tag}", []).append(held["peak_rss_mb"] - bare)
            figures.setdefault(f"libs_{tag}", []).append(held["shared_libraries"])
            two = Daemon(work, key, case, registry, backend, cameras=2).run(seconds_after_first=8.0)
            figures.setdefault(f"second_camera_mb_{tag}", []).append(two["peak_rss_mb"] - held["peak_rss_mb"])
        print(
            f"{key} daemon round {round_ + 1}: " + ", ".join(f"{k}={v[-1]:.3g}" for k, v in figures.items())
        )
    return figures


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def fmt(values: list[float], digits: int = 2) -> str:
    """median (min-max) of the rounds."""
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", default="cls,det,yolo")
    parser.add_argument("--backends", default="ort,ov")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each timed run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    parser.add_argument("--plots", type=Path, default=None, help="write PNG plots into this folder")
    parser.add_argument("--no-daemon", action="store_true", help="skip start-up and memory of the daemon")
    parser.add_argument("--replot", type=Path, default=None, help="only redraw --plots from a run's .json")
    args = parser.parse_args()
    if args.replot is not None:
        saved = json.loads(args.replot.read_text())
        plot(saved["rows"], saved["daemons"], args.plots or Path("docs/img"))
        return 0
    keep_opencv_serial()  # as the daemon does
    compile_as_installed()
    keys = [k for k in args.models.split(",") if k]
    backends = [BACKENDS[b] for b in args.backends.split(",") if b]
    started = time.time()
    load_start = Path("/proc/loadavg").read_text().split()[:3]
    rows: list[dict[str, Any]] = []
    daemons: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        work = Path(tmp)
        make_video(work / "clip.mp4", frames=240, fps=1000)  # faster than any decoder here
        for key in keys:
            case = MODELS[key]
            for backend in backends:
                bench = Bench(key, case, backend, work, args.seconds)
                figures: dict[str, list[float]] = {}

                def add(name: str, value: float, into: dict[str, list[float]] = figures) -> None:
                    into.setdefault(name, []).append(value)

                for round_ in range(args.rounds):
                    contenders = bench.contenders()
                    if round_ % 2:
                        contenders.reverse()
                    runs = {name: run() for name, run in contenders}
                    for name, run in runs.items():
                        add(f"{name}_rate", run.rate)
                        add(f"{name}_cpu_ms", run.cpu_ms_per_result)
                    for name in ("bare_paced", "pipeline_paced"):
                        p50, p95 = np.percentile(runs[name].extra["latency_ms"], [50, 95])
                        add(f"{name}_latency_p50", float(p50))
                        add(f"{name}_latency_p95", float(p95))
                    add("memory_vs_bare", ratio(runs["pipeline_memory"].rate, runs["bare"].rate))
                    add("video_vs_naive", ratio(runs["pipeline_video"].rate, runs["naive"].rate))
                    add(
                        "paced_cpu_ratio",
                        ratio(runs["pipeline_paced"].cpu_ms_per_result, runs["bare_paced"].cpu_ms_per_result),
                    )
                    swap = bench.pipeline(fps=case.pace_fps, swap_at=args.seconds / 2)
                    done = np.array(swap.extra["done_at"])
                    gaps, ends = np.diff(done), done[1:]
                    # The swap itself: from the moment the built stage is handed over, for 1 s. Building
                    # it (loading, compiling, warming up) happens before, beside the serving stage.
                    swapped, built = swap.extra["swapped_at"], swap.extra["build_started_at"]
                    near = (ends >= swapped) & (ends <= swapped + 1.0)
                    building = (ends >= built) & (ends < swapped)
                    add("swap_gap_ms", float(gaps[near].max(initial=0.0)) * 1000)
                    add("build_gap_ms", float(gaps[building].max(initial=0.0)) * 1000)
                    add("steady_gap_ms", float(gaps[~near & ~building].max(initial=0.0)) * 1000)
                    add("swap_lost", swap.extra["offered"] - swap.results - swap.extra["errors"])
                    add("swap_dropped_at_source", swap.extra["source_dropped"])
                    print(
                        f"{key} {backend} round {round_ + 1}: "
                        + ", ".join(f"{k}={v[-1]:.3g}" for k, v in figures.items()),
                        flush=True,
                    )
                rows.append({"model": key, "backend": backend, "figures": figures, "threads": bench.threads})
                shape = tuple(next(iter(bench.feeds.values())).shape)
                bench.close()
            if not args.no_daemon:
                daemons[key] = daemon_rounds(work, key, case, backends, shape, args.rounds)
    report = render(rows, daemons, args, started, load_start)
    print(report)
    if args.out:
        args.out.write_text(report)
        # Every round's figures, for plots or other views later.
        args.out.with_suffix(".json").write_text(json.dumps({"rows": rows, "daemons": daemons}, indent=1))
    if args.plots:
        plot(rows, daemons, args.plots)
    return 0


def render(
    rows: list[dict[str, Any]],
    daemons: dict[str, dict[str, list[float]]],
    args: argparse.Namespace,
    started: float,
    load_start: list[str],
) -> str:
    import onnxruntime
    import openvino

    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    lines = [
        "# Pipeline benchmarks",
        "",
        "Generated by `scripts/bench_pipeline.py` (issue 15); every figure below is from the run described "
        "here. Rerun with:",
        "",
        "```sh",
        f".venv/bin/python scripts/bench_pipeline.py --models {args.models} --backends {args.backends} "
        f"--seconds {args.seconds:g} --rounds {args.rounds} --out docs/benchmarks-pipeline.md "
        "--plots docs/img",
        "```",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| date | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))} |",
        f"| CPU | {cpu}, {len(__import__('os').sched_getaffinity(0))} logical cores |",
        f"| OS, Python | {platform.platform()}, Python {platform.python_version()} |",
        f"| onnxruntime, openvino | {onnxruntime.__version__}, {openvino.__version__} |",
        f"| load average at start / end | {', '.join(load_start)} / "
        f"{', '.join(Path('/proc/loadavg').read_text().split()[:3])} |",
        f"| wall time | {time.time() - started:.0f} s |",
        "",
        "Each cell: median of the rounds (min-max). Rounds run every contender back to back, order "
        "reversed every other round. Input: a 1280x720 photo (scikit-image astronaut on a canvas, with "
        "text), in memory or as an H.264 clip decoded by the agent's video source (`realtime: false`: "
        "every frame, decoded just ahead of the model, as the naive loop reads every frame). Paced "
        "runs: at the model's camera pace (cls 30 fps, det and yolo 10 fps).",
        "",
        "## Targets",
        "",
        "| model | backend | pipeline/memory ÷ bare (≥ 0.95) | pipeline/video ÷ naive (≥ 1.25) | "
        "CPU per result paced, pipeline ÷ bare (≤ 1.10) | swap: longest gap in the 1 s after it, ms | "
        "longest gap while the new stage was built beside, ms | longest gap otherwise, ms (frame "
        "interval) | swap: results lost |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        f = row["figures"]
        interval = 1000 / MODELS[row["model"]].pace_fps
        cells = [
            row["model"],
            row["backend"],
            fmt(f["memory_vs_bare"]),
            fmt(f["video_vs_naive"]),
            fmt(f["paced_cpu_ratio"]),
            fmt(f["swap_gap_ms"], 0),
            fmt(f["build_gap_ms"], 0),
            f"{fmt(f['steady_gap_ms'], 0)} ({interval:.0f})",
            fmt(f["swap_lost"], 0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Results per second and CPU per result",
        "",
        "The bare and naive loops run on the runtime's default threads; the pipelines on the session as "
        "the agent loads it: its trial may give the runtime one core fewer (`backends.spare_core`), "
        "shown in the threads column (default: the runtime's own).",
        "",
        "| model | backend | pipeline threads | bare /s | pipeline/memory /s | naive /s | "
        "pipeline/video /s | CPU ms/result bare paced | CPU ms/result pipeline paced | "
        "paced: bare run p50 ms | paced: pipeline capture to result p50 / p95 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        f = row["figures"]
        threads = row.get("threads")
        cells = [row["model"], row["backend"], "default" if threads is None else str(threads)]
        cells += [
            fmt(f[f"{name}_rate"], 1) for name in ("bare", "pipeline_memory", "naive", "pipeline_video")
        ]
        cells += [fmt(f["bare_paced_cpu_ms"]), fmt(f["pipeline_paced_cpu_ms"])]
        cells += [fmt(f["bare_paced_latency_p50"]), f"{fmt(f['pipeline_paced_latency_p50'])} / "
                  f"{fmt(f['pipeline_paced_latency_p95'])}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if daemons:
        tags = [b.split("/")[0] for b in (BACKENDS[k] for k in args.backends.split(",") if k)]
        lines += [
            "",
            "## The daemon: start-up and memory",
            "",
            "`edge-agent run` in its own process, one pipeline (the clip looping at the camera pace), no "
            "broker, its modules' bytecode compiled as scripts/install.sh compiles it. "
            "*First run*: fresh state dir, default selection (nothing proven yet), the model "
            "pulled from a file registry; *restart*: model stored, decision cached. Peak RSS (VmHWM) after "
            "8 s of serving with the backend fixed, on a restart (a first run proves the backend on a frame "
            "first: a passing peak, not measured here), against a bare process that imports only the "
            "runtime, loads the model and runs it for as long. *A second camera*: the same daemon with two "
            "pipelines on the model (one shared session), less the one with one. Several cameras with and "
            "without cross-stream batching: `scripts/bench_batching.py`, docs/batching.md.",
            "",
            "| model | first run to first result, s (≤ 3) | restart to first result, s (≤ 1) | "
            + " | ".join(
                f"{t}: daemon RSS MB | {t}: bare RSS MB | {t}: daemon - bare MB (≤ 60) | {t}: libraries "
                f"| {t}: a second camera on the model, MB"
                for t in tags
            )
            + " |",
            "|---|---|---|" + "---|---|---|---|---|" * len(tags),
        ]  # fmt: skip
        for key, f in daemons.items():
            cells = [fmt(f["first_run_s"]), fmt(f["restart_s"])]
            for t in tags:
                cells += [fmt(f[f"rss_{t}"], 0), fmt(f[f"bare_rss_{t}"], 0), fmt(f[f"rss_over_bare_{t}"], 0),
                          fmt(f[f"libs_{t}"], 0), fmt(f[f"second_camera_mb_{t}"], 0)]  # fmt: skip
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], daemons: dict[str, dict[str, list[float]]], folder: Path) -> None:
    """Bar charts (median of the rounds) of throughput, CPU per result and latency at a camera's
    pace, and of memory: docs/img/bench-pipeline-*.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    labels = [f"{r['model']}\n{r['backend'].split('/')[0]}" for r in rows]

    def bars(
        name: str,
        title: str,
        ylabel: str,
        series: dict[str, list[float]],
        group: list[str],
        log: bool = False,
    ) -> None:
        fig, ax = plt.subplots(figsize=(9, 4))
        if log:  # models from 1 ms to 40 ms on one chart
            ax.set_yscale("log")
        x = np.arange(len(group))
        width = 0.8 / max(1, len(series))
        for i, (label, values) in enumerate(series.items()):
            ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
        ax.set_xticks(x, group)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / f"bench-pipeline-{name}.png", dpi=100)
        plt.close(fig)

    def median_of(key: str) -> list[float]:
        return [statistics.median(r["figures"][key]) for r in rows]

    bars(
        "throughput",
        "Saturated: pipeline vs bare loop and naive serial loop",
        "results per second (log scale)",
        {
            n.replace("_", "/"): median_of(f"{n}_rate")
            for n in ("bare", "pipeline_memory", "naive", "pipeline_video")
        },
        labels,
        log=True,
    )
    bars(
        "cpu",
        "At a camera's pace: CPU per result",
        "CPU ms per result",
        {"bare loop": median_of("bare_paced_cpu_ms"), "pipeline": median_of("pipeline_paced_cpu_ms")},
        labels,
    )
    bars(
        "latency",
        "At a camera's pace: bare run time vs pipeline capture to result",
        "ms",
        {
            "bare run p50": median_of("bare_paced_latency_p50"),
            "pipeline p50": median_of("pipeline_paced_latency_p50"),
            "pipeline p95": median_of("pipeline_paced_latency_p95"),
        },
        labels,
    )
    if daemons:
        tags = sorted(
            {
                k.removeprefix("rss_")
                for f in daemons.values()
                for k in f
                if k.startswith("rss_") and "over" not in k
            }
        )
        group = [f"{model}\n{tag}" for model in daemons for tag in tags]
        bars(
            "memory",
            "Peak RSS: the daemon with one pipeline vs a bare process",
            "MB",
            {
                "bare process": [
                    statistics.median(daemons[m][f"bare_rss_{t}"]) for m in daemons for t in tags
                ],
                "daemon": [statistics.median(daemons[m][f"rss_{t}"]) for m in daemons for t in tags],
            },
            group,
        )


if __name__ == "__main__":
    sys.exit(main())
