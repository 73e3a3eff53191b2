#!/usr/bin/env bash
# Installs edge-agent as a systemd service, as root, in one command (docs/install.md):
#
#   sudo scripts/install.sh [--with openvino|tflite|tflite-legacy|gpu|web]... [--editable-config]
#                           [--from DIR_OR_WHEEL]
#   sudo scripts/install.sh --uninstall [--purge]
#
# It makes the system user edge-agent (home = the state dir, no login shell) in the groups that
# cameras and accelerators need, a venv in /opt/edge-agent/venv, /etc/edge-agent/agent.yaml (the
# example, only when there is none), the state dir /var/lib/edge-agent, and installs, enables and
# starts the unit. Idempotent: run it again to upgrade the agent or after adding hardware (a group
# that appeared, a runtime). --help lists every option.
set -euo pipefail
set -o errtrace
trap 'echo "install.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(cd "$SCRIPT_DIR/.." && pwd)"

SERVICE_USER=edge-agent
OPT_DIR=/opt/edge-agent
VENV=$OPT_DIR/venv
CONF_DIR=/etc/edge-agent
CONF=$CONF_DIR/agent.yaml
STATE_DIR=/var/lib/edge-agent
UNIT_DIR=/etc/systemd/system
UNIT=$UNIT_DIR/edge-agent.service
DROPIN_DIR=$UNIT_DIR/edge-agent.service.d
JETSON_DROPIN=$DROPIN_DIR/jetson.conf
EDITABLE_DROPIN=$DROPIN_DIR/editable-config.conf
CMD_LINK=/usr/local/bin/edge-agent
# Device groups: video (V4L2 cameras; NVIDIA nodes on some distributions), render (GPU render nodes,
# the Intel NPU's /dev/accel), dialout (serial ports), plugdev (USB devices opened through libusb:
# Coral USB), audio (ALSA microphones), apex (Coral PCIe, from gasket-dkms's udev rule).
DEVICE_GROUPS=(video render dialout plugdev audio apex)

usage() {
    cat <<'USAGE'
usage: install.sh [options]            install or upgrade (as root)
       install.sh --uninstall [--purge] [--root DIR]

  --with RUNTIME        extra inference runtime, repeatable:
                          tflite         LiteRT (ai-edge-litert): TFLite models, Coral Edge TPU
                          tflite-legacy  tflite-runtime, where no ai-edge-litert wheel exists
                          gpu            onnxruntime-gpu instead of onnxruntime (CUDA, TensorRT);
                                         the two cannot be installed together
                          openvino       OpenVINO is in every install; this checks for the NPU
                          web            the optional local web page's stack (Starlette, uvicorn:
                                         the `web` extra; turned on by web.enabled, docs/web.md)
  --editable-config     the agent may replace its config (the web page's zone editor saves it):
                        /etc/edge-agent root:edge-agent 2770, agent.yaml edge-agent:edge-agent
                        0640, and a unit drop-in with ReadWritePaths=/etc/edge-agent; implies
                        --with web. A run without it takes that back (docs/install.md)
  --gpu-wheel SPEC      the onnxruntime-gpu to install with --with gpu: a wheel file or URL (a
                        Jetson's, built for its JetPack) or a requirement; default onnxruntime-gpu
  --from DIR_OR_WHEEL   the agent to install: a checkout or an edge_agent-*.whl
                        (default: the checkout this script is in)
  --python PATH         the Python the venv is made from (default /usr/bin/python3); the service
                        user must be able to run it, so not one under /root or /home
  --system-site-packages  the venv also sees the system's Python packages (apt's)
  --constraints FILE    pip constraints for the dependencies (e.g. the checkout's constraints.txt:
                        the versions the tests ran with, for Python >= 3.11)
  --pip-arg ARG         passed to pip install, repeatable (e.g. --pip-arg=--no-index
                        --pip-arg=--find-links=/srv/wheels on a box without internet access)
  --no-deps             install edge-agent itself only, not its dependencies (they must come
                        from elsewhere, e.g. --system-site-packages); prints what they would be
  --no-enable           do not enable the unit
  --no-start            do not start (or restart) the service
  --root DIR            install into the root file system at DIR (an image being built): every
                        path is under DIR, the user is added to DIR/etc/passwd and DIR/etc/group
                        (which must exist), the unit is enabled there and nothing is started
  --uninstall           stop and remove the service, the venv, the command and the user;
                        /etc/edge-agent (handed back to root) and /var/lib/edge-agent are kept
  --purge               with --uninstall: also remove /etc/edge-agent, /var/lib/edge-agent and
                        the unit's drop-ins
USAGE
}

die() { echo "install.sh: error: $*" >&2; exit 1; }
warn() { echo "    WARNING: $*" >&2; }
say() { echo "    $*"; }
STEP=0
STEPS=0
step() { STEP=$((STEP + 1)); echo "[$STEP/$STEPS] $*"; }

