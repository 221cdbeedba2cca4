"""Shared-memory regions: the same-host fast path for the dense model between a worker and a PS.

Why: in a sync PS job every minibatch moves the whole dense model twice (gradients up,
parameters back). Through gRPC that is a serialisation, a copy into HTTP/2 frames, a copy out
and a parse on each side; on one host (the local platform) both processes can simply map the
same memory. The control messages still go through gRPC (`attach_shared_memory`, then pushes
that name the region), so ordering, errors, retries and a PS relaunch behave as with messages.

Layout of a region (a sealed memfd): a 64-byte header whose first 16 bytes are a random token
(the PS checks it to be sure it mapped the worker's memory, not another file), then for every
dense parameter of that PS a gradient slot and a parameter slot, each 64-byte aligned.

Who touches what, when: the worker writes the gradient slots, then blocks in the push RPC; the
PS reads them and, before answering, writes the parameter slots; the worker reads those after
the answer and before its next push. A worker's calls to one PS are sequential, so the RPC
itself orders every access and no lock is needed.

Why a sealed memfd and not a file in /dev/shm: a mapping of a file that its owner truncates
kills the mapper with SIGBUS on the next touch, and the worker (or any process of its user
holding the file) could do that to the PS. The worker creates the region with
`memfd_create(MFD_ALLOW_SEALING)`, sizes it and seals it against shrinking and growing
(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): from then on the kernel refuses every truncation,
by anyone. The PS opens the worker's descriptor through /proc/<worker pid>/fd/<fd> (the same
user and PID namespace only: the local platform's siblings) and maps it only after reading the
seals itself from the descriptor it opened, so a request cannot point it at an unsealed file.

Lifetime: the worker closes its descriptor as soon as the PS answered the attach call, so the
memory lives exactly as long as one of the two mappings; it never has a name in any file system.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import re
import secrets
import stat
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

ALIGN = 64
HEADER_BYTES = 64
TOKEN_BYTES = 16
DEFAULT_DIRECTORY = "/dev/shm"
FILE_PREFIX = "elasticdl-shm-"
ENV_SWITCH = "ELASTICDL_SHARED_MEMORY"  # "0" turns the fast path off in workers
# What the PS requires of a region before it maps it: no one can change its size any more.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_FD_PATH = re.compile(r"/proc/([0-9]{1,10})/fd/([0-9]{1,10})")


class SharedMemoryError(RuntimeError):
    """A region cannot be created or mapped; the message says why (the caller falls back)."""


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def default_directory() -> Optional[str]:
    """/dev/shm where it exists and memfds can be sealed (Linux); None elsewhere, which
    disables the fast path. Its free space is the budget a region must fit in."""
    if not hasattr(os, "memfd_create") or not os.path.isdir(DEFAULT_DIRECTORY):
        return None
    return DEFAULT_DIRECTORY


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Slot:
    """Where one dense tensor's gradient and parameter live in a region."""

    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]
    gradient_offset: int
    parameter_offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def plan_slots(tensors: Mapping[str, Tuple[np.dtype, Sequence[int]]]) -> Tuple[List[Slot], int]:
    """Slots for `{name: (dtype, shape)}` in name order, and the region size they need.

    All gradient slots come first, then all parameter slots, each packed back to back (aligned
    to its dtype): a model of one dtype then has one flat gradient block and one flat parameter
    block, which a worker can fill and read with a single copy each."""
    specs = []
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        specs.append((name, np.dtype(dtype), tuple(int(d) for d in shape)))
    offsets: Dict[str, List[int]] = {name: [] for name, _, _ in specs}
    offset = HEADER_BYTES
    for _block in ("gradient", "parameter"):
        offset = _aligned(offset)
        for name, dtype, shape in specs:
            offset = (offset + dtype.itemsize - 1) // dtype.itemsize * dtype.itemsize
            offsets[name].append(offset)
            offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    slots = [Slot(n, d, sh, *offsets[n]) for n, d, sh in specs]
    return slots, _aligned(offset)


