"""scripts/install.sh --editable-config (run for real into a temporary root, as tests/test_install.py
does): the zone editor can save on an installed box. The folder /etc/edge-agent root:edge-agent 2770,
agent.yaml edge-agent:edge-agent 0640 (nothing for others: it may hold a broker password), the unit's
drop-in opening exactly that folder (ReadWritePaths=); a second run changes nothing, a run without the
option takes it all back, --uninstall removes the drop-in and hands the folder back to root.

Then the editor's own save (agent/config_edit.py) runs as the target's edge-agent user (a subprocess
that drops root with setgid/setuid to its uid and gid, umask 077 as the unit's UMask=) on the file
install.sh set up: saved, owner and mode kept, nothing else left in the folder; on the layout of an
install without the option the same save is refused, the file untouched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_install import (  # noqa: F401
    PYTHON,
    REPO,
    UNIT_SOURCE,
    entries,
    install,
    make_root,
    mode_owner,
    snapshot,
    verify,
    wheel,
    workdir,
)

pytestmark = [pytest.mark.slow]

CONF_DIR = "etc/edge-agent"
DROPIN = "etc/systemd/system/edge-agent.service.d/editable-config.conf"
DROPIN_SOURCE = REPO / "systemd" / "edge-agent.service.d" / "editable-config.conf"

# The zone editor's save as the service user: imports first (as root: this checkout may be private),
# then the daemon's identity (its uid and gid only, umask 077), then save_shapes on the file.
SAVE_AS = r"""
import json, os, sys
from pathlib import Path
import agent.label_check  # noqa: F401  (save_shapes imports it when it checks)
from agent.config_edit import Drawn, Refused, file_hash, save_shapes

path, uid, gid, name = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
os.umask(0o077)
shapes = {"zones": [
    Drawn(points=((0.1, 0.4), (0.6, 0.4), (0.7, 1.0), (0.0, 1.0)), name="doorway", origin=0, moved=False),
    Drawn(points=((0.2, 0.1), (0.5, 0.1), (0.5, 0.3)), name=name),
]}
try:
    saved = save_shapes(path, "faces", shapes, file_hash(path.read_bytes()))
    print(json.dumps({"saved": saved.changed, "ids": [os.getuid(), os.getgid()]}))
except Refused as exc:
    print(json.dumps({"refused": str(exc)}))
