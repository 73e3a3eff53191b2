"""Commands on `<prefix>/<device>/cmd/<name>`: MQTT 5 request/response (docs/fleet.md, Commands).

A request is `{"id": ..., "args": {...}, "deadline": "<RFC 3339>"}`; the reply goes to the request's
response topic with its correlation data (MQTT 3.1.1: `<request topic>/reply`). Every request gets a
reply: malformed, unknown, expired, switched off (`fleet.commands`), over the rate limit or failed
ones an error with a code. `id` is the idempotency key: a request seen before gets its first reply
again and does not run twice. Commands run on a small pool of their own threads, never the MQTT
dispatcher's, so a slow benchmark does not hold up desired state; one past its deadline is answered
with an error and its late result dropped.

Model changes go through desired state, never through commands.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from agent.config import CommandsConfig
from agent.errors import EdgeAgentError
from agent.mqtt.message import Message
from agent.mqtt.router import Router

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16_384
DEFAULT_DEADLINE_S = 60.0  # a request without a deadline
MAX_RUNNING = 2  # commands running at once; more get "busy"
_REMEMBERED = 512  # idempotency keys (and their replies) kept
_REMEMBER_S = 600.0

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class CommandError(EdgeAgentError):
    """A command refused or failed, with the error code its reply carries."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class RecentLogs(logging.Handler):
    """The last lines the agent logged, for the `logs` command."""

    def __init__(self, capacity: int = 1000) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=capacity)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # a log line that cannot be formatted must not break logging
            self.handleError(record)

    def tail(self, count: int) -> list[str]:
        return list(self.lines)[-count:] if count > 0 else []


class CommandServer:
    def __init__(self, config: CommandsConfig, handlers: dict[str, Handler], max_reply_bytes: int) -> None:
        self.config = config
        self.handlers = handlers
        self.max_reply_bytes = max_reply_bytes
        self._router: Router | None = None
        self._own_prefix = ""  # replies go under the device's own topics (the broker's ACL allows no other)
        self._lock = threading.Lock()
        self._replies: collections.OrderedDict[str, tuple[float, dict[str, Any]]] = collections.OrderedDict()
        self._in_progress: set[str] = set()
        self._recent: collections.deque[float] = collections.deque()  # request times, last minute
        self._running = 0
        self.counts: collections.Counter[str] = collections.Counter()  # reply codes ("ok", errors)

    def start(self, router: Router, topic_filter: str) -> None:
        """Answer requests on `topic_filter` (`<prefix>/<device>/cmd/+`)."""
        self._router = router
        self._own_prefix = topic_filter.rsplit("/cmd/", 1)[0] + "/"
        router.route(topic_filter, self.on_request)

    # --- one request (the router's dispatcher thread) --------------------------------------------

    def on_request(self, message: Message) -> None:
        name = message.topic.rsplit("/", 1)[-1]
        request_id: str | None = None
        try:
            request = _parse(message.payload)
            request_id = request["id"]
            with self._lock:
                earlier = self._replies.get(request_id)
                if earlier is not None:
                    self._send(message, earlier[1])  # the same reply again: it does not run twice
                    return
                if request_id in self._in_progress:
                    return  # a retry while it runs: the reply comes when it is done
            self._admit(name, request)
        except CommandError as exc:
            self._answer(message, request_id, name, error=exc)
            return
        deadline = request["deadline"]
        with self._lock:
            self._in_progress.add(request_id)
            self._running += 1
        done = threading.Event()
        timer = threading.Timer(
            max(0.0, deadline - time.time()),
            self._past_deadline,
            args=(message, request_id, name, done),
        )
        timer.daemon = True
        timer.start()
        threading.Thread(
            target=self._run,
            args=(message, request_id, name, request["args"], done, timer),
            name=f"cmd-{name}",
            daemon=True,
        ).start()

    def _admit(self, name: str, request: dict[str, Any]) -> None:
        cfg = self.config
        if not cfg.enabled:
            raise CommandError(
                "disallowed", "commands are switched off on this device (fleet.commands.enabled)"
            )
        if name in cfg.deny or (cfg.allow is not None and name not in cfg.allow):
            raise CommandError(
                "disallowed", f"command {name!r} is not allowed on this device (fleet.commands)"
            )
        if name not in self.handlers:
            raise CommandError(
                "unknown-command", f"unknown command {name!r}; known: {', '.join(sorted(self.handlers))}"
            )
        if request["deadline"] <= time.time():
            raise CommandError("expired", "the request's deadline has passed")
        now = time.monotonic()
        with self._lock:
            while self._recent and now - self._recent[0] > 60:
                self._recent.popleft()
            if len(self._recent) >= cfg.max_per_minute:
                raise CommandError(
                    "busy", f"over {cfg.max_per_minute} requests a minute (fleet.commands.max_per_minute)"
                )
            if self._running >= MAX_RUNNING:
                raise CommandError("busy", f"{self._running} commands are running; try again shortly")
            self._recent.append(now)

    def _run(
        self,
        message: Message,
        request_id: str,
        name: str,
        args: dict[str, Any],
        done: threading.Event,
        timer: threading.Timer,
    ) -> None:
        try:
            result = self.handlers[name](args)
            error = None
        except CommandError as exc:
            result, error = None, exc
        except EdgeAgentError as exc:
            result, error = None, CommandError("failed", str(exc))
        except Exception as exc:  # a command's bug must not take the daemon down
            log.exception("command %s failed", name)
            result, error = None, CommandError("failed", f"{type(exc).__name__}: {exc}")
        finally:
            timer.cancel()
            with self._lock:
                self._running -= 1
        if done.is_set():
            return  # answered "expired" at its deadline already
        done.set()
        self._answer(message, request_id, name, result=result, error=error)

    def _past_deadline(self, message: Message, request_id: str, name: str, done: threading.Event) -> None:
        if done.is_set():
            return
        done.set()
        self._answer(
            message, request_id, name, error=CommandError("expired", "the deadline passed while it ran")
        )

    def _answer(
        self,
        message: Message,
        request_id: str | None,
        name: str,
        result: dict[str, Any] | None = None,
        error: CommandError | None = None,
    ) -> None:
        reply: dict[str, Any] = {"id": request_id, "ok": error is None}
        if error is None:
            reply["result"] = result
            if len(json.dumps(reply, default=str)) > self.max_reply_bytes:
                error = CommandError(
                    "failed", f"the reply is over {self.max_reply_bytes} bytes (mqtt.max_payload_bytes)"
                )
                reply = {"id": request_id, "ok": False}
        if error is not None:
            reply["error"] = {"code": error.code, "message": error.message}
            log.info("command %s (%s): %s: %s", name, request_id, error.code, error.message)
        with self._lock:
            self.counts["ok" if error is None else error.code] += 1
            if request_id is not None:
                self._in_progress.discard(request_id)
                self._replies[request_id] = (time.monotonic(), reply)
                self._forget_old()
        self._send(message, reply)

    def _forget_old(self) -> None:
        now = time.monotonic()
        while self._replies and (
            len(self._replies) > _REMEMBERED or now - next(iter(self._replies.values()))[0] > _REMEMBER_S
        ):
            self._replies.popitem(last=False)

    def _send(self, message: Message, reply: dict[str, Any]) -> None:
        if self._router is None:
            return
        if message.response_topic and not message.response_topic.startswith(self._own_prefix):
            # A device may write only under its own prefix (configs/mosquitto/acl): an answer sent
            # elsewhere would be dropped by the broker. The documented reply topic reaches the asker.
            log.warning(
                "command on %s asks for the reply on %s, outside %s; answering on %s/reply",
                message.topic,
                message.response_topic,
                self._own_prefix,
                message.topic,
            )
            message = dataclasses.replace(message, response_topic=None)
        self._router.reply(message, json.loads(json.dumps(reply, default=str)))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"replies": dict(self.counts), "running": self._running}


