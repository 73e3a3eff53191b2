"""Publishing and signing, for every registry kind that can be written to.

A folder (`file://`) is written directly (FileRegistry). An OCI registry gets the same version:
it is published into a temporary folder first (so every check, the manifest and the signature are
the folder's), then pushed. An HTTP(S) registry is a folder behind a web server: publish into that
folder. A version with an int8 variant (`publish_with_variant`) is made whole in a temporary folder
too, then installed (a folder registry) or pushed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from agent.config import RegistryConnection
from agent.errors import ModelError, RegistryError
from agent.fsutil import atomic_write_bytes, fsync_dir
from agent.registry.file_registry import PUBLISH_SUFFIX_FORMATS, FileRegistry, PublishOptions
from agent.registry.manifest import MANIFEST_FILE, SIGNATURE_FILE, Artifact, Manifest, ManifestDocument
from agent.registry.oci_registry import OciRegistry
from agent.registry.urls import public_url

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger(__name__)
T = TypeVar("T")


def publish_version(
    url: str,
    model_path: Path,
    name: str,
    version: str,
    options: PublishOptions | None = None,
    connection: RegistryConnection | None = None,
) -> tuple[Manifest, str | None]:
    """Publish a model file as name@version at `url`; return its manifest and, for an OCI registry,
    the pushed image manifest's digest (what `model.digest` pins)."""
    scheme = urlsplit(url).scheme.lower()
    options = options or PublishOptions()
    if scheme == "file":
        return FileRegistry.from_url(url).publish(model_path, name, version, options), None
    if scheme == "oci":
        with contextlib.closing(OciRegistry(url, connection)) as registry:
            if not options.force and registry.has_version(name, version):
                raise _exists(name, version, registry.url, registry.reference(name, version))
            with tempfile.TemporaryDirectory(prefix="edge-agent-publish-") as staging_dir:
                staging = FileRegistry(Path(staging_dir))
                manifest = staging.publish(model_path, name, version, options)
                document = staging.fetch_manifest(name, version)
                files = {a.file: staging.root / name / version / a.file for a in manifest.artifacts}
                return manifest, registry.push(document, files)
    raise _not_writable(url)


def publish_with_variant(
    url: str,
    model_path: Path,
    name: str,
    version: str,
    make: Callable[[Path, Path, list[Path]], T],
    options: PublishOptions | None = None,
    connection: RegistryConnection | None = None,
    precision: str = "int8",
) -> tuple[Manifest, str | None, T]:
    """Publish an ONNX model as name@version with a reduced-precision variant beside it: what
    `publish_version` returns, and what `make` (float model, variant file to write, the version's
    test data files) says it made (agent/quantize.py make_variant, through `registry publish
    --quantize`; a ModelError from it refuses the version). The version is made in a temporary
    folder first (the float model and its test data checked as ever, the variant made and proven
    there), so nothing is published when the variant cannot be made, and the version appears whole,
    signed or not."""
    options = options or PublishOptions()
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("file", "oci"):
        raise _not_writable(url)
    if precision != "int8":
        raise RegistryError(f"--quantize {precision}: only int8 variants are made")
    format = options.format or PUBLISH_SUFFIX_FORMATS.get(model_path.suffix.lower())
    if format != "onnx":
        raise RegistryError(
            f"cannot quantize {model_path.name}: --quantize makes a variant of an ONNX model "
            f"(this is {format or 'of no model format edge-agent knows'})"
        )
    if not options.force:  # before minutes of quantizing (checked again when it is installed)
        _refuse_existing(url, name, version, connection)
    variant_name = f"{model_path.stem}.{precision}.onnx"
    with tempfile.TemporaryDirectory(prefix="edge-agent-publish-") as staging_dir:
        staging = FileRegistry(Path(staging_dir))
        manifest = staging.publish(model_path, name, version, replace(options, sign_with=None, force=False))
        folder = staging.root / name / version
        testdata = [folder / a.file for a in manifest.testdata()]
        try:
            made = make(folder / model_path.name, folder / variant_name, testdata)
        except ModelError as exc:
            raise RegistryError(
                f"cannot publish {name}@{version} with an {precision} variant: {exc.message}", exc.hint
            ) from None
        variant = folder / variant_name
        artifact = Artifact(
            file=variant_name,
            sha256=hashlib.sha256(variant.read_bytes()).hexdigest(),
            size=variant.stat().st_size,
            format="onnx",
            target=options.target,
            precision=precision,
            made_from=model_path.name,
        )
        manifest = Manifest.model_validate(
            {**manifest.model_dump(), "artifacts": [*manifest.artifacts, artifact]}
        )
        data = manifest.to_bytes()
        if options.sign_with is not None:
            from agent.registry.signing import sign

            atomic_write_bytes(folder / SIGNATURE_FILE, sign(data, options.sign_with))
        atomic_write_bytes(folder / MANIFEST_FILE, data)
        files = {a.file: folder / a.file for a in manifest.artifacts}
        document = staging.fetch_manifest(name, version)
        if scheme == "oci":
            with contextlib.closing(OciRegistry(url, connection)) as registry:
                if not options.force and registry.has_version(name, version):
                    raise _exists(name, version, registry.url, registry.reference(name, version))
                return manifest, registry.push(document, files), made
        _install(FileRegistry.from_url(url), document, files, options.force)
        return manifest, None, made


