"""The GPU code a shared object carries, read from its ``.nv_fatbin`` ELF section without
cuobjdump (not in any wheel the image uses) and without a GPU.

A CUDA fat binary is a sequence of blocks (magic 0xBA55ED50, a 16-byte header, then entries);
each entry starts with its kind (1: PTX, 2: an ELF cubin of machine code), its header size and
payload size, and holds the target architecture (e.g. 80 for sm_80) at byte 28 of its header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "sass"}


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "ptx" or "sass"
    arch: int  # compute capability x 10: 80 = sm_80


def _section(data: bytes, wanted: str) -> bytes | None:
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    for name, _type, _flags, _addr, offset, size in headers:
        end = data.index(b"\0", strtab + name)
        if data[strtab + name : end].decode() == wanted:
            return data[offset : offset + size]
    return None


def fatbin_entries(path: str | Path) -> list[FatbinEntry]:
    """Every PTX and SASS entry of PATH's fat binaries ([] when it has none)."""
    section = _section(Path(path).read_bytes(), ".nv_fatbin")
    entries: list[FatbinEntry] = []
    pos = 0
    while section is not None and pos + 16 <= len(section):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", section, pos)
        if magic != FATBIN_MAGIC:
            if any(section[pos:]):  # blocks are padded with zeros at the end
                raise ValueError(f"bad fat binary magic {magic:#x} at offset {pos}")
            break
        p, end = pos + header_size, pos + header_size + fat_size
        while p < end:
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", section, p)
            (arch,) = struct.unpack_from("<I", section, p + 28)
            entries.append(FatbinEntry(KINDS.get(kind, str(kind)), arch))
            p += entry_header + payload
        pos = end
    return entries
