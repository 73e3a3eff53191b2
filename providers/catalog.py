"""The backends of this box without importing their runtimes: probed once in a child process,
cached on disk.

Importing every runtime to learn which backends exist costs the daemon the libraries and memory of
all of them (OpenVINO alone maps dozens of shared libraries), though a pipeline serves on one. So
the daemon asks a child process (`python -m providers.catalog`) to import and probe them all, and
caches the answer in `<cache_dir>/backends.json`, keyed by what can change it and is known without
importing a runtime: the runtimes' installed distributions, the hardware fingerprint, the Python,
system libraries (the linker cache) and this package's backend code. Each cached backend is a
`ProbedBackend`: its probe() is the cached one, and only load() imports its runtime (that one
only). supports() (operator coverage, asked when choosing) is answered in a child too while its
runtime is not loaded here, one child per runtime and model file, and the answers are cached in
the same file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from providers.base import (
    SYSROOT_ENV,
    Backend,
    BackendError,
    BackendOptions,
    ModelArtifact,
    ProbeResult,
    Session,
    Support,
    one_line,
)
from providers.registry import UnavailableBackend, all_backends, runtime_backends

log = logging.getLogger(__name__)

CACHE_FILE = "backends.json"
CHILD_TIMEOUT_S = 120.0  # importing OpenVINO and listing its devices takes seconds on a slow box
# Distributions whose version changes what the runtimes offer (normalised names; prefixes).
_RUNTIME_DISTRIBUTIONS = ("onnxruntime", "openvino", "ai-edge-litert", "tflite-runtime")
_FORMAT = 1  # bumped when the file's layout changes: an older file is then rebuilt


class _Checks:
    """What the backends of one cached list share: support answers (name -> sha256 -> Support),
    the runtimes already loaded here, and where to write new answers."""

    def __init__(
        self,
        path: Path | None = None,
        key: Mapping[str, Any] | None = None,
        python: str = sys.executable,
        timeout_s: float = CHILD_TIMEOUT_S,
    ) -> None:
        self.path, self.key, self.python, self.timeout_s = path, key, python, timeout_s
        self.backends: list[ProbedBackend] = []
        self.answers: dict[str, dict[str, Support]] = {}
        self.loaded: set[str] = set()  # runtimes imported in this process
        self.lock = threading.RLock()

    def supports(self, backend: ProbedBackend, artifact: ModelArtifact) -> Support:
        with self.lock:
            known = self.answers.get(backend.name, {}).get(artifact.sha256)
            if known is not None:
                return known
            if backend.runtime in self.loaded:  # no child to pay for: ask the runtime here
                support = backend.real().supports(artifact)
                self._remember({backend.name: support}, artifact)
                return support
            # One child for every usable backend of this runtime that reads the file (screening
            # asks them all in turn).
            names = [
                b.name
                for b in self.backends
                if b.runtime == backend.runtime and b.probe().available and artifact.format in b.formats
            ]
            try:
                answers = supports_in_child(names or [backend.name], artifact, self.python, self.timeout_s)
            except OSError as exc:
                log.warning(
                    "cannot start a child process to check %s on %s: %s; checking it in this process",
                    artifact.label,
                    backend.runtime,
                    one_line(exc),
                )
                support = backend.real().supports(artifact)
                self._remember({backend.name: support}, artifact)
                return support
            except BackendError as exc:  # a crash or a hang: the candidates cannot be trusted with it
                return Support(False, f"{backend.name}: {exc}")
            self._remember(answers, artifact)
            return answers.get(backend.name) or Support(False, f"{backend.name}: no answer from the check")

    def _remember(self, answers: Mapping[str, Support], artifact: ModelArtifact) -> None:
        for name, support in answers.items():
            self.answers.setdefault(name, {})[artifact.sha256] = support
        if self.path is not None and self.key is not None:
            _write(self.path, self.key, describe(self.backends), self.answers)


class ProbedBackend(Backend):
    """A backend as the child probed it; its runtime is imported on the first load() (supports()
    asks a child while the runtime is not loaded here)."""

    def __init__(self, entry: Mapping[str, Any], checks: _Checks | None = None) -> None:
        self.name = str(entry["name"])
        self.runtime = str(entry["runtime"])
        self.device = str(entry["device"])
        self.formats = frozenset(entry["formats"])
        native = entry.get("native_formats")
        self.native_formats = None if native is None else frozenset(native)
        self._probe = ProbeResult(
            self.name,
            bool(entry["available"]),
            str(entry["reason"]),
            {str(k): str(v) for k, v in dict(entry["versions"]).items()},
            tuple(str(d) for d in entry["devices"]),
        )
        self._real: Backend | None = None
        self._lock = threading.Lock()
        self._checks = checks or _Checks()
        self._checks.backends.append(self)

    def probe(self) -> ProbeResult:
        return self._probe

    def real(self) -> Backend:
        """The runtime's own backend of this name (imports that runtime only)."""
        with self._lock:
            self._checks.loaded.add(self.runtime)
            if self._real is None:
                found = [b for b in runtime_backends(self.runtime) if b.name == self.name]
                self._real = (
                    found[0]
                    if found
                    else UnavailableBackend(self.name, f"{self.runtime} no longer offers {self.name}")
                )
            return self._real

    @property  # read from the real backend, not set per instance
    def options_model(self) -> type[BackendOptions]:  # type: ignore[override]
        return self.real().options_model

    def supports(self, artifact: ModelArtifact) -> Support:
        if not self._probe.available:  # no runtime to import for a backend that cannot run here
            return Support(False, f"{self.name} is not available: {self._probe.reason}")
        return self._checks.supports(self, artifact)

    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        if not self._probe.available:
            raise BackendError(f"{self.name} is not available: {self._probe.reason}")
        return self.real().load(artifact, options)


