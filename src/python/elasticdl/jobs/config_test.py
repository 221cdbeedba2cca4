"""The client config file (~/.elasticdl/config.yaml)."""

import pytest
from elasticdl.jobs.config import (
    ConfigError,
    apply_registry,
    has_registry,
    load_config,
    with_config,
)


def test_missing_file_is_empty_config(tmp_path, monkeypatch):
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    config = load_config()
    assert config.namespace == "" and config.path == ""


def test_env_path_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTICDL_CONFIG", str(tmp_path / "none.yaml"))
    with pytest.raises(ConfigError, match=r"\$ELASTICDL_CONFIG=.*does not exist"):
        load_config()


def test_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "namespace: team\nregistry: reg.example.com/ml\nkube_context: prod\nplatform: kubernetes\n"
    )
    config = load_config(str(path))
    assert (config.namespace, config.registry, config.kube_context, config.platform) == (
        "team",
        "reg.example.com/ml",
        "prod",
        "kubernetes",
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "namspace: x\n",
            "unknown key 'namspace'; allowed keys: namespace, registry, kube_context, platform",
        ),
        ("namespace: [a\n", "invalid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("namespace: 3\n", "namespace must be a non-empty string"),
        ("platform: cloud\n", "platform 'cloud' is invalid"),
        ("image_pull_secrets: a,,b\n", "image_pull_secrets 'a,,b' has an empty Secret name"),
    ],
)
def test_errors_name_the_key(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert message in str(info.value) and str(path) in str(info.value)


def test_empty_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("")
    assert load_config(str(path)).namespace == ""


@pytest.mark.parametrize(
    "image, expected",
    [
        ("mnist:1", "reg.io/team/mnist:1"),
        ("user/mnist:1", "reg.io/team/user/mnist:1"),
        ("docker.io/user/mnist:1", "docker.io/user/mnist:1"),
        ("localhost:5000/mnist", "localhost:5000/mnist"),
        ("localhost/mnist", "localhost/mnist"),
        ("", ""),
    ],
)
def test_registry_prefix(image, expected):
    assert apply_registry(image, "reg.io/team/") == expected
    assert has_registry(expected) or not expected


def test_command_line_flags_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("namespace: team\nregistry: reg.io\nplatform: kubernetes\n")
    config = load_config(str(path))
    given = {"namespace": "mine", "image_name": "m:1"}
    values = with_config(given, config)
    assert values == {"namespace": "mine", "platform": "kubernetes", "image_name": "reg.io/m:1"}
    assert given == {"namespace": "mine", "image_name": "m:1"}  # the caller's dict is kept


def test_binary_file_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01namespace")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert str(info.value) == f"{path}: not a UTF-8 text file; fix the file or remove it"


def test_server_settings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  url: https://edl.example.com:8443\n  token: abc\n  ca: ca.pem\n")
    server = load_config(str(path)).server
    assert (server.url, server.token, server.ca) == (
        "https://edl.example.com:8443",
        "abc",
        "ca.pem",
    )
    path.write_text("namespace: team\n")
    assert load_config(str(path)).server is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("server: https://x\n", "server must be a mapping"),
        ("server:\n  url: https://x\n", "server.token is missing"),
        ("server:\n  url: ftp://x\n  token: t\n", "must start with https://"),
        ("server:\n  url: https://x\n  token: t\n  tls: 1\n", "unknown key server.tls"),
        ("server:\n  url: https://x\n  token: 5\n", "server.token must be a non-empty string"),
    ],
)
def test_bad_server_settings(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))
