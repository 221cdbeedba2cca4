"""The kept build logs: bounded, atomic, one per (user, job)."""

from __future__ import annotations

from elasticdl.server.build_logs import BuildLogs, dropped_note


def test_a_kept_log_is_its_last_bytes_from_a_line_start(tmp_path):
    logs = BuildLogs(tmp_path / "build-logs", max_bytes=100)
    text = "".join(f"line {i:03d} of the build\n" for i in range(50))  # 21 bytes a line
    logs.keep("alice", "j1", text)
    kept = logs.read("alice", "j1")
    note, _, rest = kept.partition("\n")
    dropped = len(text) - len(rest)
    assert note + "\n" == dropped_note(dropped)
    assert text.endswith(rest) and rest.startswith("line ") and len(rest.encode()) <= 100
    assert rest.splitlines()[-1] == "line 049 of the build"
    assert logs.read("bob", "j1") is None
    assert [p.name for p in (tmp_path / "build-logs" / "alice").iterdir()] == ["j1.log"]


def test_a_short_log_is_kept_whole_and_removed_with_its_job(tmp_path):
    logs = BuildLogs(tmp_path, max_bytes=100)
    logs.keep("alice", "j1", "Collecting x\nÜ done\n")
    assert logs.read("alice", "j1") == "Collecting x\nÜ done\n"
    logs.keep("alice", "j1", "")  # a later build of the same job replaces it
    assert logs.read("alice", "j1") == ""
    logs.remove("alice", "j1")
    logs.remove("alice", "j1")  # already gone: fine
    assert logs.read("alice", "j1") is None
