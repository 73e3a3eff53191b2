"""scripts/install.sh, run for real, as root: into temporary roots (--root DIR), and once as on a
box (no --root) inside a private mount namespace whose /etc, /opt, /var and /usr/local are overlays.

Each temporary root holds a minimal user database (etc/passwd, group, shadow, gshadow: the target's,
which useradd --prefix edits) and nothing else; the script makes the user, the venv (from
/usr/bin/python3, with the agent built from this checkout or a wheel), the config, the state dir and
the unit there. Dependencies are not installed (--no-deps: their wheels are hundreds of MB); the
entry point is run with this test run's own site-packages on PYTHONPATH for them, and must import the
agent from the installed venv. The checkout (and its .venv) may be in a private directory (a clone in
`mktemp -d`, under /root): what the service user must read is put where it can (see ON_THIS_BOX).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent import __version__
from agent.config_loader import load_config

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "install.sh"
UNIT_SOURCE = REPO / "systemd" / "edge-agent.service"
EXAMPLE = REPO / "configs" / "agent.example.yaml"
PYTHON = "/usr/bin/python3"
VENV = "/opt/edge-agent/venv"
WHERE = "import agent, providers; print(agent.__file__, providers.__file__)"
TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="install.sh makes users and sets owners: run as root"
)

# The groups of a small Debian box: video, dialout, audio and plugdev exist; render and apex do not.
PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\ndialout:x:20:\naudio:x:29:\nvideo:x:44:\nplugdev:x:46:\nnogroup:x:65534:\n"
SHADOW = "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n"
GSHADOW = "root:*::\ndialout:*::\naudio:*::\nvideo:*::\nplugdev:*::\nnogroup:*::\n"
PRESENT_GROUPS = ["video", "dialout", "plugdev", "audio"]
MISSING_GROUPS = ["render", "apex"]


def make_root(path: Path) -> Path:
    (path / "etc").mkdir(parents=True)
    for name, text, mode in (
        ("passwd", PASSWD, 0o644),
        ("group", GROUP, 0o644),
        ("shadow", SHADOW, 0o640),
        ("gshadow", GSHADOW, 0o640),
    ):
        file = path / "etc" / name
        file.write_text(text)
        file.chmod(mode)
    return path


def install(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--root", str(root), "--no-deps", "--python", PYTHON, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if check:
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def entries(path: Path) -> dict[str, list[str]]:
    """name -> fields of a passwd/group-style file, failing on a duplicated name."""
    lines = [line.split(":") for line in path.read_text().splitlines() if line]
    names = [fields[0] for fields in lines]
    assert len(names) == len(set(names)), f"duplicated entries in {path}: {names}"
    return {fields[0]: fields for fields in lines}


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under root with its type, mode, owner and content (the venv's lib/ by name only)."""
    result: dict[str, tuple[object, ...]] = {}
    lib = root / VENV.lstrip("/") / "lib"
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == lib:
            dirnames.clear()
        for name in dirnames + filenames:
            path = here / name
            st = path.lstat()
            content: object = None
            if stat.S_ISLNK(st.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                content = hashlib.sha256(path.read_bytes()).hexdigest()
            result[str(path.relative_to(root))] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, content)
    return result


