"""Self-update: run the edge-agent release that desired state names (docs/fleet.md, Agent releases;
docs/operations.md, Self-update).

A release is a wheel published to the model registry (`edge-agent registry publish
edge_agent-0.2.0-py3-none-any.whl --name edge-agent --version 0.2.0 --sign KEY`), pulled into the
store (verified, and signed when the trust policy says so) and installed beside the running agent::

    <state_dir>/releases/<version>/venv        a venv holding only the release's own wheel; its
                                               dependencies are the installed ones (a .pth file)
    <state_dir>/releases/current.json          what runs, and how far its trial got

current.json: `{version, venv, state: trial|good|rolled-back, previous: {version, venv}, tries,
trial_pid, health_s, failed: {version: reason}, rolled_back}`.

The installed venv (/opt/edge-agent/venv, systemd's ExecStart) is the bootstrapper: `boot()` runs
in `edge-agent run` right after the config is loaded and exec()s the release current.json names
(same pid: systemd's notify and watchdog follow it). A trial gets one start: the process started
for it confirms itself healthy within `health_s` (`Updater.tick`), else it, or the next start after
it crashed, hung or exited, goes back to the previous version. Every boot after an update runs this
module of the *installed* agent, so `boot` stays small and its current.json handling stable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import __version__
from agent.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)

# EX_TEMPFAIL: "stopped to be started again". systemd/edge-agent.service restarts on it
# (RestartForceExitStatus=75) without counting it as a failure (SuccessExitStatus=75).
RESTART_EXIT_CODE = 75
CURRENT_FILE = "current.json"
DEPS_PTH = "edge-agent-deps.pth"  # in a release venv's site-packages: the dependencies it reuses
_STEP_TIMEOUT_S = 600.0


# --- current.json -------------------------------------------------------------------------------


def releases_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "releases"


def read_current(state_dir: Path) -> dict[str, Any] | None:
    """current.json, or None when there is none or it is not usable (then the installed agent runs)."""
    path = releases_dir(state_dir) / CURRENT_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("self-update: %s is unreadable (%s); running the installed agent", path, exc)
        return None
    if not isinstance(data, dict) or not isinstance(data.get("venv"), str) or not data.get("version"):
        log.error("self-update: %s has no version and venv; running the installed agent", path)
        return None
    return data


def write_current(state_dir: Path, data: dict[str, Any]) -> None:
    path = releases_dir(state_dir) / CURRENT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def this_venv() -> Path:
    return Path(sys.prefix).resolve()


def release_env() -> dict[str, str]:
    """The environment a release runs in: this one, less what would make its Python import other
    code than its own (PYTHONPATH, PYTHONHOME)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


# --- boot: which agent runs ------------------------------------------------------------------------


def boot(state_dir: Path) -> None:
    """Run the release current.json names: exec() it (never returns), or return when this process
    is the one that should run. Called before the daemon is built."""
    current = read_current(state_dir)
    if current is None:
        return
    venv = Path(current["venv"]).resolve()
    if current.get("state") == "trial":
        if not current.get("tries"):
            current.update(tries=1, trial_pid=os.getpid())
            write_current(state_dir, current)
            log.info("self-update: starting %s on trial", current["version"])
            if venv != this_venv():
                _exec(venv, state_dir)
            return
        if current.get("trial_pid") == os.getpid():
            return  # the trial itself, exec()ed a moment ago
        reason = (
            f"{current['version']} stopped before it confirmed itself healthy (it failed to start, crashed, "
            "exited or was stopped by the watchdog; its log is in the journal)"
        )
        current = roll_back(state_dir, current, reason)
        venv = Path(current["venv"]).resolve()
    if venv != this_venv():
        _exec(venv, state_dir)


def roll_back(state_dir: Path, current: dict[str, Any], reason: str) -> dict[str, Any]:
    """Make current.json name the previous version again (state rolled-back, the reason kept in
    `failed`); returns the new content."""
    previous = current.get("previous") or {"version": "installed", "venv": sys.prefix}
    log.error("self-update: rolling back from %s to %s: %s", current["version"], previous["version"], reason)
    failed = dict(current.get("failed") or {})
    failed[current["version"]] = reason
    back = {
        "version": previous["version"],
        "venv": previous["venv"],
        "state": "rolled-back",
        "previous": None,
        "tries": 0,
        "health_s": current.get("health_s"),
        "failed": failed,
        "rolled_back": current["version"],
    }
    write_current(state_dir, back)
    return back


