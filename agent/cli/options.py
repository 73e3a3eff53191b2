"""Options the `edge-agent` command modules share, each declared once here: the config and state
dir, --json, a registry's connection (registry and models commands) and test data, and the fleet
broker's connection, which every `fleet` command takes (`broker_options`)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from agent.fleetctl.connection import BrokerOptions

DEFAULT_CONFIG = Path(os.environ.get("EDGE_AGENT_CONFIG", "/etc/edge-agent/agent.yaml"))

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="Agent config file (env EDGE_AGENT_CONFIG).", show_default=True)
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="State directory (default: from the config).")
]

# --- a model registry: publishing, signing, validating --------------------------------------------

TestDataOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--test-data",
        help="A .npz of inputs (arrays named after the model's inputs) and optional expected:<output> "
        "arrays, or an ONNX model-zoo folder (test_data_set_N of input_K.pb/output_K.pb, or a folder of "
        "them). Repeatable.",
        exists=True,
    ),
]
RtolOption = Annotated[
    float | None,
    typer.Option(
        "--rtol", min=0, help="Relative tolerance of the expected outputs (model-zoo default 1e-3)."
    ),
]
AtolOption = Annotated[
    float | None,
    typer.Option(
        "--atol", min=0, help="Absolute tolerance of the expected outputs (model-zoo default 1e-7)."
    ),
]
RegistryUrlOption = Annotated[
    str, typer.Option("--registry", help="file:///srv/registry or oci://host[:port]/prefix.")
]
UsernameOption = Annotated[str | None, typer.Option("--username", help="OCI registry user (basic auth).")]
PasswordFileOption = Annotated[
    Path | None, typer.Option("--password-file", help="File holding the OCI registry password.")
]
TokenFileOption = Annotated[Path | None, typer.Option("--token-file", help="File holding a bearer token.")]
CaFileOption = Annotated[
    Path | None, typer.Option("--ca-file", help="CA bundle that signed the OCI registry's certificate.")
]
KeyOption = Annotated[Path, typer.Option("--key", help="Ed25519 private key file (registry keygen).")]

# --- the fleet ---------------------------------------------------------------------------------

FleetJsonOption = Annotated[bool, typer.Option("--json", help="Print one machine-readable JSON object.")]
GroupOption = Annotated[str | None, typer.Option("--group", "-g", help="Target this device group.")]
DeviceOption = Annotated[str | None, typer.Option("--device", "-d", help="Target this one device.")]
SignOption = Annotated[
    Path | None,
    typer.Option("--sign", help="Sign the document with this Ed25519 private key (registry keygen)."),
]
WaitOption = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Wait until the target devices converged or failed.")
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds to wait for each wave of devices.")
]

DEFAULT_BROKER = "127.0.0.1:1883"
# The broker's connection, the last options of every fleet command, in this order.
BROKER_PARAMETERS = (
    inspect.Parameter(
        "broker",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=DEFAULT_BROKER,
        annotation=Annotated[
            str,
            typer.Option(
                "--broker", envvar="EDGE_AGENT_FLEET_BROKER", help="The fleet's MQTT broker as host:port."
            ),
        ],
    ),
    inspect.Parameter(
        "username",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=None,
        annotation=Annotated[str | None, typer.Option("--username", help="MQTT user name.")],
    ),
    inspect.Parameter(
        "password_file",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=None,
        annotation=Annotated[
            Path | None,
            typer.Option("--password-file", help="File holding the MQTT password.", dir_okay=False),
        ],
    ),
    inspect.Parameter(
        "ca_file",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=None,
        annotation=Annotated[
            Path | None, typer.Option("--ca-file", help="Use TLS, trusting this CA bundle for the broker.")
        ],
    ),
    inspect.Parameter(
        "prefix",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default="edge",
        annotation=Annotated[
            str, typer.Option("--prefix", help="Topic prefix (the agents' mqtt.topic_prefix).")
        ],
    ),
)


@dataclass(frozen=True)
class Broker:
    """The fleet broker's options as given; `options()` checks and reads them (the password file)."""

    broker: str
    username: str | None
    password_file: Path | None
    ca_file: Path | None
    prefix: str

    def options(self) -> BrokerOptions:
        from agent.fleetctl.connection import BrokerOptions

        host, sep, port_text = self.broker.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise EdgeAgentError(f"--broker {self.broker!r} is not host:port (e.g. 127.0.0.1:1883)")
        password = None
        if self.password_file is not None:
            try:
                password = self.password_file.read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise EdgeAgentError(f"cannot read the password file {self.password_file}: {exc}") from None
        return BrokerOptions(
            host=host.strip("[]"),
            port=int(port_text),
            username=self.username,
            password=password,
            ca_file=self.ca_file,
            prefix=self.prefix,
        )


def broker_options(command: Callable[..., None]) -> Callable[..., None]:
    """A fleet command taking `broker: Broker` becomes one with the broker's options (BROKER_PARAMETERS)
    after its own, so each is declared once for every fleet command."""
    own = inspect.signature(command, eval_str=True)
    parameters = [p for p in own.parameters.values() if p.name != "broker"]
    names = [p.name for p in BROKER_PARAMETERS]

    @functools.wraps(command)
    def with_broker(**kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in names}
        command(**kwargs, broker=Broker(**given))

    signature = own.replace(parameters=[*parameters, *BROKER_PARAMETERS])
    with_broker.__signature__ = signature  # type: ignore[attr-defined]
    with_broker.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return with_broker
