"""The GPU base image (deploy/docker/Dockerfile.gpu) built with ``build-images.sh gpu`` on the
REAL engine and checked in containers WITHOUT a GPU (none is here; nor is the NVIDIA container
runtime, so the driver's libcuda.so.1 is the one library no container of it can have):

* the kernels wheel is compiled on the host with nvcc for sm_80 and sm_90: the module says so
  (``cuda_archs()``, nvcc's __CUDA_ARCH_LIST__) and its fat binary holds SASS for both (read
  from its ``.nv_fatbin`` section, see fatbin.py);
* every shared object of the CUDA wheels, of torch and of the kernels resolves all its libraries
  inside the image (``ldd``: nothing "not found" but libcuda.so.1); torch's CUDA libraries find
  TensorFlow's cuDNN, cuBLAS and NCCL;
* TensorFlow 2.16.2 is a CUDA build, torch 2.2.2 a CUDA build with NCCL; both import;
* a model-zoo image on it trains Fashion-MNIST on the CPU (a local job in one container).

The build downloads ~3.1 GB of wheels once per machine into the wheel cache (--download-deps,
as the CPU image test does) and compiles the kernels once per source/nvcc (gpu-native cache).
The image itself is built once per content of its inputs (``containers.cached_base_image``:
the wheels, the build script and Dockerfile, the kernels' sources, the engine's OS base image)
and kept in the engine (~9 GB, one at a time); a run whose inputs are unchanged runs every
check below on the image it finds. It is two images: the dependencies image (TensorFlow, torch,
the CUDA wheels), which build-images.sh builds only when the third-party inputs change and the
engine keeps, and a layer of the project's wheels on it, so a change to the project's sources
costs a build of about a minute, not a reinstall of the CUDA stack. Without the Pants wheels
the tests skip, or fail where ELASTICDL_REQUIRE_ENGINE is set (CI).
"""

from __future__ import annotations

import re

import pytest
from elasticdl_tests.images.containers import (
    ALLREDUCE_JOB,
    JOB_RECORDS,
    PS_JOB,
    assert_built_on_its_dependencies_image,
    assert_trained_every_record,
    cached_base_image,
    copy_out,
    pants_wheels,
    repository_tags,
    run,
    stage_images,
    train_mnist_in_zoo_image,
    unavailable,
)
from elasticdl_tests.images.engine import repo_root
from elasticdl_tests.images.fatbin import FatbinEntry, fatbin_entries

BUILD_TIMEOUT_S = 2400  # a cold machine: ~3.1 GB of wheels, the CUDA compile, a ~9 GB image
TORCH = "2.2.2"

# Prints what the checks need, one KEY value line each; run as the image's user.
PROBE = r"""
import glob, os, subprocess, sysconfig
import elasticdl_native as n, elasticdl.ops as ops
print("NATIVE", n.__file__)
print("ARCHS", *n.cuda_archs())
print("CUDART", n.cuda_runtime_version())
print("DEVICES", n.cuda_device_count(), ops.backend())
import tensorflow as tf
print("TF", tf.__version__, tf.test.is_built_with_cuda(), len(tf.config.list_physical_devices("GPU")))
import torch, torch.distributed as dist
print("TORCH", torch.__version__, torch.version.cuda, dist.is_nccl_available(),
      torch.cuda.is_available())
# The libraries torch loads are TensorFlow's wheels (no GPU needed to ask their versions).
print("TORCH_LIBS", torch.backends.cudnn.version(), ".".join(map(str, torch.cuda.nccl.version())))
site = sysconfig.get_paths()["purelib"]
libs = [n.__file__] + sorted(glob.glob(site + "/nvidia/*/lib/*.so*") + glob.glob(site + "/torch/lib/*.so*"))
print("LIBS", len(libs))
for lib in libs:
    out = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "not found" in line:
            print("MISSING", os.path.relpath(lib, site), line.split()[0])
for lib in ("torch/lib/libtorch_cuda.so", "torch/lib/libc10_cuda.so"):
    out = subprocess.run(["ldd", site + "/" + lib], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "=>" in line and "/nvidia/" in line:
            print("RESOLVED", line.split()[0], os.path.relpath(line.split("=>")[1].split()[0], site))
"""


