#!/usr/bin/python3
"""Serve a still image as a live H.264 RTSP stream on loopback, with GStreamer's RTSP server.

For tests and demos of camera reconnects: kill this process and the camera is gone; start it again
on the same port and it is back. Runs under Debian's own /usr/bin/python3 (python3-gi and
gir1.2-gst-rtsp-server-1.0 from apt; x264enc from gstreamer1.0-plugins-ugly), not in the venv.

    /usr/bin/python3 scripts/rtsp_server.py --port 8554 --image sign.png [--fps 10] [--user U --password P]
    -> rtsp://127.0.0.1:8554/stream

It prints "ready rtsp://..." on stdout once it listens.
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--image", required=True, help="a PNG shown as every frame")
    parser.add_argument("--fps", type=int, default=10)
    parser.add_argument("--mount", default="/stream")
    parser.add_argument("--user", help="require this user (HTTP Basic auth over RTSP), with --password")
    parser.add_argument("--password", default="")
    args = parser.parse_args()

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    location = args.image.replace("\\", "\\\\").replace('"', '\\"')
    factory.set_launch(
        f'( multifilesrc location="{location}" loop=true caps=image/png,framerate={args.fps}/1'
        " ! pngdec ! videoconvert ! video/x-raw,format=I420"
        f" ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={args.fps}"
        " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
    )
    factory.set_shared(True)
    if args.user:
        # Only this user may see and play the stream: others get 401 Unauthorized.
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string("media.factory.role", "viewer")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password), token)
        server.set_auth(auth)
        permissions = GstRtspServer.RTSPPermissions()
        permissions.add_role("viewer")
        permissions.add_permission_for_role("viewer", "media.factory.access", True)
        permissions.add_permission_for_role("viewer", "media.factory.construct", True)
        factory.set_permissions(permissions)
    server.get_mount_points().add_factory(args.mount, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1
    loop = GLib.MainLoop()
    signal.signal(signal.SIGTERM, lambda *_: loop.quit())
    print(f"ready rtsp://127.0.0.1:{args.port}{args.mount}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
