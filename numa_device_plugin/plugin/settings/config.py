"""Settings of the device plugin daemon, separate from the code that serves.

:class:`Config` is frozen: the CLI builds it once from flags and environment
variables, and every other part only reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from numa_device_plugin.kubelet.grpcserver import check_socket_path
from numa_device_plugin.kubelet.registration import KUBELET_SOCKET_NAME
from numa_device_plugin.plugin.model.names import DEFAULT_RESOURCE_PREFIX, validate_resource_prefix
from numa_device_plugin.plugin.model.near import Near, check_near
from numa_device_plugin.plugin.model.resources import (
    CPUS,
    DEFAULT_CAPACITY,
    Capacity,
    validate_capacity,
)
from numa_device_plugin.plugin.settings.values import ANY_RESOURCE_VALUES
from numa_device_plugin.topology.memory import ReservedMemory

DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")
# Where kubelets of common distributions keep the device-plugin folder:
# upstream (and RKE2, kubeadm, k3s), k0s, microk8s.
KNOWN_SOCKET_DIRS: tuple[Path, ...] = (
    DEFAULT_SOCKET_DIR,
    Path("/var/lib/k0s/kubelet/device-plugins"),
    Path("/var/snap/microk8s/common/var/lib/kubelet/device-plugins"),
)


def detect_socket_dir(candidates: Sequence[Path] = KNOWN_SOCKET_DIRS) -> Path:
    """The first candidate folder holding ``kubelet.sock``; the first candidate when none does."""
    for folder in candidates:
        if (folder / KUBELET_SOCKET_NAME).exists():
            return folder
    return candidates[0]


def podresources_socket(device_plugin_dir: Path) -> Path:
    """``pod-resources/kubelet.sock`` beside the device-plugin folder, as kubelets lay
    them out (``/var/lib/kubelet/pod-resources/kubelet.sock`` for the standard folder,
    the matching path for k0s and microk8s)."""
    return device_plugin_dir.parent / "pod-resources" / KUBELET_SOCKET_NAME


def check_socket_dir(folder: Path) -> None:
    """Raise ValueError, naming ``folder``, when the plugin could not create sockets in it.

    Unusable: a file (or anything but a folder) at the path or at one of its
    parents, a folder this process may not write to (read-only file system,
    permissions), or a path so long that ``kubelet.sock`` in it exceeds the
    unix socket path limit. A folder that does not exist yet is fine when its
    nearest existing parent is a writable folder (the plugin creates it).
    """
    check_socket_path(folder / KUBELET_SOCKET_NAME)
    existing = folder
    while not existing.exists() and not existing.is_symlink():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == folder else f"cannot be created in {existing}"
        raise ValueError(f"{folder} {what} (read-only file system or permissions)")


@dataclass(frozen=True)
class Config:
    """Everything ``numa-device-plugin serve`` is told.

    ``sysfs_root``: folder holding ``devices/system`` (``/sys`` on a node).
    ``socket_dir``: the kubelet's device-plugin folder (holds ``kubelet.sock``).
    ``resource_prefix``: domain of the resource names, ``<prefix>/numa-<id>``.
    ``capacity``: slot devices per NUMA node, or ``cpus`` (one device per
    exclusive CPU, kept live from the pod resources API).
    ``include_cpuless_nodes``: also advertise NUMA nodes without a usable CPU.
    ``register_timeout``: seconds one Register call may take; above the kubelet's
    10 s dial back inside Register (``pkg/kubelet/cm/devicemanager/plugin/v1beta1``,
    ``dial``), whose outcome a shorter timeout cannot know.
    ``shutdown_grace``: seconds in-flight calls get when a server stops.
    ``debounce``: seconds to gather a burst of file events into one restart.
    ``pod_resources_socket``: the kubelet's pod resources API (None: beside the
    device-plugin folder, :func:`podresources_socket`); ``pod_resources_interval``:
    seconds between reads of it; ``cgroup_root``: the host's cgroup folder, whose
    ``kubepods`` folder is watched to read it on change (None: on the interval only,
    :mod:`numa_device_plugin.kubelet.kubepods`). ``reserved_cpus``: CPUs the kubelet keeps for
    itself, used in ``cpus`` mode only while the API cannot be read.
    ``allow_unaligned``: keep devices Healthy on a kubelet whose CPU manager is
    not ``static`` (or, for memory resources, whose Memory Manager is not ``Static``).
    ``memory_unit``: bytes per memory device, None: no memory resources;
    ``reserved_memory``: the kubelet's ``--reserved-memory`` as (NUMA node, memory
    type, bytes), used for memory only while the API cannot be read.
    ``near``: resources that follow a device (``--near NAME=SELECTOR``), each
    advertised as ``<resource_prefix>/<name>`` on the selected device's NUMA nodes;
    ``mount_table``: the host's mountinfo, where ``path:`` selectors look paths up;
    ``device_interval``: seconds between re-reads of the devices (hotplug), 0: never.
    ``any_resource``: ``auto`` (``<prefix>/any`` in ``cpus`` mode), ``on`` (refused
    with slots: a slot count cannot tell the scheduler what fits) or ``off``;
    ``socket_resources`` likewise for ``<prefix>/socket-S``, one per socket holding
    more than one NUMA node with CPUs.

    Raises ValueError from ``__post_init__`` for an invalid prefix, capacity,
    a non-positive duration, a near name that is invalid or given twice, or settings
    that contradict ``cpus`` mode.
    """

    sysfs_root: Path = Path("/sys")
    socket_dir: Path = DEFAULT_SOCKET_DIR
    resource_prefix: str = DEFAULT_RESOURCE_PREFIX
    capacity: Capacity = DEFAULT_CAPACITY
    include_cpuless_nodes: bool = False
    register_timeout: float = 15.0
    shutdown_grace: float = 1.0
    debounce: float = 0.002
    pod_resources_socket: Path | None = None
    pod_resources_interval: float = 5.0
    cgroup_root: Path | None = None
    reserved_cpus: frozenset[int] = frozenset()
    allow_unaligned: bool = False
    memory_unit: int | None = None
    reserved_memory: ReservedMemory = ()
    near: tuple[Near, ...] = ()
    mount_table: Path = Path("/proc/1/mountinfo")
    device_interval: float = 60.0
    any_resource: str = "auto"
    socket_resources: str = "auto"

    def __post_init__(self) -> None:
        for what, value, flag in (("any resource", self.any_resource, "--any-resource"),
                                  ("socket resources", self.socket_resources,
                                   "--socket-resources")):  # fmt: skip
            if value not in ANY_RESOURCE_VALUES:
                raise ValueError(
                    f"{what} must be one of {', '.join(ANY_RESOURCE_VALUES)}, got {value!r}"
                )
            if value == "on" and self.capacity != CPUS:
                name = "any" if flag == "--any-resource" else "socket-<id>"
                raise ValueError(
                    f"{self.resource_prefix}/{name} needs --capacity cpus: its device count "
                    "must be the free CPUs of the NUMA node with the most room, and a slot "
                    f"count cannot tell the scheduler what fits (use --capacity cpus, or "
                    f"{flag} off)"
                )
        validate_resource_prefix(self.resource_prefix)
        check_near(self.resource_prefix, self.near)
        validate_capacity(self.capacity)
        if self.register_timeout <= 0:
            raise ValueError(f"register timeout must be positive, got {self.register_timeout}")
        if not self.device_interval >= 0:
            raise ValueError(f"device interval must not be negative, got {self.device_interval}")
        if self.shutdown_grace < 0:
            raise ValueError(f"shutdown grace must not be negative, got {self.shutdown_grace}")
        if self.debounce < 0:
            raise ValueError(f"debounce must not be negative, got {self.debounce}")
        if not self.pod_resources_interval > 0:
            raise ValueError(
                f"pod resources interval must be positive, got {self.pod_resources_interval}"
            )
        if self.capacity == CPUS and self.include_cpuless_nodes:
            raise ValueError(
                "--capacity cpus gives a NUMA node one device per CPU: a CPU-less node "
                "would have none (drop --include-cpuless-nodes)"
            )
        if self.reserved_cpus and self.capacity != CPUS:
            raise ValueError("--reserved-cpus only applies with --capacity cpus")
        if self.memory_unit is not None and self.memory_unit <= 0:
            raise ValueError(f"memory unit must be positive, got {self.memory_unit}")
        if self.reserved_memory and self.memory_unit is None:
            raise ValueError("--reserved-memory only applies with --memory-unit")

    @property
    def cpus_mode(self) -> bool:
        return self.capacity == CPUS

    @property
    def serves_any(self) -> bool:
        """True when ``<prefix>/any`` is advertised (``any_resource`` on, or auto in
        ``cpus`` mode)."""
        return self.any_resource == "on" or (self.any_resource == "auto" and self.cpus_mode)

    @property
    def serves_sockets(self) -> bool:
        """True when ``<prefix>/socket-S`` are advertised where a socket holds several
        NUMA nodes with CPUs (``socket_resources`` on, or auto in ``cpus`` mode)."""
        return self.socket_resources == "on" or (self.socket_resources == "auto" and self.cpus_mode)

    @property
    def pod_resources_path(self) -> Path:
        """The pod resources API socket: as given, else beside the device-plugin folder."""
        return self.pod_resources_socket or podresources_socket(self.socket_dir)

    @property
    def kubelet_socket(self) -> Path:
        return self.socket_dir / KUBELET_SOCKET_NAME


_CONFIG_FIELDS = (
    "sysfs_root",
    "resource_prefix",
    "capacity",
    "include_cpuless_nodes",
    "register_timeout",
    "shutdown_grace",
    "pod_resources_socket",
    "pod_resources_interval",
    "cgroup_root",
    "reserved_cpus",
    "allow_unaligned",
    "memory_unit",
    "reserved_memory",
    "near",
    "mount_table",
    "device_interval",
    "any_resource",
    "socket_resources",
)


def config_default(name: str) -> Any:
    """Config's default for the field ``name``: the one place a setting's default is
    written, which the command line's options show and use. Raises KeyError for a name
    that is not a field with a plain default."""
    for field in fields(Config):
        if field.name == name and field.default is not MISSING:
            return field.default
    raise KeyError(name)


def config_from_params(params: Mapping[str, Any]) -> Config:
    """The frozen :class:`Config` for a command's resolved options (``ctx.params``);
    settings the command has no option for keep Config's defaults. Raises ValueError
    for a combination Config refuses (e.g. ``--reserved-cpus`` without ``cpus``)."""
    values = {name: params[name] for name in _CONFIG_FIELDS if name in params}
    values["socket_dir"] = params.get("socket_dir") or detect_socket_dir()
    return Config(**values)
