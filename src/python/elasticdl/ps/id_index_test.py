"""The direct index of a table of known vocabulary: ids below it resolve through an array, the
others through the hash map, and together they answer exactly as the hash map alone."""
import numpy as np
import pytest
from elasticdl.ps import id_index
from elasticdl.ps.id_index import DIRECT_INDEX_MAX_BYTES, IdIndex, direct_index_size


def _kinds():
    from elasticdl.ops import _backend

    return [False] + ([True] if _backend.native is not None else [])


NATIVE = pytest.mark.parametrize("native", _kinds(), ids=lambda n: "native" if n else "numpy")


def test_direct_index_size_needs_a_known_vocabulary_within_the_cap():
    assert direct_index_size(0) == 0
    assert direct_index_size(1) == 1
    assert direct_index_size(200_000) == 200_000
    assert direct_index_size(DIRECT_INDEX_MAX_BYTES // 8) == DIRECT_INDEX_MAX_BYTES // 8
    assert direct_index_size(DIRECT_INDEX_MAX_BYTES // 8 + 1) == 0
    assert IdIndex(vocabulary=0).direct_size == 0
    assert IdIndex(vocabulary=DIRECT_INDEX_MAX_BYTES // 8 + 1).direct_size == 0


@NATIVE
def test_ids_below_the_vocabulary_are_not_hashed(native):
    index = IdIndex(native=native, vocabulary=100)
    assert index.direct_size == 100
    index.insert(np.array([5, 99, 0]), np.array([0, 1, 2]))
    assert len(index) == 3 and len(index._impl) == 0
    np.testing.assert_array_equal(index.lookup(np.array([99, 0, 5, 7, 5])), [1, 2, 0, -1, 0])
    assert index.nbytes >= 100 * 8


@NATIVE
def test_hybrid_answers_as_the_hash_map_alone(native):
    """Batches mixing ids below and past the vocabulary (past: also huge ones), one-id batches,
    duplicates in lookups and misses: the same rows, length and pairs as without the direct
    index, and the ids past the vocabulary are the hash map's."""
    rng = np.random.default_rng(7)
    vocab = 1000
    hybrid = IdIndex(capacity=16, native=native, vocabulary=vocab)
    plain = IdIndex(capacity=16, native=native)
    seen: set = set()
    for batch in range(30):
        size = 1 if batch % 5 == 0 else int(rng.integers(2, 300))
        pool = rng.integers(0, 2 * vocab, size)
        if batch % 3 == 0:
            pool = np.concatenate([pool, rng.integers(0, 1 << 62, 5)])
        new = np.array([i for i in np.unique(pool).tolist() if i not in seen], dtype=np.int64)
        new = rng.permutation(new)
        rows = np.arange(len(seen), len(seen) + new.size)
        hybrid.insert(new, rows)
        plain.insert(new, rows)
        seen.update(new.tolist())
        query = np.concatenate([pool, pool[:7], rng.integers(0, 3 * vocab, 50)])
        np.testing.assert_array_equal(hybrid.lookup(query), plain.lookup(query))
    assert len(hybrid) == len(plain) == len(seen)
    ids, rows = hybrid.items()
    want_ids, want_rows = plain.items()
    order, want_order = np.argsort(ids), np.argsort(want_ids)
    np.testing.assert_array_equal(ids[order], want_ids[want_order])
    np.testing.assert_array_equal(rows[order], want_rows[want_order])
    past = np.array(sorted(i for i in seen if i >= vocab), dtype=np.int64)
    assert len(hybrid._impl) == past.size > 0
    np.testing.assert_array_equal(np.sort(hybrid._impl.items()[0]), past)


@NATIVE
def test_empty_batches_and_an_empty_index(native):
    index = IdIndex(native=native, vocabulary=10)
    index.insert(np.array([], np.int64), np.array([], np.int64))
    assert len(index) == 0
    assert index.lookup(np.array([], np.int64)).shape == (0,)
    ids, rows = index.items()
    assert ids.shape == rows.shape == (0,) and ids.dtype == rows.dtype == np.int64


def test_a_vocabulary_past_the_cap_keeps_the_hash_map(monkeypatch):
    monkeypatch.setattr(id_index, "DIRECT_INDEX_MAX_BYTES", 8 * 50)
    assert IdIndex(native=False, vocabulary=50).direct_size == 50
    index = IdIndex(native=False, vocabulary=51)
    assert index.direct_size == 0
    index.insert(np.array([3, 40]), np.array([0, 1]))
    assert len(index._impl) == 2


@pytest.mark.parametrize("vocab", [0, 1000], ids=["hash", "direct"])
@NATIVE
def test_resolve_numbers_absent_ids_as_an_append_would(native, vocab):
    """`resolve` against an oracle built from `lookup`: known ids keep their rows; absent ones
    (repeated, unsorted, below and past the vocabulary, huge) get next_row + their rank among the
    distinct absent ids by first appearance, listed once in that order; and nothing is inserted
    until the caller does."""
    rng = np.random.default_rng(11)
    index = IdIndex(capacity=16, native=native, vocabulary=vocab)
    size = 0
    for batch in range(25):
        n = 1 if batch % 6 == 0 else int(rng.integers(2, 400))
        ids = rng.integers(0, 3000, n)
        if batch % 4 == 0:
            ids = np.concatenate([ids, rng.integers(0, 1 << 62, 3), ids[:5]])
        known = index.lookup(ids)
        rows, new_ids = index.resolve(ids, size)
        first_seen = list(dict.fromkeys(ids[known < 0].tolist()))
        np.testing.assert_array_equal(new_ids, first_seen)
        assert new_ids.dtype == np.int64
        np.testing.assert_array_equal(rows[known >= 0], known[known >= 0])
        rank = {i: r for r, i in enumerate(first_seen)}
        np.testing.assert_array_equal(
            rows[known < 0], [size + rank[i] for i in ids[known < 0].tolist()]
        )
        assert len(index) == size  # resolve inserted nothing
        index.insert(new_ids, np.arange(size, size + new_ids.size))
        size += new_ids.size
        np.testing.assert_array_equal(index.lookup(ids), rows)
        again, none = index.resolve(ids, size)
        np.testing.assert_array_equal(again, rows)
        assert none.size == 0


@NATIVE
def test_resolve_of_no_ids(native):
    index = IdIndex(native=native, vocabulary=10)
    rows, new_ids = index.resolve(np.array([], dtype=np.int64), 0)
    assert rows.shape == (0,) and new_ids.shape == (0,)


@pytest.mark.parametrize("vocab", [0, 100_000], ids=["hash", "direct"])
def test_resolve_of_a_large_batch_answers_as_numpy(vocab):
    """Batches past the size the native map resolves on several threads."""
    from elasticdl.ops import _backend

    if _backend.native is None:
        pytest.skip("the native map is not built: nothing to compare with NumPy")
    rng = np.random.default_rng(3)
    indexes = [IdIndex(capacity=16, native=k, vocabulary=vocab) for k in (False, True)]
    known = np.unique(rng.integers(0, 200_000, 60_000))
    for index in indexes:
        index.insert(known, np.arange(known.size))
    ids = rng.integers(0, 250_000, 80_000)
    (rows_np, new_np), (rows_cc, new_cc) = (i.resolve(ids, known.size) for i in indexes)
    np.testing.assert_array_equal(rows_cc, rows_np)
    np.testing.assert_array_equal(new_cc, new_np)
