"""id_scan: the native pass gives the NumPy reference's answer."""
import numpy as np
import pytest
from elasticdl.ops import _backend
from elasticdl.ops.id_scan import IdScan, reference_scan_ids, scan_ids

CASES = [
    ([], 1, 0, IdScan(0, -1, True)),
    ([7], 1, 0, IdScan(7, -1, True)),
    ([1, 3, 5, 9], 2, 1, IdScan(1, -1, True)),
    ([1, 3, 4, 9], 2, 1, IdScan(1, 2, True)),
    ([6, 0, 3], 3, 0, IdScan(0, -1, False)),
    ([2, 2], 1, 0, IdScan(2, -1, False)),
    ([5, -4, 9], 2, 1, IdScan(-4, -1, False)),  # negative: ownership not looked at
    ([2**63 - 1, 0], 4, 3, IdScan(0, 1, False)),
    ([2**32 - 1, 2**32 + 2, 2**62 + 1], 3, 0, IdScan(2**32 - 1, 2, True)),
    ([5, 2**32 - 4], 3, 2, IdScan(5, 1, True)),
]


@pytest.mark.parametrize("ids, num_ps, ps_id, want", CASES)
def test_the_scan_of_known_ids(ids, num_ps, ps_id, want):
    ids = np.array(ids, dtype=np.int64)
    assert reference_scan_ids(ids, num_ps, ps_id) == want
    assert scan_ids(ids, num_ps, ps_id) == want


@pytest.mark.skipif(_backend.native is None, reason="elasticdl_native not loaded")
def test_the_native_scan_answers_as_the_reference_on_random_ids():
    rng = np.random.default_rng(5)
    for case in range(600):
        n = int(rng.integers(0, 50))
        num_ps = int(rng.integers(1, 8))  # powers of two and not: masked and divided
        ps_id = int(rng.integers(0, num_ps))
        high = (40, 1 << 32, 1 << 62)[case % 3]  # ids within 32 bits, across, far above
        ids = rng.integers(-2, high, size=n)
        if rng.random() < 0.5:
            ids = np.unique(np.abs(ids)) * num_ps + ps_id  # sorted, unique and owned
        got = IdScan(*_backend.native.scan_ids(ids, num_ps, ps_id))
        assert got == reference_scan_ids(ids, num_ps, ps_id)
    strided = np.arange(20, dtype=np.int64)[::2]  # not contiguous: the binding copies it
    assert IdScan(*_backend.native.scan_ids(strided, 2, 0)) == IdScan(0, -1, True)


def test_num_ps_must_be_positive():
    with pytest.raises(ValueError):
        scan_ids(np.arange(3), 0, 0)
