"""OCI registries (the CNCF distribution registry, Harbor, GHCR, ECR, ACR, Artifactory): model
versions stored as OCI artifacts, the way ORAS stores files.

    registry.url: oci://registry.example.com[:port]/edge-models     (a repository prefix; may be empty)
    model pp-ocr-cls, version 2.0   ->   repository edge-models/pp-ocr-cls, tag 2.0

One version is one OCI image manifest (distribution spec v1.1, image spec v1.1 artifact form) whose
layers are the files, each with an `org.opencontainers.image.title` annotation naming it::

    {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
     "artifactType": "application/vnd.edge-agent.model.v1",
     "config": <the empty descriptor, application/vnd.oci.empty.v1+json>,
     "layers": [
       {"mediaType": "application/vnd.edge-agent.model.onnx", "digest": "sha256:...", "size": 585532,
        "annotations": {"org.opencontainers.image.title": "model.onnx"}},
       {"mediaType": "application/vnd.edge-agent.manifest.v1+json", ..., title "manifest.json"},
       {"mediaType": "application/vnd.edge-agent.signature.v1+json", ..., title "manifest.json.sig"}]}

The agent pushes its own manifest.json (and its signatures) as layers, so a version in an OCI
registry carries exactly what a version in a folder does, signatures included; every artifact's
sha256 in manifest.json is its layer's digest. A version pushed by other tools (`oras push
host/repo:tag model.onnx`) has no manifest.json: the agent builds one from the layers (file name
from the title, format from the media type or the file suffix, sha256 and size from the
descriptor). Such a version is unsigned.

Pulls go by tag or by digest (`ModelRef.digest`: the image manifest's digest, checked against the
bytes). Every blob is fetched by its digest and hashed by the store. Auth: the registry's 401
challenge says how: Basic (username + password_file) or Bearer, where a token is fetched from the
challenge's realm for the scope asked (with the basic credentials when configured) and reused for
that repository. A token_file is sent as the bearer token itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import quote, urljoin, urlsplit

import httpx

from agent.config import RegistryConnection
from agent.errors import RegistryError
from agent.registry.file_registry import SUFFIX_FORMATS, check_name, utc_now_iso, version_sort_key
from agent.registry.http_client import Body, NotFound, RegistryClient, read_secret
from agent.registry.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    TESTDATA_FORMAT,
    WHEEL_FORMAT,
    Artifact,
    Manifest,
    ManifestDocument,
    key_path,
    parse_version_manifest,
)
from agent.registry.urls import public_url

log = logging.getLogger(__name__)

IMAGE_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
IMAGE_INDEX = "application/vnd.oci.image.index.v1+json"
ARTIFACT_TYPE = "application/vnd.edge-agent.model.v1"
EDGE_MANIFEST = "application/vnd.edge-agent.manifest.v1+json"
EDGE_SIGNATURE = "application/vnd.edge-agent.signature.v1+json"
EMPTY_CONFIG_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
TITLE = "org.opencontainers.image.title"
CREATED = "org.opencontainers.image.created"
FORMAT_MEDIA_TYPES = {
    "onnx": "application/vnd.edge-agent.model.onnx",
    "tflite": "application/vnd.edge-agent.model.tflite",
    "openvino-ir": "application/vnd.edge-agent.model.openvino-ir",
    TESTDATA_FORMAT: "application/vnd.edge-agent.test-data.npz",
    WHEEL_FORMAT: "application/vnd.edge-agent.release.wheel",
}
_MEDIA_TYPE_FORMATS = {media_type: format for format, media_type in FORMAT_MEDIA_TYPES.items()}
_REPOSITORY_RE = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_MAX_TAG_PAGES = 100


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class OciReference:
    """`oci://host[:port]/repository[:tag|@sha256:...]`, parsed."""

    host: str  # host[:port]
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> OciReference:
        parts = urlsplit(text)
        if parts.scheme != "oci" or not parts.netloc:
            raise RegistryError(f"{public_url(text)!r} is not an oci://host/repository reference")
        if parts.username is not None:
            raise RegistryError(
                f"{public_url(text)!r}: put OCI credentials in registry.username / password_file, not the URL"
            )
        path, digest, tag = parts.path.strip("/"), None, None
        if "@" in path:
            path, digest = path.split("@", 1)
            if not _DIGEST_RE.match(digest):
                raise RegistryError(f"{text!r}: digest {digest!r} is not sha256:<64 lowercase hex>")
        elif ":" in path.rsplit("/", 1)[-1]:
            path, tag = path.rsplit(":", 1)
        if path and not _REPOSITORY_RE.match(path):
            raise RegistryError(
                f"{text!r}: {path!r} is not a valid OCI repository name (lowercase letters, digits, "
                "'.', '_', '-', separated by '/')"
            )
        return cls(parts.netloc, path, tag, digest)

    def __str__(self) -> str:
        suffix = f"@{self.digest}" if self.digest else f":{self.tag}" if self.tag else ""
        return f"oci://{self.host}/{self.repository}{suffix}"


class OciRegistry:
    """Model versions in an OCI registry; see the module docstring."""

    def __init__(self, url: str, settings: RegistryConnection | None = None) -> None:
        base = OciReference.parse(url)
        if base.tag or base.digest:
            raise RegistryError(
                f"registry URL {url!r} names a tag or digest; the registry URL is oci://host/prefix "
                "and versions are tags under it"
            )
        self.settings = settings or RegistryConnection()
        self._host, self._prefix = base.host, base.repository
        self._auth = _ChallengeAuth(self.settings)
        self._http = RegistryClient(f"https://{self._host}/", self.settings, self._auth)

    @property
    def url(self) -> str:
        return f"oci://{self._host}/{self._prefix}".rstrip("/")

    def __repr__(self) -> str:
        return f"OciRegistry({self.url})"

    def close(self) -> None:
        self._http.close()

    def repository(self, name: str) -> str:
        check_name("name", name, RegistryError)
        repository = f"{self._prefix}/{name}" if self._prefix else name
        if not _REPOSITORY_RE.match(repository):
            raise RegistryError(
                f"model name {name!r} cannot be part of an OCI repository name ({repository!r}): "
                "OCI names are lowercase letters, digits, '.', '_' and '-'",
                hint="use lowercase model names with OCI registries",
            )
        return repository

    def reference(self, name: str, version: str) -> OciReference:
        return OciReference(self._host, self.repository(name), tag=version)

    # --- reading: the Registry protocol -------------------------------------------------------

    def list_versions(self, name: str) -> list[str]:
        repository = self.repository(name)
        url: str | None = self._api(repository, "tags", "list")
        tags: list[str] = []
        for _ in range(_MAX_TAG_PAGES):
            if url is None:
                break
            try:
                body, headers = self._http.document(url)
            except NotFound:
                raise RegistryError(
                    f"model {name!r} not found in registry {self.url} (no repository {repository})"
                ) from None
            try:
                listed = json.loads(body).get("tags") or []
                if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
                    raise TypeError("tags must be a list of strings")
            except (ValueError, TypeError, AttributeError) as exc:
                raise RegistryError(f"invalid tag list {public_url(url)}: {exc}") from None
            tags += listed
            url = _next_page(url, headers.get("Link"))
        return sorted(set(tags), key=version_sort_key)

    def get_manifest(self, name: str, version: str) -> Manifest:
        return self.fetch_manifest(name, version).manifest

    def fetch_manifest(self, name: str, version: str, digest: str | None = None) -> ManifestDocument:
        """The version's manifest (the agent's manifest.json layer, or one built from the layers of
        a version other tools pushed) with its exact bytes and signatures. By tag, or by the image
        manifest's `digest` when pinned."""
        check_name("version", version, RegistryError)
        if digest is not None and not _DIGEST_RE.match(digest):
            raise RegistryError(f"digest {digest!r} is not sha256:<64 lowercase hex>")
        repository = self.repository(name)
        shown = str(OciReference(self._host, repository, tag=None if digest else version, digest=digest))
        image, layers = self._image_manifest(repository, digest or version, shown, pinned=digest)
        by_title = {layer.title: layer for layer in layers if layer.title}
        edge = next((la for la in layers if la.media_type == EDGE_MANIFEST), by_title.get(MANIFEST_FILE))
        if edge is None:
            manifest = _manifest_from_layers(name, version, image, layers, shown)
            log.info(
                "%s was not pushed by edge-agent (no %s layer): built its manifest from the layers",
                shown,
                MANIFEST_FILE,
            )
            return ManifestDocument(manifest, manifest.to_bytes(), None, shown)
        data = self._small_blob(repository, edge, shown)
        manifest = parse_version_manifest(data, f"{shown} ({MANIFEST_FILE})", name, version)
        sig_layer = next(
            (la for la in layers if la.media_type == EDGE_SIGNATURE), by_title.get(SIGNATURE_FILE)
        )
        signature = self._small_blob(repository, sig_layer, shown) if sig_layer is not None else None
        digests = {layer.digest: layer for layer in layers}
        for artifact in manifest.artifacts:
            layer = digests.get("sha256:" + artifact.sha256)
            if layer is None or layer.size != artifact.size:
                raise RegistryError(
                    f"{shown}: its {MANIFEST_FILE} lists {artifact.file} (sha256 {artifact.sha256}, "
                    f"{artifact.size} bytes) but no layer of the image manifest has that digest and size"
                )
        return ManifestDocument(manifest, data, signature, shown)

    def open_artifact(self, name: str, version: str, artifact: Artifact | str) -> BinaryIO:
        return self.open_artifact_at(name, version, artifact, 0)[1]

    def open_artifact_at(
        self, name: str, version: str, artifact: Artifact | str, offset: int, validator: str | None = None
    ) -> tuple[int, BinaryIO]:
        """A blob by its digest (the artifact's sha256), from `offset` when the registry can resume."""
        if not isinstance(artifact, Artifact):
            artifact = self.fetch_manifest(name, version).manifest.artifact(artifact)
        repository = self.repository(name)
        url = self._api(repository, "blobs", "sha256:" + artifact.sha256)
        try:
            start, stream = self._http.stream_from(url, offset, validator)
        except NotFound:
            raise RegistryError(
                f"artifact {artifact.file} of {name}@{version}: blob sha256:{artifact.sha256} "
                f"is missing from {self._host}/{repository}"
            ) from None
        return start, cast(BinaryIO, stream)

    # --- writing ---------------------------------------------------------------------------

    def has_version(self, name: str, version: str) -> bool:
        try:
            self._http.send(
                self._api(self.repository(name), "manifests", version),
                {"Accept": IMAGE_MANIFEST},
                method="HEAD",
            ).close()
        except NotFound:
            return False
        return True

    def push(self, document: ManifestDocument, files: dict[str, Path]) -> str:
        """Push a version (its manifest.json, signatures and files as layers), tagged with its
        version; return the image manifest's digest. Blobs the repository has are not sent again
        (a file missing from `files` must be there already: re-signing needs no files)."""
        manifest = document.manifest
        repository = self.repository(manifest.name)
        layers: list[dict[str, Any]] = []
        for artifact in manifest.artifacts:
            digest = "sha256:" + artifact.sha256
            path = files.get(artifact.file)
            self._upload_blob(
                repository, digest, artifact.size, None if path is None else lambda p=path: p.open("rb")
            )
            layers.append(
                _descriptor(FORMAT_MEDIA_TYPES[artifact.format], digest, artifact.size, artifact.file)
            )
        for data, media_type, title in (
            (document.data, EDGE_MANIFEST, MANIFEST_FILE),
            (document.signature, EDGE_SIGNATURE, SIGNATURE_FILE),
        ):
            if data is not None:
                self._upload_blob(repository, digest_of(data), len(data), data)
                layers.append(_descriptor(media_type, digest_of(data), len(data), title))
        self._upload_blob(repository, digest_of(EMPTY_CONFIG), len(EMPTY_CONFIG), EMPTY_CONFIG)
        image = {
            "schemaVersion": 2,
            "mediaType": IMAGE_MANIFEST,
            "artifactType": ARTIFACT_TYPE,
            "config": {
                "mediaType": EMPTY_CONFIG_TYPE,
                "digest": digest_of(EMPTY_CONFIG),
                "size": len(EMPTY_CONFIG),
                "data": base64.b64encode(EMPTY_CONFIG).decode(),
            },
            "layers": layers,
            "annotations": {CREATED: manifest.created, TITLE: manifest.ref},
        }
        body = json.dumps(image, indent=2).encode()
        url = self._api(repository, "manifests", manifest.version)
        response = self._http.send(url, {"Content-Type": IMAGE_MANIFEST}, method="PUT", body=body)
        response.close()
        pushed = digest_of(body)
        answered = response.headers.get("Docker-Content-Digest")
        if answered and answered != pushed:
            raise RegistryError(f"{url}: the registry stored the manifest as {answered}, we sent {pushed}")
        shown = self.reference(manifest.name, manifest.version)
        log.info("pushed %s to %s as %s (%d layers)", manifest.ref, shown, pushed, len(layers))
        return pushed

    def _upload_blob(self, repository: str, digest: str, size: int, body: Body | None) -> None:
        """Monolithic upload (POST then PUT ?digest=), unless the repository has the blob already."""
        try:
            self._http.send(self._api(repository, "blobs", digest), method="HEAD").close()
            return
        except NotFound:
            if body is None:
                raise RegistryError(
                    f"{self._host}/{repository} has no blob {digest} and no file for it was given"
                ) from None
        started = self._http.send(self._api(repository, "blobs", "uploads/"), method="POST")
        started.close()
        location = started.headers.get("Location")
        if not location:
            raise RegistryError(f"{self.url}: the registry started an upload without a Location")
        upload = urljoin(str(started.url), location)
        separator = "&" if "?" in upload else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        self._http.send(
            f"{upload}{separator}digest={quote(digest)}", headers, method="PUT", body=body
        ).close()

    # --- internals -------------------------------------------------------------------------

    def _api(self, repository: str, kind: str, reference: str) -> str:
        return f"https://{self._host}/v2/{repository}/{kind}/{reference}"

    def _image_manifest(
        self, repository: str, reference: str, shown: str, pinned: str | None
    ) -> tuple[dict[str, Any], list[_Layer]]:
        url = self._api(repository, "manifests", reference)
        try:
            body, headers = self._http.document(url, {"Accept": f"{IMAGE_MANIFEST}, {IMAGE_INDEX}"})
        except NotFound:
            raise self._version_missing(repository, reference, shown) from None
        actual = digest_of(body)
        if pinned is not None and actual != pinned:
            raise RegistryError(f"{shown}: the registry sent a manifest whose digest is {actual}")
        answered = headers.get("Docker-Content-Digest")
        if answered and answered.startswith("sha256:") and answered != actual:
            raise RegistryError(
                f"{shown}: the registry says the manifest is {answered}, its bytes are {actual}"
            )
        try:
            image = json.loads(body)
            if not isinstance(image, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise RegistryError(f"invalid OCI manifest {shown}: {exc}") from None
        media_type = image.get("mediaType") or headers.get("Content-Type", "").split(";")[0]
        if media_type == IMAGE_INDEX or "manifests" in image:
            raise RegistryError(
                f"{shown} is an image index (several platforms); the agent pulls single artifacts"
            )
        if image.get("schemaVersion") != 2 or not isinstance(image.get("layers"), list):
            raise RegistryError(
                f"invalid OCI manifest {shown}: expected schemaVersion 2 with a list of layers"
            )
        layers = [_Layer.parse(raw, i, shown) for i, raw in enumerate(image["layers"])]
        return image, layers

    def _small_blob(self, repository: str, layer: _Layer, shown: str) -> bytes:
        """A small layer (manifest.json, signatures), checked against its digest."""
        url = self._api(repository, "blobs", layer.digest)
        try:
            data, _headers = self._http.document(url)
        except NotFound:
            raise RegistryError(
                f"{shown}: layer {layer.title or layer.digest} (blob {layer.digest}) is missing"
            ) from None
        if digest_of(data) != layer.digest or len(data) != layer.size:
            raise RegistryError(
                f"{shown}: layer {layer.title or layer.digest} does not match its digest "
                f"({len(data)} bytes with {digest_of(data)})"
            )
        return data

    def _version_missing(self, repository: str, reference: str, shown: str) -> RegistryError:
        if reference.startswith("sha256:"):
            return RegistryError(f"{shown} not found in registry {self.url}")
        try:
            tags = ", ".join(self.list_versions(repository.rsplit("/", 1)[-1])) or "none"
        except RegistryError:
            tags = "unknown"
        return RegistryError(f"{shown} not found in registry {self.url}, versions available: {tags}")


@dataclass(frozen=True)
class _Layer:
    media_type: str
    digest: str
    size: int
    title: str | None

    @classmethod
    def parse(cls, raw: Any, index: int, shown: str) -> _Layer:
        where = f"invalid OCI manifest {shown}: layers[{index}]"
        if not isinstance(raw, dict):
            raise RegistryError(f"{where} is not an object")
        media_type, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
        if not isinstance(media_type, str):
            raise RegistryError(f"{where}.mediaType is missing")
        if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
            raise RegistryError(f"{where}.digest {digest!r} is not sha256:<64 lowercase hex>")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RegistryError(f"{where}.size {size!r} is not a byte count")
        annotations = raw.get("annotations") or {}
        title = annotations.get(TITLE) if isinstance(annotations, dict) else None
        return cls(media_type, digest, size, title if isinstance(title, str) else None)


def _descriptor(media_type: str, digest: str, size: int, title: str) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": size, "annotations": {TITLE: title}}


def _manifest_from_layers(
    name: str, version: str, image: dict[str, Any], layers: list[_Layer], shown: str
) -> Manifest:
    """The manifest of a version pushed by other tools: its layers that are model files or test data."""
    titles = {layer.title for layer in layers if layer.title}
    artifacts = []
    for i, layer in enumerate(layers):
        format = _MEDIA_TYPE_FORMATS.get(layer.media_type)
        if format is None and layer.title:
            suffix = Path(layer.title).suffix.lower()
            format = SUFFIX_FORMATS.get(suffix) or {".npz": TESTDATA_FORMAT, ".whl": WHEEL_FORMAT}.get(suffix)
            if suffix == ".bin" and Path(layer.title).with_suffix(".xml").name in titles:
                format = "openvino-ir"  # the weights of an OpenVINO IR pushed beside its .xml
        if format is None:
            log.warning(
                "%s: layer %s (%s) is neither a model file nor test data; ignored",
                shown,
                layer.title or layer.digest,
                layer.media_type,
            )
            continue
        if layer.title is None:
            raise RegistryError(
                f"invalid OCI manifest {shown}: layers[{i}] has no {TITLE} annotation naming its file"
            )
        artifacts.append(
            {
                "file": layer.title,
                "sha256": layer.digest.removeprefix("sha256:"),
                "size": layer.size,
                "format": format,
            }
        )
    annotations = image.get("annotations")
    created = annotations.get(CREATED) if isinstance(annotations, dict) else None
    document: dict[str, Any] = {
        "schema_version": 1,
        "name": name,
        "version": version,
        "created": created if isinstance(created, str) else utc_now_iso(),
        "artifacts": artifacts,
        "metadata": {},
    }
    try:
        return Manifest.model_validate(document)
    except ValueError as exc:
        if created is not None:  # a created annotation in another time format: not worth refusing
            document["created"] = utc_now_iso()
            try:
                return Manifest.model_validate(document)
            except ValueError:
                pass
        problems = "; ".join(
            f"{key_path(e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in getattr(exc, "errors", lambda: [])()
        )
        raise RegistryError(
            f"{shown}: cannot make a model version of its layers: {problems or exc}"
        ) from None


def _next_page(url: str, link: str | None) -> str | None:
    """The next page of a paginated list (RFC 5988 Link: <url>; rel="next")."""
    if not link:
        return None
    match = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', link)
    return urljoin(url, match.group(1)) if match else None


class _ChallengeAuth(httpx.Auth):
    """Answers the registry's 401 challenge: Basic with the configured credentials, or Bearer with a
    token fetched from the challenge's realm (reused per repository until the registry refuses it)."""

    def __init__(self, settings: RegistryConnection) -> None:
        self._basic: str | None = None
        self._static_token: str | None = None
        if settings.token_file is not None:
            self._static_token = read_secret(settings.token_file, "token")
        elif settings.password_file is not None and settings.username:
            secret = read_secret(settings.password_file, "password")
            self._basic = "Basic " + base64.b64encode(f"{settings.username}:{secret}".encode()).decode()
        self._tokens: dict[str, str] = {}  # repository -> bearer token
        self._basic_wanted = False  # the registry asked for Basic once: send it from the start

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        key = _repository_of(request.url.path)
        if self._static_token is not None:
            request.headers["Authorization"] = f"Bearer {self._static_token}"
            yield request
            return
        if key in self._tokens:
            request.headers["Authorization"] = f"Bearer {self._tokens[key]}"
        elif self._basic_wanted and self._basic:
            request.headers["Authorization"] = self._basic
        response = yield request
        if response.status_code != 401:
            return
        scheme, params = _parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if scheme == "basic" and self._basic and request.headers.get("Authorization") != self._basic:
            self._basic_wanted = True
            request.headers["Authorization"] = self._basic
            yield request
        elif scheme == "bearer" and "realm" in params:
            query: dict[str, str] = {k: params[k] for k in ("service", "scope") if k in params}
            token_request = httpx.Request("GET", params["realm"], params=query)
            if self._basic:
                token_request.headers["Authorization"] = self._basic
            token_response = yield token_request
            token_response.read()
            if token_response.status_code != 200:
                status = f"{token_response.status_code} {token_response.reason_phrase}"
                raise RegistryError(
                    f"the registry's token server {public_url(params['realm'])} refused "
                    f"{query.get('scope', 'access')}: {status}",
                    hint="check registry.username / password_file",
                )
            try:
                answer = token_response.json()
                token = answer.get("token") or answer.get("access_token")
                if not isinstance(token, str) or not token:
                    raise ValueError("no token in the answer")
            except (ValueError, AttributeError) as exc:
                raise RegistryError(
                    f"the registry's token server {public_url(params['realm'])} answered: {exc}"
                ) from None
            self._tokens[key] = token
            request.headers["Authorization"] = f"Bearer {token}"
            yield request


def _repository_of(path: str) -> str:
    """/v2/<repository>/(manifests|blobs|tags)/... -> <repository>; other paths -> the path."""
    match = re.match(r"^/v2/(.+?)/(?:manifests|blobs|tags)/", path)
    return match.group(1) if match else path


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="https://auth/token",service="reg",scope="repository:a:pull"` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params
