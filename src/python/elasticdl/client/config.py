"""The client's configuration file, ``~/.elasticdl/config.yaml`` (``$ELASTICDL_CONFIG``).

Example::

    namespace: ml-team          # default --namespace
    registry: reg.example.com/team   # prefixed to --image_name values without a registry
    kube_context: prod-cluster  # default --kube_context
    platform: kubernetes        # default --platform (else: kubernetes iff --image_name)

Flags given on the command line always win. PyYAML is imported only when the file exists.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from elasticdl.client.errors import ClientError
from elasticdl.common.job_spec import elasticdl_home
from elasticdl.common.types import PlatformName

ENV_CONFIG = "ELASTICDL_CONFIG"


class ConfigError(ClientError):
    pass


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    namespace: str = ""
    registry: str = ""
    kube_context: str = ""
    platform: str = ""
    path: str = ""  # where it was read from ("" = no file)


_KEYS = tuple(f.name for f in dataclasses.fields(ClientConfig) if f.name != "path")


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
    values = {}
    for key, value in data.items():
        if key not in _KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}; allowed keys: {', '.join(_KEYS)}")
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{path}: {key} must be a non-empty string, got {value!r}")
        values[key] = value.strip()
    platforms = [p.value for p in PlatformName]
    if "platform" in values and values["platform"] not in platforms:
        raise ConfigError(
            f"{path}: platform {values['platform']!r} is invalid; use one of {', '.join(platforms)}"
        )
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
    kube_context and platform where the user gave none, its registry prefixed to images."""
    result = dict(values)
    for key in ("namespace", "kube_context", "platform"):
        value = getattr(config, key)
        if value and key not in result:
            result[key] = value
    if config.registry:
        for key in ("image_name", "worker_image"):
            if result.get(key):
                result[key] = apply_registry(str(result[key]), config.registry)
    return result
