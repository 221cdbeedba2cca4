"""PS checkpoints in the original ElasticDL layout.

    <checkpoint_dir>/version-<V>/variables-<i>-of-<N>.ckpt

Each file is one serialized `pb.Model`: shard i of N (its dense parameters and non-trainable
state, placed alike, its rows of every embedding table as IndexedSlices, all table infos, the
version, and optimizer slots under `slot:<slot>:<name>` keys, see parameters.py). A table info
carries the table's vocabulary, so a restored table gets its direct id index back
(elasticdl.ps.id_index); a checkpoint written before it did reads as vocabulary 0 (unknown:
the hash map alone, same rows). A version
directory is *valid* once all N files exist; files are written to a temporary name and renamed,
so a crash never leaves a truncated file that looks complete.

Restoring reads every shard file of a version and keeps what the *new* shard owns (dense by
name hash, rows by id % shard_num), so a job may resume on a different number of PS.

A shard is written either from a `pb.Model` (`save_shard`: the save_checkpoint RPC) or
straight from the PS's arrays (`shard_pieces`, the background writer of
elasticdl.ps.snapshot_writer): the same protobuf encoding produced field by field, each
table's rows in block order (a reader does not care about the order), so no message and no
sorted copy of a table is ever built. A file must stay under protobuf's 2 GiB message limit
to be read back (`MAX_SHARD_BYTES`): a larger shard is refused before anything is written.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from typing import Iterable

import numpy as np
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import string_to_id
from elasticdl.common.job_dir import write_atomically
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.errors import PSError
from elasticdl.ps.parameters import Parameters, is_slot_key, parse_slot_key, slot_key

logger = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"^version-(\d+)$")
_SHARD_FILE = re.compile(r"^variables-(\d+)-of-(\d+)\.ckpt$")


class CheckpointError(PSError):
    pass


def version_dir(checkpoint_dir: str, version: int) -> str:
    return os.path.join(checkpoint_dir, f"version-{version}")


def shard_file_name(shard_index: int, shard_num: int) -> str:
    return f"variables-{shard_index}-of-{shard_num}.ckpt"


def shard_path(checkpoint_dir: str, version: int, shard_index: int, shard_num: int) -> str:
    return os.path.join(
        version_dir(checkpoint_dir, version), shard_file_name(shard_index, shard_num)
    )


def _shard_files(vdir: str) -> dict[int, tuple[int, str]]:
    """{shard_index: (shard_num, path)} of the complete shard files in a version dir."""
    out = {}
    try:
        names = os.listdir(vdir)
    except FileNotFoundError:
        return out
    for name in names:
        m = _SHARD_FILE.match(name)
        if m:
            out[int(m.group(1))] = (int(m.group(2)), os.path.join(vdir, name))
    return out


def is_valid_version_dir(vdir: str) -> bool:
    files = _shard_files(vdir)
    if not files:
        return False
    nums = {n for n, _ in files.values()}
    return len(nums) == 1 and set(files) == set(range(nums.pop()))


def list_version_dirs(checkpoint_dir: str, valid_only: bool = True) -> list[tuple[int, str]]:
    """[(version, path)] sorted by version ascending."""
    out = []
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return out
    for name in names:
        m = _VERSION_DIR.match(name)
        path = os.path.join(checkpoint_dir, name)
        if m and os.path.isdir(path) and (not valid_only or is_valid_version_dir(path)):
            out.append((int(m.group(1)), path))
    return sorted(out)


def get_latest_valid_version_dir(checkpoint_dir: str) -> str | None:
    dirs = list_version_dirs(checkpoint_dir)
    return dirs[-1][1] if dirs else None


def save_shard(
    model: pb.Model,
    checkpoint_dir: str,
    shard_index: int,
    shard_num: int,
    keep_checkpoint_max: int = 0,
) -> str:
    """Write one PS's shard of version `model.version` atomically; returns the file path. Then,
    if keep_checkpoint_max > 0, delete the oldest valid versions beyond that many."""
    path = shard_path(checkpoint_dir, model.version, shard_index, shard_num)
    vdir = os.path.dirname(path)
    try:
        os.makedirs(vdir, exist_ok=True)
        write_atomically(path, model.SerializeToString(), mode=0o600, durable=True)
    except BaseException:
        discard_incomplete(vdir)
        raise
    drop_other_shard_counts(vdir, shard_num)
    if keep_checkpoint_max > 0:
        remove_old_versions(checkpoint_dir, keep_checkpoint_max)
    return path


def save_shard_pieces(
    pieces: Iterable[bytes | memoryview],
    version: int,
    checkpoint_dir: str,
    shard_index: int,
    shard_num: int,
    keep_checkpoint_max: int = 0,
) -> str:
    """`save_shard` for a shard given as the pieces of its encoding (`shard_pieces`)."""
    path = shard_path(checkpoint_dir, version, shard_index, shard_num)
    vdir = os.path.dirname(path)
    try:
        os.makedirs(vdir, exist_ok=True)
        write_atomically(path, pieces, mode=0o600, durable=True)
    except BaseException:
        discard_incomplete(vdir)
        raise
    drop_other_shard_counts(vdir, shard_num)
    if keep_checkpoint_max > 0:
        remove_old_versions(checkpoint_dir, keep_checkpoint_max)
    return path


# Protobuf refuses to parse a message of 2 GiB or more: a shard file must stay below.
MAX_SHARD_BYTES = (1 << 31) - 1
_LEN, _VARINT = 2, 0
_MODEL_VERSION, _MODEL_INFOS, _MODEL_DENSE, _MODEL_TABLES, _MODEL_STATE = 1, 2, 3, 4, 5


def shard_pieces(params: Parameters) -> tuple[list[bytes | memoryview], int]:
    """The serialized `pb.Model` of `params` (what `params.to_model_pb()` holds, slots
    included) as pieces to write one after the other, and their total size. The large pieces
    are views of the PS's own arrays, not copies: what the background writer's forked child
    writes from its copy-on-write view of them. Raises CheckpointError for a shard protobuf
    could not read back."""
    pieces: list[bytes | memoryview] = [_tag(_MODEL_VERSION, _VARINT), tu._varint(params.version)]
    for name, table in params.embedding_tables.items():
        info = [
            _string_field(1, name),
            _tag(2, _VARINT),
            tu._varint(table.dim),
            _string_field(3, table.initializer),
            _tag(4, _VARINT),
            tu._varint(pb.DT_FLOAT32),
        ]
        if table.vocabulary:  # proto3 leaves a zero out, as SerializeToString does
            info += [_tag(5, _VARINT), tu._varint(table.vocabulary)]
        pieces += _message_field(_MODEL_INFOS, info)
    for name, value in params.dense.items():
        pieces += _map_entry(_MODEL_DENSE, name, tu.ndarray_to_tensor_pieces(value))
    for slot, per_param in params.dense_slots.items():
        for name, value in per_param.items():
            key = slot_key(slot, name)
            pieces += _map_entry(_MODEL_DENSE, key, tu.ndarray_to_tensor_pieces(value))
    for name, value in params.state.items():
        pieces += _map_entry(_MODEL_STATE, name, tu.ndarray_to_tensor_pieces(value))
    for name, table in params.embedding_tables.items():
        ids = tu.ndarray_to_tensor_pieces(table.ids)  # row r holds id ids[r]: block order
        blocks = [(name, table.values)]
        blocks += [(slot_key(slot, name), table.slot(slot)) for slot in table.slot_names]
        for key, block in blocks:
            slices = _message_field(1, tu.ndarray_to_tensor_pieces(block)) + _message_field(2, ids)
            pieces += _map_entry(_MODEL_TABLES, key, slices)
    total = sum(memoryview(p).nbytes for p in pieces)
    if total > MAX_SHARD_BYTES:
        raise CheckpointError(
            f"PS {params.ps_id}'s shard is {total / 2**30:.2f} GiB, more than protobuf can read "
            "back (2 GiB); spread the model over more PS (--num_ps_pods)"
        )
    return pieces, total


def _tag(field: int, wire: int) -> bytes:
    return tu._varint(field << 3 | wire)


def _string_field(field: int, text: str) -> bytes:
    data = text.encode()
    return _tag(field, _LEN) + tu._varint(len(data)) + data


def _message_field(field: int, body: list) -> list:
    size = sum(memoryview(p).nbytes for p in body)
    return [_tag(field, _LEN) + tu._varint(size), *body]


def _map_entry(field: int, key: str, value: list) -> list:
    """One entry of a map<string, message> field: {1: key, 2: value}."""
    return _message_field(field, [_string_field(1, key), *_message_field(2, value)])


def write_failure(ps_id: int, version: int, directory: str, err: OSError) -> str:
    """One line: why PS ``ps_id`` could not write ``version``, which checkpoint stays, the fix."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        cause, fix = (
            "no space left on the device",
            "free space there or choose another --checkpoint_dir",
        )
    else:
        cause, fix = err.strerror or str(err), "check --checkpoint_dir"
    latest = get_latest_valid_version_dir(directory)
    return (
        f"PS {ps_id} did not write checkpoint version {version} to {directory}: {cause}; "
        f"the newest complete checkpoint {latest or '(none yet)'} is kept; {fix}"
    )


