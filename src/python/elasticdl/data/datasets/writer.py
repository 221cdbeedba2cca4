"""Writing prepared splits as RecordIO shards, atomically and idempotently.

Output layout::

    OUTPUT/train/data-00000.rio ...   RecordIO (snappy), ``records_per_shard`` each
    OUTPUT/test/data-00000.rio ...
    OUTPUT/.elasticdl-dataset.json    manifest, written LAST

Everything is first written under ``OUTPUT/.elasticdl-prepare-*`` and renamed into place, and
the manifest that marks the output complete is written after that, so an interrupted run
never leaves something that looks finished. A later run whose manifest matches (dataset,
parameters, content hash of the inputs, and files present with the recorded sizes) is a no-op.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import Dict, Iterator, List, Optional

from elasticdl.common.job_dir import write_atomically
from elasticdl.data import recordio
from elasticdl.data.datasets.errors import DatasetError
from elasticdl.data.datasets.progress import Progress
from elasticdl.data.datasets.spec import Split

logger = logging.getLogger(__name__)

MANIFEST = ".elasticdl-dataset.json"
MANIFEST_FORMAT = 1
STALE_MANIFEST = MANIFEST + ".replacing"  # marks an output being replaced (still ours)
SPLITS = ("train", "test")
_STAGING_PREFIX = ".elasticdl-prepare-"


@dataclass(frozen=True)
class ShardFile:
    name: str  # relative to the output directory, e.g. "train/data-00000.rio"
    records: int
    bytes: int


def read_manifest(output_dir: str) -> Optional[dict]:
    path = os.path.join(output_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("Ignoring unreadable manifest %s: %s", path, e)
        return None
    return data if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT else None


def manifest_is_complete(output_dir: str, manifest: dict, identity: dict) -> bool:
    """True if ``manifest`` describes ``identity`` and every file it lists is intact."""
    if manifest.get("identity") != identity:
        return False
    for split in SPLITS:
        for f in manifest.get("files", {}).get(split, []):
            path = os.path.join(output_dir, f["name"])
            if not os.path.isfile(path) or os.path.getsize(path) != f["bytes"]:
                return False
    return True


def _check_output_usable(output_dir: str, manifest: Optional[dict]) -> None:
    """Refuse to replace train/ or test/ directories that no prepare run wrote."""
    if manifest is not None or os.path.exists(os.path.join(output_dir, STALE_MANIFEST)):
        return
    for split in SPLITS:
        if os.path.exists(os.path.join(output_dir, split)):
            raise DatasetError(
                f"--output {output_dir!r} already has a {split}/ that elasticdl did not "
                "prepare; choose an empty directory or remove it"
            )


@contextlib.contextmanager
def output_locked(output_dir: str) -> Iterator[None]:
    """Holds an exclusive lock on ``output_dir`` (made if missing) while the block runs: two
    runs preparing the same output (tests sharing one cache, say) take turns, and the second
    finds the first's complete manifest instead of removing its staging directory. The lock is
    the directory's own (``flock`` on it), so nothing is left behind."""
    try:
        os.makedirs(output_dir, exist_ok=True)
        fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise DatasetError(f"--output {output_dir!r}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_splits(
    output_dir: str,
    splits: Dict[str, Split],
    identity: dict,
    records_per_shard: int,
    progress: bool,
) -> Dict[str, List[ShardFile]]:
    os.makedirs(output_dir, exist_ok=True)
    old_manifest = read_manifest(output_dir)
    _check_output_usable(output_dir, old_manifest)
    for name in os.listdir(output_dir):
        # Staging directories of runs that were killed (not just interrupted) are garbage.
        if name.startswith(_STAGING_PREFIX):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=output_dir)
    try:
        files: Dict[str, List[ShardFile]] = {}
        for split in SPLITS:
            data = splits[split]
            os.makedirs(os.path.join(staging, split))
            with Progress(data.num_records, f"{identity['dataset']} {split}", progress) as bar:
                files[split] = _write_shards(staging, split, data, records_per_shard, bar)
        metadata = {s: splits[s].metadata for s in SPLITS if splits[s].metadata}
        _publish(output_dir, staging, files, identity, old_manifest is not None, metadata)
        return files
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_shards(
    staging: str, split: str, data: Split, per_shard: int, bar: Progress
) -> List[ShardFile]:
    out: List[ShardFile] = []
    writer: Optional[recordio.Writer] = None
    count = 0

    def finish() -> None:
        assert writer is not None
        writer.close()
        out.append(ShardFile(rel, writer.num_records, os.path.getsize(writer.path)))

    try:
        for record in data.records:
            if writer is None or writer.num_records >= per_shard:
                if writer is not None:
                    finish()
                rel = f"{split}/data-{len(out):05d}.rio"
                writer = recordio.Writer(os.path.join(staging, rel), compressor="snappy")
            writer.write(record)
            count += 1
            bar.update()
        if writer is not None:
            finish()
            writer = None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if count != data.num_records:
        raise DatasetError(f"{split}: produced {count} records, expected {data.num_records}")
    return out


def _publish(
    output_dir: str,
    staging: str,
    files: Dict[str, List[ShardFile]],
    identity: dict,
    replacing: bool,
    metadata: Optional[dict] = None,
) -> None:
    manifest_path = os.path.join(output_dir, MANIFEST)
    stale_path = os.path.join(output_dir, STALE_MANIFEST)
    if replacing:
        # From here on the output is incomplete: the manifest must no longer say it is
        # complete, but the renamed marker still says the directories are ours to replace.
        os.replace(manifest_path, stale_path)
    for split in SPLITS:
        target = os.path.join(output_dir, split)
        if os.path.exists(target):
            os.replace(target, os.path.join(staging, f"old-{split}"))
        os.replace(os.path.join(staging, split), target)
    manifest = {
        "format": MANIFEST_FORMAT,
        "identity": identity,
        "counts": {s: sum(f.records for f in files[s]) for s in SPLITS},
        "files": {s: [asdict(f) for f in files[s]] for s in SPLITS},
    }
    if metadata:
        manifest["metadata"] = metadata
    write_atomically(manifest_path, json.dumps(manifest, indent=1, sort_keys=True), durable=True)
    if os.path.exists(stale_path):
        os.unlink(stale_path)
