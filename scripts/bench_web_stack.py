"""The web page's stack chosen by footprint: the import time, resident memory and idle CPU of a
minimal server.

Each stack runs in a fresh interpreter: it notes its resident memory (VmRSS) before the import,
imports the server, starts it on loopback on a thread of its own (as the daemon would), answers one
request, notes the memory again, then the CPU it uses over IDLE_S with no client. The median over
--runs is printed per stack, next to a bare interpreter that only starts a thread (the baseline).

    python scripts/bench_web_stack.py [--runs 5] [--path aiohttp=/tmp/aiohttp-site ...]

--path puts a directory first on sys.path for one stack (to measure stacks not installed in the
venv, e.g. `pip install --target DIR aiohttp`). Numbers: docs/web.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# One child program per stack; each prints {"import_s", "rss_before_kib", "rss_after_kib"}.
_PRELUDE = """
import json, socket, sys, threading, time, urllib.request
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])
def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]
def get(port):
    for _ in range(200):
        try:
            return urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=2).read()
        except OSError:
            time.sleep(0.02)
    raise SystemExit('the server never answered')
before = rss()
t0 = time.perf_counter()
"""

_STACKS = {
    "bare": """
import_s = time.perf_counter() - t0
threading.Thread(target=lambda: None).start()
""",
    "stdlib": """
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import_s = time.perf_counter() - t0
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()
        self.wfile.write(b'ok')
    def log_message(self, *a): pass
port = free_port()
server = ThreadingHTTPServer(('127.0.0.1', port), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
get(port)
""",
    "aiohttp": """
import asyncio
from aiohttp import web
import_s = time.perf_counter() - t0
async def hello(request):
    return web.Response(text='ok')
port = free_port()
def serve():
    async def main():
        app = web.Application(); app.router.add_get('/', hello)
        runner = web.AppRunner(app, access_log=None); await runner.setup()
        await web.TCPSite(runner, '127.0.0.1', port).start()
        await asyncio.Event().wait()
    asyncio.run(main())
threading.Thread(target=serve, daemon=True).start()
get(port)
""",
    "starlette+uvicorn": """
import asyncio
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
import_s = time.perf_counter() - t0
async def hello(request):
    return PlainTextResponse('ok')
port = free_port()
app = Starlette(routes=[Route('/', hello)])
server = uvicorn.Server(uvicorn.Config(app, host='127.0.0.1', port=port, log_level='warning',
                                       loop='asyncio', http='h11', lifespan='off'))
threading.Thread(target=server.run, daemon=True).start()
get(port)
""",
}

_EPILOGUE = """
after = rss()
c0 = time.process_time(); time.sleep(IDLE_S); idle = (time.process_time() - c0) / IDLE_S
print(json.dumps({'import_s': import_s, 'rss_before_kib': before, 'rss_after_kib': after,
                  'idle_cpu_ms_per_s': idle * 1000}))
"""
IDLE_S = 3.0  # how long each server is watched doing nothing


def measure(stack: str, path: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path:
        env["PYTHONPATH"] = path
    program = f"IDLE_S = {IDLE_S}\n" + _PRELUDE + _STACKS[stack] + _EPILOGUE
    out = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    data: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--path", action="append", default=[], help="STACK=DIR first on sys.path")
    args = parser.parse_args()
    paths = dict(item.split("=", 1) for item in args.path)
    heads = f"{'stack':<20} {'import ms':>10} {'RSS added MiB':>14} {'idle CPU ms/s':>14}"
    print(f"{heads}  (median of {args.runs} runs)")
    for stack in _STACKS:
        try:
            runs = [measure(stack, paths.get(stack)) for _ in range(args.runs)]
        except subprocess.CalledProcessError as exc:
            why = (exc.stderr or "").strip().splitlines()[-1:] or ["failed"]
            print(f"{stack:<20} {why[0]} (not installed? --path {stack}=DIR)")
            continue
        import_ms = statistics.median(r["import_s"] for r in runs) * 1000
        added = statistics.median(r["rss_after_kib"] - r["rss_before_kib"] for r in runs) / 1024
        idle = statistics.median(r["idle_cpu_ms_per_s"] for r in runs)
        print(f"{stack:<20} {import_ms:>10.1f} {added:>14.1f} {idle:>14.2f}")


if __name__ == "__main__":
    main()
