"""State topics and Home Assistant MQTT discovery (docs/integrations.md).

**State topics** (`state_topics.enabled`, or implied by `home_assistant.enabled`): besides the full
result messages, each classification or detection pipeline keeps its state on simple retained topics
under `<prefix>/<device>/state/<pipeline>/`, plain text, QoS 1, published only when a value changes:

    label              classification: the top label of the last published result
    count              detection: how many detections it had
    count/<label>      detection: how many of a watched label
    seen/<label>       ON while a watched label is in the last result (and off_delay_s after), else OFF
    image              detection with home_automation.image: the frame with its boxes drawn (JPEG)
    fps                every pipeline: its frame rate (one decimal)
    backend            every pipeline: the backend serving it (e.g. onnxruntime/CPUExecutionProvider)
    motion             a pipeline with a motion gate (`motion:`): ON while its latest frame moved, else
                       OFF (looked at every tick, sent when it changes)

and a tracking pipeline's (PipelineConfig.tracking: zones, lines or track; agent/processing/scene.py),
from its scene's counts after each frame with events (`observe_scene`) and its snapshots
(`observe_snapshot`); once the pipeline runs, they start at what a new scene has (0, OFF; the stays
have a value from the zone's first exit on):

    tracks                   objects tracked now
    zone/<zone>/count        objects in the zone
    zone/<zone>/count/<label>  of them, those of a label of the zone's `labels` filter
    zone/<zone>/stayed_s     the last stay in the zone (an `exit` event's stayed_s), seconds
    zone/<zone>/mean_stayed_s  the mean of its last STAYS_KEPT stays
    zone/<zone>/dwelling     ON while an object has been in it longer than its dwell_s (zones with one)
    zone/<zone>/overcrowded  ON while more than its max_objects are in it (zones with one)
    line/<line>/<direction>  crossings per direction name since the agent started
    line/<line>/<direction>/<label>  of them, those of a label of the line's `labels` filter
    zone/<zone>/last/<attribute>  a pipeline with attributes (all but embeddings): the value read on
                             the object that last entered the zone (read as it entered, or later)
    line/<line>/last/<attribute>  the same for the object that last crossed the line (the last plate
                             through the gate); none until one has
    snapshot                 track.snapshots: the latest snapshot of any object (JPEG)
    snapshot/<label>         the latest snapshot of a `label` object (JPEG)
    clip                     clips.enabled: the id of the clip the latest event names (agent/clips.py)
    clip_url                 and the web page on: its path there, /clips/<pipeline>/<id> (the MP4)

and the box's own under `<prefix>/<device>/state/_device/`:

    outbox_pending     results and messages queued in the outbox, not yet acknowledged by the broker

They follow the results the pipeline publishes (its `report` rules apply); fps, backend and the
outbox backlog follow the daemon's status, looked at every HEALTH_EVERY_S. After every (re)connect
they are all published again, so a broker that lost its retained messages gets them back. A topic no
longer produced (a pipeline removed, a label no longer watched, the feature turned off) is cleared
with an empty retained message; what was published is remembered in `<state_dir>/home_automation.json`
so a restart clears what the previous run left behind.

**Home Assistant** (`home_assistant.enabled`): one retained device discovery config per box on
`<discovery_prefix>/device/<object_id>/config` (Home Assistant 2024.11+), its components per pipeline
reading the state topics (no templates), and the box's own: its connectivity (a binary_sensor on the
status topic) and outbox backlog; availability from the agent's own retained status topic. It
is published after each connect, whenever the pipelines change (reload, fleet) and when Home
Assistant's birth message ("online" on `<discovery_prefix>/status`) arrives. A component that goes is
sent as `{"p": <platform>}` (Home Assistant's documented removal) and kept so in the retained config,
so a Home Assistant that was away removes it too; turning discovery off publishes an empty config,
which removes the device and all of its entities.

The package: `views` (what a pipeline shows, its state), `discovery` (Home Assistant's discovery
config), `image` (the annotated JPEG); `HomeAutomation` here is the daemon's part.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import cv2
import numpy as np

from agent.config import AgentConfig, PipelineConfig
from agent.fsutil import atomic_write_bytes
from agent.home_automation.discovery import (
    DiscoveryIdentity,
    component_ids,
    discovery_components,
    discovery_payload,
    identity_of,
)
from agent.home_automation.image import annotated_jpeg
from agent.home_automation.views import (
    DEVICE,
    OFF,
    ON,
    QOS,
    Entity,
    PipelineState,
    PipelineView,
    device_entities,
    entities,
    health_values,
    label_of,
)
from agent.logfmt import first_or_every
from agent.mqtt.message import Message
from agent.mqtt.publisher import payload_room
from agent.mqtt.topics import ha_device_config_topic, ha_status_topic, state_topic
from agent.status import PipelineStatus
from agent.steps.motion import PipelineMotion

log = logging.getLogger(__name__)

MEMORY_FILE = "home_automation.json"
_MAX_REMOVED = 256  # removed components kept (as removals) in the retained discovery config
# Exits and crossings kept for a pipeline the state topics do not know yet (until the next tick, or
# the next change of pipelines for one that went): bounded, should it never come.
_MAX_PENDING_EVENTS = 1000
HEALTH_EVERY_S = 10.0  # how often fps, backend and the outbox backlog are looked at (on change: sent)

__all__ = [
    "DEVICE",
    "HEALTH_EVERY_S",
    "MEMORY_FILE",
    "OFF",
    "ON",
    "QOS",
    "DiscoveryIdentity",
    "Entity",
    "Health",
    "HomeAutomation",
    "PipelineState",
    "PipelineView",
    "Publisher",
    "Routes",
    "annotated_jpeg",
    "component_ids",
    "device_entities",
    "discovery_components",
    "discovery_payload",
    "entities",
    "identity_of",
    "label_of",
]


class Publisher(Protocol):
    """What this module needs of the MQTT connection (agent/mqtt/connection.py)."""

    @property
    def connected(self) -> bool: ...

    def publish_snapshot(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> bool: ...

    def stats(self) -> dict[str, Any]: ...


class Running(Protocol):
    """A running pipeline, as far as the state topics care: its name (agent/pipeline.py)."""

    @property
    def name(self) -> str: ...


class Routes(Protocol):
    def route(
        self, topic_filter: str, handler: Callable[[Message], None], qos: int = 1
    ) -> Callable[[], None]: ...


# What the daemon knows of its health: each pipeline's status (agent/status.py: its rate and what
# serves it) and how many messages wait in the outbox.
Health = tuple[Mapping[str, PipelineStatus], int]


# --- the daemon's part --------------------------------------------------------------------------


@dataclass
class _Memory:
    """What the broker holds from this agent (retained), kept across restarts."""

    config_topic: str | None = None  # the discovery config published (None: none)
    components: dict[str, str] = field(default_factory=dict)  # announced: id -> platform
    removed: dict[str, str] = field(default_factory=dict)  # sent as removals: id -> platform
    state_topics: set[str] = field(default_factory=set)  # retained state topics with a value

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "discovery": {
                    "topic": self.config_topic,
                    "components": self.components,
                    "removed": self.removed,
                },
                "state_topics": sorted(self.state_topics),
            },
            indent=2,
        ).encode()

    @classmethod
    def load(cls, path: Path) -> _Memory:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            discovery = data.get("discovery") or {}
            return cls(
                discovery.get("topic"),
                {str(k): str(v) for k, v in (discovery.get("components") or {}).items()},
                {str(k): str(v) for k, v in (discovery.get("removed") or {}).items()},
                {str(t) for t in data.get("state_topics") or []},
            )
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            log.warning("ignoring %s (%s): what an earlier run left retained is not cleared", path, exc)
            return cls()


class HomeAutomation:
    """Publishes the state topics and the discovery config through the daemon's MQTT connection.

    `observe`, `observe_scene` and `observe_snapshot` are the result writer's hooks (pipeline threads);
    `tick` runs on the daemon's main loop every half second: pipeline changes, off delays, images, the
    tracking values' start, discovery, reconnects, clean-up.
    """

    def __init__(
        self,
        config: AgentConfig,
        mqtt: Publisher,
        wanted: Callable[[], list[PipelineConfig]],
        running: Callable[[], Sequence[Running]],
        health: Callable[[], Health] | None = None,
    ) -> None:
        self.config = config
        self._mqtt = mqtt
        self._wanted = wanted
        self._running_of = running
        self._health = health
        self._next_health = 0.0
        self._device: dict[tuple[str, ...], bytes] = {}  # the box's own state values (under DEVICE)
        self._lock = threading.Lock()
        self._path = config.state_dir / MEMORY_FILE
        self._memory = _Memory.load(self._path)
        self._views: dict[str, PipelineView] = {}
        self._states: dict[str, PipelineState] = {}
        # Results (output, pixels) before their view.
        self._pending: dict[str, tuple[Mapping[str, Any], np.ndarray | None]] = {}
        # Scene summaries (the latest) and events (all) before their view.
        self._pending_scenes: dict[str, tuple[Mapping[str, Any], list[Mapping[str, Any]]]] = {}
        self._pending_snapshots: dict[str, dict[str, bytes]] = {}  # label -> snapshot, before their view
        self._snapshots_too_big = 0
        self._images: dict[str, tuple[np.ndarray, list[dict[str, Any]]]] = {}  # due, not yet sent
        self._next_image: dict[str, float] = {}
        # state topic -> (payload, the connection it went out on: MqttConnection's connect count)
        self._sent: dict[str, tuple[bytes, int]] = {}
        self._connects = -1
        self._discovery_sent: bytes | None = None
        self._births_handled = 0
        self._router: Routes | None = None
        self._unroute: Callable[[], None] | None = None
        self._routed: str | None = None
        self._counts = {"state_published": 0, "images": 0, "discovery_published": 0, "births": 0}

    # --- wiring ----------------------------------------------------------------------------------

    def start(self, router: Routes) -> None:
        """Route Home Assistant's birth message (call before the connection starts)."""
        self._router = router
        self._route()

    def use_config(self, config: AgentConfig) -> None:
        """A reloaded config: what changed is applied on the next tick."""
        self.config = config
        self._route()

    def _route(self) -> None:
        ha = self.config.home_assistant
        wanted = ha_status_topic(ha.discovery_prefix) if ha.enabled else None
        if wanted == self._routed or self._router is None:
            return
        if self._unroute is not None:
            self._unroute()
            self._unroute = None
        if wanted is not None:
            self._unroute = self._router.route(wanted, self._on_ha_status)
        self._routed = wanted

    def _on_ha_status(self, message: Message) -> None:
        if message.payload.strip() == b"online":
            self._counts["births"] += 1  # the next tick publishes the discovery config again

    # --- pipeline threads ------------------------------------------------------------------------

    def observe(self, pipeline: str, output: Mapping[str, Any], pixels: np.ndarray | None) -> None:
        """A published result of `pipeline`: its `output`, and its frame's pixels when the pipeline
        keeps them for the image (the image is always the result's own frame)."""
        if not self.config.state_topics_on:
            return

        def take(state: PipelineState) -> bool:
            self._take(state, output, pixels, time.monotonic())
            return True

        def keep() -> None:
            self._pending[pipeline] = (output, pixels)

        with self._lock:
            self._hand_to(pipeline, take, keep)

    def observe_scene(
        self, pipeline: str, summary: Mapping[str, Any], events: Sequence[Mapping[str, Any]]
    ) -> None:
        """A tracking frame of `pipeline` with events: its scene's `summary` after it (Scene.summary) and
        its `events`: the counts come from the summary, the stays and per-label crossings from the
        `exit` and `cross` events, the last values read from `enter`, `cross` and `update` events."""
        if not self.config.state_topics_on:
            return

        def take(state: PipelineState) -> bool:
            state.take_scene(summary, events)
            return True

        def keep() -> None:  # the latest summary, and the events the values follow (they add up)
            before = self._pending_scenes.get(pipeline, (summary, []))[1]
            adding = [e for e in events if e.get("type") in ("exit", "cross", "enter", "update")]
            self._pending_scenes[pipeline] = (summary, [*before, *adding][-_MAX_PENDING_EVENTS:])

        with self._lock:
            self._hand_to(pipeline, take, keep)

    def observe_snapshot(self, pipeline: str, label: str, jpeg: bytes) -> None:
        """A new snapshot of a tracked `label` object of `pipeline` (JPEG, its box drawn)."""
        if not self.config.state_topics_on:
            return
        # The longer of its two topics (state/<pipeline>/snapshot/<label>) bounds it.
        topic = self._topic(pipeline, ("snapshot", "x" * max(1, len(label.encode()))))
        too_big = len(jpeg) > payload_room(int(self.config.mqtt.max_payload_bytes), topic)
        with self._lock:
            if too_big:
                self._snapshots_too_big += 1
                if first_or_every(self._snapshots_too_big):
                    log.warning(
                        "pipeline %s: a %d-byte snapshot does not fit mqtt.max_payload_bytes: not published "
                        "(%d so far)",
                        pipeline,
                        len(jpeg),
                        self._snapshots_too_big,
                    )
                return

            def keep() -> None:
                self._pending_snapshots.setdefault(pipeline, {})[label] = jpeg

            self._hand_to(pipeline, lambda state: bool(state.take_snapshot(label, jpeg)), keep)

    def _hand_to(
        self, pipeline: str, take: Callable[[PipelineState], bool], keep: Callable[[], None]
    ) -> None:
        """What a pipeline's thread observed, to its state: `take` it (True: a value may have changed,
        published now if connected), or, before the first tick has seen the pipeline, `keep` it for
        that tick. Holds the lock."""
        state = self._states.get(pipeline)
        if state is None:
            if pipeline not in self._views:
                keep()
            return
        if take(state) and self._mqtt.connected:
            self._flush(pipeline, state.values, None)

    def _take(
        self, state: PipelineState, output: Mapping[str, Any], pixels: np.ndarray | None, now: float
    ) -> None:
        detections = state.update(output, now)
        view = state.view
        if not view.image or pixels is None or now < self._next_image.get(view.name, 0.0):
            return
        self._images[view.name] = (pixels, detections)
        self._next_image[view.name] = now + view.image_interval_s

    # --- the main loop ---------------------------------------------------------------------------

    def tick(self) -> None:
        config = self.config
        views: dict[str, PipelineView] = {}
        if config.state_topics_on:
            for pipeline in self._wanted():
                if pipeline.enabled:
                    views[pipeline.name] = PipelineView.of(pipeline, config.web.enabled)
        pipelines = list(self._running_of())
        running = {p.name for p in pipelines}
        # The motion gates' verdicts, read every tick (a pipeline's `motion`, agent/pipeline.py).
        gates = {
            p.name: gate for p in pipelines if isinstance(gate := getattr(p, "motion", None), PipelineMotion)
        }
        connects = int(self._mqtt.stats().get("connects", 0))
        connected = self._mqtt.connected
        # Also at once for a new connection (the backlog it found) and new pipelines (what serves them).
        health = self._look_at_health((connected and connects != self._connects) or views != self._views)
        images: dict[str, tuple[np.ndarray, list[dict[str, Any]]]] = {}
        with self._lock:
            if views != self._views:
                self._set_views(views)
            now = time.monotonic()
            for name, state in self._states.items():
                state.expire(now)
                if name in running:
                    state.seed()
                if name in gates:
                    state.take_motion(gates[name].moving)
            if health is not None:
                self._take_health(*health)
            elif not config.state_topics_on:
                self._device = {}
            if not connected:
                return
            if connects != self._connects:  # a new connection: the broker may have lost what we sent
                self._connects = connects
                self._discovery_sent = None
            births = self._counts["births"]
            if self._publish_discovery(births != self._births_handled):
                self._births_handled = births
            for name, state in self._states.items():
                self._flush(name, state.values, connects)
            self._flush(DEVICE, self._device, connects)
            self._clear_unwanted()
            images, self._images = self._images, {}
        for name, (frame, detections) in images.items():  # encoding takes a while: outside the lock
            self._publish_image(name, frame, detections)

    def _look_at_health(self, now_too: bool) -> Health | None:
        """The daemon's health every HEALTH_EVERY_S (and `now_too`); None when not due (asked outside the
        lock: the supervisor takes its own)."""
        now = time.monotonic()
        if (
            self._health is None
            or not self.config.state_topics_on
            or (now < self._next_health and not now_too)
        ):
            return None
        self._next_health = now + HEALTH_EVERY_S
        return self._health()

    def _take_health(self, pipelines: Mapping[str, PipelineStatus], outbox_pending: int) -> None:
        for name, state in self._states.items():
            state.values.update(health_values(pipelines.get(name)))
        self._device[("outbox_pending",)] = str(int(outbox_pending)).encode()

    def _set_views(self, views: dict[str, PipelineView]) -> None:
        before: dict[str, PipelineState] = {}
        for name in list(self._states):
            if views.get(name) != self._views.get(name):
                before[name] = self._states.pop(name)
                self._next_image.pop(name, None)
                self._images.pop(name, None)
        for name, view in views.items():
            if name not in self._states:
                self._states[name] = PipelineState(view)
                if name in before:  # the pipeline changed: its scene goes on
                    self._states[name].carry(before[name])
        self._views = views
        now = time.monotonic()
        for name, (output, pixels) in list(self._pending.items()):
            if name in self._states:
                self._take(self._states[name], output, pixels, now)
        for name, (summary, events) in self._pending_scenes.items():
            if name in self._states:
                self._states[name].take_scene(summary, events)
        for name, snapshots in self._pending_snapshots.items():
            for label, jpeg in snapshots.items():
                if name in self._states:
                    self._states[name].take_snapshot(label, jpeg)
        self._pending.clear()
        self._pending_scenes.clear()
        self._pending_snapshots.clear()

    def _topic(self, pipeline: str, key: tuple[str, ...]) -> str:
        return state_topic(self.config.mqtt.topic_prefix, self.config.device.id, pipeline, *key)

    def _wanted_topics(self) -> set[str]:
        wanted = {self._topic(v.name, e.key) for v in self._views.values() for e in entities(v)}
        # Each label's latest snapshot, while the pipeline takes snapshots (an earlier run's too).
        snapshots = tuple(
            self._topic(v.name, ("snapshot",)) + "/"
            for v in self._views.values()
            if v.tracking is not None and v.tracking.snapshots
        )
        if snapshots:
            wanted |= {t for t in self._memory.state_topics if t.startswith(snapshots)}
        if self.config.state_topics_on:
            wanted |= {self._topic(DEVICE, e.key) for e in device_entities()}
        return wanted

    def _publish(self, topic: str, payload: bytes) -> bool:
        return self._mqtt.publish_snapshot(topic, payload, qos=QOS, retain=True)

    def _remember(self) -> None:
        try:
            atomic_write_bytes(self._path, self._memory.to_json(), mode=0o600, durable=False)
        except OSError as exc:
            log.warning("cannot write %s: %s", self._path, exc)

    def _flush(self, name: str, values: Mapping[tuple[str, ...], bytes], connects: int | None) -> None:
        """Publish `name`'s (a pipeline's, or DEVICE's) values that changed and, given the current
        connection's `connects`, those not yet sent on it (caller holds the lock and checked the link)."""
        new_topics = False
        for key, payload in values.items():
            topic = self._topic(name, key)
            sent = self._sent.get(topic)
            if sent is not None and sent[0] == payload and (connects is None or sent[1] == connects):
                continue
            if connects is None:  # only now: a result that changes nothing costs no lookup
                connects = int(self._mqtt.stats().get("connects", 0))
            if not self._publish(topic, payload):
                return  # the link dropped: all of it goes again after the reconnect
            self._sent[topic] = (payload, connects)
            self._counts["state_published"] += 1
            if topic not in self._memory.state_topics:
                self._memory.state_topics.add(topic)
                new_topics = True
        if new_topics:
            self._remember()

    def _clear_unwanted(self) -> None:
        """Empty retained messages on state topics nothing produces any more."""
        stale = sorted(self._memory.state_topics - self._wanted_topics())
        cleared = []
        for topic in stale:
            if not self._publish(topic, b""):
                break
            cleared.append(topic)
            self._sent.pop(topic, None)
        if cleared:
            log.info("cleared %d retained state topic(s) no longer produced: %s", len(cleared),
                     ", ".join(cleared[:5]) + (", ..." if len(cleared) > 5 else ""))  # fmt: skip
            self._memory.state_topics.difference_update(cleared)
            self._remember()

    def _publish_discovery(self, again: bool) -> bool:
        """Publish the discovery config when it changed (or `again`); False when it could not be."""
        ha = self.config.home_assistant
        memory = self._memory
        topic = ha_device_config_topic(ha.discovery_prefix, identity_of(self.config).object_id)
        if memory.config_topic is not None and (not ha.enabled or memory.config_topic != topic):
            # Turned off (or moved): an empty config removes the device and its entities.
            if not self._publish(memory.config_topic, b""):
                return False
            log.info("home_assistant: removed the device discovery config %s", memory.config_topic)
            memory.config_topic, memory.components, memory.removed = None, {}, {}
            self._discovery_sent = None
            self._remember()
        if not ha.enabled:
            return True
        identity = identity_of(self.config)
        components = discovery_components(list(self._views.values()), identity, self.config.mqtt.topic_prefix)
        removed = dict(memory.removed)
        removed.update({cid: p for cid, p in memory.components.items() if cid not in components})
        for cid in components:
            removed.pop(cid, None)
        while len(removed) > _MAX_REMOVED:
            removed.pop(next(iter(removed)))
        payload = json.dumps(discovery_payload(identity, components, removed), separators=(",", ":")).encode()
        if payload == self._discovery_sent and not again:
            return True
        if not self._publish(topic, payload):
            return False
        self._counts["discovery_published"] += 1
        announced = {cid: str(c["p"]) for cid, c in components.items()}
        if (topic, announced, removed) != (memory.config_topic, memory.components, memory.removed):
            gone = sorted(set(memory.components) - set(announced))
            if gone:
                log.info("home_assistant: removed component(s) %s", ", ".join(gone))
            memory.config_topic, memory.components, memory.removed = topic, announced, removed
            self._remember()
        self._discovery_sent = payload
        return True

    def _publish_image(self, pipeline: str, frame: np.ndarray, detections: list[dict[str, Any]]) -> None:
        topic = self._topic(pipeline, ("image",))
        limit = payload_room(int(self.config.mqtt.max_payload_bytes), topic)
        try:
            data = annotated_jpeg(frame, detections, limit)
        except (cv2.error, ValueError, TypeError) as exc:
            log.warning("pipeline %s: cannot make its image: %s", pipeline, exc)
            return
        if data is None:
            log.warning("pipeline %s: its image does not fit mqtt.max_payload_bytes even at a quarter size",
                        pipeline)  # fmt: skip
            return
        with self._lock:
            if pipeline not in self._views or not self._publish(topic, data):
                return
            self._counts["images"] += 1
            if topic not in self._memory.state_topics:
                self._memory.state_topics.add(topic)
                self._remember()

    # --- status ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        ha = self.config.home_assistant
        with self._lock:
            return {
                "state_topics": self.config.state_topics_on,
                "home_assistant": ha.enabled,
                "discovery_topic": self._memory.config_topic,
                "components": len(self._memory.components),
                "pipelines": sorted(self._views),
                **self._counts,
            }
