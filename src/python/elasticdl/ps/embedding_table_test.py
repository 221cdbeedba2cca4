import mmap

import numpy as np
import pytest
from elasticdl.ps import initializers
from elasticdl.ps.embedding_table import EmbeddingTable, strictly_increasing
from elasticdl.ps.errors import PSError
from elasticdl.ps.id_index import IdIndex


def _id_index_kinds():
    from elasticdl.ops import _backend

    return [False] + ([True] if _backend.native is not None else [])


@pytest.mark.parametrize("native", _id_index_kinds(), ids=lambda n: "native" if n else "numpy")
def test_id_index_matches_dict_through_growth(native):
    rng = np.random.default_rng(1)
    index = IdIndex(capacity=16, native=native)
    reference = {}
    for batch in range(20):
        ids = np.unique(rng.integers(0, 1 << 40, 500))
        ids = np.array([i for i in ids.tolist() if i not in reference], dtype=np.int64)
        rows = np.arange(len(reference), len(reference) + ids.size)
        index.insert(ids, rows)
        reference.update(zip(ids.tolist(), rows.tolist()))
    assert len(index) == len(reference)
    keys = np.array(list(reference), dtype=np.int64)
    query = np.concatenate([rng.choice(keys, 3000), keys[:10], keys[:10]])
    np.testing.assert_array_equal(index.lookup(query), [reference[k] for k in query.tolist()])
    absent = np.array([k for k in rng.integers(0, 1 << 40, 100).tolist() if k not in reference])
    assert (index.lookup(absent) == -1).all()


@pytest.mark.parametrize("native", _id_index_kinds(), ids=lambda n: "native" if n else "numpy")
def test_id_index_large_batches(native):
    """Batches past the native map's thread threshold, with misses and duplicates, through
    several growths; both maps must agree with a dict."""
    rng = np.random.default_rng(2)
    index, reference = IdIndex(capacity=1000, native=native), {}
    for _ in range(3):
        ids = np.setdiff1d(rng.integers(0, 1 << 62, 60_000), np.array(list(reference), np.int64))
        ids = rng.permutation(ids)
        rows = np.arange(len(reference), len(reference) + ids.size)
        index.insert(ids, rows)
        reference.update(zip(ids.tolist(), rows.tolist()))
    assert len(index) == len(reference)
    keys = np.array(list(reference), dtype=np.int64)
    query = np.concatenate([rng.choice(keys, 80_000), rng.integers(0, 1 << 62, 20_000)])
    expect = [reference.get(k, -1) for k in query.tolist()]
    np.testing.assert_array_equal(index.lookup(query), expect)


@pytest.mark.parametrize("native", _id_index_kinds(), ids=lambda n: "native" if n else "numpy")
def test_id_index_one_at_a_time_tiny_map_and_items(native):
    """A map made for 1 id takes 3,000 one-id inserts (every growth step, probes that wrap
    around the end of a small array at full load), then answers for each, for absent ids, and
    gives its pairs back through items()."""
    rng = np.random.default_rng(3)
    index, reference = IdIndex(capacity=1, native=native), {}
    ids = rng.permutation(np.unique(rng.integers(0, 1 << 63, 3000, dtype=np.int64)))
    for k, i in enumerate(ids.tolist()):
        index.insert(np.array([i]), np.array([k]))
        reference[i] = k
        if k in (0, 1, 7, 99, 1000):  # everything so far, and nothing else
            got = index.lookup(ids[: k + 1])
            np.testing.assert_array_equal(got, np.arange(k + 1))
            assert index.lookup(ids[k + 1 : k + 2]).tolist() == [-1]
    keys, rows = index.items()
    assert sorted(zip(keys.tolist(), rows.tolist())) == sorted(reference.items())
    assert index.lookup(np.array([0, (1 << 63) - 1])).tolist() == [
        reference.get(0, -1),
        reference.get((1 << 63) - 1, -1),
    ]


