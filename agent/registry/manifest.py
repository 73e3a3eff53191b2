"""The model version manifest, and cheap checks that an artifact file really is a model of its format.

A manifest is the `manifest.json` of one model version in a registry (and its copy in the local
store). It names every artifact file with its sha256 and size, so whoever pulls a version can
prove that the bytes it got are the bytes that were published.

```json
{
  "schema_version": 1,
  "name": "pp-ocr-cls",
  "version": "2.0",
  "created": "2024-05-01T12:00:00Z",
  "artifacts": [
    {"file": "model.onnx", "sha256": "<64 lowercase hex>", "size": 585532, "format": "onnx", "target": "any"},
    {"file": "inputs.npz", "sha256": "<64 lowercase hex>", "size": 1432, "format": "test-data"}
  ],
  "metadata": {"labels": ["0", "180"]}
}
```

A "wheel" artifact is an edge-agent release (a Python wheel, docs/operations.md, Self-update): a
version holding one is a release, never a model: it has that one artifact and nothing else, and
`models()` never offers it to backend selection or model inspection.

A "test-data" artifact holds inputs (and optionally expected outputs) that selection proves
backends on (agent/testdata.py); `model_file` ties it to one model file, else it is for every
model file whose inputs it fits; `rtol`/`atol` (optional) are the tolerances its expected outputs
hold to.

A reduced-precision variant (`registry publish --quantize int8`, agent/quantize.py) is one more
model file with `precision` ("int8") and `made_from` (the float model file of the version it was
made from); manifests without them load as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.config import Name
from agent.errors import ModelError, RegistryError
from providers.base import one_line

log = logging.getLogger(__name__)

ArtifactFormat = Literal["onnx", "tflite", "openvino-ir", "test-data", "wheel"]
MODEL_FORMATS: tuple[str, ...] = ("onnx", "tflite", "openvino-ir")
TESTDATA_FORMAT = "test-data"
WHEEL_FORMAT = "wheel"  # an edge-agent release (agent/self_update.py), not a model
ARTIFACT_FORMATS: tuple[str, ...] = (*MODEL_FORMATS, TESTDATA_FORMAT, WHEEL_FORMAT)

MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.json.sig"  # its signatures (agent/registry/signing.py)
INDEX_FILE = "index.json"  # at a registry's root: {"schema_version": 1, "models": {name: [versions]}}

_HEX = frozenset("0123456789abcdef")


class Artifact(BaseModel):
    """One file of a model version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(description="Plain file name inside the version directory.")
    sha256: str = Field(description="sha256 of the file's bytes, 64 lowercase hex digits.")
    size: int = Field(ge=0, description="Size of the file in bytes.")
    format: ArtifactFormat
    target: str = Field("any", min_length=1, description='Hardware it is built for: "any", "edgetpu", ...')
    model_file: str | None = Field(
        None, description="test-data only: the model file these inputs are for (default: any they fit)."
    )
    rtol: float | None = Field(
        None, ge=0, description="test-data only: relative tolerance its expected outputs hold to."
    )
    atol: float | None = Field(
        None, ge=0, description="test-data only: absolute tolerance its expected outputs hold to."
    )
    precision: Literal["int8"] | None = Field(
        None, description='A reduced-precision variant (e.g. "int8") of the model file `made_from`.'
    )
    made_from: str | None = Field(
        None, description="A variant only: the model file of this version it was made from."
    )

    @field_validator("file")
    @classmethod
    def _plain_file_name(cls, value: str) -> str:
        if not value or len(value) > 255:
            raise ValueError("must be a file name of 1 to 255 characters")
        if "/" in value or "\\" in value or "\x00" in value or ".." in value:
            raise ValueError(f"must be a plain file name without '/', '\\\\' or '..', got {value!r}")
        if value.startswith("."):
            raise ValueError(f"must not start with '.', got {value!r}")
        if value in (MANIFEST_FILE, SIGNATURE_FILE):
            raise ValueError(f"{value!r} is reserved for the manifest and its signatures")
        return value

    @field_validator("sha256")
    @classmethod
    def _lower_hex(cls, value: str) -> str:
        if len(value) != 64 or not set(value) <= _HEX:
            raise ValueError(f"must be 64 lowercase hex digits, got {value!r}")
        return value


