from elasticdl.server.uploads import clear_tmp


def test_clear_tmp_removes_only_what_the_server_wrote(tmp_path):
    (tmp_path / "upload-abc").write_bytes(b"half an upload")
    staging = tmp_path / "package-0123456789ab-xyz"
    (staging / "zoo").mkdir(parents=True)
    (staging / "zoo" / "model.py").write_text("pass\n")
    (tmp_path / "notes.txt").write_text("someone else's")
    (tmp_path / "theirs").mkdir()
    clear_tmp(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "theirs"]
    clear_tmp(tmp_path / "absent")  # no tmp/ yet: nothing to do