def check_slots(slots: Iterable[Slot], size: int) -> None:
    """Every slot inside the region, past the header, not overlapping another one."""
    spans = []
    for s in slots:
        if any(d < 0 for d in s.shape):
            raise SharedMemoryError(f"slot {s.name!r}: negative dimension in shape {s.shape}")
        for what, at in (("gradient", s.gradient_offset), ("parameter", s.parameter_offset)):
            if at % s.dtype.itemsize or at < HEADER_BYTES or at + s.nbytes > size:
                raise SharedMemoryError(
                    f"slot {s.name!r}: {what} bytes [{at}, {at + s.nbytes}) are not a "
                    f"{s.dtype.itemsize}-byte aligned range inside the region's "
                    f"[{HEADER_BYTES}, {size})"
                )
            spans.append((at, at + s.nbytes, s.name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise SharedMemoryError(f"slots {a!r} and {b!r} overlap")


class SharedRegion:
    """One mapped region and numpy views of its slots."""

    def __init__(self, path: str, size: int, token: bytes, slots: Sequence[Slot], buf: mmap.mmap):
        self.path = path
        self.size = size
        self.token = token
        self.slots: Dict[str, Slot] = {s.name: s for s in slots}
        self._buf = buf
        self._views: Dict[Tuple[str, str], np.ndarray] = {}
        self._packed = None  # PackedBlocks, or False once found not packable
        self._fd: Optional[int] = None  # the creator's memfd until `unlink`

    # ------------------------------------------------------------------ both ends
    @classmethod
    def create(
        cls,
        tensors: Mapping[str, Tuple[np.dtype, Sequence[int]]],
        directory: Optional[str] = None,
        tag: str = "",
    ) -> "SharedRegion":
        """A new region for `tensors` (the worker's side): a sealed memfd, mapped, whose
        descriptor stays open (for the PS to open) until `unlink`."""
        directory = directory or default_directory()
        if directory is None:
            raise SharedMemoryError("no /dev/shm or sealable memfd on this host")
        slots, size = plan_slots(tensors)
        token = secrets.token_bytes(TOKEN_BYTES)
        name = f"{FILE_PREFIX}{tag + '-' if tag else ''}{os.getpid()}-{secrets.token_hex(6)}"
        # A memfd is not bounded by /dev/shm's size: hold it to that budget anyway, so a host
        # (or container) with little shared memory falls back to messages instead of swapping.
        st = os.statvfs(directory)
        if size > st.f_bavail * st.f_frsize:
            raise SharedMemoryError(
                f"cannot size or map a region of {size} bytes: {directory} has "
                f"{st.f_bavail * st.f_frsize} bytes free"
            )
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as e:
            raise SharedMemoryError(f"cannot create a memfd: {e.strerror}") from None
        try:
            # Reserve the pages now: memory that runs out later would kill both processes with
            # SIGBUS on first touch, where this fails cleanly (ENOSPC) and we fall back.
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
            buf = mmap.mmap(fd, size)
        except OSError as e:
            os.close(fd)
            raise SharedMemoryError(f"cannot size or map a region of {size} bytes: {e}") from None
        buf[:TOKEN_BYTES] = token
        region = cls(f"/proc/{os.getpid()}/fd/{fd}", size, token, slots, buf)
        region._fd = fd
        return region

    @classmethod
    def attach(
        cls,
        path: str,
        size: int,
        token: bytes,
        slots: Sequence[Slot],
        directory: Optional[str] = None,
    ) -> "SharedRegion":
        """Map a region another process created (the PS's side), after checking it is that one.

        `path` must be /proc/<pid>/fd/<fd> naming one of this user's memfds created by `create`
        and sealed against every size change: the PS writes into the region, so a request must
        not be able to point it at any other file, and no one may truncate it under the PS.
        """
        match = _FD_PATH.fullmatch(path)
        if match is None:
            raise SharedMemoryError(
                f"region path {path!r} is not /proc/<pid>/fd/<fd>: a worker passes its sealed "
                "memfd (an older worker's /dev/shm file is refused, as its owner could "
                "truncate it under the PS)"
            )
        if len(token) != TOKEN_BYTES:
            raise SharedMemoryError(f"region token must be {TOKEN_BYTES} bytes, got {len(token)}")
        check_slots(slots, size)
        try:
            target = os.readlink(path)
        except OSError as e:
            raise SharedMemoryError(f"cannot open {path} here: {e.strerror}") from None
        if not target.startswith(f"/memfd:{FILE_PREFIX}"):
            raise SharedMemoryError(f"{path} is not a region's memfd (it is {target!r})")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as e:
            raise SharedMemoryError(f"cannot open {path} here: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SharedMemoryError(f"{path} is not a regular file")
            if st.st_uid != os.getuid():
                raise SharedMemoryError(f"{path} belongs to uid {st.st_uid}, not this PS's user")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0
            if seals & REQUIRED_SEALS != REQUIRED_SEALS:
                raise SharedMemoryError(
                    f"{path} is not sealed against truncation (seals {seals:#x}, need "
                    f"{REQUIRED_SEALS:#x}): its owner could shrink it under the PS"
                )
            actual = st.st_size
            if actual != size:
                raise SharedMemoryError(f"{path} has {actual} bytes, the request says {size}")
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if buf[:TOKEN_BYTES] != token:
            buf.close()
            raise SharedMemoryError(f"{path} here is not the worker's region (token differs)")
        return cls(path, size, token, slots, buf)

    def unlink(self) -> None:
        """Close the creator's descriptor (the PS has opened its own, or never will); the memory
        stays until every mapping is closed."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.unlink()
        self._views.clear()
        self._packed = False
        try:
            self._buf.close()
        except BufferError:
            # A caller still holds a view: the mapping goes when the last view does.
            pass

    # ------------------------------------------------------------------ slots
    def _view(self, name: str, which: str) -> np.ndarray:
        key = (name, which)
        view = self._views.get(key)
        if view is None:
            slot = self.slots[name]
            at = slot.gradient_offset if which == "g" else slot.parameter_offset
            count = slot.nbytes // slot.dtype.itemsize
            view = np.frombuffer(self._buf, slot.dtype, count, at).reshape(slot.shape)
            self._views[key] = view
        return view

    def gradient(self, name: str) -> np.ndarray:
        return self._view(name, "g")

    def parameter(self, name: str) -> np.ndarray:
        return self._view(name, "p")

    # ------------------------------------------------------------------ packed blocks
    def packed(self) -> Optional["PackedBlocks"]:
        """The flat gradient and parameter blocks, when the slots are one dtype packed back to
        back in name order (as `plan_slots` lays them out); None otherwise."""
        if self._packed is False:
            return None
        if self._packed is None:
            self._packed = _packed_blocks(self) or False
        return self._packed or None

    def write_gradients(self, grads: Mapping[str, np.ndarray]) -> List[str]:
        """Copy `grads` into their slots; returns the slot names that got no gradient."""
        for name, grad in grads.items():
            np.copyto(self.gradient(name), grad, casting="same_kind")
        return [name for name in self.slots if name not in grads]

    def write_parameters(self, params: Mapping[str, np.ndarray]) -> None:
        for name in self.slots:
            np.copyto(self.parameter(name), params[name], casting="same_kind")

    def parameters(self) -> Dict[str, np.ndarray]:
        """Views of the parameter slots: valid until the next push through this region."""
        return {name: self.parameter(name) for name in self.slots}


@dataclass(frozen=True)
class PackedBlocks:
    """A region's slots as two flat arrays: `entries` are (name, element offset, size, shape)
    in block order, the same for both blocks."""

    entries: Tuple[Tuple[str, int, int, Tuple[int, ...]], ...]
    gradients: np.ndarray
    parameters: np.ndarray

    def unpack(self, block: np.ndarray) -> Dict[str, np.ndarray]:
        return unpack_block(self.entries, block)


def unpack_block(entries, block: np.ndarray) -> Dict[str, np.ndarray]:
    """Views of one tensor each in a flat `block`, by (name, offset, size, shape) entries."""
    return {n: block[o : o + k].reshape(shape) for n, o, k, shape in entries}


def _packed_blocks(region: SharedRegion) -> Optional[PackedBlocks]:
    slots = [region.slots[n] for n in sorted(region.slots)]
    if not slots or len({s.dtype for s in slots}) != 1:
        return None
    dtype = slots[0].dtype
    entries, count = [], 0
    for s in slots:
        if (
            s.gradient_offset != slots[0].gradient_offset + count * dtype.itemsize
            or s.parameter_offset != slots[0].parameter_offset + count * dtype.itemsize
        ):
            return None
        n = s.nbytes // dtype.itemsize
        entries.append((s.name, count, n, s.shape))
        count += n
    buf = region._buf
    return PackedBlocks(
        tuple(entries),
        np.frombuffer(buf, dtype, count, slots[0].gradient_offset),
        np.frombuffer(buf, dtype, count, slots[0].parameter_offset),
    )


# ---------------------------------------------------------------------------------- wire form
def slots_to_pb(slots: Iterable[Slot], out) -> None:
    """Append `slots` to a repeated `SharedTensorSlot` field."""
    from elasticdl.common.tensor_utils import dtype_to_pb

    for s in slots:
        out.add(
            name=s.name,
            dtype=dtype_to_pb(s.dtype),
            shape=list(s.shape),
            gradient_offset=s.gradient_offset,
            parameter_offset=s.parameter_offset,
        )


def slots_from_pb(messages) -> List[Slot]:
    from elasticdl.common.tensor_utils import pb_to_dtype

    try:
        return [
            Slot(
                m.name,
                pb_to_dtype(m.dtype),
                tuple(int(d) for d in m.shape),
                int(m.gradient_offset),
                int(m.parameter_offset),
            )
            for m in messages
        ]
    except TypeError as e:
        raise SharedMemoryError(str(e)) from None
