"""The page's routes (Starlette): the box page, its refreshed part, /api/status, login and logout,
and the static files that ship in the package. Security: docs/web.md."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from agent.config.web import WebConfig, is_loopback
from agent.web import pages
from agent.web.auth import COOKIE, LoginLimiter, Session, Sessions, check_login, csrf_ok
from agent.web.files import UnsafeName, safe_child

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
# A page's handler: the request and its session (the user, the CSRF token for its forms).
Answer = Callable[[Request, "Session"], Awaitable[Response]]
STATUS_MAX_AGE_S = 1.0  # many open pages share one status: the daemon builds it at most once a second
_MAX_FORM_BYTES = 4096  # a login form is a few dozen bytes
_BODY_TIMEOUT_S = 10.0  # for those bytes to arrive
_HOST = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+))(?::[0-9]{1,5})?")  # name or [v6], :port
_STATIC_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
_HEADERS = {
    # Only this origin's own files; no framing (clickjacking); no MIME sniffing; no referrer.
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    # Another site's page may not embed ours (an <img> of the live frame, a snapshot, a clip).
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class CachedStatus:
    def __init__(self, status: StatusFn, clock: Callable[[], float] = time.monotonic) -> None:
        self._status, self._clock = status, clock
        self._at, self._value = -STATUS_MAX_AGE_S, b""

    def json_bytes(self) -> bytes:
        now = self._clock()
        if now - self._at >= STATUS_MAX_AGE_S or not self._value:
            self._value = json.dumps(self._status(), default=str).encode()
            self._at = now
        return self._value

    def get(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.json_bytes())
        return value


class WebApp:
    """The app and what it keeps: sessions, the login limiter, the cached status. Pages are added
    with `add_page` (docs/web.md, Adding a page), which puts every one behind the same session
    check and every POST behind the CSRF check."""

    def __init__(self, config: WebConfig, status: StatusFn, device: str) -> None:
        self.config = config
        self.device = device
        self.status = CachedStatus(status)
        self.sessions = Sessions(config.session_ttl_s)
        # The login forms' sessions (no user yet) apart: anyone can make them, and a flood of them
        # must not push the logged-in sessions out (each store keeps at most MAX_SESSIONS).
        self.forms = Sessions(config.session_ttl_s)
        self.limiter = LoginLimiter()
        self.static_root = Path(str(resources.files("agent.web").joinpath("static")))
        self.links: list[tuple[str, str]] = []  # the header's links to pages: (title, path)
        self.app = Starlette(
            routes=[
                Route("/login", self.login_form, methods=["GET"]),
                Route("/login", self.login, methods=["POST"]),
                Route("/static/{name}", self.static),
            ]
        )
        self.app.add_exception_handler(404, self._not_found)
        self.add_page("/", self.box, link="Box")
        self.add_page("/box/status", self.box_status, api=True)
        self.add_page("/api/status", self.api_status, api=True)
        self.add_page("/logout", self.logout, method="POST")

    def add_page(
        self,
        path: str,
        answer: Answer,
        method: str = "GET",
        api: bool = False,
        link: str = "",
        max_bytes: int = _MAX_FORM_BYTES,
    ) -> None:
        """Serve `answer` at `path` (a Starlette path: `/clips/{name}`) to a live session only: without
        one, the login page (`api`: 401 JSON). A POST answers 403 unless it carries its session's
        CSRF token (form field `csrf` or header `X-CSRF-Token`); `form_of(request)` is its form then.
        `link`: the page's title in the header's links (pages added in order). `max_bytes`: the
        largest POST body it takes (the zone editor's shapes are more than a login's 4 KiB)."""
        if link:
            self.links.append((link, path))

        async def endpoint(request: Request) -> Response:
            async def checked(session: Session) -> Response:
                if method == "POST":
                    form = await _small_form(request, max_bytes)
                    # The open page's cookieless session (an API call's) has no token: "" is
                    # none, else a web site's form sending csrf= would pass.
                    if form is None or not session.csrf or not csrf_ok(session, form.get("csrf")):
                        return Response("missing or wrong CSRF token", 403, media_type="text/plain")
                    request.state.form = form
                return await answer(request, session)

            return await self._guarded(request, checked, api)

        self.app.router.routes.append(Route(path, endpoint, methods=[method]))

    @property
    def open(self) -> bool:
        """No users: no login (the config allows that on loopback only)."""
        return not self.config.users

    # --- who asks ---------------------------------------------------------------------------------

    def _host_ok(self, request: Request) -> bool:
        """Without logins, only a loopback Host: a web site that rebinds its DNS name to 127.0.0.1
        must not read the page through a visitor's browser."""
        if not self.open:
            return True
        # The Host header whole, as a browser sends it: urlsplit would read "[::1].evil" or
        # "evil@127.0.0.1" as a loopback name.
        found = _HOST.fullmatch(request.headers.get("host", ""))
        return found is not None and is_loopback(found[1] or found[2])

    def session(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def _with_cookie(self, response: Response, session: Session) -> Response:
        response.set_cookie(
            COOKIE,
            session.id,
            max_age=int(self.config.session_ttl_s),
            path="/",
            httponly=True,
            secure=self.config.tls is not None,
            samesite="strict",
        )
        return response

    async def _guarded(
        self, request: Request, answer: Callable[[Session], Awaitable[Response]], api: bool = False
    ) -> Response:
        """`answer` for a request with a live session; without one: a new session where no login is
        needed, else the login page (401 for the API and the refreshed part)."""
        if not self._host_ok(request):
            return secure(Response("this page answers to localhost only", 403, media_type="text/plain"))
        session = self.session(request)
        # With users, only a logged-in session: the login form's (no user yet) opens nothing.
        if session is not None and (self.open or session.user is not None):
            return secure(await answer(session))
        if self.open and api:  # a script's request: no session kept for it (nor a form to post)
            return secure(await answer(Session("", None, "", 0.0)))
        if self.open:
            session = self.sessions.new(None)
            return secure(self._with_cookie(await answer(session), session))
        if api:
            return secure(JSONResponse({"error": "log in first: POST /login"}, 401))
        return secure(RedirectResponse("/login", 303))

    def frame(self, title: str, body: str, session: Session | None, script: str = "") -> str:
        """A whole page around `body` (HTML, escaped already) with the header and, for a logged-in
        user, the logout form; `script`: one of static/ to load (no inline script: the CSP)."""
        account = (
            "" if session is None or session.user is None else pages.logout_form(session.user, session.csrf)
        )
        links = [] if session is None else self.links
        csrf = "" if session is None else session.csrf
        return pages.page(title, body, self.device, account, script, csrf, links)

    # --- pages ------------------------------------------------------------------------------------

    async def box(self, request: Request, session: Session) -> Response:
        status = await anyio.to_thread.run_sync(self.status.get)
        body = pages.box_body(status)
        return HTMLResponse(self.frame(f"{self.device}: edge-agent", body, session, "refresh.js"))

    async def box_status(self, request: Request, session: Session) -> Response:
        return HTMLResponse(pages.status_part(await anyio.to_thread.run_sync(self.status.get)))

    async def api_status(self, request: Request, session: Session) -> Response:
        data = await anyio.to_thread.run_sync(self.status.json_bytes)
        return Response(data, media_type="application/json")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            path = safe_child(self.static_root, name)
        except UnsafeName:
            return secure(Response("not found", 404, media_type="text/plain"))
        if path.suffix not in _STATIC_TYPES or not path.is_file():
            return secure(Response("not found", 404, media_type="text/plain"))
        response = Response(path.read_bytes(), media_type=_STATIC_TYPES[path.suffix])
        secure(response).headers["Cache-Control"] = "max-age=300"
        return response

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return secure(Response("not found", 404, media_type="text/plain"))

    # --- login ------------------------------------------------------------------------------------

    def _login_page(self, session: Session, message: str = "", code: int = 200) -> Response:
        body = pages.login_body(session.csrf, message)
        return self._with_cookie(HTMLResponse(self.frame("log in", body, None), code), session)

    async def login_form(self, request: Request) -> Response:
        if not self._host_ok(request):
            return secure(Response("this page answers to localhost only", 403, media_type="text/plain"))
        if self.open:
            return secure(RedirectResponse("/", 303))
        # A session without a user carries the login form's CSRF token.
        return secure(self._login_page(self._pending(request) or self.forms.new(None)))

    def _pending(self, request: Request) -> Session | None:
        """The session a login form was given (or a logged-in one's, logging in again)."""
        return self.forms.get(request.cookies.get(COOKIE)) or self.session(request)

    async def login(self, request: Request) -> Response:
        if self.open or not self._host_ok(request):
            return secure(RedirectResponse("/", 303))
        form = await _small_form(request)
        pending = self._pending(request)
        if form is None or not csrf_ok(pending, form.get("csrf")):
            return secure(Response("missing or wrong CSRF token", 403, media_type="text/plain"))
        assert pending is not None  # csrf_ok
        user, password = form.get("user", ""), form.get("password", "")
        client = request.client.host if request.client else "?"
        keys = (f"addr:{client}", f"user:{user}")
        wait = self.limiter.wait_s(*keys)
        if wait > 0:
            log.warning(
                "web: login for %r from %s refused: too many failures (%.0f s to wait)", user, client, wait
            )
            response = self._login_page(pending, f"Too many failed logins: try again in {wait:.0f} s.", 429)
            response.headers["Retry-After"] = str(int(wait) + 1)
            return secure(response)
        ok = await anyio.to_thread.run_sync(check_login, self.config.users, user, password)
        if not ok:
            self.limiter.failed(*keys)
            log.warning("web: failed login for %r from %s", user, client)
            return secure(self._login_page(pending, "Wrong user or password.", 401))
        self.limiter.succeeded(*keys)
        self.forms.end(pending.id)  # a new id at login: a planted cookie is worth nothing
        self.sessions.end(pending.id)
        session = self.sessions.new(user)
        log.info("web: %s logged in from %s", user, client)
        return secure(self._with_cookie(RedirectResponse("/", 303), session))

    async def logout(self, request: Request, session: Session) -> Response:
        self.sessions.end(session.id)
        response = RedirectResponse("/login" if not self.open else "/", 303)
        response.delete_cookie(COOKIE, path="/")
        return response


def form_of(request: Request) -> dict[str, str]:
    """A POST page's form (`add_page` read and checked it)."""
    form: dict[str, str] = request.state.form
    return form


def secure(response: Response) -> Response:
    """The security headers (and the Date: the server's own is off, agent/web/server.py)."""
    for name, value in _HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers.setdefault("Date", formatdate(usegmt=True))
    return response


async def _small_form(request: Request, max_bytes: int = _MAX_FORM_BYTES) -> dict[str, str] | None:
    """The urlencoded form of a POST, or None when it is too big or not one; a header CSRF token
    (X-CSRF-Token, for scripts) stands in for the form's."""
    length = request.headers.get("content-length", "")
    if not length.isdigit() or int(length) > max_bytes:  # none: chunked, of any length
        return None
    form: dict[str, str] = {}
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        # Parsed here (a few bytes): Starlette's own form parser needs python-multipart.
        try:
            with anyio.fail_after(_BODY_TIMEOUT_S):
                body = (await request.body()).decode("utf-8", errors="replace")
        except TimeoutError:
            return None
        try:
            pairs = parse_qsl(body, keep_blank_values=True, max_num_fields=8)
        except ValueError:  # more fields than any page's form has: refused, not a traceback
            return None
        form = dict(pairs)
    header = request.headers.get("x-csrf-token")
    if header is not None:
        form["csrf"] = header
    return form
