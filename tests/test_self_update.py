"""Self-update over the fleet channel (agent/self_update.py), with real everything: real wheels of
this project built with a changed version, published signed to a file registry, a real mosquitto,
and the test in systemd's part: it runs the installed `edge-agent run` (this worktree's code) and,
as systemd/edge-agent.service says (Restart=on-failure, RestartForceExitStatus=75), starts it
again whenever it exits with a status that is not a success, recording every exit.

9.0.0 is a good release; 9.1.0's `run` fails at start. The agent updates itself to 9.0.0 (exit 75,
restarted, runs and confirms 9.0.0), then to 9.1.0 (exit 75, restarted, 9.1.0 fails, restarted: the
boot goes back to 9.0.0 by itself), and reports each step; its pipeline serves on after it all."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import __version__, self_update
from agent.errors import DesiredStateError, ModelError, RegistryError
from agent.fleet import protocol
from agent.fleet.desired import layer_agent
from agent.fleet.document import parse_document
from agent.registry import PublishOptions
from agent.registry.file_registry import FileRegistry
from agent.registry.manifest import Manifest
from agent.registry.signing import TrustPolicy, generate_key, load_private_key
from agent.self_update import RESTART_EXIT_CODE, Updater, boot, read_current, write_current
from agent.store import ModelStore
from tests.agent_process import EDGE_AGENT, read_status
from tests.fleet_fixtures import GOOD, MODEL, Reported, agent_config, pipeline_body, publish
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "edge-agent.service"
DEVICE = "update-box"
GOOD_RELEASE, BROKEN_RELEASE = "9.0.0", "9.1.0"
HEALTH_S = 15
RESTART_SEC = 1.0  # the unit's RestartSec=5, shortened


def _without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


# --- the pieces, without processes ------------------------------------------------------------------


def _doc(layer: str, agent: Any, priority: int = 0) -> bytes:
    body = {"schema_version": 1, "target": layer, "generation": 1, "priority": priority, "agent": agent}
    return protocol.encode(body)


def _parse(payload: bytes, layer: str) -> Any:
    return parse_document(payload, layer, TrustPolicy(), 65536, time.time())


def test_the_agent_field_is_validated_and_the_device_layer_wins() -> None:
    with pytest.raises(DesiredStateError) as info:
        _parse(_doc("device:d1", {"version": "", "health_s": 5}), "device:d1")
    text = "\n".join(info.value.problems)
    assert "$.agent.version" in text and "$.agent.health_s" in text and "greater than or equal to 10" in text
    with pytest.raises(DesiredStateError) as info:
        _parse(_doc("device:d1", {"version": "1.0", "channel": "beta"}), "device:d1")
    assert "$.agent.channel: unknown key" in info.value.problems[0]
    group = _parse(_doc("group:lobby", {"version": "0.2.0"}), "group:lobby")
    device = _parse(_doc("device:d1", {"version": "0.3.0", "health_s": 30}), "device:d1")
    assert group.agent is not None and group.agent.release == "edge-agent" and group.agent.health_s == 60
    winner = layer_agent([device, group])
    assert winner is not None and winner[0].version == "0.3.0" and winner[1] == "device:d1"
    assert layer_agent([group])[0].version == "0.2.0"  # type: ignore[index]
    assert layer_agent([_parse(_doc("device:d1", None), "device:d1")]) is None


def test_a_deploy_spec_carries_the_agent_field_checked_as_the_devices_check_it() -> None:
    from agent.errors import ConfigError
    from agent.fleetctl.spec import build_document, check_spec, parse_spec

    spec = parse_spec({"pipelines": {}, "agent": {"version": "0.2.0", "health_s": 30}})
    check_spec(spec, "group:lobby")
    document = build_document("group:lobby", 3, spec.pipelines, agent=spec.agent)
    assert _parse(protocol.encode(document), "group:lobby").agent.version == "0.2.0"
    with pytest.raises(ConfigError, match=r"\$\.agent\.health_s"):
        check_spec(parse_spec({"pipelines": {}, "agent": {"version": "0.2.0", "health_s": 1}}), "group:lobby")


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("agent/__init__.py", "")
        archive.writestr("edge_agent-0.2.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return path


def test_a_release_wheel_is_published_signed_pulled_and_never_a_model(
    tmp_path: Path, cls_model_path: Path
) -> None:
    generate_key(tmp_path / "k")
    key = load_private_key(tmp_path / "k")
    registry = FileRegistry(tmp_path / "registry")
    wheel = _fake_wheel(tmp_path / "edge_agent-0.2.0-py3-none-any.whl")
    manifest = registry.publish(wheel, "edge-agent", "0.2.0", PublishOptions(sign_with=key))
    assert [a.format for a in manifest.artifacts] == ["wheel"] and manifest.is_release()
    assert manifest.models() == []
    not_a_wheel = tmp_path / "broken-0.1-py3-none-any.whl"
    not_a_wheel.write_bytes(b"not a zip")
    with pytest.raises(RegistryError, match="not a valid wheel"):
        registry.publish(not_a_wheel, "edge-agent", "0.1")
    with pytest.raises(ValueError, match="a release holds one wheel and nothing else"):
        Manifest.model_validate({**json.loads(manifest.to_bytes()), "artifacts": [
            *json.loads(manifest.to_bytes())["artifacts"],
            {"file": "m.onnx", "sha256": "0" * 64, "size": 1, "format": "onnx"}]})  # fmt: skip

    from agent.config import TrustedKey

    trust = TrustPolicy.from_config([TrustedKey(key=tmp_path / "k.pub", models=["edge-agent"])])
    store = ModelStore(tmp_path / "store", trust=trust)
    installed = store.pull(registry, "edge-agent", "0.2.0")
    assert installed.signed_by is not None
    assert store.verify("edge-agent", "0.2.0") == []
    assert installed.artifact_path(manifest.artifacts[0]).read_bytes() == wheel.read_bytes()
    with pytest.raises(ModelError, match="is an edge-agent release"):
        installed.model_artifacts()
    registry.publish(
        cls_model_path, "cls", "1", PublishOptions(sign_with=key)
    )  # the key is trusted for edge-agent only
    with pytest.raises(Exception, match="trusted only for models matching edge-agent"):
        store.pull(registry, "cls", "1")


class _Exec(Exception):
    pass


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def execve(program: Any, argv: list[str], env: dict[str, str]) -> None:
        assert "PYTHONPATH" not in env
        calls.append([str(program), *argv[1:]])
        raise _Exec

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(sys, "argv", ["edge-agent", "run", "-c", "agent.yaml"])
    return calls


def _venv(root: Path, version: str) -> Path:
    venv = root / "releases" / version / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "edge-agent").write_text("#!/bin/sh\n")
    (venv / "bin" / "edge-agent").chmod(0o755)
    return venv


def test_boot_execs_the_trial_once_then_rolls_back_to_the_previous(
    tmp_path: Path, execs: list[list[str]]
) -> None:
    boot(tmp_path)  # no current.json: the installed agent runs
    assert execs == []
    good, trial = _venv(tmp_path, "9.0.0"), _venv(tmp_path, "9.1.0")
    write_current(tmp_path, {"version": "9.1.0", "venv": str(trial), "state": "trial", "tries": 0,
                             "previous": {"version": "9.0.0", "venv": str(good)}, "health_s": 10,
                             "failed": {}})  # fmt: skip
    with pytest.raises(_Exec):
        boot(tmp_path)
    assert execs[-1] == [str(trial / "bin" / "edge-agent"), "run", "-c", "agent.yaml"]
    current = read_current(tmp_path)
    assert current is not None and current["tries"] == 1 and current["trial_pid"] == os.getpid()
    boot(tmp_path)  # the same process (as after exec): it is the trial, it runs
    assert len(execs) == 1
    write_current(tmp_path, {**current, "trial_pid": -1})  # a later start: the trial never confirmed
    with pytest.raises(_Exec):
        boot(tmp_path)
    assert execs[-1][0] == str(good / "bin" / "edge-agent")
    current = read_current(tmp_path)
    assert current is not None and current["state"] == "rolled-back" and current["version"] == "9.0.0"
    assert "9.1.0 stopped before it confirmed itself healthy" in current["failed"]["9.1.0"]
    with pytest.raises(_Exec):  # every later start runs 9.0.0
        boot(tmp_path)
    assert execs[-1][0] == str(good / "bin" / "edge-agent")
    write_current(tmp_path, {**current, "venv": sys.prefix})  # this process is the one named: it runs
    boot(tmp_path)
    assert len(execs) == 3


def test_reported_agent_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    restarts: list[str] = []
    health: list[str | None] = ["the broker is not connected"]
    updater = Updater(tmp_path, lambda name, version: tmp_path, lambda: health[0], restarts.append)
    assert updater.report() == {"version": __version__, "desired": None, "state": "current", "reason": None}
    updater.want(__version__)
    assert updater.report()["state"] == "current" and updater.report()["desired"] == __version__
    write_current(tmp_path, {"version": "0.0.1", "venv": sys.prefix, "state": "good",
                             "failed": {"7.0": "rolled back: boom"}, "rolled_back": "7.0"})  # fmt: skip
    updater.want("7.0")  # failed here before: not tried again, reported as such
    assert updater.report() == {"version": __version__, "desired": "7.0", "state": "rolled-back",
                                "reason": "rolled back: boom"}  # fmt: skip
    # A trial that never gets healthy rolls itself back after twice health_s, and asks for a restart.
    write_current(tmp_path, {"version": __version__, "venv": sys.prefix, "state": "trial", "tries": 1,
                             "health_s": 10, "previous": {"version": "0.0.1", "venv": "/old"},
                             "failed": {}})  # fmt: skip
    trial = Updater(tmp_path, lambda name, version: tmp_path, lambda: health[0], restarts.append)
    assert trial.report()["state"] == "trial"
    clock = [1000.0]
    monkeypatch.setattr(self_update.time, "monotonic", lambda: clock[0])
    trial._started = 1000.0
    clock[0] += 19
    trial.tick()
    assert restarts == []
    clock[0] += 2
    trial.tick()
    assert restarts == [f"self-update: rolling back from {__version__}"]
    current = read_current(tmp_path)
    assert current is not None and current["state"] == "rolled-back" and current["venv"] == "/old"
    assert "the broker is not connected" in current["failed"][__version__]
    # One that is healthy for long enough is confirmed good.
    write_current(tmp_path, {"version": __version__, "venv": sys.prefix, "state": "trial", "tries": 1,
                             "health_s": 10, "failed": {}})  # fmt: skip
    confirmed = Updater(tmp_path, lambda name, version: tmp_path, lambda: None, restarts.append)
    confirmed._started = clock[0]
    confirmed.tick()
    clock[0] += 10
    confirmed.tick()
    assert (read_current(tmp_path) or {}).get("state") == "good"
    assert confirmed.report()["state"] == "good"


# --- end to end -------------------------------------------------------------------------------------


def build_wheel(work: Path, version: str, broken: bool = False) -> Path:
    """A wheel of this worktree's code with `version`; `broken`: its `run` fails at start."""
    src = work / f"src-{version}"
    for package in ("agent", "providers"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    init = src / "agent" / "__init__.py"
    text, n = re.subn(r'__version__ = "[^"]+"', f'__version__ = "{version}"', init.read_text())
    assert n == 1
    init.write_text(text)
    if broken:
        cli = src / "agent" / "cli" / "run.py"
        marker = "    os.umask(0o077)\n"
        assert marker in cli.read_text()
        cli.write_text(
            cli.read_text().replace(
                marker, f'    raise RuntimeError("{version} is broken: run fails at start")\n', 1
            )
        )
    out = work / "wheels"
    # No build isolation (no index needed): the venv's setuptools builds it (>= 68: the dev extra).
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
         str(src)],
        capture_output=True, text=True, timeout=300, env=_without_pythonpath(),
    )  # fmt: skip
    assert built.returncode == 0, f"building the {version} wheel failed:\n{built.stderr[-3000:]}"
    (wheel,) = out.glob(f"edge_agent-{version}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("wheels")
    return {
        GOOD_RELEASE: build_wheel(work, GOOD_RELEASE),
        BROKEN_RELEASE: build_wheel(work, BROKEN_RELEASE, broken=True),
    }


def unit_restarts(code: int) -> bool:
    """Whether systemd/edge-agent.service restarts the agent after it exits with `code`:
    Restart=on-failure restarts after an exit that is not a success (0 and SuccessExitStatus=);
    RestartForceExitStatus= restarts whatever Restart= says."""
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            settings.setdefault(key.strip(), []).extend(value.split())
    assert settings["Restart"] == ["on-failure"]
    success = {0, *(int(v) for v in settings.get("SuccessExitStatus", []))}
    forced = {int(v) for v in settings.get("RestartForceExitStatus", [])}
    return code in forced or code not in success


class Systemd:
    """systemd's part: start `edge-agent run -c CONFIG` (the installed agent), and after every exit
    the unit restarts on, start it again after RESTART_SEC; at most `max_starts` starts."""

    def __init__(self, config: Path, log: Path, env: dict[str, str], max_starts: int = 8) -> None:
        self.config, self.log_path, self.env, self.max_starts = config, log, env, max_starts
        self.exits: list[int] = []
        self.starts: list[float] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while len(self.starts) < self.max_starts and not self._stopping.is_set():
            self.starts.append(time.time())
            with self.log_path.open("ab") as log:
                log.write(f"--- start {len(self.starts)} ---\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [EDGE_AGENT, "run", "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT,
                    env=self.env,
                )  # fmt: skip
                code = self.proc.wait()
            self.exits.append(code)
            if self._stopping.is_set() or not unit_restarts(code):
                return
            self._stopping.wait(RESTART_SEC)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        """`systemctl stop`: SIGTERM, no restart; the last exit status."""
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
        self._thread.join(120)
        return self.exits[-1] if self.exits else None

    def kill(self) -> None:
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


@pytest.fixture
def systemd_runs() -> Iterator[list[Systemd]]:
    started: list[Systemd] = []
    yield started
    for unit in started:
        unit.kill()


def test_the_unit_restarts_on_exit_75_without_counting_it_a_failure() -> None:
    text = UNIT.read_text()
    assert re.search(r"^RestartForceExitStatus=75$", text, re.M)
    assert re.search(r"^SuccessExitStatus=75$", text, re.M)
    assert unit_restarts(RESTART_EXIT_CODE) and unit_restarts(1) and not unit_restarts(0)


@pytest.mark.slow
def test_self_update_to_a_new_wheel_and_back_from_one_that_fails_to_start(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    wheels: dict[str, Path],
    video: tuple[Path, Any],
    systemd_runs: list[Systemd],
) -> None:
    key_path = tmp_path / "release.key"
    generate_key(key_path)
    key = load_private_key(key_path)
    registry_dir = tmp_path / "registry"
    registry = FileRegistry(registry_dir)
    registry.publish(cls_model_path, MODEL, GOOD, PublishOptions(sign_with=key))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the installed agent runs this worktree's code
    # A release is published like a model, by the CLI.
    published = subprocess.run(
        [EDGE_AGENT, "registry", "publish", str(wheels[GOOD_RELEASE]), "--name", "edge-agent", "--version",
         GOOD_RELEASE, "--registry", f"file://{registry_dir}", "--sign", str(key_path)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert "(wheel," in published.stdout, published.stdout
    registry.publish(wheels[BROKEN_RELEASE], "edge-agent", BROKEN_RELEASE, PublishOptions(sign_with=key))

    config = agent_config(
        tmp_path, DEVICE, mosquitto.port, registry_dir, {"cam": pipeline_body(GOOD, video[0], 5.0)},
        registry_settings={"trusted_keys": [{"key": f"{key_path}.pub", "models": ["*"]}]},
    )  # fmt: skip
    state_dir = tmp_path / DEVICE / "state"
    results = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/results/cam")
    reported = Reported(mosquitto, DEVICE)
    unit = Systemd(config, tmp_path / "journal.log", env)
    systemd_runs.append(unit)

    def journal() -> str:
        return "; journal:\n" + unit.log()[-6000:]

    def agent_is(version: str, state: str, since: float = 0.0) -> dict[str, Any]:
        return reported.wait(
            lambda r: (r.get("agent") or {}).get("version") == version and r["agent"]["state"] == state,
            f"agent {version} {state}",
            timeout=150,
            since=since,
        )

    try:
        first = agent_is("0.1.0", "current")
        assert first["agent"]["desired"] is None
        wait_until(lambda: len(results.messages) >= 3, "results from the installed agent", timeout=120,
                   state=journal)  # fmt: skip

        def deploy(generation: int, version: str) -> None:
            body = {"schema_version": 1, "target": f"device:{DEVICE}", "generation": generation,
                    "agent": {"version": version, "health_s": HEALTH_S}}  # fmt: skip
            publish(mosquitto, f"edge/{DEVICE}/desired", protocol.sign_envelope(protocol.encode(body), key))

        # 1. To 9.0.0: installed beside, exit 75, restarted into it, confirmed.
        deploy(1, GOOD_RELEASE)
        good = agent_is(GOOD_RELEASE, "good")
        assert good["agent"]["desired"] == GOOD_RELEASE and good["agent_version"] == GOOD_RELEASE
        assert unit.exits == [RESTART_EXIT_CODE], journal()
        assert read_status(state_dir).get("agent_version") == GOOD_RELEASE
        current = json.loads((state_dir / "releases" / "current.json").read_text())
        assert current["state"] == "good" and current["version"] == GOOD_RELEASE
        release_venv = state_dir / "releases" / GOOD_RELEASE / "venv"
        assert Path(current["venv"]) == release_venv and (release_venv / "bin" / "edge-agent").exists()
        assert current["previous"]["version"] == "0.1.0"
        log = unit.log()
        # The installed agent was this worktree's (its self-update lines), and it stopped gracefully.
        assert "self-update: installing edge-agent@9.0.0" in log
        assert f"stopping to be restarted (exit {RESTART_EXIT_CODE})" in log
        assert f"edge-agent {GOOD_RELEASE} running as {DEVICE}" in log
        assert "9.0.0 confirmed healthy" in log

        # 2. To 9.1.0, whose run fails at start: exit 75, restarted, it fails, restarted, and the
        # boot goes back to 9.0.0 by itself.
        before = len(unit.starts)
        deploy(2, BROKEN_RELEASE)
        wait_until(lambda: len(unit.starts) >= before + 2, "the restart into 9.1.0 and after its failure",
                   timeout=150, state=journal)  # fmt: skip
        back = agent_is(GOOD_RELEASE, "rolled-back", since=unit.starts[-1])
        assert back["agent"]["desired"] == BROKEN_RELEASE, back["agent"]
        assert "9.1.0 stopped before it confirmed itself healthy" in back["agent"]["reason"], back["agent"]
        assert unit.exits == [RESTART_EXIT_CODE, RESTART_EXIT_CODE, 1], journal()
        log = unit.log()
        assert "9.1.0 is broken: run fails at start" in log
        assert "rolling back from 9.1.0 to 9.0.0" in log
        current = json.loads((state_dir / "releases" / "current.json").read_text())
        assert current["state"] == "rolled-back" and current["version"] == GOOD_RELEASE
        assert BROKEN_RELEASE in current["failed"]

        # 3. The pipeline serves on, from 9.0.0; 9.1.0 is not tried again.
        count = len(results.messages)
        wait_until(lambda: len(results.messages) >= count + 5, "results after the rollback", timeout=90,
                   state=journal)  # fmt: skip
        wait_until(lambda: read_status(state_dir).get("agent_version") == GOOD_RELEASE, "status of 9.0.0",
                   timeout=30)  # fmt: skip
        assert unit.stop() == 0, journal()
        assert len(unit.exits) == 4, unit.exits
    finally:
        results.close()
        reported.close()
