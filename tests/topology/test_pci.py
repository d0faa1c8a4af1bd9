"""PCI devices' sysfs values: numa_node, class codes in words."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_device_plugin.topology.fake import DeviceTree
from numa_device_plugin.topology.pci import (
    is_accelerator,
    list_entries,
    parse_numa_node,
    pci_class_name,
    read_pci_devices,
)


@pytest.mark.parametrize(
    ("text", "node"),
    [("-1", None), ("0", 0), ("1023", 1023)],
)
def test_parse_numa_node(text: str, node: int | None) -> None:
    assert parse_numa_node(text) == node


@pytest.mark.parametrize(
    ("code", "words", "accelerator"),
    [
        (0x010802, "NVMe controller", False),
        (0x020000, "Ethernet controller", False),
        (0x030200, "3D controller", True),
        (0x120000, "processing accelerator", True),
        (0x0B4000, "co-processor", True),
        (0x01FF00, "mass storage controller", False),
        (0xFFFF00, "class 0xffff00", False),
    ],
)
def test_pci_class_in_words(code: int, words: str, accelerator: bool) -> None:
    assert pci_class_name(code) == words
    assert is_accelerator(code) is accelerator


@pytest.mark.parametrize("text", ["", "-2", "1024", "9223372036854775808", "0x1", "\u0661"])
def test_parse_numa_node_refuses_what_the_kernel_never_writes(text: str) -> None:
    with pytest.raises(ValueError, match="NUMA node"):
        parse_numa_node(text)


def test_an_entry_named_a_pci_address_with_trailing_junk_is_left_out(tmp_path: Path) -> None:
    """Mutant: ``match`` for ``fullmatch``."""
    tree = DeviceTree(tmp_path)
    tree.pci("0000:41:00.0", 1)
    folder = tree.pci_folder("0000:41:00.0")
    (tmp_path / "bus/pci/devices/0000:41:00.0junk").symlink_to(folder)
    warnings: list[str] = []
    assert [d.address for d in read_pci_devices(tmp_path, warnings)] == ["0000:41:00.0"]
    assert any("0000:41:00.0junk is not named as a PCI address" in w for w in warnings)


@pytest.mark.parametrize("missing", ["class", "vendor", "device"])
def test_a_pci_device_without_an_id_file_is_left_out(tmp_path: Path, missing: str) -> None:
    """Mutant: a missing ``device`` file accepted."""
    tree = DeviceTree(tmp_path)
    tree.pci("0000:41:00.0", 1)
    (tree.pci_folder("0000:41:00.0") / missing).unlink()
    warnings: list[str] = []
    assert read_pci_devices(tmp_path, warnings) == ()
    assert any("lacks class, vendor or device" in w for w in warnings)


def test_kernel_names_are_listed_with_their_numbers_in_order(tmp_path: Path) -> None:
    """Mutant: kernel names sorted as text (nvme10n1 before nvme2n1)."""
    for name in ("nvme10n1", "nvme2n1", "nvme1n1", "sda", "nvme1n10"):
        (tmp_path / name).mkdir()
    listed = list_entries(tmp_path, "block devices", [], natural=True)
    assert listed == ["nvme1n1", "nvme1n10", "nvme2n1", "nvme10n1", "sda"]
    assert list_entries(tmp_path, "x", []) == sorted(listed)  # plain order when not natural