def drop_other_shard_counts(vdir: str, shard_num: int) -> None:
    """Remove the shard files of another PS count from ``vdir``: a job whose PS count changed
    twice at one model version (scaled up, then down before any training) writes that version
    again with the new count, and a directory holding two counts would be read as incomplete.
    Both sets hold the same model (nothing trained in between), so nothing is lost."""
    try:
        names = os.listdir(vdir)
    except FileNotFoundError:
        return
    for name in names:
        m = _SHARD_FILE.match(name)
        if m and int(m.group(2)) != shard_num:
            try:
                os.remove(os.path.join(vdir, name))
            except FileNotFoundError:
                pass


def discard_incomplete(vdir: str) -> None:
    """After this PS failed to write its shard of a version (a full disk), that version can
    never become complete: remove what the other PS wrote of it, so it does not hold space
    that the next checkpoints need. A version dir that is complete anyway is left alone."""
    if not is_valid_version_dir(vdir):
        shutil.rmtree(vdir, ignore_errors=True)


def remove_old_versions(checkpoint_dir: str, keep_checkpoint_max: int) -> None:
    """Delete the oldest *valid* version dirs so at most `keep_checkpoint_max` remain. Invalid
    (still being written by other PS) dirs are never touched. Several PS may race here; a dir
    already removed by another is fine."""
    valid = list_version_dirs(checkpoint_dir)
    for version, path in valid[: max(0, len(valid) - keep_checkpoint_max)]:
        logger.info("removing old checkpoint %s", path)
        shutil.rmtree(path, ignore_errors=True)