class Manifest(BaseModel):
    """manifest.json of one model version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1]
    name: Name
    version: Name
    created: str = Field(description='ISO 8601 time in UTC, e.g. "2024-05-01T12:00:00Z".')
    artifacts: list[Artifact] = Field(min_length=1)
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free-form: labels, preprocessing hints, provenance."
    )

    @field_validator("created")
    @classmethod
    def _utc_iso8601(cls, value: str) -> str:
        text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"must be an ISO 8601 time such as 2024-05-01T12:00:00Z, got {value!r}"
            ) from None
        if when.utcoffset() != timedelta(0):
            raise ValueError(f"must be in UTC (end with Z or +00:00), got {value!r}")
        return value

    @model_validator(mode="after")
    def _unique_files(self) -> Manifest:
        seen: set[str] = set()
        for artifact in self.artifacts:
            if artifact.file in seen:
                raise ValueError(f"artifact file {artifact.file!r} is listed twice")
            seen.add(artifact.file)
        models = {a.file for a in self.models()}
        wheels = [a.file for a in self.artifacts if a.format == WHEEL_FORMAT]
        if wheels and len(self.artifacts) > 1:
            raise ValueError(
                f"a release holds one wheel and nothing else, got {', '.join(a.file for a in self.artifacts)}"
            )
        if not models and not wheels:
            raise ValueError("no model file among the artifacts (only test data)")
        for artifact in self.artifacts:
            if (artifact.precision is None) != (artifact.made_from is None):
                raise ValueError(f"artifact {artifact.file!r}: a variant names both precision and made_from")
            if artifact.made_from is not None and (
                artifact.made_from not in models or artifact.made_from == artifact.file
            ):
                raise ValueError(
                    f"artifact {artifact.file!r}: made_from {artifact.made_from!r} is not another model "
                    f"file of this version (it has: {', '.join(sorted(models))})"
                )
            for key in ("rtol", "atol"):
                if getattr(artifact, key) is not None and artifact.format != TESTDATA_FORMAT:
                    raise ValueError(f"artifact {artifact.file!r}: {key} is for test-data artifacts only")
            if artifact.model_file is None:
                continue
            if artifact.format != TESTDATA_FORMAT:
                raise ValueError(f"artifact {artifact.file!r}: model_file is for test-data artifacts only")
            if artifact.model_file not in models:
                raise ValueError(
                    f"artifact {artifact.file!r}: model_file {artifact.model_file!r} is not a model file "
                    f"of this version (it has: {', '.join(sorted(models))})"
                )
        return self

    def models(self) -> list[Artifact]:
        """The model files (every format but test data and release wheels)."""
        return [a for a in self.artifacts if a.format in MODEL_FORMATS]

    def is_release(self) -> bool:
        """An edge-agent release (one wheel), not a model."""
        return any(a.format == WHEEL_FORMAT for a in self.artifacts)

    def testdata(self) -> list[Artifact]:
        return [a for a in self.artifacts if a.format == TESTDATA_FORMAT]

    @property
    def ref(self) -> str:
        """`name@version`, as used in messages and MQTT payloads."""
        return f"{self.name}@{self.version}"

    def artifact(self, file: str) -> Artifact:
        for artifact in self.artifacts:
            if artifact.file == file:
                return artifact
        names = ", ".join(a.file for a in self.artifacts)
        raise KeyError(f"{self.ref} has no artifact {file!r} (it has: {names})")

    def primary(self, format: str = "onnx") -> Artifact:
        """The first artifact of `format` (for OpenVINO IR that is the .xml, listed before its .bin)."""
        for artifact in self.artifacts:
            if artifact.format == format:
                return artifact
        formats = ", ".join(sorted({a.format for a in self.artifacts}))
        raise KeyError(f"{self.ref} has no {format} artifact (it has: {formats})")

    def to_bytes(self) -> bytes:
        # Test-data tolerances and a variant's fields appear only when set (manifests without them
        # read as before, byte for byte).
        document = self.model_dump(mode="json")
        for artifact in document["artifacts"]:
            for key in ("rtol", "atol", "precision", "made_from"):
                if artifact.get(key) is None:
                    artifact.pop(key, None)
        return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()

    @classmethod
    def parse_bytes(cls, data: bytes, source: str) -> Manifest:
        """Parse manifest.json; any problem is a RegistryError naming `source` and the key path."""
        try:
            raw = json.loads(data)
        except json.JSONDecodeError as exc:
            raise RegistryError(
                f"invalid model manifest {source}: not valid JSON: "
                f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        except ValueError as exc:  # bytes that are not UTF-8/16/32
            raise RegistryError(f"invalid model manifest {source}: not valid JSON text: {exc}") from None
        try:
            return cls.model_validate(raw, strict=True)
        except ValidationError as exc:
            problems = "; ".join(_describe(error) for error in exc.errors())
            raise RegistryError(f"invalid model manifest {source}: {problems}") from None


@dataclass(frozen=True)
class ManifestDocument:
    """A version's manifest as a registry serves it: the parsed manifest, its exact bytes (what a
    signature covers, and what the store keeps) and its signature file (None: unsigned)."""

    manifest: Manifest
    data: bytes
    signature: bytes | None
    source: str  # where it came from, for messages (a URL without credentials, or a path)


def parse_version_manifest(data: bytes, source: str, name: str, version: str) -> Manifest:
    """Parse a served manifest and refuse one that describes another version than was asked for."""
    manifest = Manifest.parse_bytes(data, source)
    if manifest.name != name or manifest.version != version:
        raise RegistryError(
            f"invalid model manifest {source}: it describes {manifest.ref}, not {name}@{version}"
        )
    return manifest


def check_manifest_digest(data: bytes, digest: str, source: str) -> None:
    """Refuse manifest bytes whose sha256 is not the pinned `digest` ("sha256:<64 hex>")."""
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise RegistryError(
            f"manifest {source} has digest {actual}, but {digest} is pinned; it changed since it was pinned",
            hint="pin the new digest if the change is intended",
        )


def _describe(error: Any) -> str:
    path = key_path(error.get("loc", ()))
    kind = error.get("type", "")
    if kind == "missing":
        message = "required key is missing"
    elif kind == "extra_forbidden":
        message = "unknown key"
    else:
        message = str(error.get("msg", "invalid value"))
        message = message.removeprefix("Value error, ")
    return f"{path}: {message}"


def key_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """('artifacts', 0, 'sha256') -> 'artifacts[0].sha256'; the whole document is '(top level)'."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


