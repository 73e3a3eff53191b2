"""The checked-in broker configs (configs/mosquitto/) on real mosquittos, on loopback only.

Exercised as checked in:
- configs/mosquitto/acl, byte for byte (and it is what scripts/fleet_acl.py makes of
  inventory.example.yaml), with a password file made by `mosquitto_passwd`;
- configs/mosquitto/mosquitto.conf with only the lines naming host paths and ports rewritten
  (`render_config`: the listener's port, password_file, acl_file, persistence_location, pid_file,
  log_dest to stderr, include_dir). Everything else is loaded as written: allow_anonymous false,
  persistence, queues, max_packet_size (tested: announced to MQTT 5 clients, a 256 KiB result
  passes, a bigger packet is refused). For the bridge tests the central broker's commented TLS
  listener is uncommented with a throwaway PKI;
- configs/mosquitto/bridge-site.conf with its address and remote_password rewritten and its
  bridge_cafile line uncommented (TLS to the central broker), restart_timeout shortened where a
  test waits for a reconnect, bridge_protocol_version switched to mqttv311 where a test shows why
  the file asks for mqttv50.
Not exercised: persistent_client_expiration (14 days) and autosave_interval only load; the log
file, the pid file, dropping to the mosquitto user and the mutual-TLS lines are not used.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from paho.mqtt.reasoncodes import ReasonCode

from agent.config import MqttConfig, OutboxConfig
from agent.fleetctl.acl import parse_home_assistant, parse_inventory, render_acl
from agent.mqtt import MqttConnection, Outbox, results_topic
from agent.mqtt.message import Message
from agent.mqtt.router import Router
from tests.broker_fixtures import (
    ACL,
    CONFIGS,
    PASSWORDS,
    ROOT,
    TIMEOUT_S,
    BrokerFactory,
    Client,
    ClientFactory,
    Tls,
    bridge_config,
    config_value,
    prop,
    request_properties,
)
from tests.broker_fixtures import brokers as brokers  # fixtures
from tests.broker_fixtures import clients as clients
from tests.broker_fixtures import passwd as passwd
from tests.mosquitto import Mosquitto
from tests.pki import Pki
from tests.waits import free_port, wait_until


def doc(target: str, generation: int) -> bytes:
    return json.dumps({"schema_version": 1, "target": target, "generation": generation}).encode()


@pytest.fixture
def fleet_broker(brokers: BrokerFactory) -> Mosquitto:
    return brokers("fleet")


NOT_AUTHORIZED = 0x87
SUCCESS = 0x00


def accepted(reason: ReasonCode) -> bool:
    """A PUBACK that took the message: 0x00, or 0x10 "No matching subscribers" (MQTT 5)."""
    return reason.value in (0x00, 0x10)


# -- the ACL generator ---------------------------------------------------------------------------------


def test_the_checked_in_acl_is_the_generator_output_for_the_example_inventory(tmp_path: Path) -> None:
    inventory = CONFIGS / "inventory.example.yaml"
    data = yaml.safe_load(inventory.read_text())
    devices, sites = parse_inventory(data)
    home_assistant = parse_home_assistant(data)
    assert home_assistant == ("homeassistant", "homeassistant")
    assert ACL.read_text() == render_acl(devices, sites=sites, home_assistant=home_assistant), (
        "configs/mosquitto/acl is stale: scripts/fleet_acl.py configs/mosquitto/inventory.example.yaml "
        "-o configs/mosquitto/acl"
    )
    out = tmp_path / "acl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fleet_acl.py"), str(inventory), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == ACL.read_text()


def test_render_acl_lines() -> None:
    acl = render_acl(
        {"b-dev": ["north", "lobby", "north"], "a-dev": [], "c-dev": ["lobby"]},
        prefix="plant7",
        controller="ops",
        sites={"site-a": ["c-dev"]},
    )
    lines = [line for line in acl.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "pattern read plant7/%u/desired",
        "pattern read plant7/%u/cmd/#",
        "pattern write plant7/%u/status",
        "pattern write plant7/%u/results/#",
        "pattern write plant7/%u/telemetry",
        "pattern write plant7/%u/reported",
        "pattern write plant7/%u/state/#",
        "pattern write plant7/%u/cmd/+/reply",
        # sorted by device, groups sorted and de-duplicated; a device in no group gets no block
        "user b-dev",
        "topic read plant7/groups/lobby/desired",
        "topic read plant7/groups/north/desired",
        "user c-dev",
        "topic read plant7/groups/lobby/desired",
        "user site-a",
        "topic read plant7/c-dev/desired",
        "topic read plant7/c-dev/cmd/#",
        "topic write plant7/c-dev/status",
        "topic write plant7/c-dev/results/#",
        "topic write plant7/c-dev/telemetry",
        "topic write plant7/c-dev/reported",
        "topic write plant7/c-dev/state/#",
        "topic write plant7/c-dev/cmd/+/reply",
        "topic read plant7/groups/lobby/desired",
        "user ops",
        "topic readwrite plant7/#",
    ]
    # No pattern or line grants a device a write of desired state or of commands.
    assert not [line for line in lines if "write" in line and ("desired" in line or line.endswith("cmd/#"))]


def test_render_acl_with_home_assistant() -> None:
    acl = render_acl(
        {"a-dev": [], "c-dev": []},
        prefix="plant7",
        sites={"site-a": ["c-dev"]},
        home_assistant=("ha", "disc/ha"),
    )
    lines = [line for line in acl.splitlines() if line and not line.startswith("#")]
    # Each device: its own discovery config (object id = username) and the birth message.
    i = lines.index("pattern write plant7/%u/cmd/+/reply")
    assert lines[i + 1 : i + 3] == ["pattern write disc/ha/device/%u/config", "pattern read disc/ha/status"]
    # A site bridge: its devices' configs and the birth message; Home Assistant: its prefix, status, state.
    site = lines[lines.index("user site-a") : lines.index("user ha")]
    assert site[-3:] == [
        "topic write plant7/c-dev/cmd/+/reply",
        "topic write disc/ha/device/c-dev/config",
        "topic read disc/ha/status",
    ]
    assert lines[lines.index("user ha") :] == [
        "user ha",
        "topic readwrite disc/ha/#",
        "topic read plant7/+/status",
        "topic read plant7/+/state/#",
        "user controller",
        "topic readwrite plant7/#",
    ]
    for bad, message in [
        (("a-dev", "homeassistant"), "home_assistant username 'a-dev' is also a device id"),
        (("ha", "disc/+"), "home_assistant discovery_prefix 'disc/+'"),
        (("ha x", "homeassistant"), "home_assistant username 'ha x'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            render_acl({"a-dev": []}, home_assistant=bad)
    assert parse_home_assistant({"devices": {}}) is None
    assert parse_home_assistant({"home_assistant": {}}) == ("homeassistant", "homeassistant")
    with pytest.raises(ValueError, match="unknown home_assistant keys"):
        parse_home_assistant({"home_assistant": {"user": "ha"}})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inventory": {"cam/01": []}}, "device 'cam/01'"),
        ({"inventory": {"cam+1": []}}, "device 'cam+1'"),
        ({"inventory": {"groups": []}}, "device 'groups': MQTT topic device 'groups' is reserved"),
        ({"inventory": {"cam 01": []}}, "device 'cam 01'"),
        ({"inventory": {"cam-01\ntopic readwrite #": []}}, "device 'cam-01\\ntopic readwrite #'"),
        ({"inventory": {"": []}}, "device ''"),
        ({"inventory": {"cam-01": ["#"]}}, "device 'cam-01' group '#'"),
        ({"inventory": {"cam-01": ["lobby", ""]}}, "device 'cam-01' group ''"),
        ({"inventory": {"cam-01": "lobby"}}, "device 'cam-01': groups must be a list"),
        ({"inventory": {"cam-01": []}, "prefix": "a/b"}, "topic prefix 'a/b'"),
        ({"inventory": {"cam-01": []}, "controller": "cam-01"}, "controller 'cam-01' is also a device"),
        ({"inventory": {"cam-01": []}, "controller": "ops x"}, "controller 'ops x'"),
        ({"inventory": {"cam-01": []}, "controller": "groups"}, "controller 'groups': MQTT topic device"),
        ({"inventory": {"cam-01": []}, "sites": {"cam-01": []}}, "site 'cam-01' is also a device"),
        ({"inventory": {"cam-01": []}, "sites": {"groups": []}}, "site 'groups': MQTT topic device"),
        ({"inventory": {"cam-01": []}, "sites": {"s": ["cam-09"]}}, "site 's' device 'cam-09' is not in"),
    ],
)
def test_render_acl_refuses_bad_entries_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        render_acl(**kwargs)
    assert message in str(raised.value)


def test_the_script_refuses_a_bad_inventory_naming_the_entry(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("devices:\n  cam-01: [lobby]\n  cam+02: [dock]\n")
    out = tmp_path / "acl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fleet_acl.py"), str(inventory), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 2
    assert "device 'cam+02'" in done.stderr
    assert not out.exists()  # nothing half-written
    for bad, message in [
        ("cameras: {}", "unknown inventory keys ['cameras']"),
        ("devices: [cam-01]", "'devices' must map device ids"),
        ("devices: {cam-01: lobby}", "device 'cam-01' groups must be a list"),
    ]:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_inventory(yaml.safe_load(bad))


# -- one broker: what each user may read and write ---------------------------------------------------


RETAINED_DESIRED = {
    "edge/cam-01/desired": doc("device:cam-01", 1),
    "edge/cam-02/desired": doc("device:cam-02", 1),
    "edge/groups/lobby/desired": doc("group:lobby", 1),
    "edge/groups/dock/desired": doc("group:dock", 1),
    "edge/groups/north/desired": doc("group:north", 1),
}


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_device_reads_its_own_and_its_groups_desired_state_and_its_commands_only(
    protocol: str, fleet_broker: Mosquitto, clients: ClientFactory
) -> None:
    controller = clients(fleet_broker, "controller")
    for topic, payload in RETAINED_DESIRED.items():
        assert accepted(controller.publish(topic, payload, retain=True))

    cam01 = clients(fleet_broker, "cam-01", protocol=protocol)
    # mosquitto 2.0's acl_file grants every SUBSCRIBE, even to '#', and checks each message as it
    # is delivered: the broadest filter shows anything the ACL would let through.
    assert [r.value for r in cam01.subscribe("#")] == [1]
    # Positive control: once a live message cam-01 may read arrives, every retained message (sent
    # while the SUBSCRIBE was handled, before it) has been delivered or withheld.
    assert accepted(controller.publish("edge/cam-01/cmd/control-1", b"c1"))
    cam01.wait_for("edge/cam-01/cmd/control-1")
    assert cam01.topics() == {"edge/cam-01/desired", "edge/groups/lobby/desired", "edge/cam-01/cmd/control-1"}
    own = cam01.wait_for("edge/cam-01/desired")
    group = cam01.wait_for("edge/groups/lobby/desired")
    assert own.retain and own.payload == RETAINED_DESIRED["edge/cam-01/desired"]
    assert group.retain and group.payload == RETAINED_DESIRED["edge/groups/lobby/desired"]

    # Live messages: other devices' desired state and commands, other groups, other devices'
    # reports, and the device's own status are all withheld; its own commands come through.
    forbidden = [
        "edge/cam-02/desired",
        "edge/groups/dock/desired",
        "edge/groups/north/desired",
        "edge/cam-02/cmd/ping",
        "edge/cam-02/status",
        "edge/cam-01/status",
        "edge/cam-01/reported",
    ]
    for topic in forbidden:
        assert accepted(controller.publish(topic, b"forbidden"))
    correlation = b"corr-" + protocol.encode()
    controller.publish(
        "edge/cam-01/cmd/ping",
        b'{"id": "1"}',
        properties=request_properties("edge/cam-01/cmd/ping/reply", correlation),
    )
    controller.publish("edge/groups/lobby/desired", doc("group:lobby", 2))  # live, not retained
    controller.publish("edge/cam-01/cmd/control-2", b"c2")
    cam01.wait_for("edge/cam-01/cmd/control-2")
    assert cam01.topics() == {
        "edge/cam-01/desired",
        "edge/groups/lobby/desired",
        "edge/cam-01/cmd/control-1",
        "edge/cam-01/cmd/ping",
        "edge/cam-01/cmd/control-2",
    }
    cam01.wait_for("edge/groups/lobby/desired", doc("group:lobby", 2))
    ping = cam01.wait_for("edge/cam-01/cmd/ping")
    if protocol == "5":  # the request's MQTT 5 properties reach the device
        assert prop(ping.properties, "ResponseTopic") == "edge/cam-01/cmd/ping/reply"
        assert prop(ping.properties, "CorrelationData") == correlation
        assert prop(ping.properties, "UserProperty") == [("sent-by", "test")]


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_device_writes_only_its_reports_under_its_own_prefix(
    protocol: str, fleet_broker: Mosquitto, clients: ClientFactory
) -> None:
    controller = clients(fleet_broker, "controller")
    for topic in ("edge/cam-01/desired", "edge/groups/lobby/desired"):
        assert accepted(controller.publish(topic, RETAINED_DESIRED[topic], retain=True))
    assert [r.value for r in controller.subscribe("#")] == [1]
    cam01 = clients(fleet_broker, "cam-01", protocol=protocol)

    allowed = [
        "edge/cam-01/status",
        "edge/cam-01/results/people",
        "edge/cam-01/telemetry",
        "edge/cam-01/reported",
        "edge/cam-01/cmd/ping/reply",
    ]
    for topic in allowed:
        assert accepted(cam01.publish(topic, b"from cam-01")), topic
        controller.wait_for(topic, b"from cam-01")

    forbidden = [
        "edge/cam-01/desired",  # its own desired state: only the controller writes it
        "edge/groups/lobby/desired",  # its group's
        "edge/groups/dock/desired",
        "edge/cam-02/status",  # another device's topics
        "edge/cam-02/results/people",
        "edge/cam-02/desired",
        "edge/cam-02/cmd/reboot",
        "edge/cam-01/cmd/ping",  # a command request, even to itself
        "edge/cam-01/logs",  # not a topic of the scheme
        "edge/cam-01",
        "controller/replies/1",  # a response topic outside the convention (README.md)
        "other/topic",
    ]
    # MQTT 5: mosquitto answers a refused QoS 1 PUBLISH with PUBACK 0x87 "Not authorized" and keeps
    # the connection. MQTT 3.1.1 PUBACKs carry no reason code: it is acknowledged and dropped silently.
    expected = NOT_AUTHORIZED if protocol == "5" else SUCCESS
    for topic in forbidden:
        reason = cam01.publish(topic, b"forged", retain=True)
        assert reason.value == expected, (topic, reason)
    # Positive control: once this arrives, every forged publish before it was handled.
    assert accepted(cam01.publish("edge/cam-01/telemetry", b"control"))
    controller.wait_for("edge/cam-01/telemetry", b"control")
    assert not [g for g in controller.received if g.payload == b"forged"]
    assert cam01.disconnects == []  # refused publishes do not cost the device its connection

    # Nor did a forged retained message replace or create a retained one. Control: a live message
    # published after the SUBACK comes after every retained message of the SUBSCRIBE.
    check = clients(fleet_broker, "controller")
    check.subscribe("edge/#")  # every retained message under the prefix: the controller's two
    assert accepted(check.publish("edge/check", b"control"))
    check.wait_for("edge/check")
    assert {g.topic: g.payload for g in check.received} == {
        "edge/cam-01/desired": RETAINED_DESIRED["edge/cam-01/desired"],
        "edge/groups/lobby/desired": RETAINED_DESIRED["edge/groups/lobby/desired"],
        "edge/check": b"control",
    }


def test_the_controller_writes_any_desired_state_and_reads_everything(
    fleet_broker: Mosquitto, clients: ClientFactory
) -> None:
    controller = clients(fleet_broker, "controller")
    controller.subscribe("edge/#")
    cam02 = clients(fleet_broker, "cam-02")
    cam02.subscribe("edge/cam-02/desired", "edge/groups/dock/desired", "edge/cam-02/cmd/+")
    for topic, payload in [
        ("edge/cam-02/desired", doc("device:cam-02", 5)),
        ("edge/groups/dock/desired", doc("group:dock", 7)),
        ("edge/groups/new-group/desired", doc("group:new-group", 1)),
    ]:
        assert accepted(controller.publish(topic, payload, retain=True))
    assert accepted(controller.publish("edge/cam-02/cmd/status", b"{}"))
    cam02.wait_for("edge/cam-02/desired", doc("device:cam-02", 5))
    cam02.wait_for("edge/groups/dock/desired", doc("group:dock", 7))
    cam02.wait_for("edge/cam-02/cmd/status")
    for topic in ("edge/cam-02/status", "edge/cam-02/reported", "edge/cam-02/results/x"):
        assert accepted(cam02.publish(topic, b"report"))
        controller.wait_for(topic, b"report")
    assert "edge/groups/new-group/desired" not in cam02.topics()
    # Its rights end at the prefix.
    assert controller.publish("other/topic", b"x").value == NOT_AUTHORIZED


def test_home_assistant_reads_state_and_discovery_and_a_device_writes_only_its_own_config(
    fleet_broker: Mosquitto, clients: ClientFactory
) -> None:
    """The example inventory's home_assistant section: a device publishes its state topics and its own
    discovery config (object id = its username), reads Home Assistant's birth message, and can neither
    announce nor remove another device; Home Assistant reads configs, status and state, not results."""
    ha = clients(fleet_broker, "homeassistant")
    assert [r.value for r in ha.subscribe("#")] == [1]
    cam01 = clients(fleet_broker, "cam-01")
    cam01.subscribe("homeassistant/status")
    allowed = [
        "edge/cam-01/status",
        "edge/cam-01/state/people/label",
        "edge/cam-01/state/people/seen/person",
        "homeassistant/device/cam-01/config",
    ]
    for topic in allowed:
        assert accepted(cam01.publish(topic, b"from cam-01", retain=True)), topic
        ha.wait_for(topic, b"from cam-01")
    forbidden = [
        "homeassistant/device/cam-02/config",  # another device's config: announce or remove it
        "homeassistant/sensor/cam-01/config",  # per-component discovery: not granted
        "homeassistant/status",  # Home Assistant's own birth message
        "edge/cam-02/state/people/label",
    ]
    for topic in forbidden:
        assert cam01.publish(topic, b"forged", retain=True).value == NOT_AUTHORIZED, topic
    assert accepted(ha.publish("homeassistant/status", b"online"))
    cam01.wait_for("homeassistant/status", b"online")
    # Results and desired state are not Home Assistant's to read.
    controller = clients(fleet_broker, "controller")
    for topic in ("edge/cam-01/results/people", "edge/cam-01/desired"):
        assert accepted(controller.publish(topic, b"not for ha"))
    assert accepted(cam01.publish("edge/cam-01/state/people/label", b"control"))
    ha.wait_for("edge/cam-01/state/people/label", b"control")
    assert not [g for g in ha.received if g.payload in (b"forged", b"not for ha")]
    assert ha.publish("edge/cam-01/state/people/label", b"x").value == NOT_AUTHORIZED


def test_another_device_using_a_devices_client_id_reads_nothing_of_it(
    fleet_broker: Mosquitto, clients: ClientFactory
) -> None:
    """The ACL keys on the username, never on the client id, which a client chooses. mosquitto's
    acl_file cannot tie a client id to a user: the impostor takes the connection over (README.md)."""
    controller = clients(fleet_broker, "controller")
    controller.publish("edge/cam-01/desired", RETAINED_DESIRED["edge/cam-01/desired"], retain=True)
    cam01 = clients(fleet_broker, "cam-01", client_id="edge-agent-cam-01")
    cam01.subscribe("edge/cam-01/cmd/+")
    impostor = clients(fleet_broker, "cam-02", client_id="edge-agent-cam-01")
    # mosquitto 2.0.11 drops the first connection without a DISCONNECT packet (no reason code 0x8E
    # "Session taken over" reaches the client). Its network loop stops here: reconnecting would take
    # the connection back, and so on.
    cam01._wait(lambda: bool(cam01.disconnects), "cam-01 to be disconnected")
    cam01.client.loop_stop()
    impostor.subscribe("#")
    controller.publish("edge/cam-01/cmd/reboot", b"{}")
    controller.publish("edge/cam-02/cmd/control", b"c")
    impostor.wait_for("edge/cam-02/cmd/control")
    assert impostor.topics() == {"edge/cam-02/cmd/control"}
    assert impostor.publish("edge/cam-01/status", b"forged").value == NOT_AUTHORIZED


def test_the_packet_size_limit_passes_the_agents_largest_results_and_stops_bigger_packets(
    fleet_broker: Mosquitto, clients: ClientFactory
) -> None:
    limit = int(config_value("max_packet_size"))
    agent_max = MqttConfig().max_payload_bytes
    assert limit >= 2 * agent_max
    controller = clients(fleet_broker, "controller")
    controller.subscribe("edge/cam-01/results/+")
    cam01 = clients(fleet_broker, "cam-01")
    connack_props = cam01.connacks[0][1]
    assert prop(connack_props, "MaximumPacketSize") == limit  # told to MQTT 5 clients

    topic = results_topic("edge", "cam-01", "big")
    largest = b"r" * (agent_max - len(topic) - 64)  # the agent's own bound (connection._PACKET_OVERHEAD)
    assert accepted(cam01.publish(topic, largest))
    assert len(controller.wait_for(topic).payload) == len(largest)

    # An MQTT 3.1.1 client cannot be told the limit; a packet over it costs the connection.
    old = clients(fleet_broker, "cam-01", protocol="3.1.1")
    old.client.publish(results_topic("edge", "cam-01", "huge"), b"h" * limit, qos=1)
    old._wait(lambda: bool(old.disconnects), "the broker to drop the oversized packet's connection")
    assert accepted(cam01.publish(topic, b"control"))
    controller.wait_for(topic, b"control")
    assert results_topic("edge", "cam-01", "huge") not in controller.topics()


# -- a site broker bridged to the central one ---------------------------------------------------------


@dataclass
class Fleet:
    central: Mosquitto
    central_tls: Tls
    site: Mosquitto
    controller: Client  # on the central broker


@pytest.fixture
def fleet_factory(brokers: BrokerFactory, clients: ClientFactory, pki: Pki) -> Callable[..., Fleet]:
    """`make(**bridge edits)`: a central broker (checked-in config, TLS listener on) holding retained
    desired state for devices at the site and elsewhere, and a site broker bridged to it over TLS."""

    def make(**bridge_edits: str) -> Fleet:
        central_tls = Tls(pki, free_port())
        central = brokers("central", tls=central_tls)
        controller = clients(central, "controller")
        assert [r.value for r in controller.subscribe("edge/#")] == [1]
        for topic, payload in [
            *RETAINED_DESIRED.items(),
            ("edge/cam-03/desired", doc("device:cam-03", 1)),  # cam-03 is not at site-north
        ]:
            assert accepted(controller.publish(topic, payload, retain=True))
        site = brokers("site", bridge=bridge_config(central_tls, **bridge_edits))
        return Fleet(central, central_tls, site, controller)

    return make


def wait_for_bridge(fleet: Fleet, clients: ClientFactory) -> Client:
    """A site-local observer (the controller user on the site broker) once the bridge is up: the
    central broker's retained group documents are on the site. mosquitto sends a bridge's SUBSCRIBEs
    in the order of its `topic` lines (commands, device documents, group documents), so by then the
    earlier subscriptions were answered too. Returns the observer."""
    observer = clients(fleet.site, "controller")
    observer.subscribe("edge/#")
    observer.wait_for("edge/groups/lobby/desired")
    return observer


@pytest.fixture
def agent_device(tmp_path: Path) -> Iterator[Callable[[Mosquitto], tuple[MqttConnection, Outbox]]]:
    """The agent's own MQTT connection for cam-01 (MQTT 5, logged in as cam-01): started by the test."""
    made: list[tuple[MqttConnection, Outbox]] = []

    def make(broker: Mosquitto) -> tuple[MqttConnection, Outbox]:
        outbox = Outbox(tmp_path / f"outbox-{len(made)}.db")
        config = MqttConfig(
            host=broker.host,
            port=broker.port,
            protocol="5",
            username="cam-01",
            password=PASSWORDS["cam-01"],
            keepalive_s=5,
            reconnect_min_s=0.1,
            reconnect_max_s=0.5,
            outbox=OutboxConfig(max_inflight=10),
        )
        conn = MqttConnection(config, "cam-01", outbox, lambda: b'{"state":"online"}', lambda: b"{}")
        made.append((conn, outbox))
        return conn, outbox

    try:
        yield make
    finally:
        for conn, outbox in made:
            conn.stop(publish_offline=False)
            outbox.close()


