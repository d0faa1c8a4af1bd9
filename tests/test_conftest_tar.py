"""The suite's own unpacking of ../shared's snapshots (conftest.extract_all): on Python
3.11.4 and later tarfile's ``tar`` filter, before that (Debian 12's 3.11.2, what
.ci/run picks) a fallback that must refuse and keep what the filter refuses and keeps."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import extract_all


def archive(*members: tuple[str, str, object]) -> tarfile.TarFile:
    """An in-memory tar of (name, kind, data) members: kind ``file`` (data: bytes,
    mode 0o666), ``dir``, ``symlink`` (data: its target)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(data, bytes)
                info.size, info.mode = len(data), 0o666
                tar.addfile(info, io.BytesIO(data))
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o777
                tar.addfile(info)
            else:
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


@pytest.fixture(params=["filter", "fallback"])
def unpack(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """extract_all as it runs with tarfile's filter, and as it runs without one."""
    if request.param == "fallback":
        monkeypatch.delattr(tarfile, "tar_filter", raising=False)
    elif not hasattr(tarfile, "tar_filter"):
        pytest.skip("this Python's tarfile has no extraction filter (before 3.11.4)")
    return extract_all


def test_a_member_through_a_symlink_unpacked_before_it_is_refused(
    tmp_path: Path, unpack: Callable[..., None]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    tar = archive(("link", "symlink", str(outside)), ("link/planted", "file", b"x"))
    with pytest.raises(tarfile.TarError):
        unpack(tar, target)
    assert not (outside / "planted").exists()


@pytest.mark.parametrize("name", ["../escaped", "a/../../escaped"])
def test_a_member_outside_the_target_is_refused(
    tmp_path: Path, unpack: Callable[..., None], name: str
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(tarfile.TarError):
        unpack(archive((name, "file", b"x")), target)
    assert not (tmp_path / "escaped").exists()


def test_group_and_other_write_are_dropped_and_the_tree_unpacked(
    tmp_path: Path, unpack: Callable[..., None]
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    unpack(archive(("d", "dir", None), ("d/f", "file", b"data"), ("d/l", "symlink", "f")), target)
    assert (target / "d" / "l").read_bytes() == b"data"
    assert stat.S_IMODE(os.stat(target / "d" / "f").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(target / "d").st_mode) & 0o022 == 0