# --- artifact content checks -----------------------------------------------------------------


def check_model_file(path: Path, format: str, file_name: str | None = None) -> None:
    """Raise ModelError unless `path` is plausibly a model of `format`.

    ONNX: the file must load as an onnxruntime InferenceSession on CPU (graph optimizations off,
    so this stays cheap). TFLite: the flatbuffer identifier. OpenVINO IR: the .xml must be an
    XML document whose root is <net> (its .bin weights file is not checkable on its own). Test
    data: a NumPy .npz archive of numeric arrays (agent/testdata.py).
    `file_name` is the artifact's name when `path` is a temp or blob file: the error names it, never
    the temp file (a runtime's reason that quotes the path it read gets the name in its place).
    """
    label = file_name or path.name
    try:
        _check_content(path, format, label)
    except ModelError as exc:
        if str(path) not in exc.message and path.name not in exc.message:
            raise
        message = exc.message.replace(str(path), label).replace(path.name, label)
        raise ModelError(message, hint=exc.hint) from None


def _check_content(path: Path, format: str, label: str) -> None:
    if format == "onnx":
        _check_onnx(path, label)
    elif format == "tflite":
        with path.open("rb") as f:
            head = f.read(8)
        if len(head) < 8 or head[4:8] != b"TFL3":
            raise ModelError(f"{label} is not a valid TFLite model: no TFL3 flatbuffer identifier")
    elif format == "openvino-ir":
        if not label.endswith(".xml"):
            return
        _check_openvino_xml(path, label)
    elif format == TESTDATA_FORMAT:
        from agent.testdata import load_testdata

        load_testdata(path, label)
    elif format == WHEEL_FORMAT:
        check_wheel_file(path, label)
    else:
        raise ModelError(
            f"{label}: unknown model format {format!r}; expected one of {', '.join(ARTIFACT_FORMATS)}"
        )


def check_wheel_file(path: Path, label: str) -> None:
    """A Python wheel: a zip archive with a `<name>.dist-info/WHEEL` file, named `*.whl`."""
    import zipfile

    if not label.endswith(".whl"):
        raise ModelError(f"{label} is not a wheel: a wheel's file name ends in .whl")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelError(f"{label} is not a valid wheel: not a zip archive ({exc})") from None
    if not any(
        n.count("/") == 1 and n.split("/")[0].endswith(".dist-info") and n.endswith("/WHEEL") for n in names
    ):
        raise ModelError(f"{label} is not a valid wheel: no <name>.dist-info/WHEEL in it")


def _check_onnx(path: Path, label: str) -> None:
    """What the onnx checker accepts is a model. Whether this box's runtimes load it (an old opset,
    an operator one lacks) is the selection's question, which also tries an upgraded twin."""
    import onnx  # heavy import, only when a model is checked

    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:  # the checker raises ValidationError, DecodeError, OSError, ...
        raise ModelError(f"{label} is not a valid ONNX model: {one_line(exc)}") from None
    log.debug("%s passes the onnx checker", label)


def _check_openvino_xml(path: Path, label: str) -> None:
    import xml.etree.ElementTree as ET

    try:
        for _event, element in ET.iterparse(str(path), events=("start",)):
            if element.tag != "net":
                raise ModelError(
                    f"{label} is not a valid OpenVINO IR: root element is <{element.tag}>, not <net>"
                )
            return
    except ET.ParseError as exc:
        raise ModelError(f"{label} is not a valid OpenVINO IR: not XML: {exc}") from None
    raise ModelError(f"{label} is not a valid OpenVINO IR: empty document")
