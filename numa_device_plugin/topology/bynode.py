"""What sits on each NUMA node (disks, NICs, accelerators, how many PCI devices), from
an :class:`~numa_device_plugin.topology.locality.Inventory`: the summary ``discover``,
the node page and ``/debug/state`` show per node."""

from __future__ import annotations

from dataclasses import dataclass

from numa_device_plugin.topology.locality import Inventory
from numa_device_plugin.topology.pci import is_accelerator


@dataclass(frozen=True)
class NodeDevices:
    """What sits on one NUMA node: ``disks`` (whole, non-virtual disks by name),
    ``nics`` (interfaces on a PCI device, not bonds or VLANs), ``accelerators``
    (``address class-in-words``) and ``pci`` (how many PCI devices in all)."""

    disks: tuple[str, ...]
    nics: tuple[str, ...]
    accelerators: tuple[str, ...]
    pci: int

    def document(self) -> dict[str, list[str] | int]:
        """As JSON: ``{"disks": [...], "nics": [...], "accelerators": [...], "pci": N}``."""
        return {
            "disks": list(self.disks),
            "nics": list(self.nics),
            "accelerators": list(self.accelerators),
            "pci": self.pci,
        }


NO_DEVICES = NodeDevices((), (), (), 0)


def devices_by_node(inventory: Inventory) -> dict[int, NodeDevices]:
    """What sits on each NUMA node, in one pass over ``inventory`` (time linear in the
    devices, whatever the number of NUMA nodes); a node with nothing is absent: use
    :data:`NO_DEVICES`."""
    disks: dict[int, list[str]] = {}
    nics: dict[int, list[str]] = {}
    accelerators: dict[int, list[str]] = {}
    pci: dict[int, int] = {}
    for block in inventory.block:
        if block.disk == block.name and not block.virtual:
            for node in sorted(block.nodes):
                disks.setdefault(node, []).append(block.name)
    for interface in inventory.net:
        if not interface.parts:
            for node in sorted(interface.nodes):
                nics.setdefault(node, []).append(interface.name)
    for device in inventory.pci:
        if device.numa_node is not None:
            pci[device.numa_node] = pci.get(device.numa_node, 0) + 1
            if is_accelerator(device.pci_class):
                accelerators.setdefault(device.numa_node, []).append(
                    f"{device.address} {device.class_name}"
                )
    return {
        node: NodeDevices(
            tuple(disks.get(node, ())),
            tuple(nics.get(node, ())),
            tuple(accelerators.get(node, ())),
            pci.get(node, 0),
        )
        for node in sorted({*disks, *nics, *pci})
    }


def unlocated_pci(inventory: Inventory) -> int:
    """How many PCI devices have ``numa_node`` -1 (no locality)."""
    return sum(1 for d in inventory.pci if d.numa_node is None)
