import random

import pytest
from elasticdl.server.jobs import last_lines

TEXT = "".join(f"line {i}\n" for i in range(50)) + "no end"


@pytest.mark.parametrize("count", [1, 2, 7, 51, 200])
def test_last_lines_of_any_chunking(count):
    rng = random.Random(count)
    cuts = sorted(rng.sample(range(1, len(TEXT)), 20))
    chunks = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)])]
    assert last_lines(chunks, count) == "".join(TEXT.splitlines(True)[-count:])


def test_last_lines_keeps_a_final_line_end_and_empty_input():
    assert last_lines(["a\nb\n", "c\n"], 2) == "b\nc\n"
    assert last_lines(["a\n\n"], 1) == "\n"
    assert last_lines([], 3) == ""
