"""`edge-agent fleet ...`: deploy desired state to groups and devices, watch them converge, roll
back, and send commands, over the fleet's MQTT broker (docs/fleet.md). A thin layer over the
controller (agent/fleetctl/): its typed errors and results become one-line messages (or JSON) and
the exit codes below, which live here.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.cli.common import echo_json, user_errors
from agent.cli.options import (
    Broker,
    DeviceOption,
    FleetJsonOption,
    GroupOption,
    SignOption,
    TimeoutOption,
    WaitOption,
    broker_options,
)
from agent.cli.render.fleet import print_deploy_result, print_progress, print_status
from agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from agent.fleetctl.results import DeployResult
    from agent.fleetctl.targets import Target

EXIT_CODES = """Exit codes:

- 0: every target device converged (status: all converged; cmd: the device answered ok)
- 1: invalid input (spec, key or password file): nothing was published
- 2: command-line usage
- 3: broker: cannot connect, refused, or the connection was lost
- 4: devices failed: a document refused, a pipeline failed or rolled back (cmd: the device answered an error)
- 5: the rollout was stopped and the target rolled back to the baseline
- 6: timed out: devices still in flight (status: some in flight), or no answer to a command
- 7: some target devices are offline (every online one converged)
"""


class ExitCode(IntEnum):
    """Exit statuses of `edge-agent fleet ...` (EXIT_CODES above, in its help)."""

    OK = 0  # every target device converged; a command answered ok
    ERROR = 1  # invalid spec, key or option files: nothing was published
    USAGE = 2  # command-line usage (Typer's own)
    BROKER = 3  # the broker cannot be reached, refused us, or the connection was lost
    FAILED = 4  # a target device refused the document, or a pipeline failed or rolled back
    ROLLED_BACK = 5  # the rollout was stopped and the target rolled back to the baseline
    TIMED_OUT = 6  # devices still in flight at the timeout; a command got no answer
    OFFLINE = 7  # every online target converged, but some are offline


# A deploy's or rollback's `status` (agent/fleetctl/results.py) -> its exit code; any other: OK.
DEPLOY_EXIT_CODES = {
    "failed": ExitCode.FAILED,
    "rolled-back": ExitCode.ROLLED_BACK,
    "timed-out": ExitCode.TIMED_OUT,
    "offline": ExitCode.OFFLINE,
}

fleet_app = typer.Typer(
    help="Drive a fleet over MQTT: deploy desired state, watch it converge, roll back, send commands.\n\n"
    + EXIT_CODES,
    no_args_is_help=True,
)


def _fleet_errors(as_json: bool) -> AbstractContextManager[None]:
    """The controller's errors as a message (or JSON) and their exit code, never a traceback."""
    return user_errors(as_json, exit_code=_error_exit_code)


def _error_exit_code(exc: EdgeAgentError) -> ExitCode:
    """The broker's trouble (agent/fleetctl/connection.py: BrokerError), no answer in time
    (FleetTimeout), or anything else the operator must fix."""
    from agent.fleetctl.connection import BrokerError, FleetTimeout

    if isinstance(exc, BrokerError):
        return ExitCode.BROKER
    if isinstance(exc, FleetTimeout):
        return ExitCode.TIMED_OUT
    return ExitCode.ERROR


def _target(group: str | None, device: str | None) -> Target:
    if group is not None and device is None:
        return ("group", group)
    if device is not None and group is None:
        return ("device", device)
    raise typer.BadParameter("give exactly one of --group and --device")


def _print_result(result: DeployResult, as_json: bool) -> None:
    code = DEPLOY_EXIT_CODES.get(result.status, ExitCode.OK)
    if as_json:
        # The outcome leads: ok, status (keeping its place), exit_code, then the rest of the result.
        verdict = {"ok": code == ExitCode.OK, "status": result.status, "exit_code": int(code)}
        echo_json({**verdict, **result.to_dict()})
    else:
        print_deploy_result(result)
    raise typer.Exit(int(code))


@fleet_app.command("deploy")
@broker_options
def deploy(
    file: Annotated[Path, typer.Argument(help="Deploy spec (YAML or JSON) with pipelines:.", dir_okay=False)],
    group: GroupOption = None,
    device: DeviceOption = None,
    sign: SignOption = None,
    wait: WaitOption = True,
    canary: Annotated[
        float | None,
        typer.Option("--canary", min=0.01, max=99.99, help="Deploy to this % of the group first (canaries)."),
    ] = None,
    max_failed: Annotated[
        float,
        typer.Option(
            "--max-failed",
            min=0,
            max=100,
            help="With --canary: roll back when more than this % of a wave failed.",
        ),
    ] = 0.0,
    timeout: TimeoutOption = 600.0,
    as_json: FleetJsonOption = False,
    *,
    broker: Broker,
) -> None:
    """Publish a deploy spec as the target's next generation and wait for the devices.

    FILE's pipelines become the next generation of the group's or device's desired-state document
    (retained, QoS 1; signed with --sign). --wait waits until every target device converged or
    failed. --canary deploys to that share of the group first; when more than --max-failed % of
    the canaries (or later of all) fail, the baseline goes back and the rollout stops.
    """
    from agent.fleetctl.client import FleetClient
    from agent.fleetctl.spec import check_spec, load_spec
    from agent.fleetctl.targets import target_layer
    from agent.registry.signing import load_private_key

    chosen = _target(group, device)
    with _fleet_errors(as_json):
        spec = load_spec(file)
        check_spec(spec, target_layer(chosen))  # before connecting: an invalid spec publishes nothing
        key = load_private_key(sign) if sign is not None else None
        with FleetClient(broker.options()) as client:
            result = client.deploy(
                spec,
                chosen,
                sign_key=key,
                canary_pct=canary,
                max_failed_pct=max_failed,
                wait=wait,
                timeout_s=timeout,
                progress=None if as_json else print_progress,
            )
    _print_result(result, as_json)


