"""The box: disk space, the state dir's permissions, device nodes, secret files and the clock."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import stat
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from agent.config import (
    AgentConfig,
    MqttSourceConfig,
)
from agent.fsutil import group_name, user_name
from agent.tools.doctor.core import FAIL, OK, WARN, Check
from agent.tools.doctor.pipelines import local_path

# The year this version was made: a clock before it is wrong for certain (certificates and
# signatures are "not yet valid"), and one far after it is most likely wrong too.
BUILD_YEAR = 2026
FUTURE_YEARS = 10

# Free space on the state dir's filesystem: the outbox, model pulls and the decision cache live there.
DISK_WARN_BYTES = 500 * 1024**2
DISK_WARN_SHARE = 0.10
DISK_FAIL_BYTES = 50 * 1024**2

# Camera and accelerator device nodes the agent's user must be able to open.
DEVICE_PATTERNS = ("/dev/video*", "/dev/nvidia*", "/dev/accel/*", "/dev/apex_*", "/dev/dri/renderD*")


# --- the box ---------------------------------------------------------------------------------


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_disk(state_dir: Path) -> Check:
    """Free space where the outbox, the model store and the decision cache are written."""
    usage = shutil.disk_usage(_existing(state_dir))
    share = usage.free / usage.total if usage.total else 0.0
    detail = f"{_size(usage.free)} free of {_size(usage.total)} ({share:.0%}) where {state_dir} is"
    fix = "free space: edge-agent models gc, journalctl --vacuum-size=100M, or a bigger disk"
    if usage.free < DISK_FAIL_BYTES:
        return Check("disk", FAIL, detail, fix)
    if usage.free < DISK_WARN_BYTES or share < DISK_WARN_SHARE:
        return Check("disk", WARN, detail, fix)
    return Check("disk", OK, detail)


def check_state_dir(state_dir: Path, made: bool = False) -> Check:
    """The state dir holds the outbox (results), models and decisions: the agent's user must own
    and write it, and nobody else should read it. `made`: doctor made it just now (run.py), owner
    only, as the agent makes it."""
    me = user_name(os.geteuid())
    if not state_dir.exists():
        parent = _existing(state_dir)
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("state dir", OK, f"{state_dir} does not exist yet: the agent makes it (owner only)")
        return Check(
            "state dir",
            FAIL,
            f"{state_dir} does not exist and {me} cannot make it in {parent}",
            f"install -d -m 0700 -o {me} {state_dir}",
        )
    info = state_dir.stat()
    owner = user_name(info.st_uid)
    if not stat.S_ISDIR(info.st_mode):
        return Check("state dir", FAIL, f"{state_dir} is not a directory", "fix state_dir in the config")
    if not os.access(state_dir, os.W_OK | os.X_OK):
        return Check(
            "state dir",
            FAIL,
            f"{state_dir} (owner {owner}) is not writable by {me}",
            f"chown -R {me} {state_dir}, if {me} is the user the agent runs as",
        )
    mode = stat.S_IMODE(info.st_mode)
    detail = f"{state_dir}: owner {owner}, mode {mode:04o}"
    if mode & 0o077:
        return Check(
            "state dir",
            WARN,
            f"{detail}: others can read the results, models and decisions in it",
            f"chmod 700 {state_dir}",
        )
    if info.st_uid != os.geteuid():
        return Check(
            "state dir",
            WARN,
            f"{detail}; doctor runs as {me}, so what it found is {me}'s access, not {owner}'s",
            f"run doctor as the agent's user: sudo -u {owner} edge-agent doctor",
        )
    made_now = " (made by doctor, as the agent makes it: it was not there)" if made else ""
    return Check("state dir", OK, detail + ", writable" + made_now)


def _configured_devices(config: AgentConfig | None) -> list[Path]:
    found = []
    for pipeline in config.pipelines if config is not None else []:
        local = local_path(pipeline.source)
        if local is not None and local[0] in ("camera", "serial port"):
            found.append(local[1])
    return found


def check_devices(config: AgentConfig | None) -> Check:
    """Camera and accelerator device nodes (those present, and the cameras and serial ports the
    config names) must open for reading and writing as this user. One the config names that is
    not there is its source row's FAIL."""
    present = [Path(p) for pattern in DEVICE_PATTERNS for p in glob.glob(pattern)]
    nodes = sorted(p for p in {*present, *_configured_devices(config)} if _is_device(p))
    refused: dict[str, list[str]] = {}
    for node in nodes:
        if not os.access(node, os.R_OK | os.W_OK):
            refused.setdefault(group_name(node.stat().st_gid), []).append(str(node))
    me = user_name(os.geteuid())
    if refused:
        problems = [
            f"{me} cannot open {', '.join(paths)} (group {group})" for group, paths in refused.items()
        ]
        fix = f"usermod -aG {','.join(sorted(refused))} {me}, then restart the agent"
        return Check("devices", FAIL, "; ".join(problems), fix)
    if not nodes:
        return Check("devices", OK, "no camera or accelerator device nodes here")
    as_root = " (as root, who opens anything: run doctor as the agent's user)" if os.geteuid() == 0 else ""
    return Check("devices", OK, f"{', '.join(str(n) for n in nodes)}: read and write{as_root}")


