"""Installed versions: `InstalledModel`, and `StoreReader`, the store's layout and locks with the reading
and checking of what is installed (manifest copies, their signatures, blob sizes and hashes)."""

from __future__ import annotations

import builtins
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from agent.errors import ModelError, RegistryError, StoreError
from agent.fsutil import file_lock, sha256_file
from agent.registry.file_registry import check_name, version_sort_key
from agent.registry.manifest import MANIFEST_FILE, SIGNATURE_FILE, Artifact, Manifest, ManifestDocument
from agent.registry.signing import SignatureError, TrustPolicy
from agent.testdata import TestData
from providers.base import ModelArtifact

log = logging.getLogger(__package__)  # the package's logger, as before it was split


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


class StoreReader:
    """The store's layout, locks and installed versions (read and checked); `ModelStore` adds pulling,
    importing and removing."""

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

    def _gc_lock(
        self, shared: bool = False, wait_s: float | None = None, what: str | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """The store's lock: shared while a version is recorded as installed (local file work only),
        exclusive while versions and blobs are removed."""
        if what is None:
            what = "installing into the model store" if shared else "removing versions from the model store"
        timeout = self.lock_timeout_s if wait_s is None else wait_s
        return file_lock(self.locks_dir / "gc.lock", timeout, what, error=StoreError, shared=shared)

    def _lock(
        self, path: Path, what: str, wait_s: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        timeout = self.lock_timeout_s if wait_s is None else wait_s
        return file_lock(path, timeout, what, error=StoreError)
