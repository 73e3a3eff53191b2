"""The zone editor's pages (agent/web/editor.py) through Starlette's TestClient on the real app
(agent/web/app.py WebApp): a real config file with comments, saved through the real round-trip edit
and validator (agent/config_edit.py), and a Site whose reload really loads the file with the
config loader, as the daemon's reload does. The daemon and Chromium tests: tests/test_web_end_to_end.py."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agent.config import PipelineConfig
from agent.config.web import WebConfig, WebUser
from agent.config_edit import file_hash
from agent.config_loader import load_config
from agent.errors import ConfigError
from agent.web.app import WebApp
from agent.web.editor import MAX_BYTES, drawn_from_json, editor_pages
from agent.web.passwords import hash_password
from agent.web.site import Site
from tests.test_config_edit import SHOP, TILL


@dataclass
class FakeSlot:
    """What the editor reads of a supervisor's slot: its name and its desired config."""

    name: str
    config: PipelineConfig

    @property
    def desired(self) -> Any:
        return self


@dataclass
class FakeSupervisor:
    slots_: list[FakeSlot] = field(default_factory=list)

    def slots(self) -> list[FakeSlot]:
        return self.slots_


@dataclass
class Box:
    """A Site's parts: the file, the reloads it saw, the fleet's layers."""

    path: Path
    supervisor: FakeSupervisor = field(default_factory=FakeSupervisor)
    reloads: list[dict[str, Any]] = field(default_factory=list)
    layers: dict[str, str] = field(default_factory=dict)

    def reload(self) -> dict[str, Any]:
        """As the daemon's: the file loaded by the config loader, refused when it is invalid."""
        try:
            load_config(self.path)
        except ConfigError as exc:
            outcome: dict[str, Any] = {"result": "refused", "problems": exc.problems}
        else:
            outcome = {"result": "applied", "problems": []}
        self.reloads.append(outcome)
        return outcome

    def site(self, config_file: Path | None = None) -> Site:
        return Site(
            supervisor=self.supervisor,  # type: ignore[arg-type]
            state_dir=self.path.parent / "state",
            config_file=config_file,
            reload=self.reload,
            explain=lambda: {"pipelines": []},
            layer_of=self.layers.get,
        )


def client_of(site: Site, **web: Any) -> TestClient:
    web_app = WebApp(WebConfig(enabled=True, port=0, **web), lambda: {"pipelines": {}}, "shop-1")
    editor_pages(site)(web_app)
    return TestClient(web_app.app, base_url="http://127.0.0.1")


@pytest.fixture
def box(tmp_path: Path) -> Box:
    path = tmp_path / "agent.yaml"
    path.write_text(SHOP, encoding="utf-8")
    return Box(path)


@pytest.fixture
def client(box: Box) -> Iterator[TestClient]:
    with client_of(box.site(box.path)) as test_client:
        yield test_client


def editor_data(html: str) -> dict[str, Any]:
    import html as html_module

    found = re.search(r'data-editor="([^"]*)"', html)
    assert found is not None, html
    data: dict[str, Any] = json.loads(html_module.unescape(found[1]))
    return data


def csrf_of(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]*)">', html)
    assert found is not None
    return found[1]


def post(client: TestClient, pipeline: str, shapes: dict[str, Any], sha256: str, csrf: str | None) -> Any:
    headers = {} if csrf is None else {"X-CSRF-Token": csrf}
    return client.post(
        f"/zones/{pipeline}", data={"sha256": sha256, "shapes": json.dumps(shapes)}, headers=headers
    )