ROOT=""
ROOT_GIVEN=0
UNINSTALL=0
PURGE=0
WITH=()
FROM=""
PYTHON=""
SYSTEM_SITE=0
CONSTRAINTS=""
PIP_ARGS=()
NO_DEPS=0
ENABLE=1
START=1
GPU_WHEEL=""
EDITABLE=0

while [ $# -gt 0 ]; do
    arg=$1
    value=""
    has_value=0
    case $arg in
        --*=*) value=${arg#*=}; arg=${arg%%=*}; has_value=1 ;;
    esac
    case $arg in
        --root | --with | --from | --python | --constraints | --pip-arg | --gpu-wheel)
            if [ $has_value -eq 0 ]; then
                [ $# -ge 2 ] || die "$arg needs a value (--help)"
                value=$2
                shift
            fi
            ;;
        *) [ $has_value -eq 0 ] || die "$arg takes no value" ;;
    esac
    shift
    case $arg in
        --root) ROOT=$value; ROOT_GIVEN=1 ;;
        --with)
            case $value in
                openvino | tflite | tflite-legacy | gpu | web) WITH+=("$value") ;;
                *) die "--with $value: one of openvino, tflite, tflite-legacy, gpu, web" ;;
            esac
            ;;
        --from) FROM=$value ;;
        --python) PYTHON=$value ;;
        --constraints) CONSTRAINTS=$value ;;
        --pip-arg) PIP_ARGS+=("$value") ;;
        --gpu-wheel) GPU_WHEEL=$value ;;
        --system-site-packages) SYSTEM_SITE=1 ;;
        --no-deps) NO_DEPS=1 ;;
        --no-enable) ENABLE=0 ;;
        --no-start) START=0 ;;
        --editable-config) EDITABLE=1 ;;
        --uninstall) UNINSTALL=1 ;;
        --purge) PURGE=1 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option $arg (--help)" ;;
    esac
done

[ "$(id -u)" -eq 0 ] || die "run as root (sudo $0 ...): it creates a system user and writes /etc, /opt and /var/lib"
[ $PURGE -eq 0 ] || [ $UNINSTALL -eq 1 ] || die "--purge goes with --uninstall"
if [ $ROOT_GIVEN -eq 1 ]; then
    [ -d "$ROOT" ] || die "--root $ROOT: no such directory"
    ROOT="$(cd "$ROOT" && pwd -P)"
    [ "$ROOT" != / ] || ROOT=""
