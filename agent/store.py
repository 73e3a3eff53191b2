"""The verified local model store: content-addressed blobs plus one manifest copy per installed version.

Layout::

    <root>/blobs/sha256/<hex>                       artifact bytes, named by their sha256 (read-only)
    <root>/models/<name>/<version>/manifest.json    the registry's manifest, byte for byte = "installed"
    <root>/models/<name>/<version>/manifest.json.sig its signatures, when signed
    <root>/locks/blobs/<hex>.lock                   flock per blob
    <root>/locks/models/<name>@<version>.lock       flock per version

Invariants:
- a file under a blob name always has the manifest's size and sha256 (it is downloaded into a temp
  file in the same directory, hashed while copying, checked, and only then renamed into place);
- a version is installed once its manifest copy exists, and that copy is written last, after every
  blob it names is in place (and after its signature file);
- with a trust policy (signed manifests required), a manifest is checked before any of its
  artifacts is downloaded, and the installed copy again each time it is served: the copy keeps
  the exact bytes that were signed, so the check holds on the box for as long as it is kept;
- pulls of the same blob or version from several threads or processes do the work once (flock).

An installed version is served without asking the registry again (the box keeps working offline);
`pull(verify=True)` and `verify()` re-hash the blobs and catch bit rot, and pull repairs it.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import LOCAL_VERSION, AgentConfig
from agent.errors import IntegrityError, ModelError, RegistryError, StoreError
from agent.fsutil import (
    atomic_write_bytes,
    copy_hashing,
    file_lock,
    fsync_dir,
    hash_file,
    masked_mode,
    sha256_file,
    temp_name,
)
from agent.registry import Registry
from agent.registry.file_registry import check_name, version_sort_key
from agent.registry.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    Artifact,
    Manifest,
    ManifestDocument,
    check_model_file,
)
from agent.registry.signing import SignatureError, TrustPolicy
from agent.testdata import TestData
from providers.base import ModelArtifact

log = logging.getLogger(__name__)

BLOB_MODE = 0o444  # read-only; less the umask (the daemon's 077: owner only)
# blobs/sha256/<hex>.partial: the bytes a pull cut off half way got, resumed by the next pull
# (its <hex>.partial-validator: the registry's ETag for them); never served, never a blob.
PARTIAL_SUFFIX = ".partial"


# progress(what, bytes on disk, total bytes, bytes per second): a download's progress, after every
# chunk (so a stalled download shows exactly what it got); the rate is measured over stretches of
# at least RATE_OVER_S.
Progress = Callable[[str, int, int, float], None]
RATE_OVER_S = 0.5


class _DownloadMeter:
    def __init__(self, what: str, have: int, total: int, progress: Progress | None) -> None:
        self.what, self.done, self.total, self._progress = what, have, total, progress
        self._mark_time, self._mark_done = time.monotonic(), have
        self.rate = 0.0

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._mark_time >= RATE_OVER_S:
            self.rate = (self.done - self._mark_done) / (now - self._mark_time)
            self._mark_time, self._mark_done = now, self.done
        self.report()

    def report(self) -> None:
        if self._progress is not None:
            self._progress(self.what, self.done, self.total, self.rate)


def _validator_path(partial: Path) -> Path:
    return partial.with_name(partial.name + "-validator")


def _disk_error(what: str, exc: OSError, root: Path) -> str:
    if exc.errno == errno.ENOSPC:
        return f"{what}: the disk holding {root} is full ({exc.strerror}); the partial file was removed"
    return f"{what}: {exc}"


@dataclass
class GcReport:
    """What `ModelStore.gc` / `remove` took out (or, dry, would)."""

    removed: builtins.list[dict[str, str]] = field(default_factory=builtins.list)  # name, version, why
    blobs: int = 0
    freed_bytes: int = 0
    dry_run: bool = False


@dataclass(frozen=True)
class InstalledModel:
    """A model version present in the store, every blob in place."""

    name: str
    version: str
    manifest: Manifest
    blobs_dir: Path
    signed_by: str | None = None  # the trusted key whose signature was checked (None: not required)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def artifact_path(self, artifact: Artifact | str) -> Path:
        """Path of the blob holding `artifact` (an Artifact of this manifest, or its file name).

        The blob is named by its sha256, not by the artifact's file name: pass the path to the
        runtime explicitly (e.g. OpenVINO's read_model(xml, bin)), don't rely on suffixes.
        """
        file = artifact.file if isinstance(artifact, Artifact) else artifact
        try:
            entry = self.manifest.artifact(file)
        except KeyError as exc:
            raise StoreError(str(exc.args[0])) from None
        return self.blobs_dir / entry.sha256

    def model_artifacts(self) -> builtins.list[ModelArtifact]:
        """The model files, as the backends take them. A release (an edge-agent wheel) is no model:
        ModelError, so no backend selection or inspection is ever offered one."""
        if self.manifest.is_release():
            raise ModelError(
                f"{self.ref} is an edge-agent release (a wheel), not a model",
                hint="releases are installed by the desired state's `agent` field (docs/fleet.md)",
            )
        return [
            ModelArtifact(self.artifact_path(a), a.format, a.sha256, name=a.file)
            for a in self.manifest.models()
        ]

    def testdata_artifacts(self) -> builtins.list[TestData]:
        """The test data files, each with the model file it is for and its tolerances."""
        return [
            TestData(
                ModelArtifact(self.artifact_path(a), a.format, a.sha256, name=a.file),
                a.model_file,
                a.rtol,
                a.atol,
            )
            for a in self.manifest.testdata()
        ]

    def primary(self, format: str = "onnx") -> tuple[Artifact, Path]:
        """The first artifact of `format` and its blob path."""
        try:
            artifact = self.manifest.primary(format)
        except KeyError as exc:
            raise StoreError(str(exc.args[0])) from None
        return artifact, self.blobs_dir / artifact.sha256


def store_for(config: AgentConfig) -> ModelStore:
    """The agent's store (under state_dir) with the trust policy of its `registry.trusted_keys`;
    ConfigError when a trusted key file cannot be loaded."""
    trusted = config.registry.trusted_keys if config.registry is not None else []
    return ModelStore(config.state_dir / "store", trust=TrustPolicy.from_config(trusted))


class ModelStore:
    """Content-addressed, verified model store; see the module docstring."""

    def __init__(self, root: Path, lock_timeout_s: float = 900.0, trust: TrustPolicy | None = None) -> None:
        """`trust`: which signed manifests to accept (default: signatures are not required)."""
        self.root = Path(root).absolute()
        self.trust = trust or TrustPolicy()
        self.blobs_dir = self.root / "blobs" / "sha256"
        self.models_dir = self.root / "models"
        self.locks_dir = self.root / "locks"
        self.lock_timeout_s = lock_timeout_s

    def __repr__(self) -> str:
        return f"ModelStore({self.root})"

    # --- reading ---------------------------------------------------------------------------

    def get(self, name: str, version: str) -> InstalledModel:
        """The installed version; StoreError if it is not installed or a blob is missing."""
        check_name("name", name, StoreError)
        check_name("version", version, StoreError)
        document = self._installed_document(name, version)
        if document is None:
            installed = ", ".join(m.version for m in self.list() if m.name == name) or "none"
            raise StoreError(
                f"model {name}@{version} is not installed in store {self.root} "
                f"(installed versions of {name}: {installed})",
                hint="pull it from the registry first",
            )
        manifest = document.manifest
        signed_by = self._check_trust(document)
        problems = self._blob_problems(manifest, rehash=False)
        if problems:
            raise StoreError(
                f"model {name}@{version} is installed in store {self.root} but damaged: "
                + "; ".join(problems),
                hint="pull it again to repair it",
            )
        return self._installed(manifest, signed_by)

    def is_installed(self, name: str, version: str) -> bool:
        """Installed with every blob in place (sizes; no re-hash): a pull would not ask the registry."""
        return self._ready(name, version, rehash=False) is not None

    def verify(self, name: str, version: str) -> builtins.list[str]:
        """Check the installed copy's signature against the trust policy and re-hash every blob;
        return the problems found (empty: all good)."""
        check_name("name", name, StoreError)
        check_name("version", version, StoreError)
        document = self._installed_document(name, version)
        if document is None:
            raise StoreError(f"model {name}@{version} is not installed in store {self.root}")
        manifest = document.manifest
        problems = []
        try:
            self._check_trust(document)
        except SignatureError as exc:
            problems.append(exc.message)
        problems += self._blob_problems(manifest, rehash=True)
        for problem in problems:
            log.warning("verify %s: %s", manifest.ref, problem)
        return problems

    # --- pulling ---------------------------------------------------------------------------

    def pull(
        self,
        registry: Registry,
        name: str,
        version: str,
        verify: bool = False,
        progress: Progress | None = None,
        digest: str | None = None,
    ) -> InstalledModel:
        """Install `name@version` from `registry` (no-op when already installed and intact).
        `digest` pins the registry's manifest document (Registry.fetch_manifest).

        With `verify`, existing blobs are re-hashed and any that no longer match are downloaded
        again. `progress` hears how each download goes (Progress). Raises RegistryError (registry
        unreachable / version missing), SignatureError (the trust policy refuses the manifest:
        nothing is downloaded), IntegrityError (bytes don't match the manifest),
        ModelError (the bytes match but are not a loadable model of their format) or StoreError
        (local disk problems, lock timeouts).
        """
        check_name("name", name, StoreError)
        check_name("version", version, StoreError)
        ref = f"{name}@{version}"

        ready = self._ready(name, version, verify)
        if ready is not None:
            log.debug("%s already installed in %s", ref, self.root)
            return ready

        # Shared: pulls run side by side; a gc (exclusive) never deletes a blob a pull is installing.
        with (
            self._gc_lock(shared=True),
            self._lock(self.locks_dir / "models" / f"{ref}.lock", f"installing {ref}"),
        ):
            ready = self._ready(name, version, verify)  # someone else may have finished meanwhile
            if ready is not None:
                log.debug("%s was installed by a concurrent pull", ref)
                return ready

            document = registry.fetch_manifest(name, version, digest)
            manifest = document.manifest
            if manifest.name != name or manifest.version != version:
                raise RegistryError(
                    f"registry {registry.url} answered {manifest.ref} when asked for {ref}",
                )
            signed_by = self.trust.check(document)  # before a single artifact byte is fetched
            previous = self._installed_manifest(name, version, quiet=True)
            if previous is not None and previous.artifacts != manifest.artifacts:
                log.warning(
                    "%s in registry %s differs from the installed copy (republished with force?); "
                    "installing the registry's version",
                    ref,
                    registry.url,
                )
            self._check_room(manifest, registry.url)

            for artifact in manifest.artifacts:
                self._ensure_blob(registry, manifest, artifact, verify, progress)

            version_dir = self.models_dir / name / version
            try:
                version_dir.mkdir(parents=True, exist_ok=True)
                if document.signature is not None:
                    atomic_write_bytes(version_dir / SIGNATURE_FILE, document.signature)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(version_dir / SIGNATURE_FILE)
                atomic_write_bytes(version_dir / MANIFEST_FILE, document.data)  # last, as published
            except OSError as exc:
                raise StoreError(f"cannot record {ref} as installed in {version_dir}: {exc}") from None
            log.info(
                "installed %s from %s into %s (%d artifact(s), %d bytes)",
                ref,
                registry.url,
                self.root,
                len(manifest.artifacts),
                sum(a.size for a in manifest.artifacts),
            )
            if signed_by is not None:
                log.info("%s is signed by trusted key %s", ref, signed_by)
            return self._installed(manifest, signed_by)

    def _ready(self, name: str, version: str, rehash: bool) -> InstalledModel | None:
        document = self._installed_document(name, version, quiet=True)
        if document is None or self._blob_problems(document.manifest, rehash=rehash):
            return None
        try:
            signed_by = self._check_trust(document)
        except SignatureError as exc:  # e.g. installed before signatures were required: fetch again
            log.warning("%s", exc.message)
            return None
        return self._installed(document.manifest, signed_by)

    def _ensure_blob(
        self,
        registry: Registry,
        manifest: Manifest,
        artifact: Artifact,
        rehash: bool,
        progress: Progress | None,
    ) -> None:
        """Make blobs/sha256/<hex> hold exactly the artifact's bytes, downloading if needed."""
        blob = self.blobs_dir / artifact.sha256
        what = f"artifact {artifact.file} of {manifest.ref}"
        with self._lock(self.locks_dir / "blobs" / f"{artifact.sha256}.lock", f"downloading {what}"):
            problem = self._blob_problem(artifact, rehash=rehash)
            if problem is None:
                return
            if blob.exists():
                log.warning("%s: %s; downloading it again", what, problem)
            self._remove_stale_temps(blob)
            try:
                self.blobs_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create {self.blobs_dir}: {exc}") from None
            partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
            keep_partial = False
            try:
                self._download(registry, manifest, artifact, partial, what, progress)
                check_model_file(partial, artifact.format, file_name=artifact.file)
                os.chmod(partial, masked_mode(BLOB_MODE))
                os.replace(partial, blob)
            except RegistryError as exc:
                # Cut off (network, server): what came stays for the next pull to resume from.
                got = partial.stat().st_size if partial.exists() else 0
                keep_partial = got > 0
                if keep_partial:
                    log.warning(
                        "%s: %s; keeping %d of %d bytes to resume from", what, exc.message, got, artifact.size
                    )
                raise
            except ModelError as exc:
                raise ModelError(
                    f"{what} from registry {registry.url}: {exc.message}",
                    hint="the published file is unusable; publish a good file as a new version",
                ) from None
            except OSError as exc:
                raise StoreError(_disk_error(f"cannot store {what} as {blob}", exc, self.root)) from None
            finally:
                if not keep_partial:
                    for leftover in (partial, _validator_path(partial)):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(leftover)
            fsync_dir(self.blobs_dir)
            log.info("stored %s as blob %s (%d bytes)", what, artifact.sha256[:12], artifact.size)

    def _download(
        self,
        registry: Registry,
        manifest: Manifest,
        artifact: Artifact,
        partial: Path,
        what: str,
        progress: Progress | None = None,
    ) -> None:
        """Stream the artifact into `partial` (resuming after the bytes a cut-off pull left there),
        then check size and sha256 (IntegrityError on mismatch)."""
        validator_path = _validator_path(partial)
        have = partial.stat().st_size if partial.exists() else 0
        if 0 < have < artifact.size:
            digest = hash_file(partial)
            validator = validator_path.read_text().strip() if validator_path.exists() else None
        else:
            have, validator, digest = 0, None, hashlib.sha256()
        start, src = registry.open_artifact_at(manifest.name, manifest.version, artifact, have, validator)
        with src:
            if have and start == have:
                log.info("%s: resuming the download at byte %d of %d", what, have, artifact.size)
            elif have:
                log.info(
                    "%s: the registry sends it whole again (it cannot resume, or the file changed)", what
                )
                digest = hashlib.sha256()
            new_validator = getattr(src, "validator", None)
            if new_validator:
                validator_path.write_text(new_validator)
            # Unbuffered: what came is on disk (in the page cache) at once, for a resume after a kill.
            with open(partial, "r+b" if start else "wb", buffering=0) as dst:
                dst.seek(start)
                dst.truncate()
                meter = _DownloadMeter(what, start, artifact.size, progress)
                meter.report()
                sha256, size = copy_hashing(
                    src, dst, max_bytes=artifact.size - start, digest=digest, copied=meter
                )
                meter.report()
                size += start
                dst.flush()
                os.fsync(dst.fileno())
        if size != artifact.size:
            got = f"more than {artifact.size} bytes" if size > artifact.size else f"{size} bytes"
            reason = "is truncated" if size < artifact.size else "is larger than published"
            raise IntegrityError(
                f"{what}: size mismatch: manifest says {artifact.size} bytes, got {got}; "
                f"the registry copy {reason} or was changed after publishing",
                hint="republish the model as a new version",
            )
        if sha256 != artifact.sha256:
            raise IntegrityError(
                f"{what}: sha256 mismatch: manifest says {artifact.sha256}, got {sha256}; "
                "the registry copy is corrupt or was changed after publishing",
                hint="republish the model as a new version",
            )

    # --- importing a file on the box --------------------------------------------------------

    def import_file(self, path: Path, name: str, version: str = LOCAL_VERSION) -> InstalledModel:
        """Install a model file that is on this box (`model.path`) as name@version, without a
        registry: copied into the store, hashed, checked as a model of its format. Every call
        hashes the file and the stored copy again, so a changed file becomes the new content of
        the version (the old blob is left for gc) and a damaged copy is replaced. An OpenVINO .xml
        brings the .bin beside it. Unsigned by nature: refused when the trust policy requires
        signatures."""
        from agent.registry.file_registry import SUFFIX_FORMATS, utc_now_iso

        check_name("name", name, StoreError)
        check_name("version", version, StoreError)
        if self.trust.required:
            raise SignatureError(
                f"model file {path}: this agent runs only signed models (registry.trusted_keys), and a "
                "file given by model.path has no signature",
                hint="publish it to a registry with --sign, and name it by name and version",
            )
        path = Path(path)
        format = SUFFIX_FORMATS.get(path.suffix.lower())
        if format is None:
            raise StoreError(
                f"model file {path}: cannot tell its format from the suffix (.onnx, .tflite, .xml)"
            )
        sources = [path, path.with_suffix(".bin")] if format == "openvino-ir" else [path]
        artifacts = []
        for source in sources:
            try:
                sha256, size = hash_file(source).hexdigest(), source.stat().st_size
            except OSError as exc:
                raise StoreError(f"cannot read model file {source}: {exc.strerror or exc}") from None
            artifacts.append(
                Artifact.model_validate(
                    {"file": source.name, "sha256": sha256, "size": size, "format": format}
                )
            )
        ref = f"{name}@{version}"
        with (
            self._gc_lock(shared=True),
            self._lock(self.locks_dir / "models" / f"{ref}.lock", f"importing {ref}"),
        ):
            installed = self._installed_manifest(name, version, quiet=True)
            unchanged = installed is not None and installed.artifacts == artifacts
            if installed is not None and unchanged and not self._blob_problems(installed, rehash=True):
                return self._installed(installed)
            manifest = Manifest(
                schema_version=1, name=name, version=version, created=utc_now_iso(), artifacts=artifacts,
                metadata={"source": str(path)},
            )  # fmt: skip
            for source, artifact in zip(sources, artifacts, strict=True):
                self._copy_in(source, artifact, f"model file {source}")
            version_dir = self.models_dir / name / version
            try:
                version_dir.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(version_dir / SIGNATURE_FILE)
                atomic_write_bytes(version_dir / MANIFEST_FILE, manifest.to_bytes())
            except OSError as exc:
                raise StoreError(f"cannot record {ref} as installed in {version_dir}: {exc}") from None
        log.info("imported %s from %s into %s (sha256 %s)", ref, path, self.root, artifacts[0].sha256[:12])
        return self._installed(manifest)

    def _copy_in(self, source: Path, artifact: Artifact, what: str) -> None:
        """Make blobs/sha256/<hex> hold `source`'s bytes (which must still hash to the artifact's)."""
        blob = self.blobs_dir / artifact.sha256
        with self._lock(self.locks_dir / "blobs" / f"{artifact.sha256}.lock", f"copying {what}"):
            if self._blob_problem(artifact, rehash=True) is None:
                return
            self.blobs_dir.mkdir(parents=True, exist_ok=True)
            tmp = temp_name(blob)
            try:
                with source.open("rb") as src, open(tmp, "wb") as dst:
                    sha256, size = copy_hashing(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())
                if (sha256, size) != (artifact.sha256, artifact.size):
                    raise IntegrityError(f"{what} changed while it was copied into the store; try again")
                check_model_file(tmp, artifact.format, file_name=artifact.file)
                os.chmod(tmp, masked_mode(BLOB_MODE))
                os.replace(tmp, blob)
            except OSError as exc:
                raise StoreError(_disk_error(f"cannot copy {what} into {blob}", exc, self.root)) from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            fsync_dir(self.blobs_dir)

    # --- removing ---------------------------------------------------------------------------

    def remove(self, name: str, version: str) -> GcReport:
        """Uninstall one version and delete the blobs no other installed version uses."""
        check_name("name", name, StoreError)
        check_name("version", version, StoreError)
        with self._gc_lock():
            if self._installed_manifest(name, version, quiet=True) is None:
                installed = ", ".join(m.version for m in self.list() if m.name == name) or "none"
                raise StoreError(
                    f"model {name}@{version} is not installed in store {self.root} "
                    f"(installed versions of {name}: {installed})"
                )
            report = GcReport()
            self._uninstall(name, version, "removed on request", report)
            self._delete_unused_blobs(report)
        return report

    def gc(
        self,
        in_use: Iterable[tuple[str, str]] = (),
        keep_versions: int | None = None,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        dry_run: bool = False,
        wait_s: float | None = None,
    ) -> GcReport:
        """Remove versions beyond the newest `keep_versions` of each model (by install time), those
        installed more than `max_age_s` ago, and then the oldest while the store holds more than
        `max_bytes`; never one in `in_use` (name, version). Then delete blobs no installed version
        uses, stale partial downloads of those, and upgraded twins of deleted blobs. `dry_run`
        says what would go. `wait_s`: how long to wait for pulls in progress (default: the store's
        lock timeout); StoreError when they take longer."""
        keep = set(in_use)
        report = GcReport(dry_run=dry_run)
        with self._gc_lock(wait_s=wait_s):
            installed = sorted(self.list(), key=self._installed_at, reverse=True)  # newest first
            going: dict[tuple[str, str], str] = {}
            seen: dict[str, int] = {}
            now = time.time()
            for model in installed:
                seen[model.name] = seen.get(model.name, 0) + 1
                key = (model.name, model.version)
                if key in keep:
                    continue
                if keep_versions is not None and seen[model.name] > keep_versions:
                    going[key] = f"more than {keep_versions} version(s) of {model.name} installed"
                elif max_age_s is not None and now - self._installed_at(model) > max_age_s:
                    going[key] = f"installed more than {max_age_s / 86400:g} day(s) ago"
            if max_bytes is not None:
                staying = [m for m in installed if (m.name, m.version) not in going]
                for model in reversed(staying):  # oldest first
                    if self._bytes_of(staying) <= max_bytes:
                        break
                    if (model.name, model.version) in keep:
                        continue
                    going[(model.name, model.version)] = f"the store holds more than {max_bytes:,} bytes"
                    staying = [m for m in staying if m is not model]
            for (name, version), why in going.items():
                self._uninstall(name, version, why, report)
            self._delete_unused_blobs(report)
        return report

    def _installed_at(self, model: InstalledModel) -> float:
        """When a version was installed: its manifest copy is written last, once."""
        try:
            return (self.models_dir / model.name / model.version / MANIFEST_FILE).stat().st_mtime
        except OSError:
            return 0.0

    def _bytes_of(self, models: Iterable[InstalledModel]) -> int:
        blobs = {a.sha256: a.size for m in models for a in m.manifest.artifacts}
        return sum(blobs.values())

    def _uninstall(self, name: str, version: str, why: str, report: GcReport) -> None:
        report.removed.append({"name": name, "version": version, "why": why})
        if report.dry_run:
            return
        version_dir = self.models_dir / name / version
        with self._lock(self.locks_dir / "models" / f"{name}@{version}.lock", f"removing {name}@{version}"):
            try:
                os.unlink(version_dir / MANIFEST_FILE)  # first: from here on it is not installed
                fsync_dir(version_dir)
                shutil.rmtree(version_dir)
                with contextlib.suppress(OSError):  # only when no other version is left
                    os.rmdir(version_dir.parent)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreError(f"cannot remove {name}@{version} from {version_dir}: {exc}") from None
        log.info("removed %s@%s from the store (%s)", name, version, why)

    def _delete_unused_blobs(self, report: GcReport) -> None:
        """Blobs (and partial downloads, and upgraded twins) no installed version names. Called
        under the exclusive gc lock: no pull is adding a version meanwhile."""
        going = {(r["name"], r["version"]) for r in report.removed}
        used = {
            a.sha256 for m in self.list() if (m.name, m.version) not in going for a in m.manifest.artifacts
        }
        if not self.blobs_dir.is_dir():
            return
        for path in sorted(self.blobs_dir.iterdir()):
            digest = path.name.split(".", 1)[0]
            if digest in used or len(digest) != 64 or ".partial" in path.name:
                continue  # a partial download stays for the pull that resumes it
            report.freed_bytes += path.stat().st_size
            report.blobs += 0 if path.name != digest else 1
            if not report.dry_run:
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(path, 0o644)
                    os.unlink(path)
            for twin in (self.root / "derived").glob(f"{digest}-*"):
                report.freed_bytes += twin.stat().st_size
                if not report.dry_run:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(twin)

    def _gc_lock(
        self, shared: bool = False, wait_s: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        what = "the model store (a pull)" if shared else "the model store (removing versions)"
        timeout = self.lock_timeout_s if wait_s is None else wait_s
        return file_lock(self.locks_dir / "gc.lock", timeout, what, error=StoreError, shared=shared)

    # --- listing ---------------------------------------------------------------------------

    def list(self) -> builtins.list[InstalledModel]:
        """Every version with a manifest copy, by name then natural version order."""
        found: builtins.list[InstalledModel] = []
        if not self.models_dir.is_dir():
            return found
        for model_dir in sorted(p for p in self.models_dir.iterdir() if p.is_dir()):
            versions = sorted(
                (p for p in model_dir.iterdir() if p.is_dir()), key=lambda p: version_sort_key(p.name)
            )
            for version_dir in versions:
                document = self._installed_document(model_dir.name, version_dir.name, quiet=True)
                if document is not None:
                    found.append(self._installed(document.manifest, self._signer(document)))
        return found

    # --- internals -------------------------------------------------------------------------

    def _installed(self, manifest: Manifest, signed_by: str | None = None) -> InstalledModel:
        return InstalledModel(manifest.name, manifest.version, manifest, self.blobs_dir, signed_by)

    def _check_trust(self, document: ManifestDocument) -> str | None:
        """The trusted signer of an installed copy; SignatureError (saying how to mend it) if none."""
        try:
            return self.trust.check(document)
        except SignatureError as exc:
            raise SignatureError(
                f"installed copy of {document.manifest.ref}: {exc.message}",
                hint="pull it again from a registry that has it signed by a trusted key",
            ) from None

    def _signer(self, document: ManifestDocument) -> str | None:
        """For listings: the trusted signer, None when unchecked or refused (verify says why)."""
        try:
            return self.trust.check(document)
        except SignatureError:
            return None

    def _installed_manifest(self, name: str, version: str, quiet: bool = False) -> Manifest | None:
        document = self._installed_document(name, version, quiet)
        return None if document is None else document.manifest

    def _installed_document(self, name: str, version: str, quiet: bool = False) -> ManifestDocument | None:
        """The manifest copy of an installed version with its bytes and signature file; None if
        absent (or, with quiet, unreadable)."""
        path = self.models_dir / name / version / MANIFEST_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from None
        try:
            signature: bytes | None = path.with_name(SIGNATURE_FILE).read_bytes()
        except FileNotFoundError:
            signature = None
        except OSError as exc:
            raise StoreError(f"cannot read {path.with_name(SIGNATURE_FILE)}: {exc}") from None
        try:
            manifest = Manifest.parse_bytes(data, str(path))
        except RegistryError as exc:
            if quiet:
                log.warning("store: ignoring damaged manifest copy: %s", exc.message)
                return None
            raise StoreError(exc.message, hint="pull the version again to repair it") from None
        if manifest.name != name or manifest.version != version:
            message = f"{path} describes {manifest.ref}, not {name}@{version}"
            if quiet:
                log.warning("store: ignoring misplaced manifest copy: %s", message)
                return None
            raise StoreError(message, hint="pull the version again to repair it")
        return ManifestDocument(manifest, data, signature, str(path))

    def _blob_problems(self, manifest: Manifest, rehash: bool) -> builtins.list[str]:
        problems = []
        for artifact in manifest.artifacts:
            problem = self._blob_problem(artifact, rehash)
            if problem is not None:
                problems.append(f"artifact {artifact.file}: {problem}")
        return problems

    def _blob_problem(self, artifact: Artifact, rehash: bool) -> str | None:
        blob = self.blobs_dir / artifact.sha256
        try:
            size = blob.stat().st_size
        except FileNotFoundError:
            return f"blob {blob} is missing"
        except OSError as exc:
            return f"blob {blob} cannot be read: {exc}"
        if size != artifact.size:
            return f"blob {blob} has {size} bytes, manifest says {artifact.size}"
        if rehash:
            try:
                actual = sha256_file(blob)
            except OSError as exc:
                return f"blob {blob} cannot be read: {exc}"
            if actual != artifact.sha256:
                return (
                    f"blob {blob} has sha256 {actual}, manifest says {artifact.sha256} (bit rot or modified)"
                )
        return None

    def _check_room(self, manifest: Manifest, source: str) -> None:
        """Refuse a version whose missing files do not fit on the disk, before downloading any of
        them (a manifest may declare any size; a full disk would stop the box's other writers)."""
        needed = sum(
            a.size - self.partial_bytes(a.sha256)
            for a in {a.sha256: a for a in manifest.artifacts}.values()
            if self._blob_problem(a, rehash=False) is not None
        )
        where = self.root
        while not where.exists() and where != where.parent:
            where = where.parent
        free = shutil.disk_usage(where).free
        if needed > free:
            raise StoreError(
                f"{manifest.ref} from {source} needs {needed:,} bytes, but the disk holding {self.root} "
                f"has {free:,} free; nothing was downloaded",
                hint="free some space (edge-agent models gc) or check the manifest's declared sizes",
            )

    def partial_bytes(self, sha256: str) -> int:
        """Bytes of this blob that a cut-off pull left to resume from (0: none)."""
        partial = self.blobs_dir / (sha256 + PARTIAL_SUFFIX)
        return partial.stat().st_size if partial.exists() else 0

    def _remove_stale_temps(self, blob: Path) -> None:
        """Remove temp files of this blob left by a crashed pull (we hold the blob's lock: none is live)."""
        if not self.blobs_dir.is_dir():
            return
        for stale in self.blobs_dir.glob(f"{blob.name}.tmp-*"):
            log.info("removing temp file %s left by an interrupted pull", stale)
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()

    def _lock(self, path: Path, what: str) -> contextlib.AbstractContextManager[None]:
        return file_lock(path, self.lock_timeout_s, what, error=StoreError)