def as_sent(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The shapes as the page holds them when opened: each from its place in the file, not moved."""
    return {
        kind: [
            {
                "points": s["points"],
                "origin": i,
                "moved": False,
                **({"name": s["name"]} if "name" in s else {}),
            }
            for i, s in enumerate(items)
        ]
        for kind, items in data["shapes"].items()
    }


# --- the pages --------------------------------------------------------------------------------------


def test_the_list_names_each_pipeline_with_its_shapes(client: TestClient) -> None:
    page = client.get("/zones")
    assert page.status_code == 200
    assert '<a href="/zones">Zones</a>' in page.text  # the header's link
    assert '<a href="/zones/door">door</a>: 2 zones, 1 line, 1 motion mask, 0 object masks' in page.text
    assert '<a href="/zones/yard">yard</a>: 0 zones, 1 line, 0 motion masks, 0 object masks' in page.text


def test_the_editor_page_holds_the_shapes_the_hash_and_the_plain_frame(client: TestClient, box: Box) -> None:
    page = client.get("/zones/door")
    assert page.status_code == 200
    assert '<script src="/static/editor.js"></script>' in page.text
    data = editor_data(page.text)
    assert data["sha256"] == file_hash(box.path.read_bytes())
    assert [z["name"] for z in data["shapes"]["zones"]] == ["counter", "shelf"]
    assert data["shapes"]["zones"][1]["units"] == "pixels"
    assert [z["labels"] for z in data["shapes"]["zones"]] == [["person"], None]  # the table shows them
    assert data["kinds"]["motion_masks"][0] is True  # an RTSP camera: the gate runs
    assert data["labels"] == ["person", "car"]
    yard = editor_data(client.get("/zones/yard").text)
    assert yard["kinds"]["motion_masks"] == [
        False,
        "the pipeline runs no motion gate (motion: true turns it on)",
    ]
    assert client.get("/zones/hall").status_code == 404
    for name in ("editor.js", "editor.css"):
        assert client.get(f"/static/{name}").status_code == 200


def test_values_on_the_page_are_escaped(box: Box) -> None:
    box.path.write_text(SHOP.replace("name: counter", 'name: "c<b>1"'), encoding="utf-8")
    with client_of(box.site(box.path)) as client:
        page = client.get("/zones/door").text
    assert "<b>" not in page and "c&lt;b&gt;1" in page


def test_a_daemon_without_a_config_file_says_so(box: Box) -> None:
    with client_of(box.site(None)) as client:
        assert "This daemon was not started from a config file" in client.get("/zones").text
        page = client.get("/zones/door")
        assert page.status_code == 404 and "not started from a config file" in page.text


# --- saving -----------------------------------------------------------------------------------------


def test_a_save_writes_the_file_keeping_its_comments_reloads_and_logs_the_user(
    client: TestClient, box: Box, caplog: pytest.LogCaptureFixture
) -> None:
    page = client.get("/zones/door").text
    data = editor_data(page)
    shapes = as_sent(data)
    shapes["zones"].append({"name": "till", "points": [list(p) for p in TILL], "origin": None, "moved": True})
    with caplog.at_level(logging.INFO, logger="agent.web.editor"):
        answer = post(client, "door", shapes, data["sha256"], csrf_of(page))
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "applied"
    assert answer.json()["sha256"] == file_hash(box.path.read_bytes())
    text = box.path.read_text()
    assert "      - name: counter           # by the till\n" in text  # comments kept
    assert "      - name: till\n        points: [[0.1, 0.2], [0.3, 0.2], [0.3, 0.4]]\n" in text
    assert box.reloads == [{"result": "applied", "problems": []}]
    assert f"web: local saved zones/lines of pipeline door in {box.path}" in caplog.messages


def test_with_users_only_a_logged_in_user_edits_and_the_log_names_them(
    box: Box, caplog: pytest.LogCaptureFixture
) -> None:
    user = WebUser(name="ada", password_hash=hash_password("correct horse"))
    with client_of(box.site(box.path), users=[user]) as client:
        assert client.get("/zones/door", follow_redirects=False).headers["location"] == "/login"
        assert client.post("/zones/door", data={"shapes": "{}"}).status_code == 401
        login = client.get("/login").text
        token = re.search(r'name="csrf" value="([^"]*)"', login)
        assert token is not None
        client.post("/login", data={"csrf": token[1], "user": "ada", "password": "correct horse"})
        page = client.get("/zones/door").text
        data = editor_data(page)
        shapes = as_sent(data)
        shapes["zones"] = shapes["zones"][:1]  # the shelf deleted
        with caplog.at_level(logging.INFO, logger="agent.web.editor"):
            answer = post(client, "door", shapes, data["sha256"], csrf_of(page))
    assert answer.json()["result"] == "applied"
    assert [z.name for z in load_config(box.path).pipelines[0].zones] == ["counter"]
    assert f"web: ada saved zones/lines of pipeline door in {box.path}" in caplog.messages


def test_a_bad_shape_comes_back_beside_it_and_the_file_is_untouched(client: TestClient, box: Box) -> None:
    page = client.get("/zones/door").text
    data = editor_data(page)
    shapes = as_sent(data)
    shapes["zones"].append({"name": "till", "points": [[0.1, 0.1], [0.2, 0.1]], "origin": None})
    shapes["lines"][0] = {"name": "entry", "points": [[0.2, 0.2], [1.5, 0.2]], "origin": 0, "moved": True}
    answer = post(client, "door", shapes, data["sha256"], csrf_of(page))
    assert answer.status_code == 422
    assert answer.json()["result"] == "refused"
    by_shape = answer.json()["shapes"]
    assert sorted(by_shape) == ["lines/0", "zones/2"]
    assert by_shape["zones/2"] == [
        "points: List should have at least 3 items after validation, not 2 (got [[0.1, 0.1], [0.2, 0.1]])"
    ]
    assert by_shape["lines/0"] == [
        "points: point 1 (1.5, 0.2) is outside the frame: with units: fraction (the default) coordinates "
        "are 0..1 of the frame's width and height; write units: pixels for pixels"
    ]
    assert box.path.read_text() == SHOP and box.reloads == []


def test_a_file_changed_since_the_page_opened_is_refused(client: TestClient, box: Box) -> None:
    page = client.get("/zones/door").text
    data = editor_data(page)
    box.path.write_text(SHOP + "# edited by hand meanwhile\n", encoding="utf-8")
    answer = post(client, "door", as_sent(data), data["sha256"], csrf_of(page))
    assert answer.status_code == 422
    assert answer.json()["problems"] == [
        "the file changed since you opened it: reload the page to edit what it holds now"
    ]
    assert box.path.read_text().endswith("# edited by hand meanwhile\n")


@pytest.mark.parametrize("csrf", [None, "forged"])
def test_a_save_without_its_csrf_token_is_forbidden(client: TestClient, box: Box, csrf: str | None) -> None:
    data = editor_data(client.get("/zones/door").text)
    answer = post(client, "door", {"zones": []}, data["sha256"], csrf)
    assert answer.status_code == 403
    assert box.path.read_text() == SHOP


def test_many_shapes_fit_the_editors_body_limit_and_more_is_refused(client: TestClient, box: Box) -> None:
    """A login's form limit is 4 KiB; the editor takes MAX_BYTES (add_page max_bytes)."""
    page = client.get("/zones/door").text
    data = editor_data(page)
    shapes = as_sent(data)
    # 40 zones of 40 points: about 60 KiB url-encoded, a real drawing's size at most
    for n in range(40):
        ring = [[round(0.5 + 0.01 * n * (i % 2), 3), round(i / 40, 3)] for i in range(40)]
        shapes["zones"].append({"name": f"z{n}", "points": ring, "origin": None})
    body_bytes = len(json.dumps(shapes))
    assert 8 * 1024 < body_bytes < MAX_BYTES
    answer = post(client, "door", shapes, data["sha256"], csrf_of(page))
    assert answer.status_code == 422 and answer.json()["result"] == "refused"  # read and judged, not 403
    huge = client.post(
        "/zones/door",
        data={"sha256": data["sha256"], "shapes": "[" * MAX_BYTES},
        headers={"X-CSRF-Token": csrf_of(page)},
    )
    assert huge.status_code == 403  # over MAX_BYTES: not read


def test_a_form_of_more_fields_than_any_page_has_is_refused_not_a_server_error(client: TestClient) -> None:
    page = client.get("/zones/door").text
    answer = client.post(
        "/zones/door", data={f"f{i}": "x" for i in range(10)}, headers={"X-CSRF-Token": csrf_of(page)}
    )
    assert answer.status_code == 403


def test_bad_json_is_a_bad_request(client: TestClient) -> None:
    page = client.get("/zones/door").text
    answer = client.post(
        "/zones/door", data={"sha256": "x", "shapes": "{not json"}, headers={"X-CSRF-Token": csrf_of(page)}
    )
    assert answer.status_code == 400 and answer.json()["problems"][0].startswith("shapes: ")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected an object of kind -> shapes"),
        ({"areas": []}, "'areas' is no kind of shape"),
        ({"zones": [{"points": [[0, 0], [1, 0], [1, 1]]}]}, "zones[0].name: a zone needs a name"),
        (
            {"zones": [{"name": "a", "points": [[0, "x"]]}]},
            "zones[0].points[0]: expected [x, y], two numbers",
        ),
        ({"lines": [{"name": "a", "points": [[0, 0], [1, 1]], "origin": -1}]}, "lines[0].origin"),
        ({"motion_masks": [{"points": [[0, 0]], "labels": ["car"]}]}, "a motion mask has no labels"),
    ],
)
def test_bad_shapes_from_the_page_say_what_is_wrong(data: Any, message: str) -> None:
    with pytest.raises(ValueError) as error:
        drawn_from_json(data)
    assert message in str(error.value)