def describe(backends: Sequence[Backend]) -> list[dict[str, Any]]:
    """Each backend's name, formats and probe, as JSON data (probe() runs here)."""
    described = []
    for backend in backends:
        probe = backend.probe()
        described.append(
            {
                "name": backend.name,
                "runtime": backend.runtime,
                "device": backend.device,
                "formats": sorted(backend.formats),
                "native_formats": None if backend.native_formats is None else sorted(backend.native_formats),
                "available": probe.available,
                "reason": probe.reason,
                "versions": dict(probe.versions),
                "devices": list(probe.devices),
            }
        )
    return described


_distributions: list[str] | None = None


def runtime_distributions() -> list[str]:
    """The installed runtime distributions as "name==version", read from their metadata (once per
    process: a runtime installed later is not what this process has imported)."""
    global _distributions
    if _distributions is None:
        found = set()
        for dist in _distributions_named(_RUNTIME_DISTRIBUTIONS):
            name = str(dist.metadata["Name"] or "").lower().replace("_", "-")
            if name.startswith(_RUNTIME_DISTRIBUTIONS):
                found.add(f"{name}=={dist.version}")
        _distributions = sorted(found)
    return _distributions


def _distributions_named(prefixes: tuple[str, ...]) -> Iterator[importlib.metadata.Distribution]:
    """The installed distributions whose name starts with one of `prefixes`, picked by the names of
    their metadata folders ("onnxruntime_gpu-1.20.1.dist-info"): only those are read, not the
    metadata of every package on the path (tens of ms at each start here, more on an SD card)."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip, a path that is gone
            continue
        for name in names:
            stem, _, suffix = name.rpartition(".")
            project = stem.split("-", 1)[0].lower().replace("_", "-")
            if suffix in ("dist-info", "egg-info") and project.startswith(prefixes):
                yield importlib.metadata.Distribution.at(os.path.join(entry or ".", name))


def _code_digest() -> str:
    """This package's discovery and probing code: an upgraded agent may know other backends."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("registry.py", "onnxruntime_backend.py", "openvino_backend.py", "tflite_backend.py"):
        try:
            digest.update((here / name).read_bytes())
        except OSError:
            digest.update(name.encode())
    return digest.hexdigest()[:16]


