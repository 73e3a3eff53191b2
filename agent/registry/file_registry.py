"""A model registry in a plain directory (local disk or a shared mount): `file:///srv/registry`.

Layout::

    <root>/index.json                          models and their versions (for HTTP readers)
    <root>/<name>/<version>/manifest.json
    <root>/<name>/<version>/manifest.json.sig  its signatures, when signed (agent/registry/signing.py)
    <root>/<name>/<version>/<artifact files>
    <root>/.locks/<name>@<version>.lock        (publishers only)

A version exists once its manifest.json exists. index.json is rewritten after each publish
from what is on disk, so the folder can be served as is by a web server (agent/registry/
http_registry.py), which cannot list directories. `publish` writes every artifact through a temp
file and `os.replace`, and the manifest last, so a reader never sees a half-published version.
Versions are immutable: publishing an existing one is refused unless forced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

from agent.config import NAME_PATTERN
from agent.errors import EdgeAgentError, ModelError, RegistryError
from agent.fsutil import atomic_write_bytes, copy_hashing, file_lock, fsync_dir, temp_name
from agent.registry.manifest import (
    INDEX_FILE,
    MANIFEST_FILE,
    MODEL_FORMATS,
    SIGNATURE_FILE,
    TESTDATA_FORMAT,
    WHEEL_FORMAT,
    Artifact,
    Manifest,
    ManifestDocument,
    check_manifest_digest,
    check_model_file,
    key_path,
)
from agent.testdata import TestFile, testdata_files
from providers.base import ModelArtifact

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger(__name__)

_NAME_RE = re.compile(NAME_PATTERN)

SUFFIX_FORMATS: dict[str, str] = {".onnx": "onnx", ".tflite": "tflite", ".xml": "openvino-ir"}
# What `publish` takes besides models: an edge-agent release wheel (never a model.path).
PUBLISH_SUFFIX_FORMATS: dict[str, str] = {**SUFFIX_FORMATS, ".whl": WHEEL_FORMAT}


def version_sort_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """Natural order: 1.2 < 1.10 < 2; numbers compare as numbers, text as text."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", version) if part
    )


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_name(kind: str, value: str, error: type[EdgeAgentError]) -> None:
    """Names become path components: refuse anything outside NAME_PATTERN before touching disk."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise error(f"invalid model {kind} {value!r}: must match {NAME_PATTERN}")


# --- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishOptions:
    """How a version is published (`FileRegistry.publish`, `publish_version`, `registry publish`):
    `format` (None: from the file's suffix) and `target` of its artifact, manifest `metadata`
    (labels, ...), `force` (replace an existing version), `testdata` (.npz archives or ONNX
    model-zoo folders) with the tolerances `rtol`/`atol` their expected outputs hold to, and a key
    to sign the manifest with (`sign_with`)."""

    format: str | None = None
    target: str = "any"
    metadata: Mapping[str, Any] | None = None
    force: bool = False
    testdata: Sequence[Path] = ()
    sign_with: Ed25519PrivateKey | None = None
    rtol: float | None = None
    atol: float | None = None


class FileRegistry:
    """Registry in a directory tree; see the module docstring for the layout."""

    def __init__(self, root: Path, lock_timeout_s: float = 60.0) -> None:
        self.root = Path(root).absolute()
        self.lock_timeout_s = lock_timeout_s

    @classmethod
    def from_url(cls, url: str) -> FileRegistry:
        """`file:///abs/path` (or `file://localhost/abs/path`) -> FileRegistry."""
        parts = urlsplit(url)
        if parts.scheme != "file":
            raise RegistryError(f"not a file:// registry URL: {url!r}")
        if parts.netloc not in ("", "localhost"):
            raise RegistryError(
                f"file registry URL {url!r} names host {parts.netloc!r}",
                hint="use three slashes and an absolute path, e.g. file:///srv/registry",
            )
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise RegistryError(
                f"file registry URL {url!r} needs an absolute path, e.g. file:///srv/registry"
            )
        return cls(Path(path))

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def __repr__(self) -> str:
        return f"FileRegistry({self.url})"

    def close(self) -> None:
        """Nothing to let go of (the Registry protocol's close)."""

    # reading

    def list_models(self) -> list[str]:
        self._require_root()
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and _NAME_RE.match(p.name) is not None
        )

    def list_versions(self, name: str) -> list[str]:
        """Published versions of `name` (those with a manifest), in natural version order."""
        check_name("name", name, RegistryError)
        model_dir = self.root / name
        if not model_dir.is_dir():
            self._require_root()
            models = ", ".join(self.list_models()) or "none"
            raise RegistryError(
                f"model {name!r} not found in registry {self.url} (models available: {models})"
            )
        versions = [
            p.name
            for p in model_dir.iterdir()
            if _NAME_RE.match(p.name) is not None and (p / MANIFEST_FILE).is_file()
        ]
        return sorted(versions, key=version_sort_key)

    def get_manifest(self, name: str, version: str) -> Manifest:
        return self.fetch_manifest(name, version).manifest

    def fetch_manifest(self, name: str, version: str, digest: str | None = None) -> ManifestDocument:
        """The manifest with its exact bytes and its signature file (None when unsigned);
        `digest` ("sha256:<hex>") pins the manifest's bytes."""
        check_name("name", name, RegistryError)
        check_name("version", version, RegistryError)
        path = self.root / name / version / MANIFEST_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise self._version_missing(name, version) from None
        except OSError as exc:
            raise RegistryError(f"cannot read {path}: {exc.strerror}") from None
        if digest is not None:
            check_manifest_digest(data, digest, str(path))
        manifest = Manifest.parse_bytes(data, str(path))
        if manifest.name != name or manifest.version != version:
            raise RegistryError(
                f"invalid model manifest {path}: "
                f"it describes {manifest.ref} but is stored as {name}@{version}"
            )
        signature_path = path.with_name(SIGNATURE_FILE)
        try:
            signature: bytes | None = signature_path.read_bytes()
        except FileNotFoundError:
            signature = None
        except OSError as exc:
            raise RegistryError(f"cannot read {signature_path}: {exc.strerror}") from None
        return ManifestDocument(manifest, data, signature, str(path))

    def open_artifact(self, name: str, version: str, artifact: Artifact | str) -> BinaryIO:
        """Open one artifact file for streaming reads (the caller closes it)."""
        check_name("name", name, RegistryError)
        check_name("version", version, RegistryError)
        file = artifact.file if isinstance(artifact, Artifact) else artifact
        if not file or "/" in file or ".." in file or file.startswith("."):
            raise RegistryError(f"invalid artifact file name {file!r}")
        path = self.root / name / version / file
        try:
            return path.open("rb")
        except FileNotFoundError:
            if not (self.root / name / version / MANIFEST_FILE).is_file():
                raise self._version_missing(name, version) from None
            raise RegistryError(
                f"artifact {file} of {name}@{version} is missing from registry {self.url} (expected {path})"
            ) from None
        except OSError as exc:
            raise RegistryError(f"cannot open {path}: {exc.strerror}") from None

    def open_artifact_at(
        self, name: str, version: str, artifact: Artifact | str, offset: int, validator: str | None = None
    ) -> tuple[int, BinaryIO]:
        """The artifact from byte `offset` (a resumed pull); `validator` is for HTTP registries:
        a local file that changed meanwhile is caught by the store's hash check."""
        stream = self.open_artifact(name, version, artifact)
        try:
            size = os.fstat(stream.fileno()).st_size
            start = offset if 0 < offset <= size else 0
            stream.seek(start)
        except OSError as exc:
            stream.close()
            raise RegistryError(f"cannot read {getattr(stream, 'name', artifact)}: {exc.strerror}") from None
        return start, stream

    def _require_root(self) -> None:
        if not self.root.is_dir():
            raise RegistryError(f"registry {self.url} does not exist (no directory {self.root})")

    def _version_missing(self, name: str, version: str) -> RegistryError:
        if (self.root / name / version).is_dir():
            return RegistryError(
                f"model {name!r} version {version!r} in registry {self.url} has no {MANIFEST_FILE} "
                "(it is being published, or a publish was interrupted)"
            )
        versions = self.list_versions(name)  # raises when the model itself is missing
        available = ", ".join(versions) if versions else "none"
        return RegistryError(
            f"model {name!r} version {version!r} not found in registry {self.url}, "
            f"versions available: {available}"
        )

    # writing

    def publish(
        self, model_path: Path, name: str, version: str, options: PublishOptions | None = None
    ) -> Manifest:
        """Copy a model file in as `name@version` and write its manifest; return the manifest.

        The format is inferred from the suffix (.onnx, .tflite, .xml) unless `options` give it. An
        OpenVINO .xml is published together with the .bin beside it. The file must be a valid model
        of its format (for ONNX: what the onnx checker accepts). The test data are .npz archives of
        inputs (and expected outputs) for it (agent/testdata.py), or ONNX model-zoo folders
        (`test_data_set_N` of input_K.pb/output_K.pb, or a folder of them), converted to .npz
        archives, one per set; `rtol`/`atol` are the tolerances their expected outputs hold to
        (model-zoo data default to the onnx backend test runner's 1e-3/1e-7). With test data, some
        candidate of this box (backend x artifact, an upgraded opset included) must give the
        expected outputs on every set (agent/validate.py), else the version is refused with each
        backend's reason. `sign_with` signs the manifest (its signature
        file is written before the manifest, so the version never shows up unsigned). An existing
        version is refused unless `force` (versions are immutable).
        """
        options = options or PublishOptions()
        format, target, testdata = options.format, options.target, options.testdata
        check_name("name", name, RegistryError)
        check_name("version", version, RegistryError)
        model_path = Path(model_path)
        if not model_path.is_file():
            raise RegistryError(f"cannot publish {model_path}: no such file")
        if format is None:
            inferred = PUBLISH_SUFFIX_FORMATS.get(model_path.suffix.lower())
            if inferred is None:
                raise RegistryError(
                    f"cannot tell the model format of {model_path.name} from its suffix",
                    hint=f"name it {', '.join(PUBLISH_SUFFIX_FORMATS)} or pass format=",
                )
            format = inferred
        sources = [model_path]
        if format == "openvino-ir":
            weights = model_path.with_suffix(".bin")
            if not weights.is_file():
                raise RegistryError(
                    f"cannot publish {model_path}: OpenVINO IR weights {weights.name} not found beside it"
                )
            sources.append(weights)

        if format not in (*MODEL_FORMATS, WHEEL_FORMAT):
            raise RegistryError(
                f"cannot publish {model_path}: unknown format {format!r}; "
                f"expected one of {', '.join((*MODEL_FORMATS, WHEEL_FORMAT))}"
            )
        if format == WHEEL_FORMAT and testdata:
            raise RegistryError(f"cannot publish {model_path}: a release wheel takes no test data")
        for src in sources:
            _check_artifact_fields(src.name, format, target)
        with tempfile.TemporaryDirectory(prefix="edge-agent-testdata-") as converted:
            try:
                tests = testdata_files(
                    testdata, model_path, format, Path(converted), options.rtol, options.atol
                )
            except ModelError as exc:
                raise RegistryError(exc.message) from None
            for test in tests:
                _check_artifact_fields(test.name, TESTDATA_FORMAT, "any")
            names = [src.name for src in sources] + [t.name for t in tests]
            if len(set(names)) != len(names):
                raise RegistryError(
                    f"cannot publish {model_path}: two files share a name ({', '.join(names)})"
                )
            return self._publish(sources, tests, name, version, format, options, model_path)

    def _publish(
        self,
        sources: list[Path],
        tests: list[TestFile],
        name: str,
        version: str,
        format: str,
        options: PublishOptions,
        model_path: Path,
    ) -> Manifest:
        """The checked `sources` (in `format`: the options' own, or the suffix's) and `tests` in as
        `name@version`, with the options' target, metadata, force and signature."""
        target, sign_with = options.target, options.sign_with
        version_dir = self.root / name / version
        manifest_path = version_dir / MANIFEST_FILE
        with self._lock(name, version):
            exists = manifest_path.exists()
            if exists and not options.force:
                raise RegistryError(
                    f"model {name!r} version {version!r} already exists in registry {self.url}",
                    hint="versions are immutable (a fleet relies on that): publish a new version, "
                    "or pass force=True to replace it",
                )
            created_dir = not version_dir.exists()
            created_model_dir = not version_dir.parent.exists()
            version_dir.mkdir(parents=True, exist_ok=True)
            staged: list[tuple[Path, Artifact]] = []
            try:
                # Stage (copy, hash, validate) everything before touching what is published.
                for i, src in enumerate(sources):
                    staged.append(self._stage(src, version_dir, format, target, validate=(i == 0)))
                for test in tests:
                    fields = {"rtol": test.rtol, "atol": test.atol}
                    staged.append(
                        self._stage(test.path, version_dir, TESTDATA_FORMAT, "any", True, test.name, fields)
                    )
                if tests:
                    _require_a_correct_candidate(f"{name}@{version}", staged, format, model_path)
                artifacts = [artifact for _tmp, artifact in staged]
                manifest = Manifest(
                    schema_version=1,
                    name=name,
                    version=version,
                    created=utc_now_iso(),
                    artifacts=artifacts,
                    metadata=dict(options.metadata or {}),
                )
                old = self._read_existing(manifest_path) if exists else None
                data = manifest.to_bytes()
                signature_path = version_dir / SIGNATURE_FILE
                if exists:
                    log.warning("replacing published version %s@%s in %s (force)", name, version, self.url)
                    os.unlink(manifest_path)  # the version disappears first: nobody mixes old and new files
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(signature_path)  # it signed the old bytes
                    fsync_dir(version_dir)
                for tmp, artifact in staged:
                    os.replace(tmp, version_dir / artifact.file)
                staged = []
                fsync_dir(version_dir)
                if sign_with is not None:
                    from agent.registry.signing import sign

                    atomic_write_bytes(signature_path, sign(data, sign_with))
                atomic_write_bytes(manifest_path, data)  # last: now the version exists
            except BaseException:
                for tmp, _artifact in staged:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                if created_dir:
                    shutil.rmtree(version_dir, ignore_errors=True)
                if created_model_dir:  # else the refused first version leaves a model without versions
                    with contextlib.suppress(OSError):  # only if empty: another version may be on its way
                        os.rmdir(version_dir.parent)
                raise
            if old is not None:
                keep = {a.file for a in artifacts}
                for stale in old.artifacts:
                    if stale.file not in keep:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(version_dir / stale.file)
        self.write_index()
        log.info(
            "published %s to %s (%s)",
            manifest.ref,
            self.url,
            ", ".join(f"{a.file} {a.size} bytes sha256 {a.sha256[:12]}" for a in artifacts),
        )
        return manifest

    def sign(self, name: str, version: str, private_key: Ed25519PrivateKey) -> str:
        """Add this key's signature to a published version (keeping other keys' signatures);
        return the key's id."""
        from agent.registry.signing import key_id, sign

        with self._lock(name, version):
            document = self.fetch_manifest(name, version)
            path = self.root / name / version / SIGNATURE_FILE
            try:
                atomic_write_bytes(path, sign(document.data, private_key, existing=document.signature))
            except OSError as exc:
                raise RegistryError(f"cannot write {path}: {exc.strerror}") from None
        log.info(
            "signed %s in %s with key %s", document.manifest.ref, self.url, key_id(private_key.public_key())
        )
        return key_id(private_key.public_key())

    def write_index(self) -> dict[str, list[str]]:
        """Rewrite <root>/index.json from the published versions on disk; return what it lists."""
        lock_path = self.root / ".locks" / "index.lock"
        with file_lock(lock_path, self.lock_timeout_s, "writing the registry index", error=RegistryError):
            models = {name: self.list_versions(name) for name in self.list_models()}
            models = {name: versions for name, versions in models.items() if versions}
            document = {"schema_version": 1, "models": models}
            data = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
            try:
                atomic_write_bytes(self.root / INDEX_FILE, data)
            except OSError as exc:
                raise RegistryError(f"cannot write {self.root / INDEX_FILE}: {exc.strerror}") from None
        return models

    def _lock(self, name: str, version: str) -> contextlib.AbstractContextManager[None]:
        lock_path = self.root / ".locks" / f"{name}@{version}.lock"
        return file_lock(lock_path, self.lock_timeout_s, f"publishing {name}@{version}", error=RegistryError)

    @staticmethod
    def _read_existing(manifest_path: Path) -> Manifest | None:
        try:
            return Manifest.parse_bytes(manifest_path.read_bytes(), str(manifest_path))
        except RegistryError as exc:
            log.warning("existing manifest is unreadable, replacing it: %s", exc)
            return None

    def _stage(
        self,
        src: Path,
        version_dir: Path,
        format: str,
        target: str,
        validate: bool,
        file_name: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> tuple[Path, Artifact]:
        """Copy `src` to a hidden temp file in `version_dir`, hashing it; check it is a model.
        `file_name` is its name in the version (default: its own); `fields` more manifest keys."""
        file_name = file_name or src.name
        tmp = temp_name(version_dir / f".{file_name}")
        try:
            with src.open("rb") as fin, open(tmp, "wb") as fout:
                sha256, size = copy_hashing(fin, fout)
                fout.flush()
                os.fsync(fout.fileno())
            if validate:
                try:
                    check_model_file(tmp, format, file_name=file_name)
                except ModelError as exc:
                    ref = f"{version_dir.parent.name}@{version_dir.name}"
                    raise RegistryError(f"refusing to publish {src} as {ref}: {exc.message}") from None
            extra = {k: v for k, v in (fields or {}).items() if v is not None}
            artifact = Artifact.model_validate(
                {
                    "file": file_name,
                    "sha256": sha256,
                    "size": size,
                    "format": format,
                    "target": target,
                    **extra,
                }
            )
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return tmp, artifact


def _require_a_correct_candidate(
    ref: str, staged: Sequence[tuple[Path, Artifact]], format: str, model_path: Path
) -> None:
    """Refuse a version no candidate of this box runs right on its own test data (agent/validate.py).

    Trials run in this process: publishing is a one-shot command (a runtime that crashes on the
    model takes the command down, not a daemon), and a version with many test sets stays quick."""
    from agent.testdata import TestData
    from agent.validate import validate
    from providers import run_trial
    from providers.select import SelectionPolicy

    models = [
        ModelArtifact(tmp, a.format, a.sha256, name=a.file)
        for tmp, a in staged
        if a.format != TESTDATA_FORMAT
    ]
    tests = [
        TestData(ModelArtifact(tmp, a.format, a.sha256, name=a.file), None, a.rtol, a.atol)
        for tmp, a in staged
        if a.format == TESTDATA_FORMAT
    ]
    # Publishing asks whether some backend computes it right, not which is fastest: no timing rounds.
    policy = SelectionPolicy(warmup=1, runs=1, min_time_s=0.0, budget_s=5.0, max_trials=99, rounds=0)
    with tempfile.TemporaryDirectory(prefix="edge-agent-derived-") as derived:
        result = validate(
            ref, models, tests, policy, Path(derived), trial=lambda request, _t: run_trial(request)
        )
    for label, why in result.unfit:
        raise RegistryError(f"refusing to publish test data {label}: {why}")
    if not result.usable:
        raise RegistryError(
            f"refusing to publish {ref}: no backend of this box gives the expected outputs of its test data: "
            + "; ".join(result.reasons()),
            hint="check the test data (`edge-agent models validate MODEL_FILE --test-data ...` shows every "
            "candidate's numbers), or publish without it",
        )
    log.info("%s validated: %s", ref, result.activated)


def _check_artifact_fields(file: str, format: str, target: str) -> None:
    try:
        Artifact.model_validate(
            {"file": file, "sha256": "0" * 64, "size": 0, "format": format, "target": target}
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{key_path(e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors()
        )
        raise RegistryError(f"cannot publish {file}: {problems}") from None
