"""table_sweep.py runs end to end at a tiny size (so it cannot rot) and its JSON line is sane.
Not a performance test: nothing here depends on how fast the machine is."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table_sweep.py")


def test_tiny_sweep_prints_a_sane_json_line():
    out = run_script(
        SCRIPT,
        "--vocabs",
        "2e3,2e4,1e13,1e14",
        "--max_vocab",
        "1e13",
        "--ps",
        "1,2",
        "--batch",
        "512",
        "--fill_chunk",
        "4096",
        "--repeats",
        "2",
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "ps_table_sweep"
    assert summary["vocabs_run"] == [2000, 20000, 10**13]
    assert summary["vocabs_not_run"] == [10**14]
    # 10^13 rows fit in no PS's memory: refused before any row, by each PS count.
    assert [(p["ps"], p["vocab"]) for p in summary["refused"]] == [(1, 10**13), (2, 10**13)]
    for p in summary["refused"]:
        assert p["refused"].startswith("embedding table 'emb' (vocabulary 10,000,000,000,000")
        assert "GiB on each of" in p["refused"] and "--num_ps_pods" in p["refused"]
    points = summary["points"]
    assert [(p["ps"], p["vocab"]) for p in points] == [(1, 2000), (1, 20000), (2, 2000), (2, 20000)]
    for p in points:
        assert p["raw_bytes_per_row"] == 3 * 16 * 4
        assert p["rss_mib"] > p["empty_rss_mib"] > 0
        assert p["pull_rows_per_s"] > 0 and p["push_rows_per_s"] > 0 and p["fill_rows_per_s"] > 0
    assert set(summary["largest_vocab_in_budget_projected"]) == {"1", "2"}
    assert isinstance(summary["targets_met"], bool)


def test_a_max_vocab_below_every_vocab_is_a_one_line_error():
    out = run_script(SCRIPT, "--vocabs", "1e6", "--max_vocab", "1e3", timeout=60)
    assert out.returncode == 2
    assert "--max_vocab 1000 leaves none of --vocabs [1000000]" in out.stderr
    assert "Traceback" not in out.stderr
