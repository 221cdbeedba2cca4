"""Bearer tokens, one per user, stored as their sha256 only.

``elasticdl server add-user NAME`` creates a random 32-byte token, prints it once and stores
its hash in ``<state_dir>/tokens.json`` (0600). The server re-reads the file when it changes,
so users added while it runs can log in at once. A stolen tokens file reveals no token: the
tokens are random, so their hashes cannot be reversed by guessing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from pathlib import Path

from elasticdl.common.job_dir import write_atomically
from elasticdl.server.errors import BadRequest, Conflict, Unauthorized

USER_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


def check_user_name(name: str) -> None:
    if not USER_NAME.fullmatch(name):
        raise BadRequest(
            f"user name {name!r} is invalid; use 1-32 lowercase letters, digits and '-', "
            "starting with a letter"
        )


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenStore:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, str] = {}

    # ---- reading -------------------------------------------------------------------------
    def _load(self) -> dict[str, str]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                data = json.loads(self.path.read_text())
                self._users = {
                    name: entry["sha256"] for name, entry in (data.get("users") or {}).items()
                }
                self._stamp = stamp
            return self._users

    def users(self) -> list[str]:
        return sorted(self._load())

    def authenticate(self, token: str) -> str | None:
        """The user whose token this is, else None. Every stored hash is compared (in
        constant time), so the time taken does not tell which user nearly matched."""
        if not token:
            return None
        presented = token_hash(token)
        found = None
        for name, stored in self._load().items():
            if hmac.compare_digest(presented, stored):
                found = name
        return found

    def user_of(self, authorization: str) -> str:
        """The user of an ``Authorization: Bearer <token>`` header's value; Unauthorized (401)
        for a missing, malformed or unknown token."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("missing bearer token; send 'Authorization: Bearer <token>'")
        user = self.authenticate(token.strip())
        if user is None:
            raise Unauthorized(
                "invalid token; ask the server's admin for one (elasticdl server add-user)"
            )
        return user

    # ---- writing -------------------------------------------------------------------------
    def add_user(self, name: str, replace: bool = False) -> str:
        """Create ``name`` with a new token and return the token (it is not stored)."""
        check_user_name(name)
        token = secrets.token_urlsafe(32)
        with self._lock:
            data = {"users": {}}
            if self.path.exists():
                data = json.loads(self.path.read_text())
            users = data.setdefault("users", {})
            if name in users and not replace:
                raise Conflict(f"user {name!r} exists; pass --replace to give it a new token")
            users[name] = {"sha256": token_hash(token), "created_at": time.time()}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(data, indent=2, sort_keys=True), mode=0o600)
        return token