def _system_libraries() -> list[str]:
    """Drivers' user-space parts (OpenCL and Level Zero for OpenVINO's GPU and NPU) come as system
    packages, not distributions; installing one runs ldconfig, which rewrites the linker cache."""
    found = []
    for path in ("/etc/ld.so.cache", "/etc/OpenCL/vendors"):
        try:
            stat = os.stat(path)
            found.append(f"{path}:{stat.st_mtime_ns}:{stat.st_size}")
        except OSError:
            found.append(f"{path}:-")
    return found


def cache_key(hardware_fingerprint: str) -> dict[str, Any]:
    """What the probes depend on, learned without importing a runtime."""
    from providers.tflite_backend import edgetpu_library_files  # no runtime import: a file search

    return {
        "format": _FORMAT,
        "distributions": runtime_distributions(),
        "hardware": hardware_fingerprint,
        "python": sys.version,
        "executable": sys.executable,
        "sysroot": os.environ.get(SYSROOT_ENV, ""),
        # A .so install, not a distribution: its usual files, and the linker cache (system_libraries)
        # for one ldconfig knows elsewhere (asking ldconfig itself costs a child process each start).
        "libedgetpu": edgetpu_library_files(),
        "system_libraries": _system_libraries(),
        "code": _code_digest(),
    }