# --- the fleet --------------------------------------------------------------------------------------


def test_a_pipeline_of_the_fleet_gets_the_documents_snippet_not_a_write(box: Box) -> None:
    door = load_config(box.path).pipelines[0]
    box.supervisor.slots_.append(FakeSlot("door", door))
    box.layers["door"] = "group:lobby"
    with client_of(box.site(box.path)) as client:
        page = client.get("/zones/door").text
        assert "The fleet's desired state runs this pipeline (layer group:lobby)" in page
        data = editor_data(page)
        shapes = as_sent(data)
        shapes["zones"][0]["points"] = [[0.5, 0.5], [0.9, 0.5], [0.9, 0.9]]
        shapes["zones"][0]["moved"] = True
        answer = post(client, "door", shapes, "", csrf_of(page))
        assert answer.status_code == 200
        assert answer.json()["result"] == "fleet" and answer.json()["layer"] == "group:lobby"
        pipeline = json.loads(answer.json()["snippet"])["pipelines"]["door"]
        assert pipeline["zones"][0] == {
            "name": "counter",
            "points": [[0.5, 0.5], [0.9, 0.5], [0.9, 0.9]],
            "labels": ["person"],
            "dwell_s": 30.0,
        }
        assert pipeline["source"] == {"type": "video", "uri": "rtsp://10.0.0.5/door"}
        PipelineConfig.model_validate({**pipeline, "name": "door"})
        shapes["zones"][0]["points"] = [[0.5, 0.5], [1.5, 0.5], [0.9, 0.9]]
        bad = post(client, "door", shapes, "", csrf_of(page)).json()
        assert bad["result"] == "refused" and bad["shapes"]["zones/0"][0].startswith(
            "points: point 1 (1.5, 0.5)"
        )
    assert box.path.read_text() == SHOP and box.reloads == []