def _is_device(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def check_secret_files(config_path: Path, config: AgentConfig) -> Check:
    """Passwords, tokens and private keys must not be readable by everyone on the box: the config
    file when it holds a password, and the files the config names for them."""
    inline = config.mqtt.password is not None or any(
        isinstance(p.source, MqttSourceConfig) and p.source.password is not None for p in config.pipelines
    )
    files: list[tuple[str, Path | None]] = [
        ("mqtt.password_file", config.mqtt.password_file),
        ("mqtt.tls.key_file", config.mqtt.tls.key_file if config.mqtt.tls else None),
        ("registry.password_file", config.registry.password_file if config.registry else None),
        ("registry.token_file", config.registry.token_file if config.registry else None),
    ]
    files += [
        (f"pipelines[{p.name}].source.password_file", p.source.password_file)
        for p in config.pipelines
        if isinstance(p.source, MqttSourceConfig)
    ]
    if inline:
        files.insert(0, ("the config, which holds a password,", config_path))
    exposed = []
    for key, path in files:
        with contextlib.suppress(OSError):
            if path is not None and path.stat().st_mode & stat.S_IROTH:
                exposed.append((key, path))
    if exposed:
        shown = ", ".join(f"{key} {path}" for key, path in exposed)
        paths = " ".join(str(path) for _, path in exposed)
        return Check(
            "secret files",
            WARN,
            f"readable by every user: {shown}",
            f"chmod o-rwx {paths} (0640 root:edge-agent, or 0600 owned by the agent's user)",
        )
    checked = [str(path) for _, path in files if path is not None]
    if not checked:
        return Check("secret files", OK, "no passwords, tokens or keys in files")
    return Check("secret files", OK, f"not readable by every user: {', '.join(checked)}")


def ntp_synchronized(timeout_s: float) -> bool | None:
    """Whether systemd says the clock is NTP-synchronised; None when it cannot tell."""
    timedatectl = shutil.which("timedatectl")
    if timedatectl is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                [timedatectl, "show", "-p", "NTPSynchronized", "--value"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            answer = done.stdout.strip()
            if done.returncode == 0 and answer in ("yes", "no"):
                return answer == "yes"
    timesyncd = Path("/run/systemd/timesync")
    if timesyncd.is_dir():  # systemd-timesyncd runs: it creates this file once synchronised
        return (timesyncd / "synchronized").exists()
    return None


def check_clock(now: datetime | None = None, synchronized: bool | None = None) -> Check:
    """TLS certificates and model signatures have validity periods: a box whose clock is off (no
    real-time clock and no NTP) refuses good ones."""
    now = now or datetime.now(timezone.utc)
    shown = now.strftime("%Y-%m-%d %H:%M UTC")
    set_time = "timedatectl set-ntp true (a box without a real-time clock needs NTP at every boot)"
    if now.year < BUILD_YEAR:
        return Check(
            "clock", FAIL, f"the clock says {shown}: before this version was made ({BUILD_YEAR})", set_time
        )
    if now.year > BUILD_YEAR + FUTURE_YEARS:
        return Check("clock", WARN, f"the clock says {shown}: far in the future", set_time)
    if synchronized is False:
        return Check(
            "clock",
            WARN,
            f"{shown}, not synchronised with NTP",
            "timedatectl set-ntp true, and let the box reach an NTP server (UDP 123)",
        )
    ntp = "synchronised with NTP" if synchronized else "NTP sync status unknown (no systemd-timesyncd)"
    return Check("clock", OK, f"{shown}, {ntp}")
