"""`edge-agent infer MODEL INPUT`: run a model once on an input as a pipeline would (agent/tools/infer/)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.cli.common import echo_json, load, user_errors
from agent.cli.options import DEFAULT_CONFIG, ConfigOption, JsonOption, StateDirOption
from agent.cli.render.infer import print_inference
from agent.config import AgentConfig
from agent.errors import EdgeAgentError


def infer(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="A model file (.onnx, .tflite, .xml), or NAME@VERSION in the store."
        ),
    ],
    input_path: Annotated[
        Path,
        typer.Argument(
            metavar="INPUT",
            help="An image, a video file (--frame), a WAV file (audio pipelines), or a .npy/.npz tensor "
            "(fed to the model as it is).",
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
    draw: Annotated[
        Path | None,
        typer.Option("--draw", help="Write the image (or video frame) with the boxes and labels drawn."),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="With --json: every output tensor's values too (can be large).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run MODEL once on INPUT with the pre- and postprocessing a pipeline would use: the backend,
    the time each step took, and the result (detections, classes, ...). Exit 1 on any problem."""
    from agent.store import ModelStore, store_for
    from agent.tools.infer.draw import check_picture_path
    from agent.tools.infer.inputs import PICTURES, input_kind, is_model_file_name
    from agent.tools.infer.run import infer

    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")  # a broken file is said once, as an error
    with user_errors(as_json):
        if raw and not as_json:
            raise EdgeAgentError("--raw goes with --json (the values of every output)")
        if benchmark and backend is not None:
            raise EdgeAgentError("--benchmark chooses the backend, --backend names it: give one of them")
        if draw is not None:
            if input_kind(input_path) not in PICTURES:
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
        result = infer(
            model,
            input_path,
            store,
            agent=agent_config,
            config_path=config,
            pipeline=pipeline,
            state_dir=states,
            backend=backend,
            benchmark=benchmark,
            frame=frame,
            raw=raw,
        )
        drawn = _draw_result(result, draw) if draw is not None else None
    data = result.to_dict()
    if drawn is not None:
        data["drawn"] = {"file": str(draw), "note": drawn}
    if as_json:
        echo_json(data)
    else:
        print_inference(data, result.summary)


def _draw_result(result: Any, path: Path) -> str:
    from agent.tools.infer.draw import draw, write_picture

    assert result.picture is not None and result.output is not None
    image, note = draw(result.picture, result.output)
    write_picture(path, image)
    return note
