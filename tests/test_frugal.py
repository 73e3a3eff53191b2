"""The daemon imports only the runtime it serves on (issue 15, "Frugal"): every runtime is probed in
a child process (providers/catalog.py), the answer cached under the state dir; a restart with its
decision cached maps onnxruntime's libraries, not OpenVINO's or LiteRT's."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from agent.backend_choice import box_backends, decision_key, policy_for
from agent.config import (
    AgentConfig,
    ClassificationPostprocess,
    DeviceConfig,
    ModelRef,
    PipelineConfig,
    RegistryConfig,
    VideoSourceConfig,
)
from agent.hardware import detect_hardware
from providers import all_backends, catalog
from providers.catalog import CACHE_FILE, ProbedBackend, cache_key, cached_backends, forget_in_process
from tests import daemon_fixtures
from tests.agent_process import StartAgent, pipeline_state
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, cls_artifact
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory
from tests.waits import wait_until

ORT_CPU = "onnxruntime/CPUExecutionProvider"
FINGERPRINT = "test-box"
BAD_PYTHON = "/nonexistent/python3"  # a child that cannot start
# Shared libraries of the runtimes the daemon does not serve on (path fragments in /proc/PID/maps).
FOREIGN_LIBRARIES = ("libopenvino", "ai_edge_litert", "tflite_runtime", "libtensorflowlite")
# What a restart on a stored model, an unsigned file registry and a cached decision never needs: the
# onnx package (the first run checks the pulled file with it) and cryptography (signatures).
RESTART_UNNEEDED = ("onnx_cpp2py_export", "cryptography/hazmat/bindings")


@pytest.fixture(autouse=True)
def fresh_process_memo() -> Iterator[None]:
    """Each test reads the cache file as a new daemon would."""
    forget_in_process()
    yield
    forget_in_process()


def _names(backends: list[Any]) -> list[str]:
    return [b.name for b in backends]


# --- the cache -------------------------------------------------------------------------------------


def test_the_child_probes_every_backend_as_this_process_would(tmp_path: Path) -> None:
    probed = cached_backends(tmp_path, FINGERPRINT)
    here = all_backends()
    assert _names(probed) == _names(here)
    assert all(isinstance(b, ProbedBackend) for b in probed)
    for cached, real in zip(probed, here, strict=True):
        assert cached.probe() == real.probe(), cached.name
        assert (cached.formats, cached.native_formats) == (real.formats, real.native_formats)
    data = json.loads((tmp_path / CACHE_FILE).read_text())
    assert data["key"] == cache_key(FINGERPRINT)
    assert any(d.startswith("onnxruntime==") for d in data["key"]["distributions"])


def test_a_cache_whose_key_holds_is_used_without_a_child(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = cached_backends(tmp_path, FINGERPRINT)
    forget_in_process()
    with caplog.at_level(logging.INFO, logger="providers.catalog"):
        again = cached_backends(tmp_path, FINGERPRINT, python=BAD_PYTHON)  # a child would fail
    assert caplog.text == ""
    assert all(isinstance(b, ProbedBackend) for b in again)
    assert [b.probe() for b in again] == [b.probe() for b in first]


def test_a_runtime_version_change_rebuilds_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cached_backends(tmp_path, FINGERPRINT)
    path = tmp_path / CACHE_FILE
    data = json.loads(path.read_text())
    # As written before onnxruntime was upgraded: another version, another answer.
    data["key"]["distributions"] = [
        "onnxruntime==0.0.1" if d.startswith("onnxruntime==") else d for d in data["key"]["distributions"]
    ]
    data["backends"][0]["reason"] = "written by the old version"
    path.write_text(json.dumps(data))
    forget_in_process()
    with caplog.at_level(logging.INFO, logger="providers.catalog"):
        rebuilt = cached_backends(tmp_path, FINGERPRINT)
    assert "changed since" in caplog.text
    assert "written by the old version" not in [b.probe().reason for b in rebuilt]
    assert json.loads(path.read_text())["key"] == cache_key(FINGERPRINT)


def test_the_runtime_versions_are_found_by_folder_name_as_a_full_metadata_scan_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache key reads only the runtimes' metadata (picked by folder name), not every package's;
    it must find what a scan of every installed distribution finds, an extra build among them."""

    def full_scan() -> list[str]:
        names = (
            (str(d.metadata["Name"] or "").lower().replace("_", "-"), d.version)
            for d in importlib.metadata.distributions()
        )
        return sorted({f"{n}=={v}" for n, v in names if n.startswith(catalog._RUNTIME_DISTRIBUTIONS)})

    monkeypatch.setattr(catalog, "_distributions", None)
    assert catalog.runtime_distributions() == full_scan()
    assert any(d.startswith("onnxruntime==") for d in catalog.runtime_distributions())
    # A GPU build installed beside it, in a folder of its own on the path (metadata as pip writes it)
    site = tmp_path / "site"
    (site / "onnxruntime_gpu-1.2.3.dist-info").mkdir(parents=True)
    (site / "onnxruntime_gpu-1.2.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.2.3\n"
    )
    (site / "numpy-9.9.dist-info").mkdir()  # not a runtime: never read
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    monkeypatch.setattr(catalog, "_distributions", None)
    assert "onnxruntime-gpu==1.2.3" in catalog.runtime_distributions()
    assert catalog.runtime_distributions() == full_scan()


