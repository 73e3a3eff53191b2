"""Ed25519 signatures on model manifests, and the trust policy that decides which to accept.

A signature covers the exact bytes of one version's `manifest.json`, which pin every artifact by
sha256 and size: a box that checks the signature and then the hashes runs only bytes the key's
holder published. Signatures live beside the manifest in `manifest.json.sig`::

    {"schema_version": 1,
     "signatures": [{"algorithm": "ed25519", "key_id": "<16 hex>", "signature": "<base64, 64 bytes>"}]}

Several signatures may sign one manifest (a key being rotated out, a second approver). Keys are
standard PEM files: a PKCS#8 private key and a SubjectPublicKeyInfo public key, the same as
`openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write, so a signature can be made
or checked with openssl alone (docs/registry.md). A key's id is the first 16 hex digits of the
sha256 of its 32 raw public bytes.

The trust policy comes from `registry.trusted_keys` in agent.yaml. With no key listed, manifests
need no signature. With keys listed, a manifest is accepted only when a signature by a key
trusted for that model name (shell patterns, `models: ["pp-ocr-*"]`) verifies over its bytes.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.config import TrustedKey
from agent.errors import ConfigError, EdgeAgentError
from agent.fsutil import atomic_write_bytes
from agent.registry.manifest import ManifestDocument

# cryptography (7 MB resident) is imported where keys are made, loaded or checked: a box whose
# registry.trusted_keys is empty never needs it.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "ed25519"
PUBLIC_SUFFIX = ".pub"


class SignatureError(EdgeAgentError):
    """A manifest is unsigned, its signature is bad, or no trusted key signed it."""


@dataclass(frozen=True)
class Signature:
    key_id: str
    signature: bytes


def key_id(public_key: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# --- keys --------------------------------------------------------------------------------------


def generate_key(private_path: Path, force: bool = False) -> tuple[str, Path]:
    """Write a new private key to `private_path` (mode 0600) and its public key beside it
    (`<private_path>.pub`); return (key id, public key path). Existing files are kept unless `force`."""
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + PUBLIC_SUFFIX)
    for path in (private_path, public_path):
        if path.exists() and not force:
            raise EdgeAgentError(
                f"{path} exists; refusing to overwrite a key", hint="pass --force to replace it"
            )
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        private_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(private_path, private_pem, mode=0o600)
        atomic_write_bytes(public_path, public_pem, mode=0o644)
    except OSError as exc:
        raise EdgeAgentError(f"cannot write key files {private_path}: {exc.strerror}") from None
    return key_id(private_key.public_key()), public_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read_key_file(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise EdgeAgentError(
            f"{path} is not an unencrypted PEM private key: {exc}",
            hint="make one with `edge-agent registry keygen` or `openssl genpkey -algorithm ed25519`",
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EdgeAgentError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise EdgeAgentError(
            f"{path} is not a PEM public key: {exc}",
            hint="use the .pub file `edge-agent registry keygen` wrote, or `openssl pkey -pubout`",
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise EdgeAgentError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise EdgeAgentError(f"cannot read the {what} {path}: {exc.strerror}") from None


# --- signature documents -------------------------------------------------------------------------


def sign(manifest_data: bytes, private_key: Ed25519PrivateKey, existing: bytes | None = None) -> bytes:
    """The signature document for `manifest_data` with this key's signature added (replacing an
    earlier one by the same key; signatures by other keys in `existing` are kept)."""
    new = Signature(key_id(private_key.public_key()), private_key.sign(manifest_data))
    kept = [s for s in parse_signatures(existing, "the existing signature file") if s.key_id != new.key_id]
    return signature_document([*kept, new])


def signature_document(signatures: Sequence[Signature]) -> bytes:
    document = {
        "schema_version": 1,
        "signatures": [
            {"algorithm": ALGORITHM, "key_id": s.key_id, "signature": base64.b64encode(s.signature).decode()}
            for s in signatures
        ],
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def parse_signatures(data: bytes | None, source: str) -> list[Signature]:
    """The signatures of a manifest.json.sig (none for None); SignatureError naming `source` when
    the document is not one."""
    if data is None:
        return []
    try:
        document: Any = json.loads(data)
        if not isinstance(document, dict) or document.get("schema_version") != 1:
            raise ValueError('expected an object with "schema_version": 1')
        entries = document.get("signatures")
        if not isinstance(entries, list) or not entries:
            raise ValueError('"signatures" must be a non-empty list')
        signatures = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"signatures[{i}] must be an object")
            if entry.get("algorithm") != ALGORITHM:
                raise ValueError(
                    f"signatures[{i}].algorithm must be {ALGORITHM!r}, got {entry.get('algorithm')!r}"
                )
            kid, text = entry.get("key_id"), entry.get("signature")
            if not isinstance(kid, str) or not kid:
                raise ValueError(f"signatures[{i}].key_id must be a non-empty string")
            if not isinstance(text, str):
                raise ValueError(f"signatures[{i}].signature must be a base64 string")
            try:
                raw = base64.b64decode(text, validate=True)
            except binascii.Error:
                raise ValueError(f"signatures[{i}].signature is not valid base64") from None
            if len(raw) != 64:
                raise ValueError(f"signatures[{i}].signature has {len(raw)} bytes; an ed25519 one has 64")
            signatures.append(Signature(kid, raw))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise SignatureError(f"invalid signature file {source}: {exc}") from None
    return signatures


# --- trust --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Trusted:
    key_id: str
    public_key: Ed25519PublicKey
    models: tuple[str, ...]
    path: Path

    def covers(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)


class TrustPolicy:
    """Which signed manifests this box accepts (see the module docstring)."""

    def __init__(self, keys: Sequence[_Trusted] = ()) -> None:
        self._keys = {k.key_id: k for k in keys}

    @classmethod
    def from_config(cls, trusted_keys: Sequence[TrustedKey]) -> TrustPolicy:
        """Load every `registry.trusted_keys[i].key`; a file that is not an Ed25519 public key is a
        ConfigError naming the entry."""
        keys, problems = [], []
        for i, entry in enumerate(trusted_keys):
            try:
                public_key = load_public_key(entry.key)
            except EdgeAgentError as exc:
                problems.append(f"registry.trusted_keys[{i}].key: {exc.message}")
                continue
            keys.append(_Trusted(key_id(public_key), public_key, tuple(entry.models), Path(entry.key)))
        if problems:
            raise ConfigError(
                problems, hint="trusted keys are the .pub files `edge-agent registry keygen` writes"
            )
        return cls(keys)

    @property
    def required(self) -> bool:
        """Whether manifests must be signed (some key is trusted)."""
        return bool(self._keys)

    def check(self, document: ManifestDocument) -> str | None:
        """The id of the trusted key whose signature verifies over the manifest's exact bytes
        (None when no key is trusted: signatures are not required); SignatureError saying why not."""
        if not self._keys:
            return None
        source = document.source
        if document.signature is None:
            raise SignatureError(
                f"manifest {source} is unsigned, and this agent runs only signed models "
                f"(registry.trusted_keys lists {len(self._keys)} key(s))",
                hint="sign it with `edge-agent registry sign` (or publish --sign)",
            )
        signatures = parse_signatures(document.signature, f"of manifest {source}")
        return self.verify(document.data, signatures, [document.manifest.name], f"manifest {source}")

    def verify(self, data: bytes, signatures: Sequence[Signature], models: Sequence[str], what: str) -> str:
        """The id of a trusted key whose signature verifies over `data` and that is trusted for every
        one of `models`; SignatureError naming `what` and why each signature failed otherwise."""
        from cryptography.exceptions import InvalidSignature

        problems = []
        for signature in signatures:
            trusted = self._keys.get(signature.key_id)
            if trusted is None:
                problems.append(f"key {signature.key_id} is not trusted")
                continue
            outside = [m for m in models if not trusted.covers(m)]
            if outside:
                problems.append(
                    f"key {signature.key_id} ({trusted.path}) is trusted only for models matching "
                    f"{', '.join(trusted.models)}, not {', '.join(repr(m) for m in outside)}"
                )
                continue
            try:
                trusted.public_key.verify(signature.signature, data)
            except InvalidSignature:
                problems.append(
                    f"the signature by key {signature.key_id} does not match the signed bytes "
                    "(they were changed after signing, or the signature is forged)"
                )
                continue
            return signature.key_id
        models_text = ", ".join(repr(m) for m in models) or "it"
        raise SignatureError(
            f"{what} has no valid signature by a key trusted for {models_text}: "
            + ("; ".join(problems) or "no signatures"),
            hint="trusted keys are registry.trusted_keys in agent.yaml",
        )