def test_native_id_map_load_stays_within_its_bounds():
    """The native map holds at most 4/5 of its slots, grows by 3/2 (so at least ~8/15 full
    right after a growth), and an id inserted again takes its new row."""
    from elasticdl.ops import _backend

    if _backend.native is None:
        pytest.skip("elasticdl_native is not built")
    m = _backend.native.IdMap(0)
    loads = []
    rng = np.random.default_rng(4)
    seen = np.empty(0, np.int64)
    for n in [1, 5, 100, 1000, 4096, 50_000, 70_000]:
        ids = np.setdiff1d(rng.integers(0, 1 << 62, n), seen)
        order = rng.permutation(ids.size)  # id seen[k] gets row k, inserted in random order
        m.insert(ids[order], np.arange(seen.size, seen.size + ids.size)[order])
        seen = np.concatenate([seen, ids])
        assert len(m) == seen.size <= 0.8 * m.capacity
        assert m.nbytes == 16 * m.capacity
        loads.append(len(m) / m.capacity)
    assert loads[-1] > 0.5  # not sized for the doubling of a power of two
    before = m.capacity
    m.insert(seen[:10], np.arange(10) + 10**9)  # re-insert: new rows, no new entries
    assert len(m) == seen.size and m.capacity == before
    np.testing.assert_array_equal(m.lookup(seen[:12])[:10], np.arange(10) + 10**9)
    np.testing.assert_array_equal(m.lookup(seen[10:12]), [10, 11])
    with pytest.raises(ValueError, match="rows must be >= 0"):
        m.insert(np.array([1]), np.array([-1]))


def test_ids_and_export_come_back_from_the_index():
    t = EmbeddingTable("e", 2, "zeros")
    ids = np.array([10**12, 3, 77, 5, 1 << 62])
    t.set(ids, np.arange(10, dtype=np.float32).reshape(5, 2))
    t.get(np.array([4, 3]))
    # By block row: a batch's new ids get theirs in the order the batch names them.
    np.testing.assert_array_equal(t.ids, [10**12, 3, 77, 5, 1 << 62, 4])
    got_ids, got = t.export()
    np.testing.assert_array_equal(got_ids, [3, 4, 5, 77, 10**12, 1 << 62])
    np.testing.assert_array_equal(got[:, 0], [2, 0, 6, 4, 0, 8])
    assert t.index_nbytes > 0


def test_strictly_increasing():
    assert strictly_increasing(np.array([], np.int64))
    assert strictly_increasing(np.array([7]))
    assert strictly_increasing(np.array([0, 3, 1 << 62]))
    assert not strictly_increasing(np.array([0, 3, 3]))  # a repeat
    assert not strictly_increasing(np.array([3, 0, 5]))


@pytest.mark.parametrize("batch", [[2, 5, 9, 11], [11, 9, 5, 2, 9]])
def test_new_rows_follow_first_appearance(batch):
    """Each new id gets one row, in the order the batch first names it, repeats included; present
    ids keep theirs, and a row's values depend on its id alone."""
    t = EmbeddingTable("e", 2, "uniform")
    before = t.get(np.array([5]))
    rows = t.rows(np.array(batch))
    assert len(t) == 4
    new = [i for i in dict.fromkeys(batch) if i != 5]
    np.testing.assert_array_equal(t.ids, [5, *new])
    row_of = {5: 0, **{i: r + 1 for r, i in enumerate(new)}}
    np.testing.assert_array_equal(rows, [row_of[i] for i in batch])
    np.testing.assert_array_equal(t.get(np.array([5])), before)
    np.testing.assert_array_equal(t.get(np.array([9])), EmbeddingTable("e", 2).get(np.array([9])))


def test_rows_and_slots_survive_growth_into_mapped_blocks():
    """Past 1 MiB a block is an anonymous mapping of its own (so a grown-out block goes back
    to the kernel, not to malloc's free lists); the rows and slots move with every doubling."""
    t = EmbeddingTable("e", 16, "zeros")
    rng = np.random.default_rng(3)
    ids = rng.permutation(40_000).astype(np.int64) * 7
    values = rng.standard_normal((ids.size, 16)).astype(np.float32)
    t.set(ids[:100], values[:100])
    t.slot("m")[:] = 0.5
    for start in range(100, ids.size, 5000):
        t.set(ids[start : start + 5000], values[start : start + 5000])
        t.set(ids[start : start + 5000], values[start : start + 5000] * 2, slot="m")
    np.testing.assert_array_equal(t.get(ids), values)
    m = t.slot("m")[t.rows(ids, create=False)]
    np.testing.assert_array_equal(m[:100], np.full((100, 16), 0.5, np.float32))
    np.testing.assert_array_equal(m[100:], values[100:] * 2)
    for block in (t.values, t.slot("m")):
        base = block
        while isinstance(base, np.ndarray):
            base = base.base
        base = base.obj if isinstance(base, memoryview) else base
        assert isinstance(base, mmap.mmap) and block.flags.writeable and block.flags.c_contiguous
    small = EmbeddingTable("s", 4).values
    assert small.base is None or not isinstance(small.base, mmap.mmap)


