"""The page's logins: sessions, CSRF tokens and the login rate limit (docs/web.md, Security).

All in memory, on the web thread only (the server's event loop): a restart logs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agent.config.web import WebUser
from agent.web.passwords import dummy_hash, verify_password

COOKIE = "edge_agent_session"
MAX_SESSIONS = 256  # past it the oldest session ends: a flood of logins cannot grow memory
# The login rate limit, per client address and per user name: this many failures in a row are
# free, then each further attempt waits twice as long as the last (capped), refused until then.
FREE_FAILURES = 5
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 300.0
MAX_TRACKED = 4096  # keys the limiter remembers; the least recently failed are forgotten first


@dataclass
class Session:
    id: str
    user: str | None  # None: a loopback page without users (no login needed)
    csrf: str
    expires: float


class Sessions:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def new(self, user: str | None) -> Session:
        session = Session(
            secrets.token_urlsafe(32), user, secrets.token_urlsafe(32), self._clock() + self.ttl_s
        )
        self._by_id[session.id] = session
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id; an expired one is dropped."""
        session = self._by_id.get(session_id or "")
        if session is None:
            return None
        if session.expires <= self._clock():
            del self._by_id[session.id]
            return None
        return session

    def end(self, session_id: str | None) -> None:
        self._by_id.pop(session_id or "", None)


def csrf_ok(session: Session | None, sent: str | None) -> bool:
    """The token a form or header sent is this session's (compared in constant time)."""
    return session is not None and sent is not None and hmac.compare_digest(session.csrf, sent)


class LoginLimiter:
    """Consecutive failed logins per key (a client address, a user name); a success clears the key."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (count, allowed at)

    def wait_s(self, *keys: str) -> float:
        """Seconds until an attempt for these keys is allowed (0: now)."""
        now = self._clock()
        return max([0.0] + [self._failures[k][1] - now for k in keys if k in self._failures])

    def failed(self, *keys: str) -> None:
        for key in keys:
            count = self._failures.pop(key, (0, 0.0))[0] + 1
            over = count - FREE_FAILURES
            delay = 0.0 if over < 0 else min(MAX_DELAY_S, FIRST_DELAY_S * 2.0**over)
            self._failures[key] = (count, self._clock() + delay)
            while len(self._failures) > MAX_TRACKED:
                self._failures.popitem(last=False)

    def succeeded(self, *keys: str) -> None:
        for key in keys:
            self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, (0, 0.0))[0]


def check_login(users: list[WebUser], name: str, password: str) -> bool:
    """`name` is a configured user and `password` is theirs; as slow for an unknown name."""
    stored = next((u.password_hash.get_secret_value() for u in users if u.name == name), None)
    ok = verify_password(password, stored or dummy_hash())
    return ok and stored is not None
