"""id_shares gives what the plain NumPy expressions give: owners, masks, split and put-back."""
import numpy as np
import pytest
from elasticdl.worker import id_shares


@pytest.mark.parametrize("num_ps", [1, 2, 3, 4, 5, 8])
def test_owners_are_the_floor_modulo_for_any_int64(num_ps):
    ids = np.array([0, 1, 2, 3, 7, 8, 2**40 + 3, 2**63 - 1, -1, -2, -(2**63)], dtype=np.int64)
    np.testing.assert_array_equal(id_shares.owners(ids, num_ps), ids % num_ps)
    masks = id_shares.owner_masks(ids, num_ps)
    assert len(masks) == num_ps
    for ps_id, mask in enumerate(masks):
        np.testing.assert_array_equal(mask, ids % num_ps == ps_id)


@pytest.mark.parametrize("num_ps", [1, 2, 3, 4])
@pytest.mark.parametrize("dim", [1, 8, 3])
def test_split_rows_keeps_order_and_leaves_none_for_a_ps_without_ids(num_ps, dim):
    rng = np.random.default_rng(num_ps * 10 + dim)
    ids = np.sort(rng.choice(10_000, 500, replace=False)).astype(np.int64)
    ids = ids[ids % num_ps != num_ps - 1] if num_ps > 1 else ids  # the last PS gets none
    values = rng.standard_normal((ids.size, dim)).astype(np.float32)
    shares = id_shares.split_rows(values, ids, num_ps)
    assert len(shares) == num_ps
    for ps_id, share in enumerate(shares):
        mask = ids % num_ps == ps_id
        if not mask.any():
            assert share is None
            continue
        got_values, got_ids = share
        np.testing.assert_array_equal(got_ids, ids[mask])
        np.testing.assert_array_equal(got_values, values[mask])
        assert got_values.dtype == np.float32 and got_values.flags.c_contiguous


@pytest.mark.parametrize("dim", [1, 2, 8, 64])
def test_put_rows_equals_fancy_assignment(dim):
    rng = np.random.default_rng(dim)
    n = 1000
    positions = rng.permutation(n)[:600]
    rows = rng.standard_normal((600, dim)).astype(np.float32)
    want = np.zeros((n, dim), np.float32)
    want[positions] = rows
    got = np.zeros((n, dim), np.float32)
    id_shares.put_rows(got, positions, rows)
    np.testing.assert_array_equal(got, want)
    # a slice of positions, and rows that are a read-only view of received bytes
    frozen = np.frombuffer(rows[:100].tobytes(), dtype=np.float32).reshape(100, dim)
    id_shares.put_rows(got, slice(200, 300), frozen)
    np.testing.assert_array_equal(got[200:300], rows[:100])


def test_put_rows_falls_back_for_arrays_it_cannot_view():
    out = np.zeros((6, 4), np.float64)
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    id_shares.put_rows(out, np.array([5, 0, 2]), rows)  # dtypes differ: NumPy casts
    np.testing.assert_array_equal(out[[5, 0, 2]], rows.astype(np.float64))
    strided = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]
    out32 = np.zeros((6, 4), np.float32)
    id_shares.put_rows(out32, np.array([1, 3, 4]), strided)  # not contiguous
    np.testing.assert_array_equal(out32[[1, 3, 4]], strided)
