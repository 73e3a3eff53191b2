"""`edge-agent source`: read a source for a few seconds and say what came; `--save` keeps a frame with
a pipeline's zones and lines and a grid of fraction coordinates drawn, to place zones by."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.cli.common import echo_json, load, user_errors
from agent.cli.options import DEFAULT_CONFIG, ConfigOption, JsonOption
from agent.errors import EdgeAgentError

if TYPE_CHECKING:
    import numpy as np

    from agent.config import PipelineConfig


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
    save: Annotated[
        Path | None,
        typer.Option(
            "--save",
            help="Write the first frame to this image (.jpg, .png) with a grid of fraction coordinates "
            "(0..1 of the width and height, as zones' points are given) and the --pipeline's zones and "
            "lines drawn (TARGET's own when it names a pipeline).",
        ),
    ] = None,
    pipeline: Annotated[
        str | None,
        typer.Option("--pipeline", help="With --save: draw this pipeline's (of -c CONFIG) zones and lines."),
    ] = None,
    grid: Annotated[
        bool, typer.Option("--grid/--no-grid", help="With --save: the grid of fraction coordinates.")
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Read a source for a few seconds and say what came: frames, rate, size, errors. Exit 1 if nothing.

    With --save: stop at the first frame and write it with the zones and lines of a pipeline drawn
    over a grid of fraction coordinates, to read a zone's points off (docs/analytics.md)."""
    from agent.sources.check import check_source, source_config_for

    saved: dict[str, Any] | None = None
    with user_errors(as_json):
        if save is None and pipeline is not None:
            raise EdgeAgentError("--pipeline names the zones and lines to draw on --save's frame: add --save")
        if save is not None:
            _check_save_path(save)
        pipelines = {p.name: p for p in load(config).pipelines} if config.is_file() or pipeline else {}
        chosen = pipelines[target].source if target in pipelines else source_config_for(target)
        drawn: PipelineConfig | None = None
        if pipeline is not None:
            if pipeline not in pipelines:
                known = ", ".join(sorted(pipelines)) or "none"
                raise EdgeAgentError(f"no pipeline named {pipeline!r} in {config} (its pipelines: {known})")
            drawn = pipelines[pipeline]
        elif target in pipelines:
            drawn = pipelines[target]
        if save is not None and chosen.type != "video":
            raise EdgeAgentError(f"--save keeps a video frame; {target} is a {chosen.type} source")
        report = check_source(chosen, seconds, until_first=save is not None)
        if save is not None and report.sample is not None:
            saved = _save(save, report.sample, drawn, grid)
    if as_json:
        data = report.to_json()
        if saved is not None:
            data["saved"] = saved
        echo_json(data)
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
        if saved is not None:
            _print_saved(saved)
    if not report.ok:
        if save is not None:
            typer.echo(f"error: no frame came, so {save} was not written", err=True)
        raise typer.Exit(1)


def _check_save_path(path: Path) -> None:
    """EdgeAgentError unless an image can be written at `path` (before the source is read)."""
    import cv2

    if path.is_dir():
        raise EdgeAgentError(f"--save {path} is a folder: name the image to write")
    if path.suffix.lower() in (".gif", ".mp4", ".webm", ".avi") or not cv2.haveImageWriter(str(path)):
        raise EdgeAgentError(f"--save {path}: not an image type this writes", hint="name a .jpg or .png")
    if not path.parent.is_dir():
        raise EdgeAgentError(f"--save {path}: folder {path.parent} does not exist")


def _save(path: Path, frame: np.ndarray, pipeline: PipelineConfig | None, grid: bool) -> dict[str, Any]:
    """Write `frame` with the grid and the pipeline's zones and lines; what was drawn, for people and
    --json: each zone's and line's points as configured and in this frame's pixels."""
    import cv2
    import numpy as np

    from agent.processing.drawing import GRID_STEP, draw_grid, draw_zones
    from agent.processing.zones import LineShape, ZoneShape, frame_problems
    from agent.tools.infer.draw import write_image

    image: np.ndarray = np.ascontiguousarray(frame, np.uint8)
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    height, width = image.shape[:2]
    zones = list(pipeline.zones) if pipeline is not None else []
    lines = list(pipeline.lines) if pipeline is not None else []
    if grid:
        image = draw_grid(image)
    zone_shapes = [ZoneShape.from_config(zone, width, height) for zone in zones]
    line_shapes = [LineShape.from_config(line, width, height) for line in lines]
    if zone_shapes or line_shapes:
        image = draw_zones(image, zone_shapes, line_shapes)
    write_image(path, image, "--save", quality=92)

    def pixels(points: Any) -> list[list[int]]:
        return [[round(float(x)), round(float(y))] for x, y in points]

    return {
        "file": str(path),
        "size": [width, height],
        "pipeline": pipeline.name if pipeline is not None else None,
        "grid": GRID_STEP if grid else None,
        "zones": [
            {"name": z.name, "units": z.units, "points": z.points, "pixels": pixels(s.polygon)}
            for z, s in zip(zones, zone_shapes, strict=True)
        ],
        "lines": [
            {"name": ln.name, "units": ln.units, "points": ln.points, "pixels": pixels([s.start, s.end])}
            for ln, s in zip(lines, line_shapes, strict=True)
        ],
        "problems": frame_problems(zones, lines, width, height),
    }


def _print_saved(saved: dict[str, Any]) -> None:
    width, height = saved["size"]
    drawn = [f"zone {z['name']}" for z in saved["zones"]] + [f"line {ln['name']}" for ln in saved["lines"]]
    what = f" with {', '.join(drawn)}" if drawn else ""
    if saved["pipeline"] is not None and not drawn:
        what = f" (pipeline {saved['pipeline']} has no zones or lines)"
    typer.echo(f"saved {saved['file']}: the first frame, {width}x{height}{what}")
    if saved["grid"] is not None:
        typer.echo(
            f"grid: a line every {saved['grid']:g} of the width (x, labelled along the top) and the height "
            "(y, down the left): a zone's points are [x, y] in these fractions (units: fraction)"
        )
    for item in saved["zones"] + saved["lines"]:
        shown = ", ".join(f"[{x:g}, {y:g}]" for x, y in item["points"])
        typer.echo(f"  {item['name']}: {shown} ({item['units']}) = pixels {item['pixels']}")
    for problem in saved["problems"]:
        typer.echo(f"warning: {problem}", err=True)
