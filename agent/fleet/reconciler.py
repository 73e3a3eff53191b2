"""Desired state in, reported state out: the device side of docs/fleet.md.

Documents arrive on the device's and its groups' desired topics (through the router), are checked
(agent/fleet/document.py: size, JSON, signature, schema, expiry; agent/fleet/desired.py: generation),
persisted, layered over agent.yaml and handed to `Supervisor.apply`, which brings each changed
pipeline in with its health window and rolls it back by itself. A refused document changes nothing
that runs; the reason goes into reported state. Reported state is retained on
`<prefix>/<device>/reported`, republished on every transition and after every reconnect, and kept
small (reasons clipped, the last few refusals).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent import __version__
from agent.clock import iso_utc
from agent.config import AgentConfig
from agent.desired_pipeline import DesiredPipeline
from agent.errors import DesiredStateError
from agent.fleet import protocol
from agent.fleet.desired import UNCHANGED, DesiredStore, admit, layer_agent, layer_pipelines
from agent.fleet.document import DesiredDocument, parse_document
from agent.mqtt.message import Message
from agent.mqtt.router import Router
from agent.mqtt.topics import desired_topic, group_desired_topic, reported_topic
from agent.registry.signing import TrustPolicy
from agent.status import IN_FLIGHT, LONG_TEXTS, Phase, PipelineStatus
from agent.supervisor import Supervisor
from agent.text import clip

if TYPE_CHECKING:
    from agent.self_update import Updater

log = logging.getLogger(__name__)

_MAX_REFUSALS = 10  # kept in reported state, newest last
_REASON_CHARS = 600  # one reason in reported state; the log has it whole
_FAILED: tuple[Phase, ...] = ("failed", "rolled-back")  # a document's generation that did not come in


def _clip(text: str | None) -> str | None:
    return None if text is None else clip(text, _REASON_CHARS, " ... (clipped)")


class Reconciler:
    def __init__(
        self,
        config: AgentConfig,
        supervisor: Supervisor,
        trust: TrustPolicy,
        publish_retained: Callable[[str, bytes], bool],
        connects: Callable[[], int],
        updater: Updater | None = None,
    ) -> None:
        """`publish_retained(topic, payload)` sends reported state (False: not sent, try later);
        `connects()` counts connections, so a reconnect republishes it; `updater` hears the `agent`
        release desired state names (None: no self-update)."""
        self.config = config
        self.device = config.device.id
        self.supervisor = supervisor
        self.trust = trust
        self.store = DesiredStore(config.state_dir)
        self._publish_retained = publish_retained
        self._connects = connects
        self._lock = threading.Lock()
        self._documents: dict[str, DesiredDocument] = {}  # layer -> the accepted document
        self._document_state: dict[str, dict[str, Any]] = {}  # layer -> observed/applied/state/reason
        self._refused: list[dict[str, Any]] = []
        # Every document message since the start: each ends refused, accepted or unchanged.
        self._counts = {"received": 0, "accepted": 0, "unchanged": 0, "withdrawn": 0}
        self._refusals = 0  # (`refused` keeps the last few)
        self._last_sent: bytes | None = None
        self._sent_on_connect = -1
        self.updater = updater
        self.topic = reported_topic(config.mqtt.topic_prefix, self.device)
        self.layers = {
            desired_topic(config.mqtt.topic_prefix, self.device): protocol.device_layer(self.device)
        }
        for group in config.device.groups:
            self.layers[group_desired_topic(config.mqtt.topic_prefix, group)] = protocol.group_layer(group)

    def use_config(self, config: AgentConfig) -> None:
        """A reloaded config (only its reloadable settings differ: the pipelines desired state layers)."""
        self.config = config

    # --- start: the persisted documents, then the broker's ------------------------------------

    def start(self, router: Router | None) -> None:
        """Apply agent.yaml with the documents accepted before (the broker may be away), then listen."""
        documents, reasons = self.store.load(self.trust, self.config.fleet.max_document_bytes, time.time())
        for reason in reasons:
            log.warning("desired state: %s", reason)
            self._refuse(
                reason.split(":", 2)[0] if reason.startswith(("device:", "group:")) else "?", None, reason
            )
        with self._lock:
            for document in documents:
                if document.layer in self.layers.values():
                    self._documents[document.layer] = document
                    self._document_state[document.layer] = {
                        "observed_generation": document.generation,
                        "applied_generation": document.generation,
                        "state": "applied",
                        "reason": None,
                    }
        if documents:
            log.info(
                "desired state: starting on %s",
                ", ".join(f"{d.layer} generation {d.generation}" for d in documents),
            )
        self.apply()
        if router is not None and self.config.fleet.enabled:
            for topic, layer in self.layers.items():
                router.route(topic, self._handler_for(layer))

    def _handler_for(self, layer: str) -> Callable[[Message], None]:
        return lambda message: self.on_document(layer, message)

    # --- documents ------------------------------------------------------------------------------

    def on_document(self, layer: str, message: Message) -> None:
        """One message on a desired topic: withdraw, refuse, ignore (the applied one again) or apply."""
        with self._lock:
            self._counts["received"] += 1
        if not message.payload:
            with self._lock:
                self._counts["withdrawn"] += 1
                withdrawn = self._documents.pop(layer, None)
                self._document_state[layer] = {
                    "observed_generation": None,
                    "applied_generation": None,
                    "state": "withdrawn",
                    "reason": None,
                }
            if withdrawn is not None:
                log.info("desired state: %s withdrawn (empty retained message)", layer)
                self.store.remove(layer)
                self.apply()
            return
        observed = _generation_of(message.payload)
        try:
            document = parse_document(
                message.payload, layer, self.trust, self.config.fleet.max_document_bytes, time.time()
            )
            observed = document.generation
            if admit(document, self.store) == UNCHANGED:
                with self._lock:
                    self._counts["unchanged"] += 1
                return  # the applied document again (a retained message after a reconnect)
            self._check_can_serve(document)
        except DesiredStateError as exc:
            self._refuse(layer, observed, str(exc))
            return
        self.store.save(document)
        self.store.mark_applied(layer, document.generation)
        with self._lock:
            self._counts["accepted"] += 1
            self._documents[layer] = document
            self._document_state[layer] = {
                "observed_generation": document.generation,
                "applied_generation": document.generation,
                "state": "applied",
                "reason": None,
            }
        log.info("desired state: %s generation %d accepted", layer, document.generation)
        self.apply()

    def _check_can_serve(self, document: DesiredDocument) -> None:
        """What the schema cannot know: this agent pulls registry models only with a registry."""
        if self.config.registry is not None:
            return
        uses = sorted(
            name for name, p in document.pipelines.items() if p is not None and p.model.path is None
        )
        if uses:
            problem = (
                f"{document.layer}: $.pipelines: {', '.join(uses)} name registry models, and this agent "
                "has no registry configured (registry: in agent.yaml)"
            )
            raise DesiredStateError(document.layer, [problem])

    def _refuse(self, layer: str, generation: int | None, reason: str) -> None:
        log.error("desired state refused: %s", reason)
        with self._lock:
            state = self._document_state.setdefault(
                layer,
                {"observed_generation": None, "applied_generation": None, "state": "refused", "reason": None},
            )
            applied = self._documents.get(layer)
            state.update(
                {
                    "observed_generation": generation,
                    "applied_generation": applied.generation if applied else state.get("applied_generation"),
                    "state": "refused",
                    "reason": _clip(reason),
                }
            )
            self._refused.append(
                {
                    "layer": layer,
                    "generation": generation,
                    "reason": _clip(reason),
                    "at": iso_utc(time.time()),
                }
            )
            del self._refused[:-_MAX_REFUSALS]
            self._refusals += 1
        self.report(force=True)

    def desired(self) -> list[DesiredPipeline]:
        """agent.yaml layered with the accepted documents (docs/fleet.md, Layering)."""
        with self._lock:
            documents = list(self._documents.values())
        layered = layer_pipelines(self.config.pipelines, documents, self.device, self.config.fleet.health)
        return list(layered.values())

    def desired_release(self) -> tuple[str, str, float] | None:
        """(version, registry name, health_s) of the release the winning `agent` field names."""
        with self._lock:
            documents = list(self._documents.values())
        winner = layer_agent(documents)
        if winner is None:
            return None
        release, _layer = winner
        return release.version, release.release, release.health_s

    def apply(self) -> None:
        self.supervisor.apply(self.desired())
        if self.updater is not None:
            wanted = self.desired_release()
            if wanted is None:
                self.updater.want(None)
            else:
                self.updater.want(*wanted)
        self.report(force=True)

    # --- reported state --------------------------------------------------------------------------

    def documents(self) -> dict[str, dict[str, Any]]:
        """Per layer: observed and applied generation, state, reason."""
        with self._lock:
            return {layer: dict(s) for layer, s in self._document_state.items()}

    def reported(self) -> dict[str, Any]:
        pipelines = {name: state.reported_json(_clip) for name, state in self.supervisor.states().items()}
        documents = self.documents()
        with self._lock:
            refused, refusals, counts = list(self._refused), self._refusals, dict(self._counts)
        return {
            "schema_version": protocol.SCHEMA_VERSION,
            "device": self.device,
            "groups": list(self.config.device.groups),
            "agent_version": __version__,
            "agent": self._agent_report(),
            "updated_at": iso_utc(time.time()),
            "documents": documents,
            "pipelines": pipelines,
            "refused": refused,
            "refusals": refusals,
            "messages": {**counts, "refused": refusals},
        }

    def _agent_report(self) -> dict[str, Any]:
        if self.updater is None:
            return {"version": __version__, "desired": None, "state": "current", "reason": None}
        report = self.updater.report()
        return {**report, "reason": _clip(report.get("reason"))}

    def tick(self) -> None:
        """From the daemon's loop: reported state that could not be sent goes out once the link is back."""
        self.report()

    def report(self, force: bool = False) -> None:
        """Publish reported state when it changed (or after a reconnect); called on every transition
        and from the daemon's loop, so one that could not be sent goes out once the link is back."""
        document = self.reported()
        body = dict(document, updated_at=None)
        fingerprint = json.dumps(body, sort_keys=True, default=str).encode()
        connects = self._connects()
        with self._lock:
            if not force and fingerprint == self._last_sent and connects == self._sent_on_connect:
                return
        payload = _fit(document, self.config.mqtt.max_payload_bytes)
        if self._publish_retained(self.topic, payload):
            with self._lock:
                self._last_sent, self._sent_on_connect = fingerprint, connects


