"""The stand-in's pod resources side: ``v1.PodResourcesLister`` (List,
GetAllocatableResources, Get) on ``kubelet.sock`` in its own folder, answering from
the shared :class:`~.pods.Pods` model. It can go away and come back on its own
(:meth:`PodResourcesStandIn.stop`, :meth:`PodResourcesStandIn.start`), as the API
does around a kubelet restart.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from numa_device_plugin.api.podresources.v1 import api_pb2 as pr_pb2
from numa_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from numa_device_plugin.kubelet.grpcserver import UnixSocketServer
from numa_device_plugin.kubelet.registration import KUBELET_SOCKET_NAME
from numa_device_plugin.kubelet_standin.pods import Pods
from numa_device_plugin.plugin.serving.servicer import Context


class PodResourcesStandIn:
    """Serves the pod resources API for ``pods`` on ``<directory>/kubelet.sock``;
    ``calls`` counts List calls."""

    def __init__(self, directory: Path, pods: Pods) -> None:
        self.pods = pods
        self.calls = 0
        self.server = UnixSocketServer(
            directory / KUBELET_SOCKET_NAME,
            lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(
                _PodResourcesServicer(self), server
            ),
        )

    @property
    def socket(self) -> Path:
        return self.server.path

    async def start(self) -> None:
        """Serve (again), creating the folder when missing; no-op while serving."""
        if not self.server.serving:
            self.server.path.parent.mkdir(parents=True, exist_ok=True)
            await self.server.start()

    async def stop(self) -> None:
        """Go away, socket and all."""
        await self.server.stop(0)


class _PodResourcesServicer(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, api: PodResourcesStandIn) -> None:
        self._api = api

    async def List(
        self, request: pr_pb2.ListPodResourcesRequest, context: Context
    ) -> pr_pb2.ListPodResourcesResponse:
        self._api.calls += 1
        return pr_pb2.ListPodResourcesResponse(pod_resources=self._api.pods.listed())

    async def GetAllocatableResources(
        self, request: pr_pb2.AllocatableResourcesRequest, context: Context
    ) -> pr_pb2.AllocatableResourcesResponse:
        return self._api.pods.allocatable_resources()

    async def Get(
        self, request: pr_pb2.GetPodResourcesRequest, context: Context
    ) -> pr_pb2.GetPodResourcesResponse:
        pod = self._api.pods.find(request.pod_namespace, request.pod_name)
        if pod is not None:
            return pr_pb2.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found"
        )
        raise AssertionError("unreachable")
