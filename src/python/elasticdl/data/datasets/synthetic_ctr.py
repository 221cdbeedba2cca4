"""synthetic_ctr: a Criteo-shaped click dataset drawn from a hidden logistic model.

Each row has 13 dense features (log1p of exponential "counts", like Criteo's integer columns
after the usual transform) and ``features`` categorical ids, each Zipf-distributed over its own
vocabulary of ``vocab`` ids (rank ``k`` has probability ~ ``k ** -zipf``; the ranks are
scattered over the id space by a per-feature affine map, as hashing would). The label is drawn
from ``sigmoid(bias + sum_f w_f(id_f) + dense . w_dense)``, where ``w_f(id)`` comes from a hash
of ``(seed, f, id)``: no table of 10^8 weights is ever built. Because the generating model is
known, so is the best AUC any model can reach on the data (the AUC of the true probabilities
against the drawn labels); it is computed on the test split and stored in the manifest.

Record schema (``tf.train.Example``)::

    dense        float_list, 13 values
    categorical  int64_list, ``features`` values, feature f's id in [0, vocab)
    label        int64_list, one value in {0, 1}

Rows are generated in blocks of ``BLOCK`` from ``SeedSequence([seed, block])``: the output is a
function of the parameters alone, whatever the shard size. Everything is vectorised with NumPy,
including the protobuf encoding of the records (varints included).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
from elasticdl.data.datasets.errors import DatasetError
from elasticdl.data.datasets.spec import DatasetSpec, Inputs, Split
from elasticdl.data.example_codec import feature_entry, float_feature, int64_feature

NUM_DENSE = 13
MAX_VOCAB = 10**8
MAX_FEATURES = 256
MAX_ROWS = 10**10
MAX_ZIPF = 5.0
BLOCK = 65536
TEST_FRACTION = 0.1
AUC_ROWS = 2_000_000  # test rows the AUC ceiling is computed on (the first ones)
TARGET_POSITIVE_RATE = 0.25  # about Criteo's click rate
CATEGORICAL_LOGIT_STD = 1.5  # std of the summed categorical weights
DENSE_LOGIT_STD = 0.6
_MULTIPLIERS = (1_000_000_007, 998_244_353, 754_974_721)  # primes; one is coprime with vocab


@dataclass(frozen=True)
class CtrParams:
    """The flags of ``elasticdl dataset prepare synthetic_ctr``."""

    rows: int = 1_000_000
    features: int = 26
    vocab: int = 1_000_000
    zipf: float = 1.1
    seed: int = 0

    def check(self) -> None:
        def bad(flag, value, need):
            raise DatasetError(f"--{flag} {value!r} is invalid: {need}")

        for name in ("rows", "features", "vocab", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                bad(name, value, "it must be an integer")
        if not 10 <= self.rows <= MAX_ROWS:
            bad("rows", self.rows, f"use 10 .. {MAX_ROWS} rows")
        if not 1 <= self.features <= MAX_FEATURES:
            bad("features", self.features, f"use 1 .. {MAX_FEATURES} categorical features")
        if not 2 <= self.vocab <= MAX_VOCAB:
            bad("vocab", self.vocab, f"use 2 .. {MAX_VOCAB} ids per feature")
        if not isinstance(self.zipf, (int, float)) or not 0 <= self.zipf <= MAX_ZIPF:
            bad("zipf", self.zipf, f"use an exponent in [0, {MAX_ZIPF:g}] (0 = uniform ids)")
        if not 0 <= self.seed < 2**63:
            bad("seed", self.seed, "use a non-negative integer")

    @property
    def test_rows(self) -> int:
        return max(1, int(self.rows * TEST_FRACTION))

    def identity(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


# ---- the hidden model -----------------------------------------------------------------------
class HiddenModel:
    """Everything about the data that follows from the parameters: id scattering, weights,
    bias, and the generator of each block of rows."""

    def __init__(self, params: CtrParams):
        self.p = params
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([params.seed, 2**32])))
        self.multiplier = next(m for m in _MULTIPLIERS if math.gcd(m, params.vocab) == 1)
        self.offsets = rng.integers(0, params.vocab, params.features, dtype=np.int64)
        self.dense_scale = rng.uniform(0.5, 50.0, NUM_DENSE)
        self.w_dense = rng.normal(0.0, 1.0, NUM_DENSE)
        self.w_dense *= DENSE_LOGIT_STD / np.linalg.norm(self.w_dense)
        self.hash_key = np.uint64(int(rng.integers(0, 2**63)))
        # Uniform weights in [-a, a] have std a / sqrt(3).
        self.w_cat_half_width = CATEGORICAL_LOGIT_STD * math.sqrt(3.0 / params.features)
        self.dense_center = self._dense_center(rng)
        self.bias = 0.0
        self.bias = self._calibrate_bias()

    def _dense_center(self, rng) -> np.ndarray:
        sample = np.log1p(np.floor(rng.exponential(self.dense_scale, (BLOCK, NUM_DENSE))))
        return sample.mean(axis=0)

    def _calibrate_bias(self) -> float:
        """The bias that makes the mean click probability TARGET_POSITIVE_RATE (bisection on
        one block of rows drawn from a stream of its own)."""
        rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence([self.p.seed, 2**32 + 1]))
        )
        _, _, logit = self._draw(rng, BLOCK)
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if np.mean(_sigmoid(logit + mid)) < TARGET_POSITIVE_RATE:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """Bounded continuous power law on [1, V+1) by inverse CDF, floored to ranks 0..V-1."""
        v, s = float(self.p.vocab), float(self.p.zipf)
        if abs(s - 1.0) < 1e-9:
            x = np.power(v + 1.0, u)
        else:
            e = 1.0 - s
            x = np.power(1.0 + u * ((v + 1.0) ** e - 1.0), 1.0 / e)
        return np.clip(np.floor(x).astype(np.int64) - 1, 0, self.p.vocab - 1)

    def weights(self, ids: np.ndarray) -> np.ndarray:
        """w_f(id) for an (n, F) array of ids: a splitmix64 hash of (key, f, id) -> uniform."""
        f = np.arange(ids.shape[1], dtype=np.uint64)
        with np.errstate(over="ignore"):
            h = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            h ^= (f << np.uint64(40)) ^ self.hash_key
            h = _splitmix64(h)
        u = (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        return (2.0 * u - 1.0) * self.w_cat_half_width

    def _draw(self, rng, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        ranks = self.ranks(rng.random((n, self.p.features)))
        ids = (ranks * self.multiplier + self.offsets) % self.p.vocab
        dense = np.log1p(np.floor(rng.exponential(self.dense_scale, (n, NUM_DENSE))))
        logit = self.weights(ids).sum(axis=1) + (dense - self.dense_center) @ self.w_dense
        return ids, dense.astype(np.float32), logit + self.bias

    def block(self, index: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``[index * BLOCK, (index + 1) * BLOCK)``: ids, dense, click probability,
        label."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.p.seed, index])))
        ids, dense, logit = self._draw(rng, BLOCK)
        prob = _sigmoid(logit)
        labels = (rng.random(BLOCK) < prob).astype(np.int64)
        return ids, dense, prob, labels

    def rows(self, start: int, stop: int) -> Iterator[Tuple[np.ndarray, ...]]:
        """Blocks of rows ``[start, stop)`` as (ids, dense, prob, labels), sliced from BLOCKs."""
        b = start // BLOCK
        while b * BLOCK < stop:
            lo, hi = max(start, b * BLOCK) - b * BLOCK, min(stop, (b + 1) * BLOCK) - b * BLOCK
            yield tuple(a[lo:hi] for a in self.block(b))
            b += 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC (ties count one half), by ranks."""
    labels = np.asarray(labels).astype(bool)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based, ties averaged
    rank_sum = average_rank[inverse][labels].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# ---- vectorised tf.train.Example encoding ----------------------------------------------------