def _refuse_existing(url: str, name: str, version: str, connection: RegistryConnection | None) -> None:
    if urlsplit(url).scheme.lower() == "file":
        registry = FileRegistry.from_url(url)
        if (registry.root / name / version / MANIFEST_FILE).exists():
            raise _exists(name, version, registry.url)
        return
    with contextlib.closing(OciRegistry(url, connection)) as oci:
        if oci.has_version(name, version):
            raise _exists(name, version, oci.url, oci.reference(name, version))


def _install(registry: FileRegistry, document: ManifestDocument, files: dict[str, Path], force: bool) -> None:
    """Put a version made elsewhere into a folder registry as FileRegistry.publish does: the files
    first, the signature, the manifest last (then the version exists), stale files of a replaced
    version removed."""
    name, version = document.manifest.name, document.manifest.version
    folder = registry.root / name / version
    manifest_path = folder / MANIFEST_FILE
    with registry._lock(name, version):  # the lock FileRegistry.publish takes for this version
        old = (
            Manifest.parse_bytes(manifest_path.read_bytes(), str(manifest_path))
            if manifest_path.exists()
            else None
        )
        if old is not None and not force:
            raise _exists(name, version, registry.url, None)
        folder.mkdir(parents=True, exist_ok=True)
        if old is not None:
            log.warning("replacing published version %s@%s in %s (force)", name, version, registry.url)
            os.unlink(manifest_path)  # the version disappears first: nobody mixes old and new files
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder / SIGNATURE_FILE)
        for file, source in files.items():
            staged = folder / f".{file}.staged"
            shutil.copyfile(source, staged)
            os.replace(staged, folder / file)
        fsync_dir(folder)
        if document.signature is not None:
            atomic_write_bytes(folder / SIGNATURE_FILE, document.signature)
        atomic_write_bytes(manifest_path, document.data)
        for stale in old.artifacts if old is not None else []:
            if stale.file not in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / stale.file)
    registry.write_index()


def _exists(name: str, version: str, url: str, reference: object = None) -> RegistryError:
    return RegistryError(
        f"model {name!r} version {version!r} already exists in registry {url}"
        + (f" ({reference})" if reference is not None else ""),
        hint="versions are immutable (a fleet relies on that): publish a new version, "
        "or pass --force to replace it",
    )


def sign_version(
    url: str,
    name: str,
    version: str,
    private_key: Ed25519PrivateKey,
    connection: RegistryConnection | None = None,
) -> tuple[str, str | None]:
    """Add this key's signature to a published version; return the key's id and, for an OCI
    registry, the new image manifest's digest (the tag moves to it; the files are not sent again).
    A version other tools pushed to an OCI registry gets the manifest the agent reads from its
    layers, signed."""
    from agent.registry.manifest import ManifestDocument
    from agent.registry.signing import key_id, sign

    scheme = urlsplit(url).scheme.lower()
    if scheme == "file":
        return FileRegistry.from_url(url).sign(name, version, private_key), None
    if scheme == "oci":
        with contextlib.closing(OciRegistry(url, connection)) as registry:
            document = registry.fetch_manifest(name, version)
            signature = sign(document.data, private_key, existing=document.signature)
            signed = ManifestDocument(document.manifest, document.data, signature, document.source)
            return key_id(private_key.public_key()), registry.push(signed, files={})
    raise _not_writable(url)


def _not_writable(url: str) -> RegistryError:
    return RegistryError(
        f"cannot write to registry {public_url(url)!r}: publish and sign write to a folder (file://) or "
        "an OCI registry (oci://)",
        hint="an https:// registry is a folder behind a web server: publish into that folder, then upload it",
    )