def _exec(venv: Path, state_dir: Path) -> None:
    program = venv / "bin" / "edge-agent"
    if not os.access(program, os.X_OK):
        log.error("self-update: %s is missing; running the installed agent", program)
        return
    log.info("self-update: handing over to %s", program)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.execve(program, [str(program), *sys.argv[1:]], release_env())


# --- installing -----------------------------------------------------------------------------------


def install_release(venv: Path, wheel: Path, version: str) -> None:
    """Make `venv` a venv of this Python holding `wheel` (and reusing this agent's dependencies),
    whose `edge-agent --version` says `version`. RuntimeError saying what failed."""
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    env = {**release_env(), "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _step([sys.executable, "-m", "venv", "--without-pip", str(venv)], "creating the venv", env)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    # The release brings its own code; its dependencies (and pip) are this agent's. A release
    # whose dependencies changed needs them installed in the base venv first (docs/operations.md).
    (site / DEPS_PTH).write_text("".join(f"{path}\n" for path in dependency_dirs()))
    python = str(venv / "bin" / "python")
    _step(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "--quiet",
            str(wheel),
        ],
        "installing the wheel",
        env,
    )
    out = _step([str(venv / "bin" / "edge-agent"), "--version"], "the smoke test (edge-agent --version)", env)
    if out.split()[-1:] != [version]:
        raise RuntimeError(f"the smoke test (edge-agent --version) printed {out.strip()!r}, not {version}")


def dependency_dirs() -> list[str]:
    """Where this agent's dependencies are: its venv's site-packages, or, when it is a release
    itself, the ones its own .pth file names (so every release points at the installed venv)."""
    import site

    dirs: list[str] = []
    for path in site.getsitepackages():
        pth = Path(path) / DEPS_PTH
        if pth.is_file():
            dirs += [line for line in pth.read_text().splitlines() if line.strip()]
        else:
            dirs.append(path)
    return list(dict.fromkeys(dirs))


def _step(command: list[str], what: str, env: dict[str, str]) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=_STEP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{what} failed: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' / '.join(tail)}")
    return done.stdout


# --- the daemon's side ------------------------------------------------------------------------------


