"""PCI devices' sysfs values: numa_node, class codes in words."""

from __future__ import annotations

import pytest

from numa_device_plugin.topology.pci import is_accelerator, parse_numa_node, pci_class_name


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
