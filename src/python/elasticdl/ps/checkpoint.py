"""PS checkpoints in the original ElasticDL layout.

    <checkpoint_dir>/version-<V>/variables-<i>-of-<N>.ckpt

Each file is one serialized `pb.Model`: shard i of N (its dense parameters and non-trainable
state, placed alike, its rows of every embedding table as IndexedSlices, all table infos, the
version, and optimizer slots under `slot:<slot>:<name>` keys, see parameters.py). A version
directory is *valid* once all N files exist; files are written to a temporary name and renamed,
so a crash never leaves a truncated file that looks complete.

Restoring reads every shard file of a version and keeps what the *new* shard owns (dense by
name hash, rows by id % shard_num), so a job may resume on a different number of PS.
"""
from __future__ import annotations

import logging
import os
import re
import shutil

import numpy as np
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import string_to_id
from elasticdl.common.job_dir import write_atomically
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.errors import PSError
from elasticdl.ps.parameters import is_slot_key, parse_slot_key

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
        _discard_incomplete(vdir)
        raise
    if keep_checkpoint_max > 0:
        remove_old_versions(checkpoint_dir, keep_checkpoint_max)
    return path


def _discard_incomplete(vdir: str) -> None:
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