class Updater:
    """Installs the release desired state names, asks for the restart into it, and, while this
    process is a release on trial, confirms it healthy or rolls it back.

    `pull(name, version)` returns the verified wheel's path in the store; `health()` is None while
    the agent is healthy (broker connected, every pipeline running), else why not;
    `request_restart(reason)` stops the daemon gracefully with RESTART_EXIT_CODE."""

    def __init__(
        self,
        state_dir: Path,
        pull: Callable[[str, str], Path],
        health: Callable[[], str | None],
        request_restart: Callable[[str], None],
    ) -> None:
        self.state_dir = Path(state_dir)
        self._pull = pull
        self._health = health
        self._request_restart = request_restart
        self._lock = threading.Lock()
        self._wanted: tuple[str, str, float] | None = None  # version, release, health_s
        self._installing: str | None = None
        self._state: str | None = None  # installing | failed | restarting, for the wanted version
        self._reason: str | None = None
        self._started = time.monotonic()
        self._healthy_since: float | None = None
        current = read_current(self.state_dir)
        self._trial = (
            current is not None
            and current.get("state") == "trial"
            and Path(current["venv"]).resolve() == this_venv()
        )

    def want(self, version: str | None, release: str = "edge-agent", health_s: float = 60.0) -> None:
        """The release desired state names now (None: none is named); installs it when it is not the
        running one, off the caller's thread."""
        with self._lock:
            wanted = None if version is None else (version, release, health_s)
            if wanted == self._wanted:
                return
            self._wanted, self._state, self._reason = wanted, None, None
            if version is None or version == __version__ or self._installing is not None:
                return  # an install in progress checks _wanted when it ends
            failed = (read_current(self.state_dir) or {}).get("failed") or {}
            if version in failed:
                log.warning(
                    "self-update: %s failed here before (%s); not tried again", version, failed[version]
                )
                return
            self._installing = version
            self._state = "installing"
        threading.Thread(
            target=self._install, args=(version, release, health_s), name="self-update", daemon=True
        ).start()

    def _install(self, version: str, release: str, health_s: float) -> None:
        venv = releases_dir(self.state_dir) / version / "venv"
        try:
            log.info("self-update: installing %s@%s into %s", release, version, venv)
            wheel = self._pull(release, version)
            install_release(venv, wheel, version)
        except Exception as exc:  # pull, venv, pip or the smoke test: reported, the agent runs on
            reason = f"installing {release}@{version} failed: {getattr(exc, 'message', None) or exc}"
            log.error("self-update: %s", reason)
            with contextlib.suppress(OSError):
                shutil.rmtree(venv.parent)
            with self._lock:
                self._installing = None
                if self._wanted is not None and self._wanted[0] == version:
                    self._state, self._reason = "failed", reason
                    current = read_current(self.state_dir) or self._running_entry()
                    current.setdefault("failed", {})[version] = reason
                    write_current(self.state_dir, current)
            return
        with self._lock:
            self._installing = None
            if self._wanted is None or self._wanted[0] != version:
                log.info("self-update: %s installed, but no longer wanted", version)
                wanted = self._wanted
            else:
                wanted = None
                self._commit(version, venv, health_s)
        if wanted is not None:  # desired state moved on during the install
            self._wanted = None
            self.want(*wanted)

    def _running_entry(self) -> dict[str, Any]:
        return {"version": __version__, "venv": str(this_venv()), "state": "good", "failed": {}}

    def _commit(self, version: str, venv: Path, health_s: float) -> None:
        current = read_current(self.state_dir)
        if current is None or current.get("state") != "trial":
            previous = {"version": __version__, "venv": str(this_venv())}
        else:  # replacing a trial: go back to what it would have gone back to
            previous = current.get("previous") or {"version": __version__, "venv": str(this_venv())}
        write_current(
            self.state_dir,
            {
                "version": version,
                "venv": str(venv),
                "state": "trial",
                "previous": previous,
                "tries": 0,
                "health_s": health_s,
                "failed": (current or {}).get("failed") or {},
                "rolled_back": None,
            },
        )
        self._state = "restarting"
        log.info("self-update: %s installed; restarting into it (exit %d)", version, RESTART_EXIT_CODE)
        self._request_restart(f"self-update to {version}")

    def tick(self) -> None:
        """From the daemon's loop: while on trial, confirm this version or roll it back."""
        if not self._trial:
            return
        current = read_current(self.state_dir)
        if current is None or current.get("state") != "trial":
            self._trial = False
            return
        health_s = float(current.get("health_s") or 60.0)
        now = time.monotonic()
        problem = self._health()
        if problem is None:
            self._healthy_since = self._healthy_since or now
        else:
            self._healthy_since = None
        up = now - self._started
        if self._healthy_since is not None and up >= health_s and now - self._healthy_since >= health_s / 2:
            current.update(state="good", tries=0, trial_pid=None)
            write_current(self.state_dir, current)
            self._trial = False
            log.info("self-update: %s confirmed healthy after %.0f s; it stays", __version__, up)
        elif up >= 2 * health_s:
            self._trial = False
            reason = (
                f"{__version__} was not healthy within {2 * health_s:g} s: {problem or 'not for long enough'}"
            )
            roll_back(self.state_dir, current, reason)
            self._request_restart(f"self-update: rolling back from {__version__}")

    def report(self) -> dict[str, Any]:
        """`agent` in reported state: the running version, the desired one, and where it stands."""
        current = read_current(self.state_dir) or {}
        with self._lock:
            wanted = self._wanted[0] if self._wanted else None
            state, reason = self._state, self._reason
        mine = Path(current.get("venv", "/nonexistent")).resolve() == this_venv()
        if state is None:
            failed = current.get("failed") or {}
            if wanted is not None and wanted != __version__ and wanted in failed:
                state = "rolled-back" if current.get("rolled_back") == wanted else "failed"
                reason = failed[wanted]
            elif mine and current.get("state") in ("trial", "good"):
                state = current["state"]
            else:
                state = "current"
        return {"version": __version__, "desired": wanted, "state": state, "reason": reason}
