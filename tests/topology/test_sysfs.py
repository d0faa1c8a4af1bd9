"""Parsers and readers of sysfs files: table tests, and errors that name file and content."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_device_plugin.topology import sysfs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", set()),
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-1,3-4,6-12,15", {0, 1, 3, 4, 6, 7, 8, 9, 10, 11, 12, 15}),
        ("0-2,33-34,45,72-73", {0, 1, 2, 33, 34, 45, 72, 73}),
        (" 4-5 \n", {4, 5}),
        ("7,7", {7}),
    ],
)
def test_parse_cpulist(text: str, expected: set[int]) -> None:
    assert sysfs.parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "1 2", "0-70000", "0x3"])
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is checked in read_parsed tests
        sysfs.parse_cpulist(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000003", {0, 1}),
        ("0000c000", {14, 15}),
        ("03", {0, 1}),
        ("00000000,0000ffff", set(range(16))),
        ("00000000,00000000,00000000,0000ff00", set(range(8, 16))),
        ("0000,3f000000", set(range(24, 30))),
        ("fc00,00000000", set(range(42, 48))),
        ("00000001,00000000", {32}),
        ("00", set()),
    ],
)
def test_parse_cpumap(text: str, expected: set[int]) -> None:
    assert sysfs.parse_cpumap(text) == expected


@pytest.mark.parametrize("text", ["", "xyz", "123456789", "ff,,ff", "0x3"])
def test_parse_cpumap_rejects(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        sysfs.parse_cpumap(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [(set(), ""), ({0}, "0"), ({0, 1, 2, 3, 8}, "0-3,8"), ({1, 3, 5}, "1,3,5"), ({5, 4}, "4-5")],
)
def test_format_cpulist(cpus: set[int], text: str) -> None:
    assert sysfs.format_cpulist(cpus) == text
    assert sysfs.parse_cpulist(text) == cpus


def test_parse_distance() -> None:
    assert sysfs.parse_distance("10 21") == (10, 21)
    for bad in ("", "10 x", "10 -1", "10 0"):
        with pytest.raises(ValueError):  # noqa: PT011
            sysfs.parse_distance(bad)


def test_parse_meminfo_total_is_bytes() -> None:
    text = "Node 1 MemFree:  5 kB\nNode 1 MemTotal:      8386704 kB\nNode 1 MemUsed: 1 kB\n"
    assert sysfs.parse_meminfo_total(text) == 8386704 * 1024
    with pytest.raises(ValueError, match="MemTotal"):
        sysfs.parse_meminfo_total("Node 0 MemFree: 5 kB")


def test_read_text_strips_trailing_nuls_and_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "online"
    path.write_bytes(b"0-1\n\x00")
    assert sysfs.read_text(path) == "0-1"
    assert sysfs.read_text(tmp_path / "missing") is None


def test_read_parsed_names_file_and_content(tmp_path: Path) -> None:
    path = tmp_path / "cpulist"
    path.write_text("0-3,banana\n")
    with pytest.raises(sysfs.SysfsFormatError) as caught:
        sysfs.read_parsed(path, sysfs.parse_cpulist)
    assert caught.value.path == path
    assert caught.value.content == "0-3,banana"
    assert str(path) in str(caught.value)
    assert "'0-3,banana'" in str(caught.value)


def test_read_text_unreadable_names_file(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(sysfs.SysfsError, match="a-folder"):
        sysfs.read_text(folder)


def test_read_text_binary_garbage_is_format_error(tmp_path: Path) -> None:
    path = tmp_path / "cpulist"
    path.write_bytes(b"\xff\xfe0-1")
    with pytest.raises(sysfs.SysfsFormatError, match="not UTF-8"):
        sysfs.read_text(path)


def test_a_sibling_folder_sharing_the_roots_name_as_a_prefix_is_outside(tmp_path: Path) -> None:
    """/sys-evil is not under /sys: a link there is refused like any link out."""
    root = tmp_path / "sys"
    evil = tmp_path / "sys-evil"
    (root / "class" / "block").mkdir(parents=True)
    (evil / "disk").mkdir(parents=True)
    (evil / "disk" / "serial").write_text("PLANTED\n")
    (root / "class" / "block" / "sda").symlink_to(evil / "disk")
    (root / "serial").symlink_to(evil / "disk" / "serial")
    confined = sysfs.Confined(root)
    assert confined.folder(root / "class" / "block" / "sda") == (
        f"{root / 'class' / 'block' / 'sda'} points outside the sysfs root"
    )
    assert not confined.inside(str(evil))
    assert confined.inside(str(root))
    with pytest.raises(sysfs.SysfsError, match="points outside the sysfs root"):
        confined.read_text(root / "serial")


def test_an_attribute_that_is_a_link_inside_the_root_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "devices" / "ctrl").mkdir(parents=True)
    (root / "devices" / "ctrl" / "serial").write_text("S1\n")
    (root / "devices" / "disk").mkdir()
    (root / "devices" / "disk" / "serial").symlink_to("../ctrl/serial")
    assert sysfs.Confined(root).read_text(root / "devices" / "disk" / "serial") == "S1"
