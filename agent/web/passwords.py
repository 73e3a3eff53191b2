"""Password hashes for the page's users: scrypt from the standard library (OpenSSL's), salted.

    python -m agent.web.passwords < password.txt      # prints the hash for web.users[].password_hash

The password is read from stdin (never an argument: it would show in `ps` and the shell history).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import secrets
import sys

# RFC 7914's interactive cost: about 50 ms and 16 MiB per check on a small ARM box.
_N, _R, _P = 2**14, 8, 1
_MAXMEM = 64 * 1024 * 1024
_FORMAT = re.compile(r"scrypt\$n=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/]+=*)\$([A-Za-z0-9+/]+=*)")


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=32)


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, _N, _R, _P)
    b64 = base64.b64encode
    return f"scrypt$n={_N},r={_R},p={_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    """`password` matches `stored` (hash_password's output), compared in constant time."""
    found = _FORMAT.fullmatch(stored)
    if not found:
        return False
    n, r, p = (int(found.group(i)) for i in (1, 2, 3))
    if n > 2**20 or r > 32 or p > 16:  # a config cannot make each login cost seconds
        return False
    salt, digest = base64.b64decode(found.group(4)), base64.b64decode(found.group(5))
    try:
        return hmac.compare_digest(_scrypt(password, salt, n, r, p), digest)
    except ValueError:  # n not a power of 2, memory over the limit
        return False


@functools.cache
def dummy_hash() -> str:
    """Checked against for an unknown user, so that a login takes as long whether or not the name
    exists."""
    return hash_password(secrets.token_urlsafe(16))


def main() -> int:
    text = sys.stdin.readline().rstrip("\r\n")
    if not text:
        print("no password on stdin (e.g. `python -m agent.web.passwords < file`)", file=sys.stderr)
        return 2
    print(hash_password(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
