"""`edge-agent infer MODEL INPUT`: run a model once on an input as a pipeline would (agent/tools/infer/)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.cli.common import echo_json, load, user_errors
from agent.cli.options import DEFAULT_CONFIG, ConfigOption, JsonOption, StateDirOption
from agent.cli.render.infer import print_inference
from agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from agent.config import AgentConfig, PipelineConfig
    from agent.tools.infer.run import InferRequest


def infer(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="A model file (.onnx, .tflite, .xml), or NAME@VERSION in the store."
        ),
    ],
    input_arg: Annotated[
        str,
        typer.Argument(
            metavar="INPUT",
            help="An image, a video file (--frame), a camera or stream (rtsp://, http(s)://, /dev/videoN, "
            "gst:PIPELINE: its first frame; with --track, --seconds of it), a WAV file (audio "
            "pipelines), or a .npy/.npz tensor (fed to the model as it is).",
        ),
    ],
    pipeline: Annotated[
        str | None,
        typer.Option(
            "--pipeline",
            help="Process the input as this pipeline of -c CONFIG does (its preprocess, postprocess, "
            "state and report rules); default: the model's own hints, else plain image defaults.",
        ),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="Run on this backend, e.g. onnxruntime/CPUExecutionProvider, openvino/CPU, tflite/cpu "
            "(default: the agent's choice for this model on this box).",
        ),
    ] = None,
    benchmark: Annotated[
        bool,
        typer.Option("--benchmark", help="Prove the candidate backends on this input first (seconds)."),
    ] = False,
    frame: Annotated[
        int | None, typer.Option("--frame", min=0, help="Video: the frame to run on (default 0).")
    ] = None,
    track: Annotated[
        bool,
        typer.Option(
            "--track",
            help="Video or camera: run every frame, follow the boxes (track ids) and print the events as "
            "they happen (new, enter, exit, cross, dwell, end) and a summary; zones, lines and track "
            "settings from --pipeline, else the tracker's defaults and no zones. A --pipeline with "
            "attributes: its second models read the objects, and the events carry what they read. An "
            "image: its one frame.",
        ),
    ] = False,
    seconds: Annotated[
        float | None,
        typer.Option(
            "--seconds",
            min=0.1,
            help="With --track: at most this much of the clip (a camera: how long to read it; default 10).",
        ),
    ] = None,
    draw: Annotated[
        Path | None,
        typer.Option(
            "--draw",
            help="Write the image (or video frame) with the boxes and labels drawn, and the --pipeline's "
            "zones and lines. With --track: OUT.mp4 (H.264), OUT.webm (VP8) or OUT.avi (MJPEG), the whole "
            "clip with boxes, track ids, attributes read, anchor points, zones by state and count, lines "
            "with counts (same fps and size); OUT.jpg or OUT.png, the frame with the most tracked objects "
            "(the latest of equals).",
        ),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="With --json: every output tensor's values too (can be large).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run MODEL once on INPUT with the pre- and postprocessing a pipeline would use: the backend,
    the time each step took, and the result (detections, classes, ...). Exit 1 on any problem.

    INPUT may be a camera or stream (rtsp://, http(s)://, /dev/videoN, gst:...): its first frame.

    With --track, every frame of a video (or --seconds of a camera; an image is one frame): the
    objects followed (track ids), the events as they happen (new, enter, exit, cross, dwell, end)
    and a summary."""
    from agent.store import ModelStore, store_for
    from agent.tools.infer.camera import is_camera
    from agent.tools.infer.choice import named_pipeline
    from agent.tools.infer.draw import check_picture_path
    from agent.tools.infer.inputs import PICTURES, input_kind, is_model_file_name
    from agent.tools.infer.run import InferRequest, infer
    from agent.tools.infer.track import check_track_draw
    from agent.tools.infer.video import is_video_name

    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")  # a broken file is said once, as an error
    # A camera's URL stays as it is written (a Path would make rtsp:// rtsp:/).
    camera = input_arg if is_camera(input_arg) else None
    input_path = Path(input_arg)
    with user_errors(as_json):
        if raw and not as_json:
            raise EdgeAgentError("--raw goes with --json (the values of every output)")
        if benchmark and backend is not None:
            raise EdgeAgentError("--benchmark chooses the backend, --backend names it: give one of them")
        kind = "camera" if camera is not None else input_kind(input_path)
        if seconds is not None and not track:
            raise EdgeAgentError("--seconds goes with --track (without it: one frame)")
        if track:
            if frame is not None:
                raise EdgeAgentError("--frame runs one frame, --track runs them all: give one of them")
            if raw:
                raise EdgeAgentError("--raw is for one input's outputs, not a tracked clip")
            if kind not in ("video", "camera", "image"):
                raise EdgeAgentError(
                    f"--track follows objects across a video's frames; {input_path} is not a video, a "
                    "camera or an image"
                )
            if draw is not None:
                check_track_draw(draw, kind)
        elif draw is not None:
            if is_video_name(draw):
                raise EdgeAgentError(f"--draw {draw}: a drawn video goes with --track (without it: an image)")
            if kind not in (*PICTURES, "camera"):
                raise EdgeAgentError(
                    f"--draw needs an image or a video frame to draw on; {input_path} is neither"
                )
            check_picture_path(draw)
        from_store = not is_model_file_name(model)
        agent_config: AgentConfig | None = None
        if pipeline is not None or (from_store and state_dir is None):
            agent_config = load(config)
        elif config.is_file():
            with contextlib.suppress(EdgeAgentError):  # only its backend settings would be used
                agent_config = load(config)
        states = state_dir or (agent_config.state_dir if agent_config is not None else None)
        if state_dir is not None or agent_config is None:
            store = ModelStore((states or Path(".")) / "store")
        else:
            store = store_for(agent_config)
        request = InferRequest(
            model,
            input_path,
            store,
            agent=agent_config,
            config_path=config,
            pipeline=pipeline,
            state_dir=states,
            backend=backend,
            benchmark=benchmark,
            camera=camera,
        )
        if track:
            _track(request, draw, seconds, as_json)
            return
        result = infer(request, frame=frame, raw=raw)
        drawn = None
        if draw is not None:
            named = named_pipeline(agent_config, pipeline, config) if pipeline is not None else None
            drawn = _draw_result(result, draw, named)
    data = result.to_dict()
    if drawn is not None:
        data["drawn"] = {"file": str(draw), "note": drawn}
    if as_json:
        echo_json(data)
    else:
        print_inference(data, result.summary)


def _draw_result(result: Any, path: Path, pipeline: PipelineConfig | None) -> str:
    """The picture with the output drawn, over the pipeline's zones and lines (each with how many of
    the boxes it holds, by the zone's anchor) where it has any."""
    from agent.tools.infer.draw import draw, write_picture

    assert result.picture is not None and result.output is not None
    zones = pipeline.zones if pipeline is not None else []
    lines = pipeline.lines if pipeline is not None else []
    image, note = draw(result.picture, result.output, zones, lines)
    write_picture(path, image)
    return note


def _track(request: InferRequest, draw: Path | None, seconds: float | None, as_json: bool) -> None:
    """`infer --track`: people see the events as they happen, scripts one JSON document at the end."""
    from agent.cli.render.infer import track_printer
    from agent.tools.infer.track import track

    printer = None if as_json else track_printer()
    result = track(
        request,
        draw=draw,
        seconds=seconds,
        on_start=printer.start if printer is not None else None,
        on_event=printer.event if printer is not None else None,
    )
    data = result.to_dict()
    if draw is not None:
        data["drawn"] = {"file": str(draw), "note": result.drawn}
    if printer is not None:
        printer.end(data)
    else:
        echo_json(data)