def mode_owner(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def verify(root: Path, unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", str(unit)], capture_output=True, text=True, timeout=60
    )


def run_entry_point(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed `edge-agent` script, run the way its #! line says, by the venv's Python.

    Its #! names /opt/edge-agent/venv/bin/python, the target's path, which does not exist here.
    The dependencies come from this test run's environment (PYTHONPATH: searched before the venv's
    site-packages, which holds the agent itself; no .pth files are read from it)."""
    venv = root / VENV.lstrip("/")
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_DEVICE_ID", "MQTT_HOST")}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    return subprocess.run(
        [str(venv / "bin" / "python"), str(venv / "bin" / "edge-agent"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="edge-agent-install-") as tmp:
        yield Path(tmp)


def copy_checkout(dest: Path) -> Path:
    """What a checkout holds for a build (pyproject.toml's packages and readme), copied to dest."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("agent", "providers"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def wheel(workdir: Path) -> Path:
    """This checkout as a wheel, built from a copy (the build leaves nothing in the checkout)."""
    src = copy_checkout(workdir / "src")
    wheels = workdir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        check=True,
        timeout=TIMEOUT_S,
    )
    return next(wheels.glob("edge_agent-*.whl"))


@dataclass
class Installed:
    root: Path
    first: subprocess.CompletedProcess[str]
    second: subprocess.CompletedProcess[str]
    snapshots: list[dict[str, tuple[object, ...]]]


@pytest.fixture(scope="module")
def installed(workdir: Path) -> Installed:
    """A root installed into twice (from this checkout), with a snapshot after each run."""
    version = subprocess.run(
        [PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    assert version == f"{sys.version_info.major}.{sys.version_info.minor}", (
        f"{PYTHON} is Python {version}, this test run {sys.version_info[:2]}: the dependencies this run "
        "lends the installed venv would not load"
    )
    root = make_root(workdir / "root-a")
    first = install(root)
    after_first = snapshot(root)
    second = install(root)
    return Installed(root, first, second, [after_first, snapshot(root)])


@pytest.mark.slow
def test_install_creates_user_venv_config_state_and_unit(installed: Installed) -> None:
    root, out = installed.root, installed.first.stdout
    assert [int(n) for n in re.findall(r"^\[(\d)/8\]", out, re.M)] == list(range(1, 9)), out

    # The user: a system account, no login, home = the state dir; its own group.
    user = entries(root / "etc/passwd")["edge-agent"]
    uid, gid = int(user[2]), int(user[3])
    assert 100 <= uid < 1000, user
    assert user[5:] == ["/var/lib/edge-agent", "/usr/sbin/nologin"]
    groups = entries(root / "etc/group")
    assert groups["edge-agent"][2] == str(gid)
    assert entries(root / "etc/shadow")["edge-agent"][1].startswith(("!", "*"))  # no password
    # The device groups the box has, and only those (no 216/GROUP from a missing one).
    for name in PRESENT_GROUPS:
        assert groups[name][3].split(",") == ["edge-agent"], groups[name]
    for name in MISSING_GROUPS:
        assert name not in groups
    assert "added to groups: video dialout plugdev audio" in out
    assert "groups not on this box (skipped): render apex" in out
    assert "SupplementaryGroups=" not in "".join(
        line for line in UNIT_SOURCE.read_text().splitlines() if not line.startswith("#")
    )

    # Config: the example, root:edge-agent 0640, in a root-owned 0755 dir.
    conf = root / "etc/edge-agent/agent.yaml"
    assert conf.read_bytes() == EXAMPLE.read_bytes()
    assert mode_owner(conf) == (0o640, 0, gid)
    assert mode_owner(root / "etc/edge-agent") == (0o755, 0, 0)
    # State: the agent's only.
    assert mode_owner(root / "var/lib/edge-agent") == (0o700, uid, gid)

    # The unit, enabled in the target (WantedBy=multi-user.target), not started.
    unit = root / "etc/systemd/system/edge-agent.service"
    assert unit.read_bytes() == UNIT_SOURCE.read_bytes()
    assert mode_owner(unit) == (0o644, 0, 0)
    wants = root / "etc/systemd/system/multi-user.target.wants/edge-agent.service"
    assert os.readlink(wants) == "/etc/systemd/system/edge-agent.service"
    assert not (root / "etc/systemd/system/edge-agent.service.d").exists()  # no Jetson here
    assert "not started (--root)" in out

    # The venv: made from /usr/bin/python3, with the target's paths, readable by everyone.
    venv = root / VENV.lstrip("/")
    cfg = (venv / "pyvenv.cfg").read_text()
    assert "home = /usr/bin\n" in cfg and "include-system-site-packages = false" in cfg
    assert os.readlink(venv / "bin/python3") == PYTHON
    assert (venv / "bin/edge-agent").read_text().splitlines()[0] == f"#!{VENV}/bin/python"
    assert mode_owner(root / "opt/edge-agent")[0] == mode_owner(venv)[0] == 0o755
    leaks = [
        str(path)
        for path in [venv / "pyvenv.cfg", *(venv / "bin").iterdir(), *venv.rglob("*.pyc")]
        if path.is_file() and not path.is_symlink() and str(root).encode() in path.read_bytes()
    ]
    assert leaks == [], f"files in the venv name this machine's {root}: {leaks[:5]}"
    assert os.readlink(root / "usr/local/bin/edge-agent") == f"{VENV}/bin/edge-agent"
    # --no-deps says what the dependencies would have been: the CPU onnxruntime, no extras.
    deps = re.search(r"dependencies not installed \(--no-deps\); they would be: (.*)", out)
    assert deps is not None, out
    assert "onnxruntime>=1.17" in deps.group(1).split() and "onnxruntime-gpu" not in deps.group(1)


@pytest.mark.slow
def test_installed_entry_point_runs_the_installed_agent(installed: Installed) -> None:
    root = installed.root
    result = run_entry_point(root, "version")
    assert (result.returncode, result.stdout) == (0, f"{__version__}\n"), result.stderr
    result = run_entry_point(root, "--help")
    assert result.returncode == 0 and "run" in result.stdout and "config" in result.stdout, result.stderr
    venv = root / VENV.lstrip("/")
    where = subprocess.run(
        [str(venv / "bin/python"), "-c", WHERE],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]},
        cwd=root,  # not this checkout: `python -c` puts the working directory first on sys.path
    )
    site = venv / "lib"
    assert all(Path(p).is_relative_to(site) for p in where.stdout.split()), where
    # The example config, installed as it is, validates and runs no pipeline until one is set up
    # (its registry and camera are placeholders).
    conf = root / "etc/edge-agent/agent.yaml"
    result = run_entry_point(root, "config", "validate", str(conf))
    assert result.returncode == 0 and result.stdout.startswith("OK: "), result.stdout + result.stderr
    assert not [p.name for p in load_config(conf, environ={}).pipelines if p.enabled]


@pytest.mark.slow
def test_second_run_changes_nothing(installed: Installed) -> None:
    first, second = installed.snapshots
    assert first == second
    for name in ("passwd", "group", "shadow", "gshadow"):
        entries(installed.root / "etc" / name)  # no duplicated user or group
    out = installed.second.stdout
    for said in (
        "user edge-agent exists",
        "already in groups: video dialout plugdev audio",
        "kept (exists; its content is not touched)",
        "exists (kept: models, outbox, status)",
        "unit /etc/systemd/system/edge-agent.service: unchanged",
    ):
        assert said in out, out


@pytest.mark.slow
def test_unit_passes_systemd_analyze_verify(installed: Installed, workdir: Path) -> None:
    """The installed unit, checked against the installed tree (ExecStart= must be executable there).

    `verify --root` looks for everything under the root: it gets this machine's systemd units
    (multi-user.target, sysinit.target...) and /bin/kill (ExecReload=), as a real target has them."""
    check = workdir / "verify"
    shutil.copytree(installed.root, check, symlinks=True)
    shutil.copytree("/usr/lib/systemd/system", check / "usr/lib/systemd/system", symlinks=True)
    (check / "bin").mkdir(exist_ok=True)
    shutil.copy2("/bin/kill", check / "bin/kill")
    unit = check / "etc/systemd/system/edge-agent.service"
    result = verify(check, unit)
    # verify exits 0 on unknown keys and bad values too, printing why: any output is a failure.
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")

    # Not vacuous: the same check on a unit with a typo, and on a root without the venv.
    broken = unit.read_text().replace("DeviceAllow=char-alsa rw", "DeviceAllow=char-alsa rx")
    unit.write_text(broken)
    result = verify(check, unit)
    assert "Invalid device rights 'rx'" in result.stderr
    unit.write_bytes(UNIT_SOURCE.read_bytes())
    shutil.rmtree(check / "opt")
    result = verify(check, unit)
    assert result.returncode != 0 and "/opt/edge-agent/venv/bin/edge-agent is not executable" in result.stderr

    # The exposure docs/operations.md records (systemd 252: 3.0 "OK").
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNIT_SOURCE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for edge-agent\.service: (\d+\.\d)", result.stdout)
    assert level is not None, result.stdout + result.stderr
    assert float(level.group(1)) <= 3.0, level.group(0)


@pytest.mark.slow
def test_existing_config_kept_then_uninstall_and_purge(workdir: Path, wheel: Path) -> None:
    """A box with its own config (naming a video under /home), a Jetson, --with gpu and tflite,
    the agent from a wheel; then --uninstall keeps config and state, --purge removes them."""
    root = make_root(workdir / "root-b")
    (root / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 4.0\n")
    conf = root / "etc/edge-agent/agent.yaml"
    conf.parent.mkdir(parents=True)
    mine = b"device: {id: dock-7}\npipelines:\n  - {name: d, model: {name: m, version: '1'},\n" + (
        b"     source: {type: video, uri: /home/pi/dock.mp4}, postprocess: {type: raw}}\n"
    )
    conf.write_bytes(mine)
    conf.chmod(0o600)
    state = root / "var/lib/edge-agent"
    state.mkdir(parents=True, mode=0o755)
    (state / "outbox.sqlite").write_bytes(b"undelivered results")

    result = install(root, "--from", str(wheel), "--with", "gpu", "--with", "tflite", "--no-enable")
    out = result.stdout
    assert f"agent: from the wheel {wheel}" in out
    assert conf.read_bytes() == mine  # byte for byte
    gid = int(entries(root / "etc/passwd")["edge-agent"][3])
    uid = int(entries(root / "etc/passwd")["edge-agent"][2])
    assert mode_owner(conf) == (0o640, 0, gid)  # readable by the agent, by no one else
    assert "owner and mode set to root:edge-agent 0640" in out
    # The service could not see /home/pi/dock.mp4 (ProtectHome=yes): said at install time.
    assert "names paths the service cannot see" in result.stderr
    assert "line 4:" in result.stderr and "/home/pi/dock.mp4" in result.stderr
    # A state dir made by hand (0755, root's) becomes the agent's, its files kept.
    assert mode_owner(state) == (0o700, uid, gid)
    assert mode_owner(state / "outbox.sqlite")[1:] == (uid, gid)
    # --with gpu: onnxruntime-gpu instead of onnxruntime, never both; tflite's extra added.
    deps = re.search(r"they would be: (.*)", out)
    assert deps is not None, out
    names = [re.split(r"[<>=!~\[]", req)[0] for req in deps.group(1).split()]
    assert "onnxruntime-gpu" in names and "onnxruntime" not in names and "ai-edge-litert" in names
    # Jetson: the device allow list is lifted by a drop-in (CUDA's nodes differ between JetPacks).
    dropin = root / "etc/systemd/system/edge-agent.service.d/jetson.conf"
    text = dropin.read_text()
    assert "DeviceAllow=\nDevicePolicy=auto\n" in text and "PrivateTmp=no\n" in text
    assert mode_owner(dropin) == (0o644, 0, 0)
    assert not (root / "etc/systemd/system/multi-user.target.wants").exists()  # --no-enable
    # An admin's own drop-in, to be kept by --uninstall.
    own = dropin.parent / "paths.conf"
    own.write_text("[Service]\nBindReadOnlyPaths=/home/pi/videos\n")

    result = install(root, "--uninstall")
    out = result.stdout
    unit = "etc/systemd/system/edge-agent.service"
    for gone in ("opt/edge-agent", "usr/local/bin/edge-agent", unit, dropin):
        assert not (root / gone).exists(), gone
    assert "edge-agent" not in entries(root / "etc/passwd")
    assert "edge-agent" not in entries(root / "etc/group")
    assert "edge-agent" not in entries(root / "etc/shadow")
    for name in PRESENT_GROUPS:
        assert entries(root / "etc/group")[name][3] == "", name
    assert conf.read_bytes() == mine
    assert (state / "outbox.sqlite").read_bytes() == b"undelivered results"
    assert own.read_text().startswith("[Service]")
    assert "kept /etc/edge-agent (--purge removes it)" in out
    assert "kept /etc/systemd/system/edge-agent.service.d: your drop-ins" in out

    again = install(root, "--uninstall")  # nothing left to do: fine
    assert "no user edge-agent" in again.stdout

    install(root, "--uninstall", "--purge")
    for gone in ("etc/edge-agent", "var/lib/edge-agent", "etc/systemd/system/edge-agent.service.d"):
        assert not (root / gone).exists(), gone
    assert (entries(root / "etc/passwd").keys(), entries(root / "etc/group").keys()) == (
        {"root", "nobody"},
        {"root", "dialout", "audio", "video", "plugdev", "nogroup"},
    )


def test_refuses_a_python_the_service_user_cannot_run(workdir: Path) -> None:
    """A venv links to the Python it is made from: one under /root (pyenv's, say) or in a directory
    only its owner may enter would not run as edge-agent. Refused before anything is changed."""
    root = make_root(workdir / "root-c")
    before = snapshot(root)
    with tempfile.TemporaryDirectory(dir="/root", prefix="edge-agent-python-") as home:
        python = Path(home) / "python3"
        shutil.copy2(os.path.realpath(PYTHON), python)
        result = subprocess.run(
            ["bash", str(SCRIPT), "--root", str(root), "--python", str(python)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert "under a home directory: the service user edge-agent cannot run it" in result.stderr
    assert "--python /usr/bin/python3" in result.stderr

    private = workdir / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    shutil.copy2(os.path.realpath(PYTHON), python)
    result = subprocess.run(
        ["bash", str(SCRIPT), "--root", str(root), "--python", str(python)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"{private} (above {python}) cannot be entered by other users (mode 700)" in result.stderr
    assert snapshot(root) == before


def test_root_needs_the_targets_user_database(workdir: Path) -> None:
    bare = workdir / "root-d"
    bare.mkdir()
    result = install(bare, check=False)
    assert result.returncode == 1
    assert f"no {bare}/etc/passwd or {bare}/etc/group" in result.stderr
    assert list(bare.iterdir()) == []


# The script as it runs on a box (no --root), in a private mount namespace: /etc, /opt, /var and
# /usr/local are overlays whose changes land in $W/upper, so this machine's own are not touched; and
# in a network namespace of its own, so the agent run here reaches no broker of this machine.
# systemd is not running here (no /run/systemd/system): the unit is installed, not enabled.
# The agent is installed from a copy of this checkout in a private directory ($SRC, under $W: mode
# 0700, as a clone in `mktemp -d` or /root is): the installed release must not need its source.
# The dependencies (--no-deps) are this test run's site-packages ($DEPS), which may be under a
# private directory too (this checkout's .venv): they are lent to edge-agent through a bind mount
# at a path everyone can enter, $LENT.
ON_THIS_BOX = r"""
set -euo pipefail
ip link set lo up  # 127.0.0.1 in this network namespace, with no broker on it
for dir in /etc /opt /var /usr/local; do
    mkdir -p "$W/upper$dir" "$W/work$dir"
    mount -t overlay overlay -o "lowerdir=$dir,upperdir=$W/upper$dir,workdir=$W/work$dir" "$dir"
done
LENT=/usr/local/lib/edge-agent-test-deps
mkdir -p -m 0755 "$LENT"
mount --bind "$DEPS" "$LENT"
cd /
bash "$SCRIPT" --no-deps --python /usr/bin/python3 --from "$SRC"
echo "== passwd $(getent passwd edge-agent)"
echo "== groups $(id -Gn edge-agent)"
modes=$(stat -c '%a:%U:%G' /etc/edge-agent/agent.yaml /var/lib/edge-agent /opt/edge-agent/venv)
echo "== modes $(echo $modes)"
as_agent() { runuser -u edge-agent -- env PYTHONPATH="$LENT" "$@"; }
echo "== source $(as_agent test -r "$SRC/pyproject.toml" && echo readable || echo private)"
echo "== version $(as_agent /usr/local/bin/edge-agent version)"
echo "== validate $(as_agent /usr/local/bin/edge-agent config validate /etc/edge-agent/agent.yaml)"
echo "== home $(as_agent /opt/edge-agent/venv/bin/python -c 'import os; print(os.path.expanduser("~"))')"
# The example config as installed runs (no broker in this network namespace: it retries, as it should).
as_agent /usr/local/bin/edge-agent run -c /etc/edge-agent/agent.yaml --duration 2 2>"$W/run.log"
errors=$(grep -c ' ERROR ' "$W/run.log" || true)
echo "== ran $errors errors, $(grep -o 'running as [a-z0-9-]*' "$W/run.log")"
echo "== state $(ls /var/lib/edge-agent | grep -E '^(outbox.sqlite|status.json)$' | tr '\n' ' ')"
bash "$SCRIPT" --uninstall
venv=$([ -e /opt/edge-agent ] && echo venv || echo no venv)
echo "== after $(getent passwd edge-agent || echo no user), $venv"
"""


@pytest.mark.slow
def test_install_on_this_box_runs_as_the_service_user(workdir: Path) -> None:
    """Without --root: useradd/usermod on /etc itself, and the service user, through runuser, runs
    the installed command by its own #! line and reads the config (root:edge-agent 0640); the
    agent installed from a checkout in a private directory (as a clone in `mktemp -d` is)."""
    w = workdir / "box"
    w.mkdir(mode=0o700)
    private = w / "private"
    private.mkdir(mode=0o700)
    src = copy_checkout(private / "checkout")
    result = subprocess.run(
        ["unshare", "--mount", "--net", "--propagation", "private", "bash", "-c", ON_THIS_BOX],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("EDGE_DEVICE_ID", "MQTT_HOST")},
            "W": str(w),
            "SCRIPT": str(SCRIPT),
            "SRC": str(src),
            "DEPS": sysconfig.get_paths()["purelib"],
        },
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    said = dict(line[3:].split(" ", 1) for line in out.splitlines() if line.startswith("== "))
    assert said["passwd"].startswith("edge-agent:x:")
    assert said["passwd"].endswith(":edge-agent daemon:/var/lib/edge-agent:/usr/sbin/nologin")
    box_groups = {line.split(":")[0] for line in Path("/etc/group").read_text().splitlines()}
    device_groups = [g for g in ("video", "render", "dialout", "plugdev", "audio", "apex") if g in box_groups]
    primary, *groups = said["groups"].split()
    assert (primary, sorted(groups)) == ("edge-agent", sorted(device_groups))
    assert said["modes"].split() == ["640:root:edge-agent", "700:edge-agent:edge-agent", "755:root:root"]
    assert said["source"] == "private"  # what follows runs without the checkout it came from
    assert f"agent: from the checkout {src.resolve()}" in out
    assert said["version"] == __version__
    assert said["validate"].startswith("OK: /etc/edge-agent/agent.yaml")
    assert said["home"] == "/var/lib/edge-agent"
    assert said["ran"] == "0 errors, running as lobby-cam-01", (w / "run.log").read_text()
    assert said["state"].split() == ["outbox.sqlite", "status.json"]
    assert "runs as edge-agent" in out
    assert "systemd is not running here: the unit is installed, not enabled or started" in out
    assert said["after"] == "no user, no venv"
    # This machine's own user database is untouched; the overlay took the changes.
    assert "edge-agent" not in Path("/etc/passwd").read_text()
    assert not Path("/opt/edge-agent").exists()
    assert (w / "upper/etc/passwd").exists()