def generation_outcomes(
    documents: dict[str, dict[str, Any]], pipelines: Mapping[str, PipelineStatus]
) -> dict[str, dict[str, Any]]:
    """Each layer's document state (`Reconciler.documents`) with what became of its applied
    generation here, from the pipelines' states (`Supervisor.states`): an accepted document is not
    yet a serving one. `outcome`: `applied` (every pipeline it brought runs it), `applying` (one is
    still being brought in), `failed` (one failed or was rolled back; `failed` lists them, each
    with the version that serves instead), None when no generation of it is applied. `edge-agent
    status` shows it; reported state keeps the documents as they are (the controller judges the
    pipelines itself)."""
    outcomes = {}
    for layer, document in documents.items():
        ours = {name: p for name, p in pipelines.items() if p.change.desired.layer == layer}
        failed = [p.outcome_json(name, _clip) for name, p in sorted(ours.items()) if p.phase in _FAILED]
        if document.get("applied_generation") is None:
            outcome = None
        elif failed:
            outcome = "failed"
        elif any(p.phase in IN_FLIGHT for p in ours.values()):
            outcome = "applying"
        else:
            outcome = "applied"
        outcomes[layer] = {**document, "outcome": outcome, "failed": failed}
    return outcomes


def _fit(document: dict[str, Any], limit: int) -> bytes:
    """The reported document as JSON within `limit` bytes (any broker's packet limit): with very many
    pipelines, the long texts go first (backend explanations, then reasons), then the refusals list."""
    payload = json.dumps(document, separators=(",", ":"), default=str).encode()
    for key in LONG_TEXTS:
        if len(payload) <= limit:
            return payload
        for pipeline in document["pipelines"].values():
            pipeline[key] = None
        document["trimmed"] = True
        payload = json.dumps(document, separators=(",", ":"), default=str).encode()
    if len(payload) > limit:
        document["refused"] = document["refused"][-1:]
        payload = json.dumps(document, separators=(",", ":"), default=str).encode()
    return payload


def _generation_of(payload: bytes) -> int | None:
    """The generation a refused document claims, for reported state (best effort, small ones only)."""
    if len(payload) > protocol.MAX_DOCUMENT_BYTES:
        return None
    try:
        data = json.loads(payload)
        if protocol.is_envelope(data) and isinstance(data.get("document"), str):
            data = json.loads(data["document"])
        generation = data.get("generation") if isinstance(data, dict) else None
    except (ValueError, RecursionError):
        return None
    return generation if type(generation) is int else None