@fleet_app.command("rollback")
@broker_options
def rollback(
    group: GroupOption = None,
    device: DeviceOption = None,
    sign: SignOption = None,
    wait: WaitOption = True,
    timeout: TimeoutOption = 600.0,
    as_json: FleetJsonOption = False,
    *,
    broker: Broker,
) -> None:
    """Put the baseline back: what the target ran before the last deploy.

    Publishes the next generation with the current document's rollout.baseline as its pipelines,
    then (--wait) waits for the target devices.
    """
    from agent.fleetctl.client import FleetClient
    from agent.registry.signing import load_private_key

    chosen = _target(group, device)
    with _fleet_errors(as_json):
        key = load_private_key(sign) if sign is not None else None
        with FleetClient(broker.options()) as client:
            result = client.rollback(
                chosen,
                sign_key=key,
                wait=wait,
                timeout_s=timeout,
                progress=None if as_json else print_progress,
            )
    _print_result(result, as_json)


@fleet_app.command("status")
@broker_options
def status(
    group: GroupOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the broker's retained state.")
    ] = 30.0,
    as_json: FleetJsonOption = False,
    *,
    broker: Broker,
) -> None:
    """Every device: desired vs reported generation, and per pipeline what serves, what is desired
    and what became of it ("serving det@3; desired det@4 failed: why"), backends.

    Read from the broker's retained state. A device whose status is offline is shown offline, with
    what it last reported; one that restarted and has not reported since, in flight. Exits 0 when
    all converged, 4 if any failed, 6 if any is still in flight, 7 if any is offline.
    """
    from agent.fleetctl.client import FleetClient

    with (
        _fleet_errors(as_json),
        FleetClient(broker.options()) as client,
    ):
        devices = client.collect_status(group, timeout_s=timeout)
    summary = {"devices": len(devices), "converged": 0, "failed": 0, "in-flight": 0, "offline": 0}
    for device in devices:
        summary[device.condition()[0]] += 1
    code = ExitCode.OK
    for condition, exit_code in (
        ("failed", ExitCode.FAILED),
        ("in-flight", ExitCode.TIMED_OUT),
        ("offline", ExitCode.OFFLINE),
    ):
        if summary[condition]:
            code = exit_code
            break
    line = (
        f"{summary['devices']} devices: {summary['converged']} converged, {summary['failed']} failed, "
        f"{summary['in-flight']} in flight, {summary['offline']} offline"
    )
    if as_json:
        echo_json({"ok": code == ExitCode.OK, "summary": summary, "devices": [d.to_dict() for d in devices]})
    else:
        print_status(devices, line)
    raise typer.Exit(int(code))


@fleet_app.command("cmd")
@broker_options
def cmd(
    device: Annotated[str, typer.Argument(help="The device id.")],
    name: Annotated[str, typer.Argument(help="The command: ping, status, diagnostics, logs, ...")],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments as key=value (JSON values: lines=50, on=true).")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the answer.")
    ] = 10.0,
    as_json: FleetJsonOption = False,
    *,
    broker: Broker,
) -> None:
    """Send a command to one device and print its answer.

    MQTT 5 request/response: the answer comes back on <prefix>/<device>/cmd/<name>/reply with the
    request's correlation data.
    """
    from agent.fleetctl.client import FleetClient

    arguments = _command_args(args or [])
    with (
        _fleet_errors(as_json),
        FleetClient(broker.options()) as client,
    ):
        reply = client.command(device, name, arguments, timeout_s=timeout)
    code = ExitCode.OK if reply.ok else ExitCode.FAILED
    if as_json:
        echo_json(reply.to_dict())
    elif reply.ok:
        typer.echo(json.dumps(reply.result, indent=2, default=str))
    else:
        error = reply.error or {}
        typer.echo(f"error: {device} answered {error.get('code', '?')}: {error.get('message', '')}", err=True)
    raise typer.Exit(int(code))


def _command_args(items: list[str]) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not key=value")
        try:
            arguments[key] = json.loads(text)
        except ValueError:
            arguments[key] = text
    return arguments