fi
has() { local x; for x in "${WITH[@]+"${WITH[@]}"}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
[ -z "$GPU_WHEEL" ] || has gpu || die "--gpu-wheel goes with --with gpu"
# The zone editor that writes the config is part of the web page: its stack comes with it.
[ $EDITABLE -eq 0 ] || has web || WITH+=(web)

# Everything this script touches is a path on the target: $ROOT/path.
r() { printf '%s%s' "$ROOT" "$1"; }
# Commands that change the user database work on the target's files (shadow's --prefix: no chroot,
# so DIR needs only etc/passwd and etc/group, not a whole system).
PREFIX_ARGS=()
[ -z "$ROOT" ] || PREFIX_ARGS=(--prefix "$ROOT")
SYSTEMD_RUNNING=0
[ -z "$ROOT" ] && [ -d /run/systemd/system ] && SYSTEMD_RUNNING=1

if [ -n "$ROOT" ]; then
    [ -f "$ROOT/etc/passwd" ] && [ -f "$ROOT/etc/group" ] ||
        die "--root $ROOT: no $ROOT/etc/passwd or $ROOT/etc/group; the target's user database is needed to add the edge-agent user to it (a debootstrap tree or a mounted image has them)"
fi

passwd_entry() {  # name:x:uid:gid:gecos:home:shell of a user on the target, or nothing
    if [ -n "$ROOT" ]; then
        awk -F: -v u="$1" '$1 == u' "$ROOT/etc/passwd"
    else
        getent passwd "$1" || true
    fi
}
group_entry() {  # name:x:gid:members of a group on the target, or nothing
    if [ -n "$ROOT" ]; then
        awk -F: -v g="$1" '$1 == g' "$ROOT/etc/group"
    else
        getent group "$1" || true
    fi
}
in_group() {  # user, group entry
    local members
    members=$(printf '%s' "$2" | cut -d: -f4)
    [[ ",$members," == *",$1,"* ]]
}

# --- uninstall ------------------------------------------------------------------------------

uninstall() {
    STEPS=5
    echo "edge-agent uninstall${ROOT:+ from root $ROOT}"
    # Its ids, for the config step: they are gone from the user database by then.
    local old_ids
    old_ids=$(passwd_entry "$SERVICE_USER" | cut -d: -f3,4)
    step "service"
    if [ $SYSTEMD_RUNNING -eq 1 ] && systemctl cat edge-agent.service >/dev/null 2>&1; then
        systemctl disable --now edge-agent.service 2>&1 | sed 's/^/    /' || true
        say "stopped and disabled edge-agent.service"
    fi
    local link found=0
    for link in "$(r "$UNIT_DIR")"/*.wants/edge-agent.service; do
        [ -L "$link" ] || continue
        rm -f "$link"
        found=1
        say "removed ${link#"$ROOT"}"
    done
    if [ -f "$(r "$UNIT")" ]; then
        rm -f "$(r "$UNIT")"
        say "removed $UNIT"
    elif [ $found -eq 0 ]; then
        say "no unit installed"
    fi
    local dropin
    for dropin in "$JETSON_DROPIN" "$EDITABLE_DROPIN"; do
        if [ -f "$(r "$dropin")" ]; then
            rm -f "$(r "$dropin")"
            say "removed $dropin"
        fi
    done
    if [ -d "$(r "$DROPIN_DIR")" ]; then
        if [ $PURGE -eq 1 ]; then
            rm -rf "$(r "$DROPIN_DIR")"
            say "removed $DROPIN_DIR (--purge)"
        elif rmdir "$(r "$DROPIN_DIR")" 2>/dev/null; then
            say "removed $DROPIN_DIR (empty)"
        else
            say "kept $DROPIN_DIR: your drop-ins (--purge removes them)"
        fi
    fi
    [ $SYSTEMD_RUNNING -eq 0 ] || systemctl daemon-reload

    step "venv and command"
    if [ -L "$(r "$CMD_LINK")" ] && [ "$(readlink "$(r "$CMD_LINK")")" = "$VENV/bin/edge-agent" ]; then
        rm -f "$(r "$CMD_LINK")"
        say "removed $CMD_LINK"
    fi
    if [ -e "$(r "$OPT_DIR")" ]; then
        rm -rf "$(r "$OPT_DIR")"
        say "removed $OPT_DIR"
    else
        say "no $OPT_DIR"
    fi

    step "user $SERVICE_USER"
    local entry gid
    entry=$(passwd_entry "$SERVICE_USER")
    if [ -n "$entry" ]; then
        gid=$(printf '%s' "$entry" | cut -d: -f4)
        userdel "${PREFIX_ARGS[@]+"${PREFIX_ARGS[@]}"}" "$SERVICE_USER"
        say "removed user $SERVICE_USER"
        # userdel removes the user's own group only where login.defs says USERGROUPS_ENAB yes.
        entry=$(group_entry "$SERVICE_USER")
        if [ -n "$entry" ] && [ "$(printf '%s' "$entry" | cut -d: -f3)" = "$gid" ] &&
            [ -z "$(printf '%s' "$entry" | cut -d: -f4)" ]; then
            groupdel "${PREFIX_ARGS[@]+"${PREFIX_ARGS[@]}"}" "$SERVICE_USER"
            say "removed group $SERVICE_USER"
        fi
    else
        say "no user $SERVICE_USER"
    fi

    step "config $CONF_DIR"
    if [ $PURGE -eq 1 ]; then
        rm -rf "$(r "$CONF_DIR")"
        say "removed $CONF_DIR (--purge)"
    elif [ -e "$(r "$CONF_DIR")" ]; then
        # What belonged to the removed user is root's now: a user made later with the same uid or
        # gid must not get to read or replace the config (--editable-config made both its own).
        local path ids
        for path in "$CONF_DIR" "$CONF"; do
            [ -e "$(r "$path")" ] && [ ! -L "$(r "$path")" ] && [ -n "$old_ids" ] || continue
            ids=$(stat -c %u:%g "$(r "$path")")
            if [ "${ids%%:*}" = "${old_ids%%:*}" ] || [ "${ids##*:}" = "${old_ids##*:}" ]; then
                chown 0:0 "$(r "$path")"
                if [ "$path" = "$CONF_DIR" ]; then chmod 00755 "$(r "$path")"; else chmod go-rwx "$(r "$path")"; fi
                say "$path: owner set to root:root (it was $SERVICE_USER's)"
            fi
        done
        say "kept $CONF_DIR (--purge removes it)"
    fi

    step "state $STATE_DIR"
    if [ $PURGE -eq 1 ]; then
        rm -rf "$(r "$STATE_DIR")"
        say "removed $STATE_DIR: models, outbox, status (--purge)"
    elif [ -e "$(r "$STATE_DIR")" ]; then
        say "kept $STATE_DIR: models, undelivered results (--purge removes it)"
    fi
    echo "edge-agent uninstalled"
}

if [ $UNINSTALL -eq 1 ]; then
    [ ${#WITH[@]} -eq 0 ] && [ -z "$FROM" ] || die "--uninstall takes no --with, --editable-config or --from"
    uninstall
    exit 0
fi

# --- install --------------------------------------------------------------------------------

STEPS=8
echo "edge-agent install${ROOT:+ into root $ROOT}"

step "checks"
# The venv links to the Python it is made from, and the service runs as edge-agent with
# ProtectHome=yes: a Python under /root or /home (pyenv, conda, a user's build) cannot be run by
# it, and neither can one in a directory other users cannot enter.
if [ -z "$PYTHON" ]; then
    if [ -x /usr/bin/python3 ]; then
        PYTHON=/usr/bin/python3
    else
        PYTHON=$(command -v python3 || true)
        [ -n "$PYTHON" ] || die "no python3 found: apt-get install python3 python3-venv (or give --python)"
    fi
fi
case $PYTHON in
    */*) ;;
    *) PYTHON=$(command -v "$PYTHON" || true); [ -n "$PYTHON" ] || die "--python: not found" ;;
