"""`edge-agent providers`, `explain` and `bench`: the backends of this box, where a pipeline or
model runs and why, and how fast each backend runs a model."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from agent.cli.common import echo_json, load, model_state_dir, user_errors
from agent.cli.options import DEFAULT_CONFIG, ConfigOption, JsonOption, StateDirOption
from agent.cli.render.backends import bench_progress, print_bench, print_explanation, print_providers
from agent.errors import EdgeAgentError


def providers(as_json: JsonOption = False) -> None:
    """The hardware found and every backend: available or not, why, and versions."""
    from agent.backend_choice import providers_report

    report = providers_report()
    if as_json:
        echo_json(report)
        return
    print_providers(report)


def explain(
    name: Annotated[str, typer.Argument(help="A pipeline name, a model NAME[@VERSION], or a model file.")],
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Why a pipeline (or model) runs on its backend: every candidate, its verdict and numbers. From
    the running daemon when there is one; else where the next start would run it (the cached
    decision, or what a first start serves and the candidates it proves next). A pipeline with
    attributes: each second model too, after the pipeline's own."""
    from agent.tools.explain import explain as explain_records

    with user_errors(as_json):
        from agent.tools.infer.inputs import is_model_file_name

        # A model file needs no config (its backend settings are used when it is valid); a pipeline
        # or a stored model does.
        agent_config = None
        if not is_model_file_name(name) and (config.is_file() or state_dir is None):
            agent_config = load(config)
        elif config.is_file():
            with contextlib.suppress(EdgeAgentError):
                agent_config = load(config)
        records = explain_records(name, agent_config, config, state_dir)
    if as_json:
        echo_json(records)
        return
    print_explanation(records)


def bench(
    model: Annotated[str, typer.Argument(help="A model file, or NAME[@VERSION] in the store.")],
    backend: Annotated[str, typer.Option("--backend", help="A backend name, or 'all'.")] = "all",
    runs: Annotated[int, typer.Option("--runs", min=1, help="Timed runs per backend.")] = 100,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs first.")] = 10,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=0,
            help="Then time every backend again side by side in this many interleaved rounds (0: not).",
        ),
    ] = 5,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            help="Shape of the random inputs: 1x3x48x192, or NAME=1x3x48x192 per input of several.",
        ),
    ] = None,
    inputs: Annotated[
        Path | None,
        typer.Option("--inputs", help="A test data .npz (arrays named after the model's inputs) to time on."),
    ] = None,
    pipeline: Annotated[
        str | None,
        typer.Option("--pipeline", help="Time on inputs of the size this pipeline of the config feeds."),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Latency (p50/p90/p99), throughput and peak memory of MODEL per backend, each in its own process;
    then every backend again side by side in interleaved rounds (the figures to compare on a busy box).

    Inputs: --inputs, else the model's own test data (when its manifest has some), else random
    inputs of the size a pipeline feeds it (--pipeline, else the config's first pipeline on MODEL,
    else the size the model's manifest or metadata names), else random tensors of the model's input
    shapes (--shape; open batch dimension = 1, other open dimensions = 224).
    """
    from agent.backend_choice import current_choice
    from agent.store import ModelStore
    from agent.tools.bench import bench as run_bench
    from agent.tools.bench import bench_feeds
    from agent.tools.infer.choice import settings_for, state_or_scratch
    from agent.tools.inventory import resolve_model
    from providers import NoBackendError, all_backends

    with user_errors(as_json):
        store_root = model_state_dir(model, config, state_dir)
        store = ModelStore((store_root or Path(".")) / "store")
        resolved = resolve_model(model, store)
        ref, artifacts = resolved.ref, resolved.artifacts
        backends = all_backends()
        if backend != "all":
            backends = [b for b in backends if b.name == backend]
            if not backends:
                raise EdgeAgentError(f"unknown backend {backend!r}", hint="edge-agent providers lists them")
        agent = None
        if config.is_file():
            with contextlib.suppress(EdgeAgentError):  # without it: the defaults
                agent = load(config)
        if pipeline is not None and agent is None:
            raise EdgeAgentError(f"--pipeline {pipeline}: no config at {config}", hint="give -c CONFIG")
        shaped = None
        if not shape and inputs is None and (pipeline is not None or not resolved.testdata):
            from agent.tools.infer.run import pipeline_shaped_feeds

            shaped = pipeline_shaped_feeds(model, store, agent, pipeline, config)
        feeds, fed = shaped if shaped is not None else bench_feeds(resolved, shape or [], inputs)
        with state_or_scratch(store_root or (agent.state_dir if agent is not None else None)) as states:
            # What this box serves the model on (marked in the table), and the artifacts it chooses
            # among: an upgraded twin is timed too.
            try:
                choice = current_choice(settings_for(agent, states), None, artifacts, ref, resolved.testdata)
            except NoBackendError:
                choice = None
            if choice is not None:
                artifacts = choice.artifacts
            if as_json:
                rows, cpu = run_bench(artifacts, feeds, backends, runs, warmup, rounds=rounds)
            else:
                with bench_progress() as progress:
                    rows, cpu = run_bench(
                        artifacts, feeds, backends, runs, warmup, progress=progress, rounds=rounds
                    )
    serving = (choice.backend, choice.artifact) if choice is not None else None
    for row in rows:
        row["selected"] = (row["backend"], row["artifact"]) == serving
    if as_json:
        summary = choice.summary() if choice is not None else None
        echo_json(
            {"model": ref, "runs": runs, "warmup": warmup, "inputs": fed, "choice": summary, "results": rows,
             "rounds": rounds if cpu is not None else 0, "cpu": None if cpu is None else asdict(cpu)}
        )  # fmt: skip
        return
    print_bench(ref, runs, warmup, fed, rows, rounds if cpu is not None else 0, cpu)
