import os

import pytest
from elasticdl.ps import memory_fit
from elasticdl.ps.memory_fit import MemoryRoom, TableDemand, TablesDoNotFitError, check_fit

GIB = 1 << 30


def _write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_bytes_per_row_is_row_slots_and_map_share():
    assert memory_fit.bytes_per_row(16, 2) == 192 + 30  # Adam: row, m, v
    assert memory_fit.bytes_per_row(8, 0) == 32 + 30  # SGD
    assert memory_fit.rows_per_ps(10, 4) == 3 and memory_fit.rows_per_ps(8, 4) == 2


def test_a_table_that_fits_passes_and_unknown_vocabularies_are_not_checked():
    room = MemoryRoom(1 * GIB, "test")
    check_fit([TableDemand("emb", 1_000_000, 16)], 1, 2, room)  # 222 MB
    check_fit([TableDemand("hashed", 0, 1024)], 1, 2, room)
    check_fit([], 1, 2, room)


def test_a_table_too_large_is_refused_with_one_line_naming_it_and_the_fixes():
    room = MemoryRoom(2 * GIB, "MemAvailable of its machine")
    with pytest.raises(TablesDoNotFitError) as e:
        check_fit([TableDemand("user", 100_000_000, 16), TableDemand("hashed", 0, 8)], 2, 2, room)
    msg = str(e.value)
    assert "\n" not in msg
    assert "'user' (vocabulary 100,000,000, dim 16: 50,000,000 rows x 222 B on each PS)" in msg
    assert "needs 13.3 GiB on each of 2 PS" in msg  # 5e7 x 222 B + 5e7 x 64 B growing
    assert "more than the 2.0 GiB this PS has (MemAvailable of its machine)" in msg
    assert "--num_ps_pods 14 or more" in msg  # 28.6e9 B / 2 GiB
    assert "--ps_resource_limit" in msg and "smaller dim" in msg
    assert "hashed" not in msg


def test_ps_on_one_machine_split_its_memory_and_are_told_so():
    room = memory_fit.split(MemoryRoom(8 * GIB, "MemAvailable of its machine"), 4)
    assert room == MemoryRoom(
        2 * GIB, "MemAvailable of its machine, split over the job's 4 PS on it", 4
    )
    assert memory_fit.split(room, 1) is room
    check_fit([TableDemand("t", 8_000_000, 16)], 4, 2, room)  # 2M rows per PS: 0.5 GiB
    with pytest.raises(TablesDoNotFitError) as e:
        check_fit([TableDemand("t", 40_000_000, 16)], 4, 2, room)  # 10M rows per PS: 2.7 GiB
    msg = str(e.value)
    assert "more than the 2.0 GiB this PS has (MemAvailable of its machine, split over" in msg
    # More PS on the same machine would not help: at least one more PS, on machines of its own.
    assert "use PS on machines of their own (--num_ps_pods 5 or more on Kubernetes)" in msg


def test_several_tables_count_together():
    room = MemoryRoom(GIB, "test")
    tables = [TableDemand(f"t{i}", 2_000_000, 16) for i in range(5)]  # 444 MB each
    check_fit(tables[:2], 1, 2, room)
    with pytest.raises(
        TablesDoNotFitError, match=r"embedding tables 't0' .*and 2 more need 2.2 GiB"
    ):
        check_fit(tables, 1, 2, room)


def test_cgroup_v2_limit_is_the_smallest_over_the_ancestors(tmp_path):
    proc, fs = str(tmp_path / "proc"), str(tmp_path / "cg")
    _write(proc, "self/cgroup", "0::/kubepods/pod1/ps\n")
    _write(fs, "memory.max", "max\n")
    _write(fs, "kubepods/memory.max", str(64 * GIB))
    _write(fs, "kubepods/pod1/memory.max", str(4 * GIB))
    _write(fs, "kubepods/pod1/ps/memory.max", "max")
    assert memory_fit.cgroup_limit(proc, fs) == 4 * GIB
    _write(proc, "meminfo", "MemTotal: 100 kB\nMemAvailable:   52428800 kB\n")  # 50 GiB
    _write(proc, "self/status", "Name: python\nVmRSS:\t  524288 kB\n")  # 0.5 GiB
    room = memory_fit.memory_room(proc, fs)
    assert room.bytes == int(3.5 * GIB)
    assert "cgroup memory limit 4.0 GiB less its 0.5 GiB in use" in room.source


def test_cgroup_v1_and_no_limit_fall_back_to_mem_available(tmp_path):
    proc, fs = str(tmp_path / "proc"), str(tmp_path / "cg")
    _write(proc, "self/cgroup", "5:cpu:/x\n4:memory:/docker/abc\n0::/\n")
    _write(fs, "memory/docker/abc/memory.limit_in_bytes", str(3 * GIB))
    _write(fs, "memory/memory.limit_in_bytes", "9223372036854771712")  # v1's "unlimited"
    assert memory_fit.cgroup_limit(proc, fs) == 3 * GIB
    _write(proc, "meminfo", "MemAvailable: 1048576 kB\n")  # 1 GiB: smaller than the limit
    _write(proc, "self/status", "VmRSS: 1024 kB\n")
    assert memory_fit.memory_room(proc, fs) == MemoryRoom(GIB, "MemAvailable of its machine")
    os.remove(os.path.join(fs, "memory/docker/abc/memory.limit_in_bytes"))
    assert memory_fit.cgroup_limit(proc, fs) is None


def test_this_process_has_some_room():
    room = memory_fit.memory_room()
    assert 0 < room.bytes and room.source