"""


def save_as_service_user(conf: Path, uid: int, gid: int, zone: str) -> dict[str, object]:
    """The doorway kept, a new zone `zone` added: {saved: bool, ids} or {refused: why}."""
    done = subprocess.run(
        [sys.executable, "-c", SAVE_AS, str(conf), str(uid), str(gid), zone],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_editable_config_lets_the_service_user_save_and_is_taken_back(
    workdir: Path,  # noqa: F811
    wheel: Path,  # noqa: F811
) -> None:
    os.chmod(workdir, 0o711)  # the service user must reach the root's files (a TemporaryDirectory is 0700)
    root = make_root(workdir / "root-editable")
    first = install(root, "--from", str(wheel), "--editable-config", "--no-enable")
    user = entries(root / "etc/passwd")["edge-agent"]
    uid, gid = int(user[2]), int(user[3])
    conf_dir, conf, dropin = root / CONF_DIR, root / CONF_DIR / "agent.yaml", root / DROPIN

    # The layout: the folder the agent's group may write (setgid), the file the agent's; no one else.
    assert mode_owner(conf_dir) == (0o2770, 0, gid)
    assert mode_owner(conf) == (0o640, uid, gid)
    assert "extras: web" in first.stdout  # the editor is the web page's: its stack comes with it
    assert "/etc/edge-agent: root:edge-agent 2770" in first.stdout
    # The drop-in: the folder opened for writing, nothing more (the mode: systemd warns otherwise).
    assert dropin.read_bytes() == DROPIN_SOURCE.read_bytes()
    assert mode_owner(dropin) == (0o644, 0, 0)
    settings = [ln for ln in dropin.read_text().splitlines() if ln and not ln.startswith("#")]
    assert settings == ["[Service]", "ReadWritePaths=/etc/edge-agent", "ConfigurationDirectoryMode=2770"]

    # systemd reads the unit with the drop-in without a complaint (and does complain of a bad one).
    check = workdir / "verify-editable"
    (check / "etc/systemd/system").mkdir(parents=True)
    shutil.copytree(root / "etc/systemd/system", check / "etc/systemd/system", dirs_exist_ok=True)
    shutil.copytree("/usr/lib/systemd/system", check / "usr/lib/systemd/system", symlinks=True)
    entry = check / "opt/edge-agent/venv/bin/edge-agent"  # ExecStart= must be an executable there
    entry.parent.mkdir(parents=True)
    entry.write_text("#!/bin/sh\n")
    entry.chmod(0o755)
    (check / "bin").mkdir()
    shutil.copy2("/bin/kill", check / "bin/kill")
    unit = check / "etc/systemd/system/edge-agent.service"
    assert unit.read_bytes() == UNIT_SOURCE.read_bytes()
    result = verify(check, unit)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    bad = check / DROPIN
    bad.write_text(bad.read_text().replace("Mode=2770", "Mode=27x0"))
    assert "Failed to parse mode value" in verify(check, unit).stderr

    # Idempotent: the same command again changes nothing.
    before = snapshot(root)
    again = install(root, "--from", str(wheel), "--editable-config", "--no-enable")
    assert snapshot(root) == before
    assert "drop-in /etc/systemd/system/edge-agent.service.d/editable-config.conf: unchanged" in again.stdout
    assert "owner and mode set" not in again.stdout and "2770 (" not in again.stdout

    # The zone editor's save as the daemon: written, the owner and the mode as they were.
    original = conf.read_text()
    answer = save_as_service_user(conf, uid, gid, "counter")
    assert answer == {"saved": True, "ids": [uid, gid]}, answer
    text = conf.read_text()
    assert "- name: counter" in text and "points: [[0.2, 0.1], [0.5, 0.1], [0.5, 0.3]]" in text
    kept = [ln for ln in original.splitlines() if "counter" not in ln]
    assert all(ln in text.splitlines() for ln in kept if ln.lstrip().startswith("#"))  # comments kept
    assert mode_owner(conf) == (0o640, uid, gid)
    assert mode_owner(conf_dir) == (0o2770, 0, gid)
    assert sorted(p.name for p in conf_dir.iterdir()) == ["agent.yaml"]  # no temp file left

    # A run without the option takes it back: root's folder and file, no drop-in; the editor refuses.
    plain = install(root, "--from", str(wheel), "--no-enable")
    assert mode_owner(conf_dir) == (0o755, 0, 0)
    assert mode_owner(conf) == (0o640, 0, gid)
    assert not dropin.exists() and not dropin.parent.exists()
    assert "editable-config.conf: removed (no --editable-config" in plain.stdout
    saved = conf.read_bytes()
    answer = save_as_service_user(conf, uid, gid, "till")
    assert "belongs to uid 0" in str(answer.get("refused")), answer
    assert "scripts/install.sh --editable-config" in str(answer.get("refused")), answer  # what to do
    assert conf.read_bytes() == saved

    # --uninstall: the drop-in goes, and what was the removed user's is root's.
    install(root, "--from", str(wheel), "--editable-config", "--no-enable")
    assert dropin.exists()
    gone = install(root, "--uninstall")
    assert not dropin.exists() and not dropin.parent.exists()
    assert "removed /etc/systemd/system/edge-agent.service.d/editable-config.conf" in gone.stdout
    assert mode_owner(conf_dir) == (0o755, 0, 0)
    assert mode_owner(conf) == (0o600, 0, 0)
    assert conf.read_bytes() == saved
    refused = install(root, "--uninstall", "--editable-config", check=False)
    assert refused.returncode != 0 and "takes no --with, --editable-config or --from" in refused.stderr
