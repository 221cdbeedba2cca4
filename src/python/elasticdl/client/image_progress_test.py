"""Progress display fed with engine stream chunks as the Docker Engine API sends them
(recorded from dockerd 20.10 / podman 4.3; no engine needed here -- the real-engine tests are
in tests/python/elasticdl_tests/images)."""

from __future__ import annotations

import io

from elasticdl.client.image_progress import BuildProgress, PushProgress

BUILD_STREAM = [
    {"stream": "Step 1/3 : FROM local/base"},
    {"stream": "\n"},
    {"stream": " ---> f2f531c50ac7\n"},
    {"stream": "Step 2/3 : RUN pip install -r r.txt\n"},
    {"stream": " ---> Using cache\n"},
    {"stream": " ---> 0a1b2c3d4e5f\n"},
    {"stream": "Step 3/3 : COPY zoo /model_zoo\n"},
    {"stream": " ---> Running in 99aa\n"},
    {"stream": "hello from RUN\nsecond line\n"},
    {"stream": "Removing intermediate container 99aa\n"},
    {"aux": {"ID": "sha256:" + "ab" * 32}},
    {"stream": "Successfully built abababababab\n"},
    {"stream": "Successfully tagged zoo:v1\n"},
]


def test_build_progress_lines_and_cache():
    out = io.StringIO()
    p = BuildProgress(out=out)
    for chunk in BUILD_STREAM:
        p.feed(chunk)
    assert out.getvalue().splitlines() == [
        "[1/3] FROM local/base",
        "[2/3] RUN pip install -r r.txt",
        "      (cached)",
        "[3/3] COPY zoo /model_zoo",
        "      | hello from RUN",
        "      | second line",
    ]
    assert p.cached_steps == [2]
    assert p.image_id == "sha256:" + "ab" * 32
    assert p.where == "at step 3/3 (COPY zoo /model_zoo)"


def test_build_progress_podman_format():
    p = BuildProgress(out=io.StringIO())
    for line in (
        "STEP 1/2: FROM local/base",
        "STEP 2/2: COPY . /m",
        "--> Using cache 1234",
        "--> 5678",
    ):
        p.feed({"stream": line + "\n"})
    assert (p.step, p.steps_total, p.instruction) == (2, 2, "COPY . /m")


PUSH_STREAM = [
    {"status": "The push refers to repository [127.0.0.1:5000/t/m]"},
    {"status": "Preparing", "progressDetail": {}, "id": "aaa"},
    {"status": "Preparing", "progressDetail": {}, "id": "bbb"},
    {
        "status": "Pushing",
        "progressDetail": {"current": 500, "total": 1000},
        "progress": "[==>  ]",
        "id": "aaa",
    },
    {"status": "Layer already exists", "progressDetail": {}, "id": "bbb"},
    {"status": "Pushing", "progressDetail": {"current": 1000, "total": 1000}, "id": "aaa"},
    {"status": "Pushed", "progressDetail": {}, "id": "aaa"},
    {"status": "v1: digest: sha256:" + "cd" * 32 + " size: 740"},
    {"progressDetail": {}, "aux": {"Tag": "v1", "Digest": "sha256:" + "cd" * 32, "Size": 740}},
]


def test_push_progress_log_mode():
    out = io.StringIO()
    p = PushProgress(image="127.0.0.1:5000/t/m:v1", out=out, tty=False)
    for chunk in PUSH_STREAM:
        p.feed(chunk)
    p.finish()
    assert out.getvalue().splitlines() == ["  bbb: Layer already exists", "  aaa: Pushed"]
    assert p.digest == "sha256:" + "cd" * 32
    assert (p.layers_pushed, p.layers_existing) == (1, 1)


def test_push_progress_bar_on_a_terminal():
    out = io.StringIO()
    p = PushProgress(image="t/m:v1", out=out, tty=True, min_redraw_s=0.0)
    for chunk in PUSH_STREAM:
        p.feed(chunk)
    p.finish()
    frames = out.getvalue().split("\r")
    assert "50%" in out.getvalue()
    assert frames[-1].startswith("pushing t/m:v1 [" + "#" * 30 + "] 100%")
    assert frames[-1].endswith("2/2 layers\n")
