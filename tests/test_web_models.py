"""The models page (agent/web/models_page.py) over a real supervisor: the real YOLOv8n face detector
(a model file, imported into a real store, its backend chosen as at a daemon's start) on the rendered
clip of a face crossing a line, served by the page's app (Starlette's TestClient).

It shows what `edge-agent explain` says of each running pipeline (the serving backend and why: the
same words the CLI prints, agent/explained.py) and what `edge-agent models list` shows of the store,
every value escaped; its part refreshes without a reload."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from agent.cli.render.backends import print_explanation
from agent.config.web import WebConfig
from agent.config_loader import load_config
from agent.desired_pipeline import DesiredPipeline
from agent.explained import explained
from agent.session_pool import SessionPool
from agent.store import store_for
from agent.store.listing import installed_rows
from agent.supervisor import Supervisor
from agent.web.app import WebApp
from agent.web.models_page import explained_html, models_page
from providers import SelectionPolicy
from tests.face_clip import faces_pipeline
from tests.media_fixtures import ListSink
from tests.test_pipeline_tracking import crossing_clip  # noqa: F401  (fixture)
from tests.waits import wait_until


@pytest.fixture(scope="module")
def supervisor(
    tmp_path_factory: pytest.TempPathFactory,
    crossing_clip: Path,  # noqa: F811
    yolo_path: Path,
    yolo_labels: list[str],
) -> Iterator[Supervisor]:
    """A supervisor running the face pipeline, built as the daemon builds it (store, choice, stage)."""
    tmp = tmp_path_factory.mktemp("models-page")
    pipeline = faces_pipeline(
        yolo_path, yolo_labels, {"type": "video", "uri": str(crossing_clip), "loop": True}
    )
    settings = {
        "device": {"id": "models-box"},
        "state_dir": str(tmp / "state"),
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": [pipeline],
    }
    (tmp / "agent.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    config = load_config(tmp / "agent.yaml")
    b = config.backends
    sessions = SessionPool(
        b.batching, b.max_batch, SelectionPolicy(rtol=b.rtol, atol=b.atol, max_mismatch=b.max_mismatch)
    )
    running = Supervisor(config, store_for(config), sessions, ListSink())
    running.apply([DesiredPipeline(p) for p in config.pipelines])
    try:
        wait_until(lambda: bool(running.serving_records()), "the pipeline to serve", timeout=120,
                   state=lambda: {n: s.to_json() for n, s in running.states().items()})  # fmt: skip
        yield running
    finally:
        running.stop(30)


def explain(supervisor: Supervisor) -> dict[str, Any]:
    return {"pipelines": supervisor.serving_records()}  # (what the daemon's Site.explain returns)


def page_text(markup: str) -> str:
    """What a reader sees of the HTML: tags gone, entities read, spaces folded."""
    inline = re.sub(r"</?strong>", "", markup)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", inline)))


def spoken(line: list[tuple[str, bool]]) -> str:
    return re.sub(r"\s+", " ", "".join(text for text, _ in line))


def test_the_models_page_shows_the_serving_backend_and_why_as_explain_says_it_and_the_store(
    supervisor: Supervisor, capsys: pytest.CaptureFixture[str]
) -> None:
    web_app = WebApp(WebConfig(enabled=True, port=0), lambda: {"pipelines": {}}, "models-box")
    models_page(supervisor.store, lambda: explain(supervisor))(web_app)
    with TestClient(web_app.app, base_url="http://127.0.0.1") as page:
        answer = page.get("/models")
        assert answer.status_code == 200, answer.text
        assert '<a href="/models">Models</a>' in answer.text and "/static/refresh.js" in answer.text
        shown = page_text(answer.text)
        [record] = explain(supervisor)["pipelines"]
        said = explained(record)
        # The serving backend and why: the words `edge-agent explain` prints, each line of them.
        backend = record["serving"]["backend"]  # (the box's choice: OpenVINO's CPU or onnxruntime's)
        assert f"faces ({record['model']}): serving now on {backend} on 320n.onnx" in shown
        assert said.lines, said  # (a live record says how it was proven, or that it was not)
        for line in [said.title, *said.lines]:
            assert spoken(line) in shown, (spoken(line), shown)
        print_explanation([record])
        printed = capsys.readouterr().out
        for line in [said.title, *said.lines]:
            assert spoken(line) in re.sub(r"\s+", " ", printed)  # ... as the CLI prints them
        for candidate in said.candidates or []:
            assert candidate.backend in shown and candidate.verdict in shown
        # The store: each installed version's files, as `edge-agent models list` lists them.
        [version] = installed_rows(supervisor.store)
        [artifact] = version["artifacts"]
        assert f"{version['name']} {version['version']} {artifact['file']} {artifact['format']}" in shown
        assert artifact["sha256"][:16] in shown and f"{artifact['size']:,}" in shown
        # The part the page refreshes: the same, without the frame around it.
        part = page.get("/models/part")
        assert part.status_code == 200 and "<header>" not in part.text and backend in part.text
        assert page.get("/static/refresh.js").status_code == 200


def test_every_value_on_the_models_page_is_escaped() -> None:
    hostile = "<script>alert(1)</script>"
    record = {"pipeline": hostile, "model": f"m@{hostile}", "error": f"cannot load {hostile}", "live": True}
    markup = explained_html(record)
    assert "<script>" not in markup and "&lt;script&gt;" in markup
    assert page_text(markup).strip() == (
        f"{hostile} (m@{hostile}): left out, the pipeline serves without it cannot load {hostile}"
    )
