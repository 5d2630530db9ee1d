"""xdpx.io: fsspec paths (local and memory://) and atomic writes."""

from __future__ import annotations

import os

import pytest

from xdpx import io


@pytest.mark.parametrize("base", ["local", "memory://xdpx-test-io"])
def test_round_trip_and_listing(tmp_path, base):
    root = str(tmp_path) if base == "local" else base
    path = io.join(root, "a", "b.txt")
    io.write_text(path, "你好\n")
    assert io.exists(path) and io.isfile(path) and io.isdir(io.join(root, "a"))
    assert io.read_text(path) == "你好\n"
    io.write_bytes(io.join(root, "a", "c.bin"), b"\x00\x01")
    assert [p.rsplit("/", 1)[-1] for p in io.glob(io.join(root, "a", "*"))] == ["b.txt", "c.bin"]
    io.rm(io.join(root, "a"), recursive=True)
    assert not io.exists(path)


@pytest.mark.parametrize("base", ["local", "memory://xdpx-test-atomic"])
def test_failed_write_keeps_previous_file_and_leaves_no_temp(tmp_path, base):
    root = str(tmp_path) if base == "local" else base
    path = io.join(root, "out.txt")
    io.write_text(path, "old")
    with pytest.raises(RuntimeError):
        with io.open_atomic(path, "wb") as f:
            f.write(b"half")
            raise RuntimeError("crash mid-write")
    assert io.read_text(path) == "old"
    assert [p.rsplit("/", 1)[-1] for p in io.glob(io.join(root, "*"))] == ["out.txt"]


def test_open_refuses_write_modes(tmp_path):
    with pytest.raises(ValueError, match="open_atomic"):
        io.open(str(tmp_path / "x"), "w")


def test_replace_dir_swaps_whole_directory(tmp_path):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old.txt").write_text("old")
    tmp = io.tmp_sibling(str(final))
    io.write_text(io.join(tmp, "new.txt"), "new")
    io.replace_dir(tmp, str(final))
    assert sorted(os.listdir(final)) == ["new.txt"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_dirname_of_paths_and_urls():
    assert io.dirname("models/run/best") == "models/run"
    assert io.dirname("memory://bucket/run/best/") == "memory://bucket/run"
    assert io.dirname("confusion.png") == "."
