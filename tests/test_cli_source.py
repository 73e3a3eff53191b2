"""`edge-agent source`: try a camera, pipeline or microphone before putting it in a config. The CLI
runs as a subprocess on real sources: a rendered video file, a GStreamer test card, a WAV file,
a pipeline's source from a config, and sources that do not work (a closed RTSP port on loopback,
a missing file), which must exit 1 with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runs import cli, cli_json
from tests.media_fixtures import demo_video_module, write_wav
from tests.waits import free_port


def test_a_video_file_reports_frames_rate_and_size(tmp_path: Path) -> None:
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    # Long enough for the whole 3 s file (the check ends with it), so what is counted does not depend
    # on how fast a busy machine opens the file.
    report = cli_json("source", str(video), "--seconds", "30", "-c", str(tmp_path / "none.yaml"))
    assert report["ok"] and report["kind"] == "file" and report["stats"]["error"] is None
    assert report["stats"]["state"] == "finished" and report["stats"]["frames_decoded"] == 30
    assert report["shape"] == [80, 320, 3] and report["dtype"] == "uint8"  # the demo signs: 320x80
    # Every frame counted (a fast reader gets most of them), at the file's own 10 fps: its 30 frames
    # take at least 2.9 s, however idle the machine (a file read flat out would give hundreds a second).
    assert report["received"] + report["stats"]["frames_dropped"] == 30 and report["received"] >= 15, report
    assert report["per_second"] <= 11, report
    assert report["first_after_s"] < 2.5, report  # at once, long before the file's 3 s are over


@pytest.mark.slow
def test_a_gstreamer_pipeline_and_the_plain_output(tmp_path: Path) -> None:
    card = "gst:videotestsrc is-live=true ! video/x-raw,width=160,height=120,framerate=15/1 ! appsink"
    out = cli("source", card, "--seconds", "5", "-c", str(tmp_path / "none.yaml"))  # 5 s: for a busy machine
    lines = out.splitlines()
    assert lines[0] == f"source: {card} (gstreamer), streaming"
    assert lines[1].startswith("received: ") and "each [120, 160, 3] uint8" in lines[1]


def test_audio_and_a_pipeline_from_the_config(tmp_path: Path) -> None:
    wav = tmp_path / "tone.wav"
    write_wav(wav, (np.sin(np.arange(32000) / 5) * 8000).astype(np.int16), 16000)  # 2 s
    config = tmp_path / "agent.yaml"
    config.write_text(
        json.dumps(
            {
                "device": {"id": "box"},
                "registry": {"url": f"file://{tmp_path}/registry"},
                "pipelines": [
                    {
                        "name": "lobby-mic",
                        "model": {"name": "vad", "version": "1"},
                        "source": {"type": "audio", "uri": str(wav), "window": 512, "realtime": False},
                        "preprocess": {"type": "audio"},
                        "postprocess": {"type": "raw"},
                    }
                ],
            }
        )
    )
    report = cli_json("source", "lobby-mic", "-c", str(config), "--seconds", "30")  # ends with the file
    assert report["ok"] and report["kind"] == "audio-file" and report["shape"] == [512]
    assert report["received"] == 32000 // 512 == report["stats"]["windows"]  # every window, none lost
    assert report["stats"]["state"] == "finished"


@pytest.mark.slow
def test_sources_that_do_not_work_exit_1_and_say_why(tmp_path: Path) -> None:
    closed = f"rtsp://127.0.0.1:{free_port()}/stream"  # nothing listens there
    # Seconds enough for a busy machine to make (and fail) the first attempt.
    out = cli("source", closed, "--seconds", "5", "-c", str(tmp_path / "none.yaml"), expect=1)
    assert f"source: {closed} (url), retrying" in out
    assert f"error: cannot open url source {closed}" in out
    missing = tmp_path / "gone.mp4"
    report = _json_part(
        cli("source", str(missing), "--seconds", "3", "--json", "-c", str(tmp_path / "none.yaml"), expect=1)
    )
    assert report["ok"] is False and report["received"] == 0
    assert report["stats"]["error"] == f"video file {missing} does not exist"


def _json_part(output: str) -> dict[str, object]:
    """The JSON document in a failed command's output (stdout; the log lines of stderr come after)."""
    start = output.index("{")
    document, _ = json.JSONDecoder().raw_decode(output[start:])
    return document  # type: ignore[no-any-return]
