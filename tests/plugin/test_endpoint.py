"""Endpoints: one server and one registration per resource; what counts as registered
when a registration finishes late or the endpoint stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from numa_device_plugin.plugin.advertised.build import build_resource
from numa_device_plugin.plugin.model.recorder import NullRecorder
from numa_device_plugin.plugin.serving import endpoint as endpoint_module
from numa_device_plugin.plugin.serving.endpoint import Endpoint, Endpoints
from numa_device_plugin.plugin.serving.servicer import NumaDevicePluginServicer
from numa_device_plugin.plugin.settings.config import Config
from numa_device_plugin.topology.fake import SysfsTree


@pytest.fixture
def endpoints_config(two_nodes: SysfsTree, sock_dir: Path) -> Config:
    return Config(sysfs_root=two_nodes.root, socket_dir=sock_dir, register_timeout=1.0)


def an_endpoint(config: Config) -> Endpoint:
    resource = build_resource("numa-align", 0, 3)
    return Endpoint(config, resource, NumaDevicePluginServicer(resource), (1, 2, 3))


def recording_endpoints(config: Config, registered: list[str]) -> Endpoints:
    return Endpoints(
        config, NullRecorder(), on_registered=registered.append, on_change=lambda: None
    )


async def test_a_registration_finishing_after_its_endpoint_was_replaced_does_not_count(
    endpoints_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: a stale registration of a replaced endpoint counted."""

    async def accepted(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(endpoint_module, "register", accepted)
    seen: list[str] = []
    endpoints = recording_endpoints(endpoints_config, seen)
    old, new = an_endpoint(endpoints_config), an_endpoint(endpoints_config)
    endpoints._running[old.resource.name] = new
    await endpoints.keep_registering(old)
    assert endpoints.registered == set()
    assert seen == []
    endpoints._running[new.resource.name] = new
    await endpoints.keep_registering(new)
    assert endpoints.registered == {new.resource.name}
    assert seen == [new.resource.name]


async def test_stopping_ends_the_registration_and_the_registered_state(
    endpoints_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutants: the ``await`` on the cancelled registration dropped (it ran on after
    stop returned); stopped endpoints left in ``registered``."""
    gate = asyncio.Event()

    async def slow(*args: object, **kwargs: object) -> None:
        try:
            await gate.wait()
        finally:  # as register's channel does: closing it takes a few loop turns
            await asyncio.sleep(0.2)

    monkeypatch.setattr(endpoint_module, "register", slow)
    endpoints = recording_endpoints(endpoints_config, [])
    resource = build_resource("numa-align", 0, 3)
    await endpoints.start(resource, NumaDevicePluginServicer(resource), (1, 2, 3))
    running = endpoints.running[resource.name]
    await endpoints.stop([resource.name], 0.1)
    assert running.registration is not None
    assert running.registration.done(), "stop returns once the registration has ended"

    gate.set()
    fast = build_resource("numa-align", 1, 3)
    await endpoints.start(fast, NumaDevicePluginServicer(fast), (1, 2, 3))
    registration = endpoints.running[fast.name].registration
    assert registration is not None
    await registration
    assert endpoints.registered == {fast.name}
    await endpoints.stop([fast.name], 0.1)
    assert endpoints.registered == set()