def test_lazy_init_is_deterministic_per_id_and_order_independent():
    a = EmbeddingTable("user", 8, "uniform")
    b = EmbeddingTable("user", 8, "uniform")
    va = a.get(np.array([7, 3, 7, 1000000007]))
    vb = b.get(np.array([1000000007, 3]))
    assert len(a) == 3 and len(b) == 2
    np.testing.assert_array_equal(va[0], va[2])  # duplicate ids -> same row
    np.testing.assert_array_equal(va[3], vb[0])
    np.testing.assert_array_equal(va[1], vb[1])
    assert va.dtype == np.float32 and va.shape == (4, 8)
    assert np.abs(va).max() <= 0.05 and np.abs(va).max() > 0
    other = EmbeddingTable("item", 8, "uniform").get(np.array([7]))
    assert not np.array_equal(other[0], va[0])  # tables get different seeds


def test_get_returns_copy_and_set_overwrites_and_creates():
    t = EmbeddingTable("e", 3, "zeros")
    got = t.get(np.array([1, 2]))
    got[:] = 5
    np.testing.assert_array_equal(t.get(np.array([1])), [[0, 0, 0]])
    t.set(np.array([2, 9]), np.array([[1, 2, 3], [4, 5, 6]], np.float32))
    np.testing.assert_array_equal(t.get(np.array([9, 2, 1])), [[4, 5, 6], [1, 2, 3], [0, 0, 0]])
    ids, values = t.export()
    np.testing.assert_array_equal(ids, [1, 2, 9])
    np.testing.assert_array_equal(values[2], [4, 5, 6])


def test_slots_share_rows_and_grow_with_the_table():
    t = EmbeddingTable("e", 2, "ones")
    t.get(np.array([5]))
    m = t.slot("m")
    assert m.shape == (1, 2) and not m.any()
    acc = t.slot("accumulator", init=0.1)
    np.testing.assert_allclose(acc, 0.1)
    t.set(np.array([5]), np.array([[3, 4]], np.float32), slot="m")
    t.get(np.arange(100, 300))  # forces several block reallocations
    assert t.slot("m").shape == (201, 2)
    np.testing.assert_array_equal(t.slot("m")[t.rows(np.array([5]))], [[3, 4]])
    np.testing.assert_allclose(t.slot("accumulator")[-1], 0.1)
    np.testing.assert_array_equal(t.values[t.rows(np.array([5]))], [[1, 1]])
    assert t.slot_names == ("m", "accumulator")


@pytest.mark.parametrize(
    "name,check",
    [
        ("zeros", lambda v: (v == 0).all()),
        ("Ones", lambda v: (v == 1).all()),
        ("RandomNormal", lambda v: abs(v.std() - 0.05) < 0.005),
        ("truncated_normal", lambda v: np.abs(v).max() <= 0.1 + 1e-6),
        ("glorot_uniform", lambda v: np.abs(v).max() <= np.sqrt(3.0 / 16) + 1e-6),
        ("random_uniform", lambda v: np.abs(v).max() <= 0.05 and abs(v.mean()) < 0.005),
    ],
)
def test_initializers(name, check):
    assert check(EmbeddingTable("t", 16, name).get(np.arange(1000)))


def test_bad_input_is_rejected_with_clear_messages():
    with pytest.raises(
        initializers.UnknownInitializerError, match="unknown embedding initializer 'he_magic'"
    ):
        EmbeddingTable("t", 4, "he_magic")
    t = EmbeddingTable("t", 4)
    with pytest.raises(PSError, match="non-negative"):
        t.get(np.array([-1]))
    with pytest.raises(PSError, match="integers"):
        t.get(np.array([1.5]))
    with pytest.raises(PSError, match="do not match"):
        t.set(np.array([1]), np.zeros((1, 3)))
    with pytest.raises(PSError, match="no row for ids"):
        t.rows(np.array([42]), create=False)


def test_a_slot_created_late_holds_init_in_old_and_new_rows():
    table = EmbeddingTable("e", 4)
    table.rows(np.arange(100))  # capacity 128: a slot made now writes only the 100 live rows
    np.testing.assert_array_equal(table.slot("m", 0.5), np.full((100, 4), 0.5, np.float32))
    table.rows(np.arange(100, 300))  # grows past the capacity the slot was made with
    np.testing.assert_array_equal(table.slot("m"), np.full((300, 4), 0.5, np.float32))


