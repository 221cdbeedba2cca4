"""The client's configuration file, ``~/.elasticdl/config.yaml`` (``$ELASTICDL_CONFIG``).

Example::

    namespace: ml-team          # default --namespace
    registry: reg.example.com/team   # prefixed to --image_name values without a registry
    image_pull_secrets: regcred # default --image_pull_secrets: a private registry's pull
                                # credentials, a Secret in the namespace (not with a server:
                                # the server's --image_pull_secrets apply to its jobs)
    kube_context: prod-cluster  # default --kube_context
    platform: kubernetes        # default --platform (else: kubernetes iff --image_name)
    server:                     # a job server (elasticdl server): jobs and data go through it
      url: https://edl.example.com:8443
      token: <the token 'elasticdl server add-user' printed>
      ca: ~/.elasticdl/server-ca.pem   # optional: the CA of the server's TLS certificate

Flags given on the command line always win. PyYAML is imported only when the file exists.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from elasticdl.common.job_spec import elasticdl_home
from elasticdl.common.types import PlatformName
from elasticdl.jobs.errors import ClientError

ENV_CONFIG = "ELASTICDL_CONFIG"


class ConfigError(ClientError):
    pass


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    url: str
    token: str
    ca: str = ""


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    namespace: str = ""
    registry: str = ""
    kube_context: str = ""
    platform: str = ""
    image_pull_secrets: str = ""
    path: str = ""  # where it was read from ("" = no file)
    server: ServerSettings | None = None


_KEYS = tuple(f.name for f in dataclasses.fields(ClientConfig) if f.name != "path")
_SERVER_KEYS = tuple(f.name for f in dataclasses.fields(ServerSettings))


def _server_settings(path: str, value: Any) -> ServerSettings:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: server must be a mapping with url, token and optionally ca")
    for key, item in value.items():
        if key not in _SERVER_KEYS:
            raise ConfigError(
                f"{path}: unknown key server.{key}; allowed keys: {', '.join(_SERVER_KEYS)}"
            )
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{path}: server.{key} must be a non-empty string, got {item!r}")
    for key in ("url", "token"):
        if key not in value:
            raise ConfigError(f"{path}: server.{key} is missing")
    url = value["url"].strip()
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{path}: server.url {url!r} must start with https:// (or http://)")
    return ServerSettings(url=url, token=value["token"].strip(), ca=value.get("ca", "").strip())


def config_path() -> str:
    return os.path.expanduser(
        os.environ.get(ENV_CONFIG) or os.path.join(elasticdl_home(), "config.yaml")
    )


def load_config(path: str | None = None) -> ClientConfig:
    path = path or config_path()
    if not os.path.isfile(path):
        if os.environ.get(ENV_CONFIG) and path == config_path():
            raise ConfigError(f"${ENV_CONFIG}={path} does not exist; fix the path or unset it")
        return ClientConfig()
    import yaml  # only now: most users have no config file

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file; fix the file or remove it") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{path}: invalid YAML{line}; fix the file or remove it") from None
    if data is None:
        return ClientConfig(path=path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys ({', '.join(_KEYS)}), got {type(data).__name__}"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}; allowed keys: {', '.join(_KEYS)}")
        if key == "server":
            values["server"] = _server_settings(path, value)
            continue
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{path}: {key} must be a non-empty string, got {value!r}")
        values[key] = value.strip()
    platforms = [p.value for p in PlatformName]
    if "platform" in values and values["platform"] not in platforms:
        raise ConfigError(
            f"{path}: platform {values['platform']!r} is invalid; use one of {', '.join(platforms)}"
        )
    if "image_pull_secrets" in values:
        from elasticdl.common.job_spec import parse_pull_secrets
        from elasticdl.common.spec_codec import SpecError

        try:
            parse_pull_secrets(values["image_pull_secrets"], "image_pull_secrets")
        except SpecError as e:
            raise ConfigError(f"{path}: {e}") from None
    return ClientConfig(path=path, **values)


def has_registry(image: str) -> bool:
    """Docker's rule: the first path component names a registry if it has a '.' or ':' or is
    'localhost' (``reg.io/x``, ``localhost:5000/x``); ``user/x`` and ``x:tag`` have none."""
    if "/" not in image:
        return False
    first = image.split("/", 1)[0]
    return "." in first or ":" in first or first == "localhost"


def apply_registry(image: str, registry: str) -> str:
    if not image or not registry or has_registry(image):
        return image
    return f"{registry.rstrip('/')}/{image}"


def with_config(values: dict[str, Any], config: ClientConfig) -> dict[str, Any]:
    """``values`` (what the user gave) completed from the config file: the file's namespace,
    kube_context and platform where the user gave none, its registry prefixed to images, its
    image_pull_secrets where the user gave none (not with a server: the server's own apply)."""
    result = dict(values)
    for key in ("namespace", "kube_context", "platform"):
        value = getattr(config, key)
        if value and key not in result:
            result[key] = value
    if config.image_pull_secrets and config.server is None:
        result.setdefault("image_pull_secrets", config.image_pull_secrets)
    if config.registry:
        for key in ("image_name", "worker_image"):
            if result.get(key):
                result[key] = apply_registry(str(result[key]), config.registry)
    return result