def _parse(payload: bytes) -> dict[str, Any]:
    """The request's id, args and deadline (epoch seconds); CommandError("malformed") saying why."""
    if len(payload) > MAX_REQUEST_BYTES:
        raise CommandError("malformed", f"the request is {len(payload)} bytes; at most {MAX_REQUEST_BYTES}")
    try:
        data = json.loads(payload) if payload else {}
    except (ValueError, RecursionError) as exc:
        raise CommandError("malformed", f"the request is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CommandError("malformed", "the request must be a JSON object")
    unknown = sorted(set(data) - {"id", "args", "deadline"})
    if unknown:
        raise CommandError("malformed", f"unknown key(s) {', '.join(unknown)} (allowed: id, args, deadline)")
    request_id = data.get("id")
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= 128:
        raise CommandError("malformed", '"id" must be a string of 1 to 128 characters (the idempotency key)')
    args = data.get("args", {})
    if not isinstance(args, dict):
        raise CommandError("malformed", '"args" must be an object')
    deadline_text = data.get("deadline")
    if deadline_text is None:
        deadline = time.time() + DEFAULT_DEADLINE_S
    else:
        try:
            if not isinstance(deadline_text, str):
                raise ValueError("not a string")
            stamp = datetime.fromisoformat(deadline_text.replace("Z", "+00:00"))
            if stamp.tzinfo is None:
                raise ValueError("no time zone")
            deadline = stamp.timestamp()
        except ValueError as exc:
            raise CommandError(
                "malformed", f'"deadline" must be an RFC 3339 time with a zone ({exc})'
            ) from None
    return {"id": request_id, "args": args, "deadline": deadline}
