import os

import numpy as np
import pytest
from elasticdl.common import shared_memory as shm
from elasticdl.proto import elasticdl_pb2 as pb

pytestmark = pytest.mark.skipif(shm.default_directory() is None, reason="needs /dev/shm")

TENSORS = {
    "dense/kernel": (np.float32, (3, 5)),
    "dense/bias": (np.float32, (5,)),
    "scalar": (np.float32, ()),
}


def test_slots_are_aligned_disjoint_and_fit_the_region():
    slots, size = shm.plan_slots(TENSORS)
    assert [s.name for s in slots] == sorted(TENSORS)
    spans = []
    for s in slots:
        assert s.gradient_offset % 4 == 0 and s.parameter_offset % 4 == 0
        spans += [(s.gradient_offset, s.nbytes), (s.parameter_offset, s.nbytes)]
    spans.sort()
    assert spans[0][0] >= shm.HEADER_BYTES
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b
    assert spans[-1][0] + spans[-1][1] <= size
    shm.check_slots(slots, size)  # accepted as planned


def test_one_dtype_packs_into_one_gradient_and_one_parameter_block():
    region = shm.SharedRegion.create(TENSORS, tag="test")
    region.unlink()
    packed = region.packed()
    assert [e[0] for e in packed.entries] == sorted(TENSORS)
    assert packed.gradients.size == packed.parameters.size == 15 + 5 + 1
    packed.gradients[:] = np.arange(21, dtype=np.float32)  # one copy fills every slot
    for name, value in packed.unpack(packed.gradients).items():
        np.testing.assert_array_equal(region.gradient(name), value)
    region.parameter("scalar")[...] = 9
    assert packed.unpack(packed.parameters)["scalar"] == 9
    region.close()
    mixed = shm.SharedRegion.create({"a": (np.float32, (2,)), "b": (np.float64, (2,))}, tag="test")
    mixed.unlink()
    assert mixed.packed() is None  # two dtypes: slot by slot only
    mixed.close()


def test_two_mappings_see_each_others_writes_and_outlive_the_name():
    mine = shm.SharedRegion.create(TENSORS, tag="test")
    theirs = shm.SharedRegion.attach(mine.path, mine.size, mine.token, list(mine.slots.values()))
    mine.unlink()  # the creator's descriptor is closed: the memory stays mapped
    grads = {"dense/kernel": np.arange(15, dtype=np.float32).reshape(3, 5), "scalar": np.float32(2)}
    assert mine.write_gradients(grads) == ["dense/bias"]
    np.testing.assert_array_equal(theirs.gradient("dense/kernel"), grads["dense/kernel"])
    assert theirs.gradient("scalar") == 2
    params = {n: np.full(shape, 7, dtype) for n, (dtype, shape) in TENSORS.items()}
    theirs.write_parameters(params)
    for name, value in mine.parameters().items():
        np.testing.assert_array_equal(value, params[name])
        assert value.shape == TENSORS[name][1]
    theirs.close()
    mine.close()


def _region_and_slots():
    region = shm.SharedRegion.create(TENSORS, tag="test")
    return region, list(region.slots.values())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r, s: dict(token=b"x" * 16), "token differs"),
        (lambda r, s: dict(token=b"short"), "16 bytes"),
        (lambda r, s: dict(size=r.size + 64), "has .* bytes"),
        (lambda r, s: dict(path="/etc/passwd"), "is not /proc/<pid>/fd/<fd>"),
        (lambda r, s: dict(path="/proc/self/fd/0"), "is not /proc/<pid>/fd/<fd>"),
        (lambda r, s: dict(path=r.path + "0000"), "cannot open"),
        (
            lambda r, s: dict(
                slots=[s[0], shm.Slot("x", s[0].dtype, (4,), s[0].gradient_offset, r.size - 64)]
            ),
            "overlap",
        ),
        (
            lambda r, s: dict(slots=[shm.Slot("x", s[0].dtype, (1000,), 64, 128)]),
            "inside the region",
        ),
        (lambda r, s: dict(slots=[shm.Slot("x", s[0].dtype, (1,), 66, 128)]), "aligned"),
    ],
)
def test_attach_refuses_what_is_not_the_workers_region(change, message):
    region, slots = _region_and_slots()
    try:
        args = dict(path=region.path, size=region.size, token=region.token, slots=slots)
        args.update(change(region, slots))
        with pytest.raises(shm.SharedMemoryError, match=message):
            shm.SharedRegion.attach(**args)
    finally:
        region.unlink()
        region.close()


