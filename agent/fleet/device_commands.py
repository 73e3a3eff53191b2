"""What each command does on this device (agent/fleet/commands.py answers them). Each takes the
request's `args` and returns the reply's `result`; bad args are a CommandError("malformed")."""

from __future__ import annotations

import statistics
import time
from typing import Any, Protocol

from agent import __version__
from agent.backend_choice import DecisionStore
from agent.config import AgentConfig
from agent.errors import EdgeAgentError
from agent.fleet.commands import CommandError, Handler, RecentLogs
from agent.supervisor import Supervisor


class _Stats(Protocol):
    def stats(self) -> dict[str, Any]: ...


class DeviceAgent(Protocol):
    """What the commands need of the running agent (agent/daemon.py Agent): its settings, its
    pipelines, its status and its links' counters."""

    @property
    def config(self) -> AgentConfig: ...

    @property
    def started_at(self) -> float: ...

    @property
    def supervisor(self) -> Supervisor: ...

    @property
    def mqtt(self) -> _Stats: ...

    @property
    def outbox(self) -> _Stats: ...

    def status(self) -> dict[str, Any]: ...


_MAX_BENCH_RUNS = 200
_MAX_LOG_LINES = 1000


def device_handlers(agent: DeviceAgent, logs: RecentLogs) -> dict[str, Handler]:
    def ping(_args: dict[str, Any]) -> dict[str, Any]:
        return {
            "pong": True,
            "device": agent.config.device.id,
            "agent_version": __version__,
            "uptime_s": round(time.time() - agent.started_at, 1),
        }

    def status(_args: dict[str, Any]) -> dict[str, Any]:
        return agent.status()

    def diagnostics(_args: dict[str, Any]) -> dict[str, Any]:
        from agent.backend_choice import providers_report  # probes every runtime: only when asked

        return {**providers_report(), "mqtt": agent.mqtt.stats(), "outbox": agent.outbox.stats()}

    def restart_pipeline(args: dict[str, Any]) -> dict[str, Any]:
        name = _pipeline_arg(args)
        agent.supervisor.restart(name)
        return {"pipeline": name, "restarting": True}

    def reselect_backend(args: dict[str, Any]) -> dict[str, Any]:
        name = _pipeline_arg(args)
        try:  # the decision the serving stage follows; else the one recorded for the pipeline
            key: str | None = agent.supervisor.pipeline(name).stage.model.key or None
        except EdgeAgentError:
            key = None
        forgotten = DecisionStore(agent.config.state_dir).forget(name, key)
        agent.supervisor.restart(name)
        return {"pipeline": name, "forgot_cached_decision": forgotten, "restarting": True}

    def benchmark(args: dict[str, Any]) -> dict[str, Any]:
        name = _pipeline_arg(args)
        runs = args.get("runs", 20)
        if type(runs) is not int or not 1 <= runs <= _MAX_BENCH_RUNS:
            raise CommandError("malformed", f'"runs" must be an integer from 1 to {_MAX_BENCH_RUNS}')
        pipeline = agent.supervisor.pipeline(name)
        session, feeds = pipeline.stage.model.session, pipeline.stage.feeder.warm_up_feeds()
        times = []
        for _ in range(runs):  # beside the live stream: the numbers include its load
            start = time.perf_counter()
            session.run(feeds)
            times.append((time.perf_counter() - start) * 1000)
        times.sort()
        serving = pipeline.stage.serving()
        chosen = serving.chosen  # None: a session given, not chosen
        return {
            "pipeline": name,
            "model": pipeline.stage.ref,
            "backend": session.backend,
            "artifact": None if chosen is None else chosen.artifact,
            "precision": serving.precision,
            "proven": None if chosen is None else chosen.proven,
            "runs": runs,
            "median_ms": round(statistics.median(times), 3),
            "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3),
        }

    def recent_logs(args: dict[str, Any]) -> dict[str, Any]:
        lines = args.get("lines", 100)
        if type(lines) is not int or not 1 <= lines <= _MAX_LOG_LINES:
            raise CommandError("malformed", f'"lines" must be an integer from 1 to {_MAX_LOG_LINES}')
        return {"lines": logs.tail(lines)}

    return {
        "ping": ping,
        "status": status,
        "diagnostics": diagnostics,
        "restart-pipeline": restart_pipeline,
        "reselect-backend": reselect_backend,
        "benchmark": benchmark,
        "logs": recent_logs,
    }


def _pipeline_arg(args: dict[str, Any]) -> str:
    name = args.get("pipeline")
    if not isinstance(name, str) or not name:
        raise CommandError("malformed", '"pipeline" (the pipeline\'s name) is required')
    return name