def _varints(values: np.ndarray, width: int) -> Tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of non-negative ``values`` < 2**(7*width) <= 2**28: bytes
    (..., width) and a mask of the bytes each value uses."""
    v = values.astype(np.uint32)
    out = np.empty(v.shape + (width,), np.uint8)
    lengths = np.ones(v.shape, np.uint8)
    for k in range(width):
        out[..., k] = v >> np.uint32(7 * k)
        if k:
            lengths += v >= np.uint32(1 << (7 * k))
    k = np.arange(width, dtype=np.uint8)
    mask = k < lengths[..., None]
    out &= np.uint8(0x7F)
    out |= (k < lengths[..., None] - 1).view(np.uint8) << np.uint8(7)
    return out, mask


def _varint_len(values: np.ndarray) -> np.ndarray:
    n = np.ones(values.shape, np.int64)
    for k in range(1, 10):
        n += values >= (1 << (7 * k))
    return n


class RecordEncoder:
    """Encodes blocks of rows as Example bytes, the same bytes ``example_codec`` writes."""

    def __init__(self, features: int):
        self.features = features
        dense = feature_entry("dense", float_feature(np.zeros(NUM_DENSE, np.float32)))
        self.dense_prefix = np.frombuffer(dense[: -4 * NUM_DENSE], np.uint8)
        self.labels = [feature_entry("label", int64_feature([v])) for v in (0, 1)]
        assert len(self.labels[0]) == len(self.labels[1])
        self.label_bytes = np.array([np.frombuffer(x, np.uint8) for x in self.labels])
        self.name = b"categorical"

    def encode(self, ids: np.ndarray, dense: np.ndarray, labels: np.ndarray) -> Iterator[bytes]:
        n = ids.shape[0]
        pieces = []  # (bytes (n, w), mask (n, w)), concatenated row by row

        def const(b: np.ndarray):
            pieces.append((np.broadcast_to(b, (n, b.size)), np.ones((n, b.size), bool)))

        def varint(values: np.ndarray, width: int):
            pieces.append(_varints(values, width))

        id_bytes, id_mask = _varints(ids, 4)
        payload = id_mask.sum(axis=(1, 2))  # packed int64 payload length per row
        int64_list = 1 + _varint_len(payload) + payload  # field 1, length, payload
        feature = 1 + _varint_len(int64_list) + int64_list  # Feature.int64_list (field 3)
        name = len(self.name)
        entry_body = 1 + 1 + name + 1 + _varint_len(feature) + feature
        cat_entry = 1 + _varint_len(entry_body) + entry_body
        dense_entry = self.dense_prefix.size + 4 * NUM_DENSE
        features_len = dense_entry + cat_entry + self.label_bytes.shape[1]

        const(np.array([0x0A], np.uint8))  # Example.features
        varint(features_len, 3)
        const(self.dense_prefix)
        pieces.append(
            (dense.astype("<f4").view(np.uint8).reshape(n, -1), np.ones((n, 4 * NUM_DENSE), bool))
        )
        const(np.array([0x0A], np.uint8))  # Features.feature map entry
        varint(entry_body, 2)
        const(np.frombuffer(bytes([0x0A, name]) + self.name + b"\x12", np.uint8))
        varint(feature, 2)
        const(np.array([0x1A], np.uint8))  # Feature.int64_list
        varint(int64_list, 2)
        const(np.array([0x0A], np.uint8))  # Int64List.value, packed
        varint(payload, 2)
        pieces.append((id_bytes.reshape(n, -1), id_mask.reshape(n, -1)))
        pieces.append((self.label_bytes[labels], np.ones((n, self.label_bytes.shape[1]), bool)))

        data = np.concatenate([p[0] for p in pieces], axis=1)
        mask = np.concatenate([p[1] for p in pieces], axis=1)
        flat = data[mask].tobytes()
        ends = np.cumsum(mask.sum(axis=1)).tolist()
        start = 0
        for end in ends:
            yield flat[start:end]
            start = end


# ---- the dataset ------------------------------------------------------------------------------
def locate(source: Optional[str]) -> Inputs:
    if source is not None:
        raise DatasetError(
            "--source: synthetic_ctr is generated, it reads no source; drop --source"
        )
    return Inputs(files=[])


def metadata(params: CtrParams, model: HiddenModel, start: int, stop: int) -> Dict[str, object]:
    """What a model can expect of rows ``[start, stop)`` (the test split): the AUC of the
    hidden model (on its first AUC_ROWS rows) and the click rates."""
    probs, labels = [], []
    for _, _, prob, label in model.rows(start, min(stop, start + AUC_ROWS)):
        probs.append(prob)
        labels.append(label)
    prob, label = np.concatenate(probs), np.concatenate(labels)
    return {
        "auc_ceiling": round(auc(prob, label), 6),
        "auc_rows": int(label.size),
        "test_positive_rate": round(float(label.mean()), 6),
        "mean_click_probability": round(float(prob.mean()), 6),
        "params": asdict(params),
        "schema": {
            "dense": f"float_list[{NUM_DENSE}]",
            "categorical": f"int64_list[{params.features}] in [0, {params.vocab})",
            "label": "int64_list[1] in {0, 1}",
        },
    }


def build(inputs: Inputs, limit: Optional[int]) -> Dict[str, Split]:
    params: CtrParams = inputs.extra["params"]  # type: ignore[assignment]
    model = HiddenModel(params)
    encoder = RecordEncoder(params.features)
    rows = params.rows if limit is None else min(params.rows, int(limit))
    test = min(params.test_rows, rows - 1)
    train = rows - test

    def records(start: int, stop: int) -> Iterator[bytes]:
        for ids, dense, _, labels in model.rows(start, stop):
            yield from encoder.encode(ids, dense, labels)

    return {
        "train": Split(train, records(0, train)),
        "test": Split(test, records(train, rows), metadata=metadata(params, model, train, rows)),
    }


SPEC = DatasetSpec(
    name="synthetic_ctr",
    description="Criteo-shaped clicks from a hidden logistic model: 13 dense + --features "
    "Zipf ids (--rows --features --vocab --zipf --seed)",
    records_per_shard=BLOCK,
    schema_version=1,
    locate=locate,
    build=build,
    params_type=CtrParams,
)
