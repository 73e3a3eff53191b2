"""Getting versions in: pulls from a registry (resumable, checked, disk space first) and imports of a
model file on the box, each blob written to a temp file, checked and renamed into place."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from agent.config import LOCAL_VERSION
from agent.errors import IntegrityError, ModelError, RegistryError, StoreError
from agent.fsutil import atomic_write_bytes, copy_hashing, fsync_dir, hash_file, masked_mode, temp_name
from agent.registry import Registry
from agent.registry.file_registry import check_name
from agent.registry.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    Artifact,
    Manifest,
    ManifestDocument,
    check_model_file,
)
from agent.registry.signing import SignatureError
from agent.store.installed import InstalledModel, StoreReader

log = logging.getLogger(__package__)  # the package's logger, as before it was split

BLOB_MODE = 0o444  # read-only; less the umask (the daemon's 077: owner only)
# blobs/sha256/<hex>.partial: the bytes a pull cut off half way got, resumed by the next pull
# (its <hex>.partial-validator: the registry's ETag for them); never served, never a blob.
PARTIAL_SUFFIX = ".partial"


# progress(what, bytes on disk, total bytes, bytes per second): a download's progress, after every
# chunk (so a stalled download shows exactly what it got); the rate is measured over stretches of
# at least RATE_OVER_S.
Progress = Callable[[str, int, int, float], None]
RATE_OVER_S = 0.5
_INSTALL_ROUNDS = 3  # fetches of a version's blobs when a clean-up takes one before it is recorded


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


class StorePuller(StoreReader):
    """Pulling and importing versions into the store."""

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

        # Per version: two pulls of one version do the work once. Network I/O happens under this
        # lock and the blobs' own, never under the store's (gc) lock: a stalled registry holds up
        # nothing but pulls of what it is sending (a gc skips a version whose pull is in progress).
        pulling = f"installing {ref} from {registry.url}"
        with self._lock(self.locks_dir / "models" / f"{ref}.lock", pulling):
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
            for _round in range(_INSTALL_ROUNDS):
                for artifact in manifest.artifacts:
                    self._ensure_blob(registry, manifest, artifact, verify, progress)
                verify = False  # checked once; a blob a gc took meanwhile is simply fetched again
                # Shared: installs run side by side; a gc (exclusive, local file work only) takes
                # no blob of a version recorded here, and may have taken one before.
                with self._gc_lock(shared=True, what=f"recording {ref} as installed"):
                    if not self._blob_problems(manifest, rehash=False):
                        self._record(ref, document)
                        break
                log.info("%s: a blob went (a clean-up ran meanwhile); fetching it again", ref)
            else:
                raise StoreError(f"cannot install {ref}: its blobs kept going while it was pulled")
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

    def _record(self, ref: str, document: ManifestDocument) -> None:
        """Write the version's signature and manifest copy (last: from then on it is installed)."""
        manifest = document.manifest
        version_dir = self.models_dir / manifest.name / manifest.version
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
        downloading = f"downloading {what} from {registry.url}"
        with self._lock(self.locks_dir / "blobs" / f"{artifact.sha256}.lock", downloading):
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
                self._copy_in(source, artifact, f"model file {source} for {ref}")
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
                try:
                    check_model_file(tmp, artifact.format, file_name=source.name)
                except ModelError as exc:  # named as the user gave it, never by the temp copy
                    raise ModelError(f"{what}: {exc.message}", hint=exc.hint) from None
                os.chmod(tmp, masked_mode(BLOB_MODE))
                os.replace(tmp, blob)
            except OSError as exc:
                raise StoreError(_disk_error(f"cannot copy {what} into {blob}", exc, self.root)) from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            fsync_dir(self.blobs_dir)

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