def _open_region_fds():
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{shm.FILE_PREFIX}"):
                fds.append(fd)
        except OSError:
            pass
    return fds


def test_the_region_cannot_change_size_under_the_ps():
    region, slots = _region_and_slots()
    theirs = shm.SharedRegion.attach(region.path, region.size, region.token, slots)
    # Its creator (the only other holder of a descriptor) cannot shrink or grow it: the mapper
    # could never get SIGBUS from a truncation.
    for size in (0, region.size // 2, region.size * 2):
        with pytest.raises(PermissionError):
            os.ftruncate(region._fd, size)
    theirs.gradient("scalar")[...] = 5
    assert region.gradient("scalar") == 5
    theirs.close()
    region.close()


def _hostile(path_of, **seals):
    """An attach of what a hostile worker could offer instead of a sealed region."""
    region, slots = _region_and_slots()
    try:
        with pytest.raises(shm.SharedMemoryError) as refused:
            shm.SharedRegion.attach(path_of(region), region.size, region.token, slots)
        return str(refused.value)
    finally:
        region.close()


def test_attach_refuses_an_unsealed_memfd_a_dev_shm_file_and_other_descriptors(tmp_path):
    import fcntl

    # A memfd of the right name, size and token, but not sealed: its owner could truncate it.
    fd = os.memfd_create(f"{shm.FILE_PREFIX}hostile", os.MFD_ALLOW_SEALING)
    try:
        region, slots = _region_and_slots()
        os.ftruncate(fd, region.size)
        os.pwrite(fd, region.token, 0)
        with pytest.raises(shm.SharedMemoryError, match="not sealed against truncation"):
            shm.SharedRegion.attach(
                f"/proc/{os.getpid()}/fd/{fd}", region.size, region.token, slots
            )
        # Sealed against growing only: still refused.
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
        with pytest.raises(shm.SharedMemoryError, match="not sealed against truncation"):
            shm.SharedRegion.attach(
                f"/proc/{os.getpid()}/fd/{fd}", region.size, region.token, slots
            )
        region.close()
    finally:
        os.close(fd)
    # A /dev/shm file, even 0600 and ours, is refused by name and through a descriptor.
    path = os.path.join(shm.default_directory(), f"{shm.FILE_PREFIX}hostile-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 4096)
        assert "is not /proc/<pid>/fd/<fd>" in _hostile(lambda r: path)
        assert "is not a region's memfd" in _hostile(lambda r: f"/proc/{os.getpid()}/fd/{fd}")
    finally:
        os.close(fd)
        os.unlink(path)
    # Any other descriptor of the process (here a regular file) is not a region either.
    other = tmp_path / "f"
    other.write_bytes(b"x" * 4096)
    with open(other, "rb") as f:
        assert "is not a region's memfd" in _hostile(
            lambda r: f"/proc/{os.getpid()}/fd/{f.fileno()}"
        )


def test_slots_survive_the_wire_form():
    before = _open_region_fds()
    region, slots = _region_and_slots()
    req = pb.AttachSharedMemoryRequest()
    shm.slots_to_pb(slots, req.slots)
    assert (
        shm.slots_from_pb(pb.AttachSharedMemoryRequest.FromString(req.SerializeToString()).slots)
        == slots
    )
    region.close()
    assert _open_region_fds() == before  # no view held: descriptor and mapping are gone


def test_switch():
    assert shm.enabled({})
    assert not shm.enabled({shm.ENV_SWITCH: "0"})


def test_a_region_larger_than_the_free_shared_memory_is_refused_not_mapped():
    import os as _os

    st = _os.statvfs(shm.default_directory())
    before = _open_region_fds()
    too_big = st.f_bavail * st.f_frsize // 4 + (1 << 20)  # float32 elements beyond what is free
    with pytest.raises(shm.SharedMemoryError, match="cannot size or map"):
        shm.SharedRegion.create({"huge": (np.float32, (too_big,))}, tag="test")
    assert _open_region_fds() == before
