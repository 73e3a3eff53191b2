"""`edge-agent doctor` on a state dir that does not exist yet (issue 34, item 8): its backend check
writes the backends' probe cache there, so the dir gets made; made 0755 as a side effect, the
state dir row then warned about the 0755 doctor itself made (exit 1 on a config with nothing else
wrong). Doctor makes it as the agent does, owner only (0700), and says so. Through the real CLI,
with a real model file (the backend check loads it: PaddleOCR's text direction classifier)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import yaml

from tests.cli_runs import edge_agent


def test_doctor_makes_a_missing_state_dir_owner_only_and_does_not_warn_about_it(
    tmp_path: Path, cls_model_path: Path
) -> None:
    state_dir = tmp_path / "fresh" / "state"  # neither exists
    config = {
        "device": {"id": "shop"},
        "state_dir": str(state_dir),
        "mqtt": {"host": "127.0.0.1", "port": 1},  # the broker row FAILs: nothing else is looked at
        "pipelines": [
            {
                "name": "door-cam",
                "model": {"path": str(cls_model_path)},
                "source": {"type": "video", "uri": str(tmp_path / "door.mp4")},  # its row FAILs too
                "postprocess": {"type": "classification"},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))

    done = edge_agent("doctor", "-c", str(path), "--timeout", "3", "--json")
    rows = {row["name"]: row for row in json.loads(done.stdout)["checks"]}
    assert rows["backend:door-cam"]["status"] == "OK", rows["backend:door-cam"]
    assert (state_dir / "cache").is_dir()  # the backend check wrote its probe cache there
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    row = rows["state dir"]
    assert row["status"] == "OK", row
    assert row["detail"].endswith(
        "mode 0700, writable (made by doctor, as the agent makes it: it was not there)"
    )

    # Run again: the dir is there now, and it is as the agent keeps it.
    again = edge_agent("doctor", "-c", str(path), "--timeout", "3", "--json")
    row = {r["name"]: r for r in json.loads(again.stdout)["checks"]}["state dir"]
    assert row["status"] == "OK" and row["detail"].endswith("mode 0700, writable"), row