def test_other_hardware_rebuilds_the_cache(tmp_path: Path) -> None:
    cached_backends(tmp_path, FINGERPRINT)
    cached_backends(tmp_path, "another-box")
    assert json.loads((tmp_path / CACHE_FILE).read_text())["key"]["hardware"] == "another-box"


@pytest.mark.parametrize("content", ["{not json", '{"key": {}}', '{"backends": [{"name": "x"}]}', "[]"])
def test_an_unreadable_cache_is_ignored_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    (tmp_path / CACHE_FILE).write_text(content)
    with caplog.at_level(logging.INFO, logger="providers.catalog"):
        backends = cached_backends(tmp_path, FINGERPRINT)
    assert "ignoring unreadable backend cache" in caplog.text or "changed since" in caplog.text
    assert _names(backends) == _names(all_backends())
    assert json.loads((tmp_path / CACHE_FILE).read_text())["key"] == cache_key(FINGERPRINT)


def test_a_failing_child_falls_back_to_probing_here(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="providers.catalog"):
        backends = cached_backends(tmp_path, FINGERPRINT, python=BAD_PYTHON)
    assert "could not probe the inference runtimes in a child process" in caplog.text
    assert BAD_PYTHON in caplog.text
    assert not any(isinstance(b, ProbedBackend) for b in backends)  # the runtimes' own, probed here
    assert _names(backends) == _names(all_backends())
    # What was probed here is cached all the same: the next start needs no child.
    forget_in_process()
    again = cached_backends(tmp_path, FINGERPRINT, python=BAD_PYTHON)
    assert [b.probe() for b in again] == [b.probe() for b in backends]


def test_a_cached_backend_imports_its_runtime_only(tmp_path: Path, cls_model_path: Path) -> None:
    cached_backends(tmp_path, FINGERPRINT)  # the cache, as a first start leaves it
    script = f"""
import json, sys
from pathlib import Path
from providers.catalog import cached_backends
from tests.media_fixtures import cls_artifact
backends = cached_backends(Path({str(tmp_path)!r}), {FINGERPRINT!r})
by_name = {{b.name: b for b in backends}}
artifact = cls_artifact(Path({str(cls_model_path)!r}))
# Screening asks every usable backend; the ones whose runtime is not loaded answer from a child.
answers = {{n: by_name[n].supports(artifact).ok for n in ("openvino/CPU", "openvino/AUTO", {ORT_CPU!r})}}
by_name[{ORT_CPU!r}].load(artifact).warm_up()
print(json.dumps([answers, sorted({{m.split(".")[0] for m in sys.modules}})]))
"""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True, cwd=root
    )
    answers, modules = json.loads(done.stdout.splitlines()[-1])
    assert answers == {"openvino/CPU": True, "openvino/AUTO": True, ORT_CPU: True}
    assert "onnxruntime" in modules
    assert not set(modules) & {"openvino", "ai_edge_litert", "tflite_runtime"}, modules
    # The answers are cached with the probes: the next start asks no child.
    sha = cls_artifact(cls_model_path).sha256
    supports = json.loads((tmp_path / CACHE_FILE).read_text())["supports"]
    assert supports["openvino/CPU"][sha][0] is True and supports[ORT_CPU][sha][0] is True


