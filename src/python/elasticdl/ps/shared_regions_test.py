import numpy as np
import pytest
from elasticdl.common import shared_memory as shm
from elasticdl.ps.errors import RegionNotAttachedError
from elasticdl.ps.shared_regions import SharedRegions

pytestmark = pytest.mark.skipif(shm.default_directory() is None, reason="needs /dev/shm")


def _region():
    region = shm.SharedRegion.create({"w": (np.float32, (4,))}, tag="regions-test")
    region.unlink()
    return region


def test_a_worker_attaching_again_replaces_its_region_and_idle_ones_expire():
    now = [0.0]
    regions = SharedRegions(idle_expiry_s=60, clock=lambda: now[0])
    first = regions.add(_region(), worker_id=0)
    other = regions.add(_region(), worker_id=1)
    second = regions.add(_region(), worker_id=0)  # worker 0 again: its first region goes
    assert len(regions) == 2 and first != second
    with pytest.raises(RegionNotAttachedError, match="attach it again"):
        regions.get(first)
    now[0] = 50.0
    regions.get(second)  # used: stays
    now[0] = 100.0  # worker 1 has not pushed for 100 s (it died without detaching)
    regions.add(_region(), worker_id=2)
    with pytest.raises(RegionNotAttachedError):
        regions.get(other)
    assert regions.get(second) is not None and len(regions) == 2
    regions.remove(second)
    assert regions.remove(second) is None and len(regions) == 1
    regions.close()
    assert len(regions) == 0
