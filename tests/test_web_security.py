"""The web page's security (docs/web.md, Security; the attacks: docs/reliability.md): the real server
(uvicorn on a thread, as the daemon runs it) over real HTTP on loopback, and its parts on their own."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.config.web import WebConfig, WebUser
from agent.config_loader import load_config
from agent.errors import ConfigError
from agent.web.auth import FREE_FAILURES, LoginLimiter, Sessions
from agent.web.files import UnsafeName, safe_child
from agent.web.passwords import hash_password, verify_password
from agent.web.server import MAX_CONNECTIONS, WebServer
from tests.pki import Pki
from tests.waits import wait_until

PASSWORD = "correct horse battery staple"
STATUS = {"device": "web-box", "agent_version": "test", "mqtt": {"connected": True}, "pipelines": {}}


@pytest.fixture(scope="module")
def password_hash() -> str:
    return hash_password(PASSWORD)


def serve(pages: tuple[Any, ...] = (), **settings: Any) -> Iterator[str]:
    config = WebConfig(enabled=True, port=0, **settings)
    server = WebServer(config, lambda: STATUS, "web-box", pages)
    server.start()
    try:
        scheme = "https" if settings.get("tls") else "http"
        yield f"{scheme}://127.0.0.1:{server.port}"
    finally:
        server.stop()


@pytest.fixture
def with_users(password_hash: str) -> Iterator[str]:
    yield from serve(users=[WebUser(name="admin", password_hash=password_hash)])


@pytest.fixture
def without_users() -> Iterator[str]:
    yield from serve()


def client(base: str, **extra: Any) -> httpx.Client:
    return httpx.Client(base_url=base, follow_redirects=False, timeout=10, **extra)


def login_token(browser: httpx.Client) -> str:
    page = browser.get("/login")
    assert page.status_code == 200
    return page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def log_in(browser: httpx.Client, password: str = PASSWORD, user: str = "admin") -> httpx.Response:
    token = login_token(browser)
    return browser.post("/login", data={"csrf": token, "user": user, "password": password})


# --- logins -----------------------------------------------------------------------------------------


def test_with_users_nothing_is_served_without_a_session(with_users: str) -> None:
    with client(with_users) as browser:
        assert browser.get("/").status_code == 303
        assert browser.get("/").headers["location"] == "/login"
        assert browser.get("/api/status").status_code == 401
        assert browser.get("/box/status").status_code == 401
        # A made-up session id is no session.
        browser.cookies.set("edge_agent_session", "forged-session-id")
        assert browser.get("/api/status").status_code == 401


def test_a_login_gives_a_strict_http_only_session_cookie(with_users: str) -> None:
    with client(with_users) as browser:
        assert log_in(browser, "wrong password").status_code == 401
        answer = log_in(browser)
        assert answer.status_code == 303, answer.text
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert "secure" not in cookie  # plain HTTP on loopback: a Secure cookie would never come back
        assert browser.get("/api/status").json() == STATUS
        page = browser.get("/")
        assert page.status_code == 200 and "web-box" in page.text and "Log out" in page.text
        for header in ("content-security-policy", "x-frame-options", "x-content-type-options"):
            assert header in page.headers


def test_the_cookie_is_secure_over_tls(pki: Pki, password_hash: str) -> None:
    from agent.config.web import WebTlsConfig

    tls = WebTlsConfig(cert_file=pki.server_cert, key_file=pki.server_key)
    users = [WebUser(name="admin", password_hash=password_hash)]
    for base in serve(listen="0.0.0.0", tls=tls, users=users):
        with client(base, verify=ssl.create_default_context(cafile=str(pki.ca))) as browser:
            answer = log_in(browser)
            assert answer.status_code == 303
            assert "secure" in answer.headers["set-cookie"].lower()
            assert browser.get("/api/status").status_code == 200


def test_a_missing_or_forged_csrf_token_is_refused(with_users: str) -> None:
    with client(with_users) as browser:
        login_token(browser)
        form = {"user": "admin", "password": PASSWORD}
        assert browser.post("/login", data=form).status_code == 403
        assert browser.post("/login", data={**form, "csrf": "forged"}).status_code == 403
        assert browser.get("/api/status").status_code == 401  # neither logged in
        assert log_in(browser).status_code == 303
        # Logged in: a state-changing request still needs this session's token, in the form or header.
        assert browser.post("/logout").status_code == 403
        with client(with_users) as other:
            someone_elses = login_token(other)
        assert browser.post("/logout", data={"csrf": someone_elses}).status_code == 403
        assert browser.post("/logout", headers={"X-CSRF-Token": "forged"}).status_code == 403
        assert browser.get("/api/status").status_code == 200  # still logged in
        page = browser.get("/").text
        token = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        assert browser.post("/logout", data={"csrf": token}).status_code == 303
        assert browser.get("/api/status").status_code == 401


def test_twenty_bad_logins_in_a_row_are_slowed(with_users: str) -> None:
    with client(with_users) as browser:
        codes = [log_in(browser, f"guess {i}").status_code for i in range(20)]
        assert codes[:FREE_FAILURES] == [401] * FREE_FAILURES
        assert codes.count(429) >= 10, codes  # refused without checking: guessing stops
        # While it waits, even the right password is refused, and says when to try again.
        refused = log_in(browser)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1


def test_the_limiter_doubles_the_wait_per_address_and_per_user() -> None:
    now = [0.0]
    limiter = LoginLimiter(clock=lambda: now[0])
    for _ in range(FREE_FAILURES - 1):
        limiter.failed("addr:a", "user:admin")
    assert limiter.wait_s("addr:a", "user:admin") == 0
    waits = []
    for _ in range(4):
        limiter.failed("addr:a", "user:admin")
        waits.append(limiter.wait_s("addr:a", "user:admin"))
        now[0] += waits[-1]
    assert waits == [1.0, 2.0, 4.0, 8.0]
    # Another address guessing the same user waits too (per user), a fresh one for another user not.
    limiter.failed("user:admin")
    assert limiter.wait_s("addr:b", "user:admin") == 16.0
    assert limiter.wait_s("addr:b", "user:other") == 0
    limiter.succeeded("addr:a", "user:admin")
    assert limiter.wait_s("addr:a", "user:admin") == 0


def test_sessions_expire() -> None:
    now = [0.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    session = sessions.new("admin")
    assert sessions.get(session.id) is session
    now[0] = 61
    assert sessions.get(session.id) is None


def test_passwords_are_salted_scrypt_hashes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.web.passwords"], input=PASSWORD + "\n", capture_output=True,
        text=True, timeout=30, check=True,
    )  # fmt: skip
    made = done.stdout.strip()
    assert made.startswith("scrypt$") and PASSWORD not in made
    user = WebUser(name="admin", password_hash=made)
    assert user.password_hash.get_secret_value() == made and made not in user.model_dump_json()
    with pytest.raises(ValueError, match="not a password hash"):
        WebUser(name="admin", password_hash=PASSWORD)
    assert verify_password(PASSWORD, made)
    assert not verify_password(PASSWORD + "!", made)
    assert hash_password(PASSWORD) != made  # salted


def test_slow_clients_are_cut_off_and_cannot_hold_the_page(
    without_users: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent.web.server.HEADER_TIMEOUT_S", 0.5)
    port = int(without_users.rsplit(":", 1)[1])
    # More than the connection bound: some say nothing, some send headers a byte at a time.
    slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(MAX_CONNECTIONS + 8)]
    try:
        for sock in slow[::2]:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")

        def closed(sock: socket.socket) -> bool:
            sock.setblocking(False)
            try:
                return sock.recv(1024) == b""
            except BlockingIOError:
                return False
            except ConnectionResetError:
                return True

        still_open = list(slow)

        def all_closed() -> bool:
            still_open[:] = [sock for sock in still_open if not closed(sock)]
            return not still_open

        wait_until(all_closed, "the server to close the slow connections", timeout=10,
                   state=lambda: f"; {len(still_open)} still open")  # fmt: skip
        with client(without_users) as browser:
            assert browser.get("/api/status").status_code == 200
    finally:
        for sock in slow:
            sock.close()


def test_idle_keep_alive_connections_make_room_for_a_new_client(without_users: str) -> None:
    """A crowd of clients that each made one request and keep their connection open (keep-alive,
    idle) would hold every connection the server allows until their idle timeout, and again with a
    request every few seconds: a new client gets 503 meanwhile. Idle ones make room instead."""
    port = int(without_users.rsplit(":", 1)[1])
    idle: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS - 1):  # all the server answers at once (the next is the 32nd)
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(sock)
            sock.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""  # its answer: idle between requests now, the connection kept
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
        with client(without_users) as browser:
            assert browser.get("/api/status").status_code == 200
    finally:
        for sock in idle:
            sock.close()


async def echo(request: Any, session: Any) -> Any:
    from starlette.responses import JSONResponse

    from agent.web.app import form_of

    return JSONResponse({"user": session.user, "form": form_of(request)})


def test_a_page_added_by_another_part_is_behind_the_session_and_csrf_checks(password_hash: str) -> None:
    users = [WebUser(name="admin", password_hash=password_hash)]
    for base in serve(pages=(lambda app: app.add_page("/echo", echo, method="POST"),), users=users):
        with client(base) as browser:
            assert browser.post("/echo", data={"zone": "door"}).status_code == 303  # to /login
            assert log_in(browser).status_code == 303
            assert browser.post("/echo", data={"zone": "door"}).status_code == 403
            token = browser.get("/").text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            answer = browser.post("/echo", data={"zone": "door"}, headers={"X-CSRF-Token": token})
            assert answer.json() == {"user": "admin", "form": {"zone": "door", "csrf": token}}
            assert browser.post("/echo", data={"zone": "door", "csrf": token}).status_code == 200
    for base in serve(pages=(lambda app: app.add_page("/echo", echo, method="POST"),)):
        with client(base) as browser:  # no login needed here, but still a token
            assert browser.post("/echo", data={"zone": "door"}).status_code == 403


def test_with_no_client_the_server_schedules_no_wakeups() -> None:
    # uvicorn's own server wakes 10 times a second (about 2 ms of CPU a second, doing nothing).
    server = WebServer(WebConfig(enabled=True, port=0), lambda: STATUS, "web-box")
    server.start()
    try:
        loop = server.event_loop
        assert loop is not None

        async def timers() -> list[asyncio.TimerHandle]:
            return [t for t in loop._scheduled if not t.cancelled()]  # type: ignore[attr-defined]

        assert asyncio.run_coroutine_threadsafe(timers(), loop).result(5) == []
    finally:
        server.stop()


# --- without users: loopback only ------------------------------------------------------------------


def test_on_loopback_without_users_no_login_is_needed(without_users: str) -> None:
    with client(without_users) as browser:
        page = browser.get("/")
        assert page.status_code == 200 and 'id="pipelines"' in page.text
        assert browser.get("/api/status").json() == STATUS
        assert browser.get("/login").status_code == 303
        # DNS rebinding: a site whose name now points at 127.0.0.1 gets nothing.
        assert browser.get("/api/status", headers={"Host": "attacker.example"}).status_code == 403


def test_it_listens_on_the_ipv6_loopback(password_hash: str) -> None:
    users = [WebUser(name="admin", password_hash=password_hash)]
    for login_needed in (False, True):
        config = WebConfig(enabled=True, listen="::1", port=0, users=users if login_needed else [])
        server = WebServer(config, lambda: STATUS, "web-box")
        server.start()
        try:
            with client(f"http://[::1]:{server.port}") as browser:
                assert browser.get("/api/status").status_code == (401 if login_needed else 200)
        finally:
            server.stop()


def test_a_page_that_cannot_start_says_why(tmp_path: Path, without_users: str) -> None:
    from agent.config.web import WebTlsConfig
    from agent.errors import EdgeAgentError

    taken = int(without_users.rsplit(":", 1)[1])
    with pytest.raises(EdgeAgentError, match=f"web: 127.0.0.1:{taken}: cannot listen"):
        WebServer(WebConfig(enabled=True, port=taken), lambda: STATUS, "web-box").start()
    (tmp_path / "bad.pem").write_text("not a certificate")
    tls = WebTlsConfig(cert_file=tmp_path / "bad.pem", key_file=tmp_path / "bad.pem")
    with pytest.raises(EdgeAgentError, match="cannot load the TLS certificate or key"):
        WebServer(WebConfig(enabled=True, port=0, tls=tls), lambda: STATUS, "web-box").start()
    # The page that runs is untouched by both.
    with client(without_users) as browser:
        assert browser.get("/api/status").status_code == 200


# --- off the loopback: the config refuses -----------------------------------------------------------


@pytest.mark.parametrize(
    ("web", "missing"),
    [
        ("listen: 0.0.0.0", "tls and users"),
        ("listen: '::'", "tls and users"),
        ("listen: 192.0.2.7\n  users: [{name: a, password_hash: 'HASH'}]", "without tls"),
        ("listen: 0.0.0.0\n  tls: {cert_file: /c.pem, key_file: /k.pem}", "without users"),
    ],
)
def test_off_the_loopback_without_tls_or_users_is_a_config_error_at_its_line(
    tmp_path: Path, password_hash: str, web: str, missing: str
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "device: {id: box}\n"
        f"state_dir: {tmp_path / 'state'}\n"
        "web:\n"
        "  enabled: true\n"
        f"  {web.replace('HASH', password_hash)}\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    text = str(raised.value)
    assert f"{path}:3" in text and "off the loopback" in text and missing in text, text


@pytest.mark.parametrize("listen", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_neither_tls_nor_users(listen: str) -> None:
    assert WebConfig(enabled=True, listen=listen).listen == listen


def test_the_page_is_off_by_default(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(f"device: {{id: box}}\nstate_dir: {tmp_path / 'state'}\n")
    assert load_config(path).web.enabled is False


# --- file names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "../agent.yaml",
        "..",
        ".",
        "",
        "/etc/passwd",
        "a/../../etc/passwd",
        "%2e%2e%2fagent.yaml",
        "..%2fagent.yaml",
        "%2e%2e",
        "..\\agent.yaml",
        "snap\\..\\..\\x",
        "snap.jpg\x00.txt",
        "snap.jpg\n",
        ".hidden",
        "sub/snap.jpg",
        "..%c0%af",
        "\u2024\u2024/x",  # one-dot leaders that look like ..
    ],
)
def test_safe_child_refuses_traversal_in_every_spelling(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeName):
        safe_child(tmp_path, name)


def test_safe_child_refuses_a_symlink_out_of_root(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", root / "link.jpg")
    with pytest.raises(UnsafeName):
        safe_child(root, "link.jpg")
    (root / "cam-17.jpg").write_bytes(b"jpeg")
    assert safe_child(root, "cam-17.jpg") == (root / "cam-17.jpg").resolve()


def test_static_files_go_through_safe_child(without_users: str) -> None:
    with client(without_users) as browser:
        assert browser.get("/static/refresh.js").status_code == 200
        assert browser.get("/static/web.css").headers["content-type"].startswith("text/css")
        for name in ("..%2f__init__.py", "%2e%2e%2fapp.py", "..%5capp.py", "refresh.js%00.css"):
            assert browser.get(f"/static/{name}").status_code == 404, name
