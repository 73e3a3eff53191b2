#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh on a fresh Debian/Ubuntu machine:
# system packages (when missing, as root), a venv in .venv, pinned Python packages.
# Idempotent and quick when nothing changed. Source it: `source scripts/setup.sh`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
PYTHON="${PYTHON:-python3}"

need_apt=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
# mosquitto_sub/pub: README's "Using it" shows the mosquitto_sub equivalent of `edge-agent watch`
# (tests/test_watch.py runs it).
command -v mosquitto_sub >/dev/null 2>&1 || need_apt+=(mosquitto-clients)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # TLS tests make their certificates
"$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv)
# scripts/install.sh makes its venv from the system's Python (tests/test_install.py): Debian's own.
/usr/bin/python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3 python3-venv)
command -v useradd >/dev/null 2>&1 || [ -x /usr/sbin/useradd ] || need_apt+=(passwd)  # install.sh: the service user
[ -x /bin/kill ] || need_apt+=(procps)  # the unit's ExecReload=/bin/kill (tests/test_install.py verifies it)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need_apt+=(iproute2)  # test_install.py: a network namespace
# The RTSP camera tests serve a stream with GStreamer's RTSP server, run by Debian's own python3.
/usr/bin/python3 -c "import gi; gi.require_version('GstRtspServer', '1.0')" >/dev/null 2>&1 ||
    need_apt+=(python3-gi gir1.2-gst-rtsp-server-1.0)
command -v espeak-ng >/dev/null 2>&1 || need_apt+=(espeak-ng)  # speech for the audio/VAD tests
# The sign clip's fonts (tests/sign_clip.py: DejaVu sans, serif and mono faces).
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf ] || need_apt+=(fonts-dejavu-core)
command -v arecord >/dev/null 2>&1 || need_apt+=(alsa-utils)  # live audio capture (alsa: sources)
command -v gst-launch-1.0 >/dev/null 2>&1 || need_apt+=(gstreamer1.0-tools)  # GStreamer camera pipelines
command -v ffmpeg >/dev/null 2>&1 || need_apt+=(ffmpeg)  # HTTP MJPEG camera tests serve with ffmpeg -listen
command -v docker-registry >/dev/null 2>&1 || need_apt+=(docker-registry)  # CNCF distribution, OCI tests
# The web pages' tests drive a real headless Chromium through Debian's chromedriver (tests/browser.py).
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
gst_plugins=/usr/lib/$(uname -m)-linux-gnu/gstreamer-1.0
[ -e "$gst_plugins/libgstx264.so" ] || need_apt+=(gstreamer1.0-plugins-ugly)        # x264enc
[ -e "$gst_plugins/libgstpng.so" ] || need_apt+=(gstreamer1.0-plugins-good)         # pngdec, rtph264pay
[ -e "$gst_plugins/libgstpnm.so" ] || need_apt+=(gstreamer1.0-plugins-bad)           # pnmenc
[ -e "$gst_plugins/libgstlibav.so" ] || need_apt+=(gstreamer1.0-libav)               # avdec_mpeg4 (.mp4 files)
[ -e "$gst_plugins/libgstvideoconvertscale.so" ] || [ -e "$gst_plugins/libgstvideoconvert.so" ] ||
    need_apt+=(gstreamer1.0-plugins-base)                                              # videoconvert
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${need_apt[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "setup: please install: ${need_apt[*]} (apt-get install ${need_apt[*]})" >&2
        exit 1
    fi
fi
# Debian starts mosquitto as a service on install; the tests and the demo run their own.
# docker-registry's service would listen on every interface (:5000): the tests start their own on
# loopback, so the packaged one is stopped where systemd runs.
if [[ " ${need_apt[*]} " == *" docker-registry "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

stamp="$VENV/.edge-agent-setup"
want="$(cat "$REPO/pyproject.toml" "$REPO/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: creating $VENV and installing pinned packages (constraints.txt)" >&2
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -c "$REPO/constraints.txt" -e "$REPO[tflite,dev]"
    # Real trained models for the demo and tests ship in this wheel. Its metadata asks for the
    # GUI build of OpenCV, which would clash with opencv-python-headless: take the files only.
    # RapidOCR()'s own needs (pyclipper, shapely) come with the dev extra above.
    "$VENV/bin/python" -m pip install -q -c "$REPO/constraints.txt" --no-deps rapidocr-onnxruntime
    # mediapipe 0.10.21 is the last wheel with .tflite models (face detection etc.); its metadata
    # pins numpy<2 and pulls in jax: take the model files only, it is never imported.
    "$VENV/bin/python" -m pip install -q -c "$REPO/constraints.txt" --no-deps mediapipe
    # nudenet's 320n.onnx is a trained YOLOv8n (faces among its 18 classes) for the detection tests;
    # AGPL-3.0, so it is a test input only. Its dependencies are installed already.
    "$VENV/bin/python" -m pip install -q -c "$REPO/constraints.txt" --no-deps nudenet
    # silero-vad's ONNX voice-activity models; its hard dependency is torch, which the ONNX files
    # do not need: take the files only (never imported).
    "$VENV/bin/python" -m pip install -q -c "$REPO/constraints.txt" --no-deps silero-vad
    # The reference ByteTrack our tracker is measured against (tests/test_tracking_metrics.py):
    # roboflow's trackers and supervision ask for the GUI build of OpenCV, matplotlib and PyAV, none
    # of which ByteTrackTracker's import path needs; take them and the two small packages it does.
    "$VENV/bin/python" -m pip install -q -c "$REPO/constraints.txt" --no-deps \
        trackers supervision pydeprecate defusedxml
    echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
