"""`edge-agent web ...`: the optional web page's tools (docs/web.md). `hash-password` makes the line
for `web.users[].password_hash`."""

from __future__ import annotations

import sys

import typer

from agent.cli.common import echo_json, user_errors
from agent.cli.options import JsonOption
from agent.errors import EdgeAgentError

web_app = typer.Typer(help="The optional web page (docs/web.md).", no_args_is_help=True)


@web_app.command("hash-password")
def hash_password(as_json: JsonOption = False) -> None:
    """Print the salted scrypt hash of a password, for web.users[].password_hash.

    The password comes from stdin (its first line: `edge-agent web hash-password < pw.txt`), or, at a
    terminal, from a prompt that does not echo it (asked twice). Never an argument: it would show in
    `ps` and the shell's history."""
    from agent.web.passwords import hash_password as make_hash

    with user_errors(as_json):
        password = _password()
        line = make_hash(password)
    if as_json:
        echo_json({"password_hash": line})
        return
    typer.echo(line)


def _password() -> str:
    """The password from a no-echo prompt at a terminal, else stdin's first line."""
    if sys.stdin.isatty():
        import getpass

        first = getpass.getpass("Password: ")
        if first and getpass.getpass("Again: ") != first:
            raise EdgeAgentError("the two passwords differ", hint="run it again")
    else:
        first = sys.stdin.readline().rstrip("\r\n")
    if not first:
        raise EdgeAgentError(
            "no password given",
            hint="type it at the prompt, or pipe it in: edge-agent web hash-password < pw.txt",
        )
    return first