class Inbox:
    """What the device's handlers got, waitable."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.messages: list[Message] = []

    def add(self, message: Message) -> None:
        with self._cond:
            self.messages.append(message)
            self._cond.notify_all()

    def wait_for(self, topic: str, payload: bytes | None = None) -> Message:
        def match() -> Message | None:
            with self._cond:
                return next(
                    (m for m in self.messages if m.topic == topic and payload in (None, m.payload)), None
                )

        wait_until(lambda: match() is not None, f"{topic} {payload!r} at the device", timeout=TIMEOUT_S)
        found = match()
        assert found is not None
        return found


def serve_commands(conn: MqttConnection, inbox: Inbox) -> Router:
    """cam-01's desired state and commands, as the daemon will route them: every command is answered
    with Router.reply (the request's response topic, else <request topic>/reply)."""
    router = Router(conn)
    for topic in ("edge/cam-01/desired", "edge/groups/lobby/desired"):
        router.route(topic, inbox.add)

    def command(message: Message) -> None:
        inbox.add(message)
        request = json.loads(message.payload)
        router.reply(message, {"id": request["id"], "ok": True, "result": {"pong": True}})

    router.route("edge/cam-01/cmd/+", command)
    return router


def test_a_device_on_a_site_broker_is_deployed_to_and_reports_through_the_bridge(
    fleet_factory: Callable[..., Fleet],
    clients: ClientFactory,
    agent_device: Callable[[Mosquitto], tuple[MqttConnection, Outbox]],
) -> None:
    fleet = fleet_factory()
    controller = fleet.controller
    observer = wait_for_bridge(fleet, clients)
    # What the central ACL lets the site's bridge have: its devices' and their groups' documents,
    # not cam-03's or group north's. Control: a later generation of a document the site may have
    # (the bridge's SUBSCRIBEs were answered, retained documents first, before it could arrive).
    assert accepted(controller.publish("edge/groups/dock/desired", doc("group:dock", 2), retain=True))
    observer.wait_for("edge/groups/dock/desired", doc("group:dock", 2))
    assert observer.topics() == {
        "edge/cam-01/desired",
        "edge/cam-02/desired",
        "edge/groups/lobby/desired",
        "edge/groups/dock/desired",
    }

    # The agent's connection on the site broker: retained documents from the site's store.
    conn, outbox = agent_device(fleet.site)
    inbox = Inbox()
    serve_commands(conn, inbox)
    conn.start()
    wait_until(lambda: set(conn.stats()["subscriptions"].values()) == {"active"}, "SUBACKs", state=conn.stats)
    assert inbox.wait_for("edge/groups/lobby/desired").retain
    assert inbox.wait_for("edge/cam-01/desired").payload == doc("device:cam-01", 1)

    # Deployed to: a new retained group document published on the central broker reaches the device.
    assert accepted(controller.publish("edge/groups/lobby/desired", doc("group:lobby", 2), retain=True))
    inbox.wait_for("edge/groups/lobby/desired", doc("group:lobby", 2))

    # Reports through the bridge: the birth status, results from the agent's outbox, and (published
    # by a plain client, as the daemon does not publish it yet) retained reported state and telemetry.
    assert controller.wait_for("edge/cam-01/status").payload == b'{"state":"online"}'
    for n in range(3):
        outbox.put(results_topic("edge", "cam-01", "people"), json.dumps({"id": f"r{n}"}).encode())
    conn.notify_new_message()
    device = clients(fleet.site, "cam-01")
    assert accepted(device.publish("edge/cam-01/reported", b'{"device": "cam-01"}', retain=True))
    assert accepted(device.publish("edge/cam-01/telemetry", b'{"cpu": 1}'))
    controller.wait_for("edge/cam-01/reported")
    controller.wait_for("edge/cam-01/telemetry")
    wait_until(
        lambda: (
            [g.payload for g in controller.received if g.topic.endswith("/results/people")]
            == [json.dumps({"id": f"r{n}"}).encode() for n in range(3)]
        ),
        "the three results, in order, at the controller",
        timeout=TIMEOUT_S,
    )
    later = clients(fleet.central, "controller")
    later.subscribe("edge/cam-01/reported")
    assert later.wait_for("edge/cam-01/reported").retain  # retained on the central broker as well

    # A command from the central broker with an MQTT 5 response topic and correlation data: the
    # request reaches the device with both, the reply (Router.reply) reaches the controller with its
    # correlation data. Response topic convention: <request topic>/reply (README.md).
    controller.subscribe("edge/+/cmd/+/reply")
    props = request_properties("edge/cam-01/cmd/ping/reply", b"corr-42")
    assert accepted(controller.publish("edge/cam-01/cmd/ping", b'{"id": "c42"}', properties=props))
    request = inbox.wait_for("edge/cam-01/cmd/ping")
    assert request.response_topic == "edge/cam-01/cmd/ping/reply"
    assert request.correlation_data == b"corr-42"
    assert request.user_properties == (("sent-by", "test"),)
    assert request.expiry_s is not None and 0 < request.expiry_s <= 120
    reply = controller.wait_for("edge/cam-01/cmd/ping/reply")
    assert json.loads(reply.payload) == {"id": "c42", "ok": True, "result": {"pong": True}}
    assert prop(reply.properties, "CorrelationData") == b"corr-42"
    assert prop(reply.properties, "ContentType") == "application/json"

    # A device the central broker does not know at this site: the site broker takes its messages
    # (its own prefix), the central one refuses them from the bridge, and the bridge carries on.
    cam03 = clients(fleet.site, "cam-03")
    assert accepted(cam03.publish("edge/cam-03/status", b"cam-03 here"))
    assert accepted(controller.publish("edge/cam-03/cmd/ping", b'{"id": "x"}'))
    assert accepted(device.publish("edge/cam-01/telemetry", b"control"))
    controller.wait_for("edge/cam-01/telemetry", b"control")
    assert "edge/cam-03/status" not in controller.topics()
    assert accepted(controller.publish("edge/cam-01/cmd/control", b'{"id": "ctl"}'))
    observer.wait_for("edge/cam-01/cmd/control")
    assert "edge/cam-03/cmd/ping" not in observer.topics()


def test_an_mqtt_3_1_1_bridge_drops_the_mqtt_5_properties_and_the_reply_convention_still_holds(
    fleet_factory: Callable[..., Fleet],
    clients: ClientFactory,
    agent_device: Callable[[Mosquitto], tuple[MqttConnection, Outbox]],
) -> None:
    """Why bridge-site.conf sets bridge_protocol_version mqttv50: mosquitto's default bridge protocol
    strips every property. The reply still arrives, because the response topic a controller must use
    is the topic the agent falls back to without one; only the correlation data is lost (the payload's
    id correlates)."""
    fleet = fleet_factory(bridge_protocol_version="bridge_protocol_version mqttv311")
    controller = fleet.controller
    wait_for_bridge(fleet, clients)
    conn, _ = agent_device(fleet.site)
    inbox = Inbox()
    serve_commands(conn, inbox)
    conn.start()
    wait_until(lambda: set(conn.stats()["subscriptions"].values()) == {"active"}, "SUBACKs", state=conn.stats)
    controller.subscribe("edge/+/cmd/+/reply")
    props = request_properties("edge/cam-01/cmd/ping/reply", b"corr-7")
    assert accepted(controller.publish("edge/cam-01/cmd/ping", b'{"id": "c7"}', properties=props))
    request = inbox.wait_for("edge/cam-01/cmd/ping")
    assert request.response_topic is None and request.correlation_data is None
    assert request.user_properties == () and request.expiry_s is None
    reply = controller.wait_for("edge/cam-01/cmd/ping/reply")
    assert json.loads(reply.payload)["id"] == "c7"
    assert (reply.properties.json() if reply.properties is not None else {}) == {}
    # Retained documents still cross it as retained (try_private).
    assert inbox.wait_for("edge/groups/lobby/desired").retain


def test_the_site_broker_keeps_results_while_the_central_broker_is_away(
    fleet_factory: Callable[..., Fleet],
    clients: ClientFactory,
    agent_device: Callable[[Mosquitto], tuple[MqttConnection, Outbox]],
) -> None:
    """cleansession false + the site's queue: results the agent handed to the site broker while the
    central one was down reach a controller with a persistent session once the bridge is back."""
    fleet = fleet_factory(restart_timeout="restart_timeout 1 2")  # the file's 5-120 s backoff is slow
    wait_for_bridge(fleet, clients)
    controller = clients(fleet.central, "controller", client_id="test-controller", session_expiry_s=3600)
    controller.subscribe("edge/+/results/+")
    controller.close()
    conn, outbox = agent_device(fleet.site)
    conn.start()
    wait_until(lambda: conn.connected, "the agent connected to the site broker", timeout=TIMEOUT_S)

    fleet.central.stop()  # a clean shutdown: the controller's session is saved (persistence true)
    ids = [f"while-away-{n}" for n in range(20)]
    for result_id in ids:
        outbox.put(results_topic("edge", "cam-01", "people"), json.dumps({"id": result_id}).encode())
    conn.notify_new_message()
    assert conn.flush(TIMEOUT_S), "the site broker did not take the results"  # PUBACKed by the site

    fleet.central.start()
    back = clients(fleet.central, "controller", client_id="test-controller", session_expiry_s=3600)
    wait_until(
        lambda: [json.loads(g.payload)["id"] for g in back.received if "/results/" in g.topic] == ids,
        "every result, in order, after the central broker came back",
        timeout=TIMEOUT_S,
        state=lambda: [g.topic for g in back.received],
    )


@pytest.mark.parametrize("version", ["mqttv50", "mqttv311"])
def test_what_the_central_broker_keeps_for_a_site_that_is_away(
    version: str, fleet_factory: Callable[..., Fleet], clients: ClientFactory
) -> None:
    """mosquitto 2.0 connects an mqttv50 bridge with clean start off but no session expiry interval,
    so the central broker ends its session when the link drops: a command sent meanwhile is lost. An
    mqttv311 bridge's session is kept and the command is delivered when the site is back. Retained
    desired state arrives either way (the bridge subscribes again)."""
    fleet = fleet_factory(bridge_protocol_version=f"bridge_protocol_version {version}")
    wait_for_bridge(fleet, clients)
    # A persistent session on the site broker (which persists, and is stopped cleanly) collects
    # what the bridge brings in for cam-01 while no one is connected.
    site_session = {"client_id": "test-site-observer", "session_expiry_s": 3600}
    first = clients(fleet.site, "controller", **site_session)
    first.subscribe("edge/cam-01/cmd/+")
    first.close()  # the session stays (its expiry); a client left running would reconnect and take it
    fleet.site.stop()
    controller = fleet.controller
    assert accepted(controller.publish("edge/cam-01/cmd/while-away", b'{"id": "a"}'))
    assert accepted(controller.publish("edge/groups/lobby/desired", doc("group:lobby", 3), retain=True))
    fleet.site.start()
    back = clients(fleet.site, "controller")
    back.subscribe("edge/groups/lobby/desired")
    back.wait_for("edge/groups/lobby/desired", doc("group:lobby", 3))  # the bridge is back
    assert accepted(controller.publish("edge/cam-01/cmd/control", b'{"id": "c"}'))
    observer = clients(fleet.site, "controller", **site_session)
    observer.wait_for("edge/cam-01/cmd/control")
    # Anything the central broker kept for the bridge was sent on its reconnect, before the control.
    kept = "edge/cam-01/cmd/while-away" in observer.topics()
    assert kept == (version == "mqttv311")
