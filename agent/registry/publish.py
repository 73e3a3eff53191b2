"""Publishing and signing, for every registry kind that can be written to.

A folder (`file://`) is written directly (FileRegistry). An OCI registry gets the same version:
it is published into a temporary folder first (so every check, the manifest and the signature are
the folder's), then pushed. An HTTP(S) registry is a folder behind a web server: publish into that
folder.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from agent.config import RegistryConnection
from agent.errors import RegistryError
from agent.registry.file_registry import FileRegistry, PublishOptions
from agent.registry.manifest import Manifest
from agent.registry.oci_registry import OciRegistry
from agent.registry.urls import public_url

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


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
                raise RegistryError(
                    f"model {name!r} version {version!r} already exists in registry {registry.url} "
                    f"({registry.reference(name, version)})",
                    hint="versions are immutable (a fleet relies on that): publish a new version, "
                    "or pass --force to replace it",
                )
            with tempfile.TemporaryDirectory(prefix="edge-agent-publish-") as staging_dir:
                staging = FileRegistry(Path(staging_dir))
                manifest = staging.publish(model_path, name, version, options)
                document = staging.fetch_manifest(name, version)
                files = {a.file: staging.root / name / version / a.file for a in manifest.artifacts}
                return manifest, registry.push(document, files)
    raise _not_writable(url)


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