def read_shard(path: str) -> pb.Model:
    with open(path, "rb") as f:
        data = f.read()
    try:
        return pb.Model.FromString(data)
    except Exception as e:  # protobuf's DecodeError
        raise CheckpointError(f"checkpoint file {path} is corrupt: {e}") from None


def resolve_version_dir(path: str) -> str:
    """`path` may be a version dir or a checkpoint dir (then its newest valid version)."""
    if _VERSION_DIR.match(os.path.basename(os.path.normpath(path))):
        if not is_valid_version_dir(path):
            raise CheckpointError(
                f"checkpoint {path} is incomplete or missing: it needs all "
                "variables-<i>-of-<N>.ckpt files"
            )
        return path
    latest = get_latest_valid_version_dir(path)
    if latest is None:
        raise CheckpointError(f"no valid checkpoint (version-<V> dir with all shards) in {path}")
    return latest


def restore_newest_readable(
    checkpoint_dir: str, shard_index: int, shard_num: int
) -> tuple[pb.Model, str] | None:
    """Shard ``shard_index`` from the newest complete version under ``checkpoint_dir`` that
    can be read; a version whose files are corrupt (a disk that filled up, a torn copy) is
    skipped with a warning in favour of the one before it. None when there is none."""
    for _, vdir in reversed(list_version_dirs(checkpoint_dir)):
        try:
            return restore(vdir, shard_index, shard_num), vdir
        except (CheckpointError, OSError) as e:
            logger.warning("skipping checkpoint %s: %s", vdir, e)
    return None


def restore(path: str, shard_index: int, shard_num: int) -> pb.Model:
    """The Model of shard `shard_index` of `shard_num` PS, rebuilt from all shard files of the
    checkpoint at `path` (a version dir, or a checkpoint dir -> newest valid version)."""
    if shard_num <= 0 or not 0 <= shard_index < shard_num:
        raise CheckpointError(f"shard_index must be in [0, {shard_num}), got {shard_index}")
    vdir = resolve_version_dir(path)
    out = pb.Model()
    version = None
    infos: dict[str, pb.EmbeddingTableInfo] = {}
    rows: dict[str, list[tu.IndexedRows]] = {}
    for index, (_, file_path) in sorted(_shard_files(vdir).items()):
        shard = read_shard(file_path)
        if version is None:
            version = shard.version
        elif shard.version != version:
            raise CheckpointError(
                f"checkpoint {vdir} mixes versions: {file_path} has {shard.version}, "
                f"others {version}"
            )
        for info in shard.embedding_table_infos:
            infos.setdefault(info.name, info)
        for name, tensor in shard.dense_parameters.items():
            owner = parse_slot_key(name)[1] if is_slot_key(name) else name
            if string_to_id(owner, shard_num) == shard_index:
                out.dense_parameters[name].CopyFrom(tensor)
        for name, tensor in shard.state.items():
            if string_to_id(name, shard_num) == shard_index:
                out.state[name].CopyFrom(tensor)
        for name, slices in shard.embedding_tables.items():
            r = tu.pb_to_indexed_rows(slices)
            mine = (r.indices % shard_num) == shard_index
            if mine.any():
                rows.setdefault(name, []).append(tu.IndexedRows(r.values[mine], r.indices[mine]))
    out.version = version
    for info in infos.values():
        out.embedding_table_infos.add().CopyFrom(info)
    for name, parts in rows.items():
        merged = tu.IndexedRows(
            np.concatenate([p.values for p in parts]), np.concatenate([p.indices for p in parts])
        )
        tu.indexed_rows_to_pb(merged, out.embedding_tables[name])
    logger.info(
        "restored shard %d of %d from %s (version %d)", shard_index, shard_num, vdir, version
    )
    return out
