import numpy as np
import pytest
from elasticdl.worker.ps_types import message_layout

LAYOUT_OF = [
    {"b": (np.float32, (2, 3)), "a": (np.float32, (4,))},
    {},
    {"c": (np.float32, (5,))},
]


def test_a_message_layout_lays_each_ps_tensors_back_to_back_in_name_order():
    layout = message_layout(LAYOUT_OF)
    assert layout.entries_of(0) == (("a", 0, 4, (4,)), ("b", 4, 6, (2, 3)))
    assert layout.entries_of(1) == ()  # a PS holding no dense tensor
    assert layout.entries_of(2) == (("c", 0, 5, (5,)),)
    assert message_layout([{"a": (np.float32, (1,)), "b": (np.float64, (1,))}]) is None


def test_pack_and_unpack_round_trip_per_ps():
    layout = message_layout(LAYOUT_OF)
    params = {
        "a": np.arange(4, dtype=np.float32),
        "b": np.arange(6, dtype=np.float32).reshape(2, 3) + 10,
        "c": np.arange(5, dtype=np.float32) + 20,
    }
    blocks = layout.pack(params)
    assert sorted(blocks) == [0, 2] and all(b.ctypes.data % 64 == 0 for b in blocks.values())
    for ps_id, block in blocks.items():
        for name, value in layout.unpack(ps_id, block).items():
            np.testing.assert_array_equal(value, params[name])
    assert layout.pack({"a": params["a"]}) is None  # a tensor of the layout missing
    with pytest.raises(KeyError):
        layout.unpack(1, blocks[0])