esac
[ -x "$PYTHON" ] || die "--python $PYTHON: not an executable"
py_info=$("$PYTHON" - <<'PY'
import os, sys
base = getattr(sys, "_base_executable", sys.executable)
print(os.path.dirname(base))
print(os.path.realpath(base))
print(sys.base_prefix)
print("%d.%d" % sys.version_info[:2])
print(int(sys.version_info >= (3, 10)))
try:
    import venv, ensurepip  # noqa: F401
    print(1)
except ImportError:
    print(0)
PY
) || die "--python $PYTHON does not run"
{
    read -r PY_HOME
    read -r PY_REAL
    read -r PY_BASE_PREFIX
    read -r PY_VERSION
    read -r PY_OK_VERSION
    read -r PY_HAS_VENV
} <<<"$py_info"
[ "$PY_OK_VERSION" = 1 ] || die "$PYTHON is Python $PY_VERSION; edge-agent needs 3.10 or newer"
for p in "$(readlink -f "$PYTHON")" "$PY_REAL" "$PY_BASE_PREFIX"; do
    case $p/ in
        /root/* | /home/* | /run/user/*)
            die "$PYTHON is (or is based on) $p, under a home directory: the service user $SERVICE_USER cannot run it (home directories are private, and the unit sets ProtectHome=yes, which hides /root, /home and /run/user). Use a system Python: --python /usr/bin/python3 (apt-get install python3 python3-venv), or install that Python under /opt or /usr/local"
            ;;
    esac
done
others_can() {  # path, bits (x or rx): may users other than the owner use it?
    local path=$1 need=$2 mode
    mode=$(stat -L -c %a "$path") || return 1
    mode=$((8#$mode))
    [ $((mode & 1)) -eq 1 ] || return 1
    [ "$need" != rx ] || [ $((mode & 4)) -eq 4 ]
}
check_reachable() {  # every directory above $1 must be enterable by others, $1 itself $2
    local path=$1 dir
    others_can "$path" "$2" || die "$path (of $PYTHON) is not readable/executable by other users (mode $(stat -L -c %a "$path")): the service user $SERVICE_USER could not run the venv; use another --python or chmod o+${2} it"
    dir=$(dirname "$path")
    while [ "$dir" != / ]; do
        others_can "$dir" x || die "$dir (above $PYTHON) cannot be entered by other users (mode $(stat -L -c %a "$dir")): the service user $SERVICE_USER could not run the venv; use another --python (e.g. /usr/bin/python3)"
        dir=$(dirname "$dir")
    done
}
check_reachable "$PY_REAL" x
check_reachable "$PY_BASE_PREFIX/lib/python$PY_VERSION" rx
[ "$PY_HAS_VENV" = 1 ] || die "$PYTHON cannot make a venv: apt-get install python3-venv"
say "python: $PYTHON (Python $PY_VERSION, $PY_REAL), usable by the service user"
if [ -n "$ROOT" ] && [ ! -e "$ROOT$PY_HOME" ]; then
    warn "the venv will use $PY_HOME/$(basename "$PYTHON") (Python $PY_VERSION) at the same path in the target; $ROOT$PY_HOME does not exist yet: the target needs that Python there"
fi

SOURCE_KIND=""
[ -n "$FROM" ] || FROM=$CHECKOUT
if [ -d "$FROM" ]; then
    FROM="$(cd "$FROM" && pwd -P)"
    [ -f "$FROM/pyproject.toml" ] && grep -q '^name = "edge-agent"' "$FROM/pyproject.toml" ||
        die "--from $FROM: not an edge-agent checkout (no pyproject.toml naming edge-agent)"
    SOURCE_KIND=checkout
elif [ -f "$FROM" ]; then
    case $(basename "$FROM") in
        edge_agent-*.whl) SOURCE_KIND=wheel; FROM="$(cd "$(dirname "$FROM")" && pwd -P)/$(basename "$FROM")" ;;
        *) die "--from $FROM: not an edge_agent-*.whl wheel" ;;
    esac
else
    die "--from $FROM: no such file or directory"
fi
say "agent: from the $SOURCE_KIND $FROM"
[ -f "$CHECKOUT/systemd/edge-agent.service" ] && [ -f "$CHECKOUT/configs/agent.example.yaml" ] ||
    die "$CHECKOUT is missing systemd/edge-agent.service or configs/agent.example.yaml"
[ -z "$CONSTRAINTS" ] || [ -f "$CONSTRAINTS" ] || die "--constraints $CONSTRAINTS: no such file"
[ -z "$CONSTRAINTS" ] || CONSTRAINTS="$(cd "$(dirname "$CONSTRAINTS")" && pwd -P)/$(basename "$CONSTRAINTS")"
JETSON=0
[ ! -f "$(r /etc/nv_tegra_release)" ] || JETSON=1
[ $JETSON -eq 0 ] || say "box: NVIDIA Jetson ($(r /etc/nv_tegra_release) exists)"

step "user $SERVICE_USER"
NOLOGIN=/usr/sbin/nologin
[ -x "$(r /usr/sbin/nologin)" ] || [ ! -x "$(r /sbin/nologin)" ] || NOLOGIN=/sbin/nologin
entry=$(passwd_entry "$SERVICE_USER")
if [ -z "$entry" ]; then
    group_args=(--user-group)
    # A group left from an earlier install (userdel keeps it where USERGROUPS_ENAB is off).
    old_group=$(group_entry "$SERVICE_USER")
    [ -z "$old_group" ] || group_args=(--gid "$(echo "$old_group" | cut -d: -f3)")
    useradd "${PREFIX_ARGS[@]+"${PREFIX_ARGS[@]}"}" --system "${group_args[@]}" --home-dir "$STATE_DIR" \
        --no-create-home --shell "$NOLOGIN" --comment "edge-agent daemon" "$SERVICE_USER"
    entry=$(passwd_entry "$SERVICE_USER")
    [ -n "$entry" ] || die "useradd did not create $SERVICE_USER"
    say "created system user $SERVICE_USER (uid $(echo "$entry" | cut -d: -f3)), home $STATE_DIR, shell $NOLOGIN"
else
    home=$(echo "$entry" | cut -d: -f6)
    shell=$(echo "$entry" | cut -d: -f7)
    if [ "$home" != "$STATE_DIR" ] || [ "$shell" != "$NOLOGIN" ]; then
        usermod "${PREFIX_ARGS[@]+"${PREFIX_ARGS[@]}"}" --home "$STATE_DIR" --shell "$NOLOGIN" "$SERVICE_USER"
        say "user $SERVICE_USER: home $home -> $STATE_DIR, shell $shell -> $NOLOGIN"
        entry=$(passwd_entry "$SERVICE_USER")
    fi
    say "user $SERVICE_USER exists (uid $(echo "$entry" | cut -d: -f3))"
fi
SERVICE_UID=$(echo "$entry" | cut -d: -f3)
SERVICE_GID=$(echo "$entry" | cut -d: -f4)
# The user is made a member of the device groups this box has, instead of the unit naming them in
# SupplementaryGroups=: a unit that names a missing group fails to start (216/GROUP), while systemd
# gives the service every group the user is in. `sudo -u edge-agent edge-agent source ...` then has
# the same access as the service. Groups that appear later (a driver installed): run this again.
added=()
already=()
missing=()
for g in "${DEVICE_GROUPS[@]}"; do
    gentry=$(group_entry "$g")
    if [ -z "$gentry" ]; then
        missing+=("$g")
    elif in_group "$SERVICE_USER" "$gentry"; then
        already+=("$g")
    else
        usermod "${PREFIX_ARGS[@]+"${PREFIX_ARGS[@]}"}" --append --groups "$g" "$SERVICE_USER"
        added+=("$g")
    fi
done
[ ${#added[@]} -eq 0 ] || say "added to groups: ${added[*]}"
[ ${#already[@]} -eq 0 ] || say "already in groups: ${already[*]}"
[ ${#missing[@]} -eq 0 ] || say "groups not on this box (skipped): ${missing[*]}"
if has openvino && [[ " ${missing[*]} " == *" render "* ]]; then
    warn "no render group: the Intel NPU (/dev/accel/accel0) and GPU render nodes belong to it once their drivers are installed; run this script again then"
fi

step "venv $VENV"
VENV_DIR=$(r "$VENV")
VPY=$VENV_DIR/bin/python
if [ -e "$VENV_DIR" ]; then
    old_home=$(sed -n 's/^home *= *//p' "$VENV_DIR/pyvenv.cfg" 2>/dev/null || true)
    if [ "$old_home" != "$PY_HOME" ] || ! "$VPY" -c '' 2>/dev/null; then
        say "the existing venv was made from ${old_home:-an unknown Python} (not $PY_HOME) or does not run: making it again"
        rm -rf "$VENV_DIR"
    fi
