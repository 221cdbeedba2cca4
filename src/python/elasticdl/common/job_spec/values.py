"""Values inside string fields of the job spec (``--envs``, ``--secret_envs``,
``--image_pull_secrets``, ...; resources and volumes have modules of their own). Each parser
raises :class:`SpecError` naming the flag and the fix."""

from __future__ import annotations

import re

from elasticdl.common.spec_codec import SpecError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_envs(envs: str) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` -> dict. A piece without '=' belongs to the previous value, so
    ``"A=x,y,B=z"`` gives ``{"A": "x,y", "B": "z"}``."""
    result: dict[str, str] = {}
    last = None
    for piece in envs.split(",") if envs else ():
        if not piece.strip() and last is None:
            continue
        if "=" in piece:
            key, value = piece.split("=", 1)
            key = key.strip()
            if not _ENV_NAME.match(key):
                raise SpecError(
                    f"--envs: {key!r} is not a valid environment variable name; use 'NAME=value,...'"
                )
            if any(ord(c) < 32 or ord(c) == 127 for c in value):
                raise SpecError(
                    f"--envs: the value of {key} contains control characters (e.g. a newline); "
                    "remove them"
                )
            if value.startswith(_SECRET_REF_PREFIX):
                raise SpecError(
                    f"--envs: {key}={_SECRET_REF_PREFIX}... would reach the pods as plain text; "
                    f"use --secret_envs={key}=<secret>/<key>"
                )
            result[key] = value
            last = key
        elif last is not None:
            result[last] += "," + piece
        else:
            raise SpecError(f"--envs: {piece!r} has no '='; use 'NAME=value,NAME2=value2'")
    return result


_SECRET_REF_PREFIX = "secretKeyRef:"
# A Secret's name (DNS-1123 subdomain) and a key of its data.
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def parse_pull_secrets(value: str, flag: str = "--image_pull_secrets") -> list[str]:
    """``"regcred,other"`` -> ["regcred", "other"]; an empty item, a name that is not a
    Secret's or one given twice raises :class:`SpecError` naming ``flag``."""
    if not (value or "").strip():
        return []
    names: list[str] = []
    for piece in value.split(","):
        name = piece.strip()
        if not name:
            raise SpecError(
                f"{flag} {value!r} has an empty Secret name; give NAME[,NAME...] "
                "(e.g. regcred, a Secret of type kubernetes.io/dockerconfigjson)"
            )
        if len(name) > 253 or not _SECRET_NAME.match(name):
            raise SpecError(
                f"{flag}: {name!r} is not a Secret name: use lowercase letters, digits, '-' "
                "and '.'"
            )
        if name in names:
            raise SpecError(f"{flag}: {name} is given twice; keep one")
        names.append(name)
    return names


def parse_secret_envs(value: str) -> dict[str, tuple[str, str]]:
    """``"NAME=secret/key,NAME2=secret2/key2"`` -> {NAME: (secret, key)}."""
    refs: dict[str, tuple[str, str]] = {}
    for piece in (value or "").split(","):
        piece = piece.strip()
        if not piece:
            continue
        name, _, ref = piece.partition("=")
        name = name.strip()
        secret, _, key = ref.strip().partition("/")
        if not _ENV_NAME.match(name) or not secret or not key:
            raise SpecError(
                f"--secret_envs: {piece!r} is not NAME=<secret>/<key>; e.g. "
                "--secret_envs=AWS_SECRET_ACCESS_KEY=s3-credentials/secret-key"
            )
        if len(secret) > 253 or not _SECRET_NAME.match(secret):
            raise SpecError(
                f"--secret_envs: {secret!r} (for {name}) is not a Secret name: use lowercase "
                "letters, digits, '-' and '.'"
            )
        if len(key) > 253 or not _SECRET_KEY.match(key) or key in (".", ".."):
            raise SpecError(
                f"--secret_envs: {key!r} (for {name}) is not a Secret key: use letters, digits, "
                "'-', '_' and '.'"
            )
        if name in refs:
            raise SpecError(f"--secret_envs: {name} is given twice; keep one")
        refs[name] = (secret, key)
    return refs


def env_name_patterns(value: str) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def aux_param_set(value: str) -> set[str]:
    return {p.strip() for p in (value or "").replace(";", ",").split(",") if p.strip()}
