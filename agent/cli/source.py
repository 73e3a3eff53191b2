"""`edge-agent source`: read a source for a few seconds and say what came."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.cli.common import echo_json, load, user_errors
from agent.cli.options import DEFAULT_CONFIG, ConfigOption, JsonOption


def source(
    target: Annotated[
        str,
        typer.Argument(
            help="A pipeline of the config (its source), or a source URI: video file, image folder, "
            "/dev/videoN, rtsp:// or http(s):// URL, gst:PIPELINE, alsa:DEVICE or a .wav file."
        ),
    ],
    config: ConfigOption = DEFAULT_CONFIG,
    seconds: Annotated[float, typer.Option("--seconds", min=0.5, max=600, help="How long to read.")] = 3.0,
    as_json: JsonOption = False,
) -> None:
    """Read a source for a few seconds and say what came: frames, rate, size, errors. Exit 1 if nothing."""
    from agent.sources.check import check_source, source_config_for

    with user_errors(as_json):
        pipelines = {p.name: p for p in load(config).pipelines} if config.is_file() else {}
        chosen = pipelines[target].source if target in pipelines else source_config_for(target)
        report = check_source(chosen, seconds)
    if as_json:
        echo_json(report.to_json())
    else:
        stats = report.stats
        typer.echo(f"source: {stats.uri} ({report.kind}), {stats.state}")
        if report.ok:
            typer.echo(
                f"received: {report.received} in {report.seconds} s ({report.per_second}/s), "
                f"the first after {report.first_after_s} s; each {report.shape} {report.dtype}"
            )
        shown = stats.to_json().items()  # the kind's own counters and the common ones that counted
        counters = {k: v for k, v in shown if k not in ("uri", "state", "error") and v not in (None, 0)}
        if counters:
            typer.echo("counters: " + ", ".join(f"{k} {v}" for k, v in counters.items()))
        if stats.error:
            typer.echo(f"error: {stats.error}", err=True)
    if not report.ok:
        raise typer.Exit(1)