fi
if [ ! -e "$VENV_DIR" ]; then
    mkdir -p "$(dirname "$VENV_DIR")"
    venv_args=()
    [ $SYSTEM_SITE -eq 0 ] || venv_args=(--system-site-packages)
    "$PYTHON" -m venv "${venv_args[@]+"${venv_args[@]}"}" "$VENV_DIR"
    # Into another root: pip's own files were compiled with this machine's path ($ROOT/opt/...).
    [ -z "$ROOT" ] || "$VENV_DIR/bin/python" -m compileall -q -f -j 0 -s "$ROOT" -p / "$VENV_DIR/lib" >/dev/null || true
    say "created with $PYTHON${venv_args[*]:+ (${venv_args[*]})}"
else
    want=false
    [ $SYSTEM_SITE -eq 0 ] || want=true
    if ! grep -qx "include-system-site-packages = $want" "$VENV_DIR/pyvenv.cfg"; then
        sed -i "s/^include-system-site-packages = .*/include-system-site-packages = $want/" "$VENV_DIR/pyvenv.cfg"
        say "include-system-site-packages set to $want"
    fi
    say "exists (made from $PY_HOME)"
fi
chmod 0755 "$(r "$OPT_DIR")" "$VENV_DIR"

pip_install() {
    "$VPY" -m pip --disable-pip-version-check install -q "$@" "${PIP_ARGS[@]+"${PIP_ARGS[@]}"}"
}
COMPILE_ARGS=()
# Into another root, pip would write this machine's paths ($ROOT/opt/...) into the compiled files:
# they are compiled below with the target's paths instead.
[ -z "$ROOT" ] || COMPILE_ARGS=(--no-compile)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ "$SOURCE_KIND" = checkout ]; then
    # Built from a copy, so that the build leaves nothing (build/, *.egg-info, root-owned) in the
    # checkout. What the wheel holds: pyproject.toml's [tool.setuptools.packages.find] and readme.
    mkdir "$WORK/src" "$WORK/wheel"
    (cd "$FROM" && tar --exclude=__pycache__ -cf - pyproject.toml README.md agent providers) | tar -C "$WORK/src" -xf -
    "$VPY" -m pip --disable-pip-version-check wheel -q --no-deps -w "$WORK/wheel" "$WORK/src" \
        "${PIP_ARGS[@]+"${PIP_ARGS[@]}"}"
    WHEEL=$(ls "$WORK"/wheel/edge_agent-*.whl)
    say "built $(basename "$WHEEL")"
