"""Home Assistant links a tracking pipeline's clips (agent/home_automation/, docs/integrations.md
"Clips"): with `clips.enabled`, state/<pipeline>/clip holds the id of the clip the latest event names,
and with the web page on, state/<pipeline>/clip_url its path on the page (/clips/<pipeline>/<id>):
the discovery config (checked against Home Assistant's schema) and the state topics, driven by a real
Scene whose events a real ClipRecorder (agent/clips.py) tags as the pipeline's clips step does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.clips import ClipRecorder
from agent.home_automation import PipelineView, discovery_components, discovery_payload, identity_of
from tests.ha_fixtures import CONFIG_TOPIC, config_of
from tests.ha_schema import check_device_discovery
from tests.test_home_assistant_tracking import FPS, STATE, H, W, home_for_tracker, scene_for, story, tracker

CLIPS = {"enabled": True, "pre_s": 0, "post_s": 0}


def test_the_clip_sensors_fit_home_assistants_schema(tmp_path: Path) -> None:
    with_web = config_of(tmp_path, [{**tracker(), "clips": CLIPS}], web={"enabled": True})
    identity = identity_of(with_web)
    views = [PipelineView.of(p, web=True) for p in with_web.pipelines]
    payload = discovery_payload(identity, discovery_components(views, identity, "edge"), {})
    assert check_device_discovery(CONFIG_TOPIC, payload) == []
    cmps = payload["cmps"]
    assert (cmps["dock__clip"]["p"], cmps["dock__clip"]["name"]) == ("sensor", "dock last clip")
    assert cmps["dock__clip"]["state_topic"] == f"{STATE}/clip"
    assert (cmps["dock__clip_url"]["name"], cmps["dock__clip_url"]["state_topic"]) == (
        "dock last clip path",
        f"{STATE}/clip_url",
    )
    # Without the page, no path; without clips, neither.
    no_web = {*discovery_components([PipelineView.of(with_web.pipelines[0])], identity, "edge")}
    assert "dock__clip" in no_web and "dock__clip_url" not in no_web
    plain = config_of(tmp_path, [tracker()], web={"enabled": True})
    cids = set(discovery_components([PipelineView.of(plain.pipelines[0], web=True)], identity, "edge"))
    assert not cids & {"dock__clip", "dock__clip_url"}


def test_the_state_topics_name_the_latest_clip_and_its_path(tmp_path: Path) -> None:
    home, link, _, wanted = home_for_tracker(
        tmp_path, [{**tracker(), "clips": CLIPS}], state_topics={"enabled": True}, web={"enabled": True}
    )
    home.tick()
    link.take()
    pipeline = config_of(tmp_path, wanted).pipelines[0]
    scene = scene_for(pipeline)
    recorder = ClipRecorder("dock", tmp_path / "clips" / "dock", pipeline.clips)
    pixels = np.zeros((64, 64, 3), np.uint8)
    clips: list[str] = []
    sent: dict[str, bytes] = {}
    try:
        for i, boxes in enumerate(story()):
            scene.step(boxes, 1000.0 + i / FPS, W, H)
            events = scene.take_events()
            recorder.frame(pixels, 1000.0 + i / FPS, events)  # puts its clip's id on the events
            if events:
                home.observe_scene("dock", scene.summary(), events)
                clips += [e["clip"] for e in events if "clip" in e and e["clip"] not in clips]
            sent.update({t.removeprefix(STATE + "/"): p for t, p in link.take()})
    finally:
        recorder.stop()
    assert clips, "the story's objects open a clip"
    assert sent["clip"] == clips[-1].encode()
    assert sent["clip_url"] == f"/clips/dock/{clips[-1]}".encode()
    # Without the web page: the id alone.
    home, link, _, _ = home_for_tracker(
        tmp_path / "no-web", [{**tracker(), "clips": CLIPS}], state_topics={"enabled": True}
    )
    home.tick()
    home.observe_scene("dock", scene.summary(), [{"type": "end", "clip": clips[-1], "object": {"id": 1}}])
    topics = {t.removeprefix(STATE + "/"): p for t, p in link.take()}
    assert topics["clip"] == clips[-1].encode() and "clip_url" not in topics
