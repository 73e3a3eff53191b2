"""The fleet protocol's pure pieces, shared by the agent (device side, agent/fleet/) and the controller
(agent/fleetctl/): layers, cohorts, a document's canonical bytes and its signed envelope. What a
document may say and its check are the other shared module, agent/fleet/document.py.

Documents, envelopes and cohorts are described in docs/fleet.md. Nothing here talks to a broker.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.registry.signing import ALGORITHM, Signature, key_id, parse_signatures
from agent.status import IN_FLIGHT, TERMINAL

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SCHEMA_VERSION = 1
# Far above any real document; stops a huge retained message before it is parsed.
MAX_DOCUMENT_BYTES = 65_536

# Terminal pipeline phases in reported state: nothing else may last (the phases: agent/status.py).
TERMINAL_PHASES = TERMINAL
IN_FLIGHT_PHASES = IN_FLIGHT


def device_layer(device: str) -> str:
    return f"device:{device}"


def group_layer(group: str) -> str:
    return f"group:{group}"


def in_canary(device_id: str, seed: str, percent: float) -> bool:
    """Whether a device is in a rollout's canary cohort: a stable hash of seed and device id, so the
    controller and every device agree without talking (docs/fleet.md, Staged rollouts)."""
    bucket = int(hashlib.sha256(f"{seed}/{device_id}".encode()).hexdigest()[:8], 16) % 10_000
    return bucket < round(percent * 100)


def encode(document: Mapping[str, Any]) -> bytes:
    """A document's canonical bytes (what is signed and published)."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def sign_envelope(document_bytes: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The signed envelope carrying `document_bytes` (docs/fleet.md, Signed documents)."""
    signature = Signature(key_id(private_key.public_key()), private_key.sign(document_bytes))
    envelope = {
        "schema_version": SCHEMA_VERSION,
        "document": document_bytes.decode(),
        "signatures": [
            {
                "algorithm": ALGORITHM,
                "key_id": signature.key_id,
                "signature": base64.b64encode(signature.signature).decode(),
            }
        ],
    }
    return json.dumps(envelope, separators=(",", ":")).encode()


def is_envelope(data: Any) -> bool:
    return isinstance(data, dict) and "document" in data and "signatures" in data


def open_envelope(data: Mapping[str, Any], source: str) -> tuple[bytes, list[Signature]]:
    """(the signed document bytes, its signatures) of a parsed envelope; ValueError when it is not
    one. Signatures are not checked here: TrustPolicy.verify does that."""
    unknown = sorted(set(data) - {"schema_version", "document", "signatures"})
    if unknown:
        raise ValueError(f"unknown key(s) in the signed envelope: {', '.join(unknown)}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f'the signed envelope needs "schema_version": {SCHEMA_VERSION}')
    text = data.get("document")
    if not isinstance(text, str):
        raise ValueError('"document" must be the signed document as a JSON string')
    signatures = parse_signatures(
        json.dumps({"schema_version": 1, "signatures": data.get("signatures")}).encode(), source
    )
    return text.encode(), signatures