def test_a_support_check_without_a_child_is_made_here(
    tmp_path: Path, cls_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cached_backends(tmp_path, FINGERPRINT)
    forget_in_process()
    backends = {b.name: b for b in cached_backends(tmp_path, FINGERPRINT, python=BAD_PYTHON)}
    with caplog.at_level(logging.WARNING, logger="providers.catalog"):
        support = backends["openvino/CPU"].supports(cls_artifact(cls_model_path))
    assert support.ok
    assert "cannot start a child process to check" in caplog.text


def _config(state_dir: Path) -> AgentConfig:
    pipeline = PipelineConfig(
        name="signs",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        source=VideoSourceConfig(type="video", uri="unused.mp4"),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(type="classification", labels=CLS_LABELS),
    )
    return AgentConfig(
        device=DeviceConfig(id="box-1"),
        state_dir=state_dir,
        registry=RegistryConfig(url=f"file://{state_dir.parent / 'registry'}"),
        pipelines=[pipeline],
    )


def test_the_decision_key_is_the_same_from_the_cached_backends(tmp_path: Path, cls_model_path: Path) -> None:
    """A decision cached before the catalog existed is still found."""
    config = _config(tmp_path / "state")
    artifacts = [cls_artifact(cls_model_path)]
    hardware = detect_hardware()
    here = all_backends()
    cached = box_backends(config, hardware)
    pipeline = config.pipelines[0]
    assert policy_for(config, pipeline, cached) == policy_for(config, pipeline)
    assert decision_key(
        artifacts, [], policy_for(config, pipeline, cached), cached, hardware
    ) == decision_key(artifacts, [], policy_for(config, pipeline), here, hardware)


# --- the daemon ------------------------------------------------------------------------------------


def _mapped_libraries(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-1] for line in maps.splitlines() if ".so" in line.rsplit("/", 1)[-1]}


def test_the_daemon_and_cli_import_no_runtime_registry_client_or_crypto_up_front() -> None:
    """Each is imported where it is used: a runtime when a stage loads on it, httpx for an HTTP or
    OCI registry, cryptography when keys are trusted, onnx when a pulled file is checked."""
    code = "import json, sys, agent.cli, agent.daemon; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = {name.split(".")[0] for name in json.loads(done.stdout)}
    assert "agent" in modules and "cv2" in modules
    unneeded = {"onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime", "httpx", "cryptography"}
    unneeded.add("onnx")
    assert not modules & unneeded, sorted(modules & unneeded)


@pytest.mark.slow
def test_a_restarted_daemon_maps_only_the_runtime_it_serves_on(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path, _ = video
    signs = daemon_fixtures.pipeline("signs", str(path), loop=True)
    signs["backend"] = {"prefer": [ORT_CPU]}
    config = daemon_fixtures.write_config(tmp_path, mosquitto.port, registry_dir, [signs])
    state_dir = tmp_path / "state"
    results = mqtt_subscriber_factory(mosquitto, f"edge/{daemon_fixtures.DEVICE}/results/#")

    first = start_agent(config)  # pulls the model, probes and screens the runtimes in children, decides
    wait_until(lambda: results.messages or first.poll() is not None, "a first result",
               timeout=180, state=lambda: "; agent log:\n" + first.log()[-3000:])  # fmt: skip
    assert first.poll() is None, first.log()[-3000:]
    first_libraries = _mapped_libraries(first.proc.pid)
    first.stop()
    assert (state_dir / "cache" / CACHE_FILE).is_file()
    assert not [lib for lib in first_libraries if any(f in lib for f in FOREIGN_LIBRARIES)]

    started = datetime.now(timezone.utc)
    second = start_agent(config)

    def served_by_second() -> list[dict[str, Any]]:
        payloads = [json.loads(m.payload) for m in results.messages]
        return [r for r in payloads if daemon_fixtures.parse_time(r["produced_at"]) > started]

    wait_until(lambda: served_by_second() and second.poll() is None, "a result from the restarted daemon",
               timeout=180, state=lambda: "; agent log:\n" + second.log()[-3000:])  # fmt: skip
    assert pipeline_state(state_dir, "signs") == "running"
    libraries = _mapped_libraries(second.proc.pid)  # while it serves
    log = second.stop()
    assert "using the cached backend decision" in log
    assert "could not probe" not in log
    assert served_by_second()[0]["backend"] == ORT_CPU
    assert any("libonnxruntime" in lib for lib in libraries), sorted(libraries)
    foreign = sorted(lib for lib in libraries if any(f in lib for f in FOREIGN_LIBRARIES + RESTART_UNNEEDED))
    assert not foreign, foreign


def test_the_daemon_limits_glibc_malloc_arenas_unless_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Frames are allocated in one thread and freed in another: one arena per thread kept what each
    freed (scripts/bench_pipeline.py: a second camera 142 MB of RSS, 43 MB with 2 arenas)."""
    import platform

    from agent.daemon import limit_malloc_arenas

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # an operator's own setting is left alone
    assert limit_malloc_arenas() is False