else
    WHEEL=$FROM
fi
# The agent itself, always replaced (a checkout's code changes without a new version number) ...
pip_install --no-deps --force-reinstall "${COMPILE_ARGS[@]+"${COMPILE_ARGS[@]}"}" "$WHEEL"
say "installed $(basename "$WHEEL")"
# ... then its dependencies, with the extras asked for. onnxruntime and onnxruntime-gpu are the same
# package built twice (both install the module `onnxruntime`): only one of them may be installed.
extras=()
has tflite && extras+=(tflite)
has tflite-legacy && extras+=(tflite-legacy)
has web && extras+=(web)
# -I: the installed agent's metadata, never an edge_agent.egg-info in the directory this runs from.
mapfile -t REQS < <("$VPY" -I - "${extras[@]+"${extras[@]}"}" <<'PY'
import sys
from importlib.metadata import distribution

try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

extras = sys.argv[1:]
for text in distribution("edge-agent").requires or []:
    req = Requirement(text)
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ["", *extras]):
        continue
    name = req.name + ("[" + ",".join(sorted(req.extras)) + "]" if req.extras else "")
    print(name + str(req.specifier))
PY
)
deps=()
runtime=""
for req in "${REQS[@]}"; do
    case $req in
        onnxruntime | onnxruntime[\<\>=!~]*) runtime=$req ;;
        *) deps+=("$req") ;;
    esac
done
[ -n "$runtime" ] || die "edge-agent's requirements name no onnxruntime: ${REQS[*]}"
other=onnxruntime-gpu
if has gpu; then
    runtime=${GPU_WHEEL:-onnxruntime-gpu}
    other=onnxruntime