def probe_in_child(python: str = sys.executable, timeout_s: float = CHILD_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every backend, probed in a fresh `python -m providers.catalog`; BackendError saying why not."""
    with tempfile.TemporaryDirectory(prefix="edge-agent-probe-") as tmp:
        out = Path(tmp) / "backends.json"
        command = [python, "-m", "providers.catalog", "probe", str(out)]
        try:
            done = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise BackendError(f"the probe process gave no answer within {timeout_s:g} s") from None
        except OSError as exc:
            raise BackendError(f"cannot start the probe process ({python}): {one_line(exc)}") from None
        if done.returncode != 0 or not out.exists():
            raise BackendError(f"the probe process failed ({_failure(done)})")
        try:
            entries: list[dict[str, Any]] = json.loads(out.read_text())
            [ProbedBackend(e) for e in entries]  # every entry must make a backend
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"the probe process wrote an unreadable answer: {one_line(exc)}") from None
        return entries


def supports_in_child(
    names: Sequence[str],
    artifact: ModelArtifact,
    python: str = sys.executable,
    timeout_s: float = CHILD_TIMEOUT_S,
) -> dict[str, Support]:
    """Backend name -> whether it runs `artifact`, asked in a fresh `python -m providers.catalog`.
    OSError when the child cannot start; BackendError when it crashes, hangs or answers nonsense."""
    with tempfile.TemporaryDirectory(prefix="edge-agent-supports-") as tmp:
        request, out = Path(tmp) / "request.pickle", Path(tmp) / "answers.pickle"
        request.write_bytes(pickle.dumps((list(names), artifact)))
        command = [python, "-m", "providers.catalog", "supports", str(request), str(out)]
        try:
            done = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise BackendError(f"checking {artifact.label} gave no answer within {timeout_s:g} s") from None
        if done.returncode != 0 or not out.exists():
            raise BackendError(f"checking {artifact.label} failed: {_failure(done)}")
        answers = pickle.loads(out.read_bytes())
        if not isinstance(answers, dict) or not all(isinstance(v, Support) for v in answers.values()):
            raise BackendError(f"checking {artifact.label} gave an unreadable answer")
        return answers


def _failure(done: subprocess.CompletedProcess[bytes]) -> str:
    code = done.returncode
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    tail = " ".join(done.stderr.decode(errors="replace").split()[-40:])
    return f"{how}: {tail}"[:500]


_memo: dict[tuple[str, str], list[Backend]] = {}
_memo_lock = threading.Lock()


def cached_backends(
    cache_dir: Path,
    hardware_fingerprint: str,
    python: str = sys.executable,
    timeout_s: float = CHILD_TIMEOUT_S,
) -> list[Backend]:
    """This box's backends, from `cache_dir/backends.json` when its key still holds, else probed in
    a child process (and cached). When the child fails, probed here (as before there was a cache),
    with a warning. The same list is handed out again in this process while the key holds, so a
    runtime is imported (and a backend's support checks cached) once."""
    key = cache_key(hardware_fingerprint)
    memo_key = (str(cache_dir), json.dumps(key, sort_keys=True))
    with _memo_lock:
        if memo_key in _memo:
            return list(_memo[memo_key])
        backends = _read_or_probe(cache_dir / CACHE_FILE, key, python, timeout_s)
        _memo[memo_key] = backends
        return list(backends)


def forget_in_process() -> None:
    """Drop the lists handed out in this process, so the next call reads the file again (tests)."""
    with _memo_lock:
        _memo.clear()


def _read_or_probe(path: Path, key: Mapping[str, Any], python: str, timeout_s: float) -> list[Backend]:
    checks = _Checks(path, key, python, timeout_s)
    cached = _read(path, key)
    if cached is not None:
        entries, checks.answers = cached
        return [ProbedBackend(e, checks) for e in entries]
    try:
        entries = probe_in_child(python, timeout_s)
        backends: list[Backend] = [ProbedBackend(e, checks) for e in entries]
    except BackendError as exc:
        log.warning(
            "could not probe the inference runtimes in a child process: %s; probing them in this "
            "process (every runtime is loaded into the daemon)",
            exc,
        )
        backends = all_backends()
        entries = describe(backends)
    _write(path, key, entries)
    return backends


def _read(
    path: Path, key: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Support]]] | None:
    """The cached entries and support answers when the file is readable and made under `key`."""
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            log.info("the runtimes or hardware changed since %s was written: probing them again", path)
            return None
        entries: list[dict[str, Any]] = data["backends"]
        [ProbedBackend(e) for e in entries]  # every entry must make a backend
        answers = {
            str(name): {
                str(sha): Support(bool(ok), str(reason), tuple(ops))
                for sha, (ok, reason, ops) in by_sha.items()
            }
            for name, by_sha in data.get("supports", {}).items()
        }
        return entries, answers
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ignoring unreadable backend cache %s: %s", path, one_line(exc))
        return None


def _write(
    path: Path,
    key: Mapping[str, Any],
    entries: list[dict[str, Any]],
    answers: Mapping[str, Mapping[str, Support]] | None = None,
) -> None:
    """Atomically (a reader never sees half a file); a failure costs only the next start's probe."""
    supports = {
        name: {sha: [s.ok, s.reason, list(s.unsupported_ops)] for sha, s in by_sha.items()}
        for name, by_sha in (answers or {}).items()
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"key": key, "backends": entries, "supports": supports}, indent=2, sort_keys=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".backends-", delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    except OSError as exc:
        log.warning("could not cache the probed backends in %s: %s", path, one_line(exc))


def _main(argv: list[str]) -> int:
    if argv[0] == "probe":
        Path(argv[1]).write_text(json.dumps(describe(all_backends())))
        return 0
    if argv[0] == "supports":
        names, artifact = pickle.loads(Path(argv[1]).read_bytes())
        answers = {}
        for name in names:
            runtime = name.partition("/")[0]
            backend = next((b for b in runtime_backends(runtime) if b.name == name), None)
            answers[name] = (
                backend.supports(artifact) if backend is not None else Support(False, f"no backend {name}")
            )
        Path(argv[2]).write_bytes(pickle.dumps(answers))
        return 0
    print(f"usage: python -m providers.catalog probe OUT | supports REQUEST OUT (not {argv[0]!r})")
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