def test_small_and_large_gathers_give_the_same_rows():
    # Few rows are gathered by NumPy, many by the lookup kernel: the same rows either way.
    t = EmbeddingTable("e", 16)
    ids = np.random.default_rng(0).permutation(5000)
    t.set(ids, np.arange(5000 * 16, dtype=np.float32).reshape(5000, 16))
    many = t.get(ids)  # 80,000 floats
    assert many.shape == (5000, 16)
    few = np.concatenate([t.get(ids[i : i + 100]) for i in range(0, 5000, 100)])
    np.testing.assert_array_equal(few, many)
    want = np.arange(5000 * 16, dtype=np.float32).reshape(5000, 16)
    np.testing.assert_array_equal(many, want)
    few[0, 0] = -1.0  # copies, not views of the table
    assert t.get(ids[:1])[0, 0] == 0.0


@pytest.fixture(params=_id_index_kinds(), ids=lambda n: "native" if n else "numpy")
def hash_backend(request, monkeypatch):
    """Tables made in the test use the native or the NumPy hash map."""
    import types

    from elasticdl.ps import id_index

    if not request.param:
        monkeypatch.setattr(id_index, "_backend", types.SimpleNamespace(native=None))
    return request.param


def _same_ops(table: EmbeddingTable, rng_seed: int) -> list[np.ndarray]:
    """Pulls (duplicates, ids past the vocabulary of 500, one-id pulls), sets, slots, SGD
    updates and growth into mapped blocks; returns every answer the table gave."""
    from elasticdl.ps.optimizer import Optimizer, OptimizerConfig

    rng = np.random.default_rng(rng_seed)
    opt = Optimizer(OptimizerConfig("Adam", learning_rate=0.1))
    out = []
    for step in range(1, 40):
        ids = rng.integers(0, 520, 64) if step % 4 else rng.integers(0, 1 << 40, 3)
        if step % 7 == 0:
            ids = ids[:1]
        out.append(table.get(ids))
        push = np.unique(ids)
        grads = rng.normal(size=(push.size, table.dim)).astype(np.float32)
        opt.apply_sparse(table, push, grads, 0.1, step)
        if step % 5 == 0:
            extra = push[:3] + 1000
            table.set(extra, rng.normal(size=(extra.size, table.dim)).astype(np.float32))
    out.append(table.get(np.arange(0, 80_000, 7)))  # past 1 MiB: mapped blocks
    out.append(table.rows(np.array([3, 499, 500, 1 << 40]), create=True))
    out += [table.ids, table.values, np.array([len(table)])]
    for slot in (None, *table.slot_names):
        out += list(table.export(slot))
    return out


def test_a_table_with_vocabulary_gives_the_same_rows_as_one_without(hash_backend):
    with_vocab = EmbeddingTable("t", 8, "uniform", seed=3, vocabulary=500)
    without = EmbeddingTable("t", 8, "uniform", seed=3)
    assert with_vocab._index.direct_size == 500 and without._index.direct_size == 0
    got, want = _same_ops(with_vocab, 11), _same_ops(without, 11)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert with_vocab.index_nbytes >= 500 * 8
    assert with_vocab.slot_names == without.slot_names == ("m", "v")


def test_gathers_pick_numpy_for_few_or_narrow_rows_and_give_the_same_rows(monkeypatch):
    from elasticdl import ops
    from elasticdl.ps import embedding_table

    assert not embedding_table.kernel_gathers(11_999, 256)
    assert embedding_table.kernel_gathers(12_000, 64)
    assert not embedding_table.kernel_gathers(100_000, 32)  # 8 floats a row
    assert embedding_table.kernel_gathers(150_000, 4)
    kernel_calls = []
    lookup = ops.embedding_lookup

    def counted(*args, **kwargs):
        kernel_calls.append(args[1].size)
        return lookup(*args, **kwargs)

    monkeypatch.setattr(embedding_table.ops, "embedding_lookup", counted)
    rng = np.random.default_rng(3)
    for dim, n in ((8, 20_000), (16, 12_000), (1, 5_000)):
        table = EmbeddingTable(f"t{dim}", dim, vocabulary=100_000)
        ids = rng.choice(100_000, n, replace=False)
        first = table.get(ids).copy()  # creates the rows
        again = rng.permutation(ids)
        want = first[np.argsort(ids)][np.searchsorted(np.sort(ids), again)]
        np.testing.assert_array_equal(table.get(again), want)
    assert kernel_calls == [12_000, 12_000]  # the 16-float rows only: created, then read