fi
[ ${#extras[@]} -eq 0 ] || say "extras: ${extras[*]}"
if has openvino; then
    say "openvino: part of every install (an edge-agent dependency); the NPU needs Intel's NPU driver, the GPU Intel's compute runtime (docs/install.md)"
fi
constraint_args=()
[ -z "$CONSTRAINTS" ] || constraint_args=(-c "$CONSTRAINTS")
if [ $NO_DEPS -eq 1 ]; then
    say "dependencies not installed (--no-deps); they would be: ${deps[*]} $runtime"
else
    if "$VPY" -c 'import importlib.metadata as m, sys; m.distribution(sys.argv[1])' "$other" 2>/dev/null; then
        "$VPY" -m pip --disable-pip-version-check uninstall -q -y "$other"
        say "removed $other (it cannot be installed beside $runtime)"
        # Its removal took files the two share: put the runtime back whole.
        pip_install --no-deps --force-reinstall "${COMPILE_ARGS[@]+"${COMPILE_ARGS[@]}"}" \
            "${constraint_args[@]+"${constraint_args[@]}"}" "$runtime"
    fi
    pip_install "${COMPILE_ARGS[@]+"${COMPILE_ARGS[@]}"}" "${constraint_args[@]+"${constraint_args[@]}"}" \
        "${deps[@]}" "$runtime"
    say "dependencies installed: ${deps[*]} $runtime${CONSTRAINTS:+ (constraints $CONSTRAINTS)}"
fi
if [ -n "$ROOT" ]; then
    # A venv holds its own path in its scripts' #! lines and activate scripts: make them the
    # target's, then compile with the target's paths (the service user cannot write .pyc files).
    "$VPY" - "$VENV_DIR" "$VENV" <<'PY'
import os, sys
here, there = sys.argv[1].encode(), sys.argv[2].encode()
paths = [os.path.join(sys.argv[1], "pyvenv.cfg")]
bindir = os.path.join(sys.argv[1], "bin")
paths += [os.path.join(bindir, n) for n in os.listdir(bindir)]
for path in paths:
    if os.path.islink(path) or not os.path.isfile(path):
        continue
    with open(path, "rb") as f:
        data = f.read()
    if here in data and b"\0" not in data[:4096]:
        with open(path, "wb") as f:
            f.write(data.replace(here, there))
PY
    # (Files that do not compile, such as test data some packages ship, are left as they are.)
    "$VPY" -m compileall -q -j 0 -s "$ROOT" -p / "$VENV_DIR/lib" >/dev/null || true
    say "paths in the venv's scripts and compiled files made the target's ($VENV)"
fi

if [ -z "$ROOT" ] && command -v runuser >/dev/null 2>&1; then
    # The proof of the checks above: the service user runs the venv's Python and finds the agent.
    if ! (cd / && runuser -u "$SERVICE_USER" -- "$VPY" -c 'import agent') 2>"$WORK/runuser.err"; then
        die "$SERVICE_USER cannot run $VENV/bin/python: $(tr '\n' ' ' <"$WORK/runuser.err")"
    fi
    say "runs as $SERVICE_USER"
fi

step "command $CMD_LINK"
link=$(r "$CMD_LINK")
if [ -L "$link" ] && [ "$(readlink "$link")" = "$VENV/bin/edge-agent" ]; then
    say "exists"
elif [ -e "$link" ] || [ -L "$link" ]; then
    warn "$CMD_LINK exists and is not a link to $VENV/bin/edge-agent: left alone"
else
    mkdir -p "$(dirname "$link")"
    ln -s "$VENV/bin/edge-agent" "$link"
    say "linked to $VENV/bin/edge-agent"
fi

step "config $CONF"
# The agent reads the config as edge-agent; it may hold passwords: root:edge-agent 0640 in a
# root:root 0755 folder. --editable-config: the agent may replace it (the zone editor's save: a temp
# file in the folder renamed over the file, keeping the owner and mode it finds, which only the
# file's owner can), so the file is edge-agent's and the folder's group edge-agent may write it
# (setgid: files root makes there get that group too); still no access for others.
conf_dir=$(r "$CONF_DIR")
conf=$(r "$CONF")
if [ $EDITABLE -eq 1 ]; then
    dir_want="0:$SERVICE_GID:2770" conf_owner=$SERVICE_UID conf_said="$SERVICE_USER:$SERVICE_USER"
    [ ! -L "$conf" ] || die "--editable-config: $CONF is a symbolic link; the editor would replace the link by a file: make it the file itself"
else
    dir_want="0:0:755" conf_owner=0 conf_said="root:$SERVICE_USER"
fi
if [ ! -d "$conf_dir" ]; then
    install -d -m 0755 -o 0 -g 0 "$conf_dir"
fi
if [ "$(stat -c %u:%g:%a "$conf_dir")" != "$dir_want" ]; then
    chown "${dir_want%:*}" "$conf_dir"
    chmod "00${dir_want##*:}" "$conf_dir"  # 00: else chmod keeps a folder's setgid bit
    if [ $EDITABLE -eq 1 ]; then
        say "$CONF_DIR: root:$SERVICE_USER 2770 (--editable-config: the agent may write in it)"
    else
        say "$CONF_DIR: root:root 0755 (without --editable-config the agent only reads it)"
    fi
fi
if [ -e "$conf" ]; then
    say "kept (exists; its content is not touched)"
else
    install -m 0640 -o "$conf_owner" -g "$SERVICE_GID" "$CHECKOUT/configs/agent.example.yaml" "$conf"
    say "installed the example (configs/agent.example.yaml): edit device.id, mqtt and the pipelines"
fi
if [ "$(stat -c %u:%g:%a "$conf")" != "$conf_owner:$SERVICE_GID:640" ]; then
    chown "$conf_owner:$SERVICE_GID" "$conf"
    chmod 0640 "$conf"
    say "owner and mode set to $conf_said 0640"
fi
# ProtectHome=yes and PrivateTmp=yes: the agent does not see /home, /root, /run/user or this
# machine's /tmp. A config naming files there would fail only once the service runs.
hidden=$(grep -nE "^[^#]*([[:space:]\"'=:,[{]|^|file://)/(home|root|run/user|tmp|var/tmp)/" "$conf" || true)
if [ -n "$hidden" ]; then
    warn "$CONF names paths the service cannot see (ProtectHome=yes hides /home, /root and /run/user; PrivateTmp=yes gives it its own /tmp and /var/tmp):"
    while IFS= read -r line; do warn "  line $line"; done <<<"$hidden"
    warn "move those files (e.g. under /srv or $STATE_DIR), or add a drop-in: docs/install.md, \"Files under /home or /tmp\""
fi
if [ $NO_DEPS -eq 0 ]; then
    if out=$("$VPY" "$VENV_DIR/bin/edge-agent" config validate "$conf" 2>&1); then
        say "$out"
    else
        warn "edge-agent config validate says:"
        while IFS= read -r line; do warn "  $line"; done <<<"$out"
        warn "the service will not start with it: fix it, then systemctl restart edge-agent"
    fi
fi

step "state $STATE_DIR"
state=$(r "$STATE_DIR")
if [ -d "$state" ]; then
    if [ "$(stat -c %u:%g "$state")" != "$SERVICE_UID:$SERVICE_GID" ]; then
        # e.g. kept by --uninstall, and the user made again with another uid
        chown -R "$SERVICE_UID:$SERVICE_GID" "$state"
        say "owner set to $SERVICE_USER (in it too)"
    fi
    if [ "$(stat -c %a "$state")" != 700 ]; then
        chmod 0700 "$state"
        say "mode set to 0700"
    fi
    say "exists (kept: models, outbox, status)"
else
    install -d -m 0700 -o "$SERVICE_UID" -g "$SERVICE_GID" "$state"
    say "created, $SERVICE_USER only (0700)"
fi

step "unit $UNIT"
install_file() {  # source, target path, what: copies when different, says what it did
    local target
    target=$(r "$2")
    if [ -f "$target" ] && cmp -s "$1" "$target"; then
        say "$3 $2: unchanged"
    else
        local verb=installed
        [ ! -f "$target" ] || verb=updated
        install -D -m 0644 -o 0 -g 0 "$1" "$target"
        say "$3 $2: $verb"
    fi
}
install_file "$CHECKOUT/systemd/edge-agent.service" "$UNIT" unit
if [ $JETSON -eq 1 ]; then
    cat >"$WORK/jetson.conf" <<'EOF'
# Written by edge-agent's scripts/install.sh on a Jetson (/etc/nv_tegra_release); it is replaced
# when the script runs again, and removed by --uninstall. Your own changes: another drop-in.
[Service]
# CUDA and TensorRT on a Jetson open /dev/nvmap, /dev/nvhost-*, /dev/nvgpu/* (misc devices and
# driver groups that differ between JetPack releases): no device allow list here.
DeviceAllow=
DevicePolicy=auto
# Older systemd (JetPack 6's Ubuntu 22.04 has 249) turns ProtectClock=yes alone into an allow list
# of /dev/rtc* that blocks every other device (fixed upstream in late 2022).
ProtectClock=no
# CSI cameras (nvarguscamerasrc) reach nvargus-daemon through the socket /tmp/argus_socket.
PrivateTmp=no
EOF
    install_file "$WORK/jetson.conf" "$JETSON_DROPIN" drop-in
fi
if [ $EDITABLE -eq 1 ]; then
    install_file "$CHECKOUT/systemd/edge-agent.service.d/editable-config.conf" "$EDITABLE_DROPIN" drop-in
elif [ -f "$(r "$EDITABLE_DROPIN")" ]; then
    # As every option here: what a run is not given it takes back (an earlier --editable-config).
    rm -f "$(r "$EDITABLE_DROPIN")"
    rmdir "$(r "$DROPIN_DIR")" 2>/dev/null || true
    say "drop-in $EDITABLE_DROPIN: removed (no --editable-config: the agent no longer writes its config)"
fi

step "systemd"
if [ -n "$ROOT" ]; then
    if [ $ENABLE -eq 1 ]; then
        if command -v systemctl >/dev/null 2>&1; then
            systemctl --root="$ROOT" enable edge-agent.service 2>&1 | sed 's/^/    /'
        else
            mkdir -p "$ROOT$UNIT_DIR/multi-user.target.wants"
            ln -sfn "$UNIT" "$ROOT$UNIT_DIR/multi-user.target.wants/edge-agent.service"
        fi
        say "enabled in $ROOT (it starts when that system boots)"
    else
        say "not enabled (--no-enable)"
    fi
    say "not started (--root)"
elif [ $SYSTEMD_RUNNING -eq 0 ]; then
    say "systemd is not running here: the unit is installed, not enabled or started"
    say "on the booted box: systemctl enable --now edge-agent"
else
    systemctl daemon-reload
    say "daemon-reload"
    if [ $ENABLE -eq 1 ]; then
        systemctl enable --quiet edge-agent.service
        say "enabled"
    fi
    if [ $START -eq 1 ]; then
        verb=started
        if systemctl is-active --quiet edge-agent.service; then
            verb=restarted
        fi
        # Type=notify: this waits for the agent's READY=1 (config loaded, outbox open).
        if systemctl restart edge-agent.service; then
            say "$verb: $(systemctl show -p StatusText --value edge-agent.service)"
        else
            warn "the service did not start; see: journalctl -u edge-agent -n 50"
            exit 1
        fi
    elif systemctl is-active --quiet edge-agent.service; then
        say "not restarted (--no-start): the running agent keeps its old code until systemctl restart edge-agent"
    else
        say "not started (--no-start)"
    fi
fi

echo "edge-agent installed. Next:"
echo "    edit $CONF, then: systemctl restart edge-agent"
echo "    systemctl status edge-agent; journalctl -u edge-agent -f"
echo "    edge-agent providers   # the hardware and backends it found"