@pytest.fixture(scope="module")
def gpu_image(engine):
    """The GPU base image built offline from the host's wheel cache, or the one built earlier
    from the same inputs (a ``containers.BaseImage``)."""
    root = repo_root()
    dist = pants_wheels(root)
    if dist is None:
        unavailable(
            "the GPU image installs the Pants wheels' declared requirements: set "
            "ELASTICDL_WHEEL_DIR or run ./pants package //:elasticdl-wheel "
            "src/python:elasticdl-client-wheel"
        )
    return cached_base_image(engine, root, "gpu", dist, "--download-deps", timeout=BUILD_TIMEOUT_S)


def _fields(out: str, key: str) -> list[list[str]]:
    return [m.split() for m in re.findall(rf"^{key} (.*)$", out, re.M)]


def test_gpu_image_has_cuda_builds_whose_libraries_resolve_inside(
    engine, gpu_image, tmp_path, capsys
):
    image, build_s = gpu_image.name, gpu_image.seconds
    client = engine.client()
    out = run(client, image, ["python3", "-c", PROBE], timeout=300)

    # The kernels: compiled for sm_80 and sm_90, a static CUDA runtime, no device here.
    assert _fields(out, "ARCHS") == [["800", "900"]], out[-3000:]
    assert int(_fields(out, "CUDART")[0][0]) >= 12000
    assert _fields(out, "DEVICES") == [["0", "native"]]
    native = copy_out(client, image, _fields(out, "NATIVE")[0][0], tmp_path)
    entries = set(fatbin_entries(native))
    assert {FatbinEntry("sass", 80), FatbinEntry("sass", 90)} <= entries, entries
    assert all(e.arch in (80, 90) for e in entries), entries

    # TensorFlow and torch: CUDA builds (no GPU to list), torch with NCCL.
    assert _fields(out, "TF") == [["2.16.2", "True", "0"]], out[-3000:]
    (torch,) = _fields(out, "TORCH")
    assert torch[0].startswith(TORCH + "+") or torch[0] == TORCH
    assert torch[1].startswith("12.") and torch[2:4] == ["True", "False"], torch
    assert _fields(out, "TORCH_LIBS") == [["8907", "2.19.3"]]  # cuDNN 8.9.7, NCCL 2.19.3

    # Every library of the kernels, the CUDA wheels and torch resolves inside the image, but
    # the driver's, which the NVIDIA container runtime mounts from the host.
    assert int(_fields(out, "LIBS")[0][0]) > 30
    missing = {tuple(f) for f in _fields(out, "MISSING")}
    assert {lib for _, lib in missing} <= {"libcuda.so.1"}, sorted(missing)
    resolved = dict(_fields(out, "RESOLVED"))
    for soname, wheel in [
        ("libcudnn.so.8", "nvidia/cudnn/"),
        ("libcublas.so.12", "nvidia/cublas/"),
        ("libnccl.so.2", "nvidia/nccl/"),
        ("libcudart.so.12", "nvidia/cuda_runtime/"),
    ]:
        assert resolved.get(soname, "").startswith(wheel), (soname, resolved)

    # The wheels stayed in the install stages (of the dependencies and of the project), whose
    # images the build script deleted.
    assert not any("/tmp/wheels" in h["CreatedBy"] for h in client.history(image))
    assert [i[:19] for i in stage_images(client, gpu_image.stage_id)] == []
    # One GPU base image is kept in the engine, whatever earlier runs built, and the
    # dependencies image under it, to which the project's wheels add a few MB.
    assert repository_tags(client, "elasticdl-test/base-gpu") == [image]
    assert_built_on_its_dependencies_image(client, gpu_image, "gpu")
    size_gb = client.inspect_image(image)["Size"] / 1e9
    built = f"built in {build_s:.1f}s" if build_s else "reused (its inputs are unchanged)"
    with capsys.disabled():
        print(f"\nGPU base image: {built}, {size_gb:.2f} GB")


def test_cpu_jobs_run_in_a_zoo_image_on_the_gpu_image(
    docker_env, gpu_image, tmp_path, monkeypatch, capsys
):
    """A parameter-server job, and an AllReduce job: the framework's torch.distributed code
    (Gloo here, no GPU) on the image's torch 2.2.2 instead of the CPU image's 2.13."""
    base = gpu_image.name
    ps, allreduce = train_mnist_in_zoo_image(
        docker_env.client(), base, tmp_path, monkeypatch, jobs=(PS_JOB, ALLREDUCE_JOB)
    )
    assert_trained_every_record(ps)
    assert_trained_every_record(allreduce, ps=False)
    with capsys.disabled():
        print(
            f"\nPS + AllReduce CPU jobs in the GPU image: {JOB_RECORDS} records each, {ps.seconds:.1f}s"
        )
