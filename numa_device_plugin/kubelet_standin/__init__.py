"""An in-process stand-in for the kubelet, for tests and the demo.

No kubelet can run on a developer's machine or in CI, so this package behaves as
the kubelet does toward device plugins (``shared/KUBELET.md``), in two sides that
share one pod model:

- :mod:`.devicemanager`: ``v1beta1.Registration`` on ``kubelet.sock``, the dial back,
  ListAndWatch, Allocate and GetPreferredAllocation;
- :mod:`.podresources`: ``v1.PodResourcesLister`` on ``kubelet.sock`` in
  ``pod_resources_dir``, answering from :mod:`.pods`.

:class:`KubeletStandIn` puts them together. :meth:`KubeletStandIn.restart` does
what a kubelet restart does: the old process's connections go away, every file in
the folder except ``kubelet_internal_checkpoint`` is deleted, and ``kubelet.sock``
is created anew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.kubelet_standin.devicemanager import (
    DIAL_TIMEOUT,
    DeviceManagerStandIn,
    PluginClient,
    RegisterRecord,
)
from numa_device_plugin.kubelet_standin.podresources import PodResourcesStandIn
from numa_device_plugin.kubelet_standin.pods import Container, Pods

__all__ = ["CHECKPOINT_NAME", "KubeletStandIn", "PluginClient", "RegisterRecord"]

CHECKPOINT_NAME = "kubelet_internal_checkpoint"


class KubeletStandIn:
    """Behaves like the kubelet toward plugins in ``directory`` (and, with
    ``pod_resources_dir``, serves the pod resources API there).

    ``device_manager`` and ``pod_resources`` are the two sides, ``model`` their pods.
    Use :meth:`wait_until` to wait for a state instead of sleeping.
    """

    def __init__(
        self,
        directory: Path,
        *,
        dial_timeout: float = DIAL_TIMEOUT,
        pod_resources_dir: Path | None = None,
        allocatable_cpus: Sequence[int] = (),
        cpu_manager_policy: str = "static",
        allocatable_memory: Mapping[int, int | Mapping[str, int]] | None = None,
        memory_manager_policy: str = "Static",
    ) -> None:
        self.directory = directory
        self._changed = asyncio.Event()
        self.device_manager = DeviceManagerStandIn(
            directory, self._notify, dial_timeout=dial_timeout
        )
        self.model = Pods(
            self.device_manager.devices,
            self.device_manager.open_devices,
            allocatable_cpus=allocatable_cpus,
            cpu_manager_policy=cpu_manager_policy,
            allocatable_memory=allocatable_memory,
            memory_manager_policy=memory_manager_policy,
        )
        self.pod_resources: PodResourcesStandIn | None = None
        if pod_resources_dir is not None:
            self.pod_resources = PodResourcesStandIn(pod_resources_dir, self.model)
        self.restarts = 0
        self.restarted_at = 0.0

    # -- the pod model, as attributes ------------------------------------------------------

    @property
    def pods(self) -> list[pr_pb2.PodResources]:
        return self.model.pods

    @property
    def allocatable_cpus(self) -> list[int]:
        return self.model.allocatable_cpus

    @allocatable_cpus.setter
    def allocatable_cpus(self, cpus: Sequence[int]) -> None:
        self.model.allocatable_cpus = list(cpus)

    @property
    def pod_resources_calls(self) -> int:
        return self.pod_resources.calls if self.pod_resources is not None else 0

    @property
    def pod_resources_socket(self) -> Path | None:
        return self.pod_resources.socket if self.pod_resources is not None else None

    def add_pod(
        self,
        namespace: str,
        name: str,
        containers: Sequence[Container],
    ) -> None:
        """Place a pod (:meth:`Pods.add`): per container its name, ``{resource: device
        ids}``, exclusive CPU ids and, optionally, memory blocks ``(type, bytes, NUMA
        nodes)``."""
        self.model.add(namespace, name, containers)

    def remove_pod(self, namespace: str, name: str) -> None:
        self.model.remove(namespace, name)

    def allocatable_resources(self) -> pr_pb2.AllocatableResourcesResponse:
        return self.model.allocatable_resources()

    # -- the device manager, as attributes -------------------------------------------------

    @property
    def socket_path(self) -> Path:
        return self.device_manager.server.path

    @property
    def clients(self) -> dict[str, PluginClient]:
        return self.device_manager.clients

    @property
    def registrations(self) -> list[RegisterRecord]:
        return self.device_manager.registrations

    def devices(self, resource_name: str) -> tuple[api_pb2.Device, ...]:
        return self.device_manager.devices(resource_name)

    def allocatable(self, resource_name: str) -> int:
        return self.device_manager.allocatable(resource_name)

    def open_streams(self, resource_name: str) -> int:
        return self.device_manager.open_streams(resource_name)

    def live(self, resource_name: str) -> bool:
        return self.device_manager.live(resource_name)

    async def allocate(
        self, resource_name: str, device_ids: Sequence[str]
    ) -> api_pb2.AllocateResponse:
        """Allocate as the kubelet does: one container request per call.

        Raises LookupError when the resource has no plugin, grpc.aio.AioRpcError
        when the plugin refuses.
        """
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        return await self.device_manager.call_allocate(resource_name, request)

    async def call_allocate(
        self, resource_name: str, request: api_pb2.AllocateRequest
    ) -> api_pb2.AllocateResponse:
        return await self.device_manager.call_allocate(resource_name, request)

    async def get_preferred_allocation(
        self,
        resource_name: str,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> api_pb2.PreferredAllocationResponse:
        return await self.device_manager.get_preferred_allocation(
            resource_name, available, must_include, size
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create ``kubelet.sock`` and serve Registration (and the pod resources API)."""
        await self.device_manager.start()
        if self.pod_resources is not None:
            await self.pod_resources.start()
        self._notify()

    async def stop(self) -> None:
        """The kubelet process goes away: every plugin connection closes, the socket too
        (the pod resources API stays: :meth:`stop_pod_resources`)."""
        await self.device_manager.stop()
        self._notify()

    async def restart(self) -> None:
        """As a kubelet restart: stop, delete every socket in the folder, create kubelet.sock.

        ``restarted_at`` is the ``time.perf_counter()`` just before the new
        ``kubelet.sock`` is created, for latency measurements.
        """
        await self.stop()
        for entry in self.directory.iterdir():
            if entry.name != CHECKPOINT_NAME and not entry.is_dir():
                entry.unlink(missing_ok=True)
        self.restarts += 1
        self.restarted_at = time.perf_counter()
        await self.start()

    async def stop_pod_resources(self) -> None:
        """The pod resources API goes away (its socket too); the device manager stays."""
        if self.pod_resources is not None:
            await self.pod_resources.stop()

    async def start_pod_resources(self) -> None:
        """The pod resources API serves again, on a new socket."""
        if self.pod_resources is not None:
            await self.pod_resources.start()

    async def __aenter__(self) -> KubeletStandIn:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
        await self.stop_pod_resources()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds; raises TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate():
                changed = self._changed
                await changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
