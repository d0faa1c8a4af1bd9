"""Helpers for tests that run the plugin against the kubelet stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from numa_device_plugin.config import Config
from numa_device_plugin.kubelet_standin import KubeletStandIn
from numa_device_plugin.manager import PluginManager


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[PluginManager]:
    """Run ``PluginManager.serve`` in a task for the block; stop it and re-raise its error."""
    manager = PluginManager(config)
    task = asyncio.create_task(manager.serve())
    try:
        yield manager
    finally:
        manager.stop()
        await asyncio.wait_for(task, 10)


def all_live(kubelet: KubeletStandIn, names: list[str]) -> bool:
    return all(kubelet.live(name) for name in names)


async def wait_all_live(kubelet: KubeletStandIn, names: list[str], timeout: float = 10) -> None:
    await kubelet.wait_until(lambda: all_live(kubelet, names), timeout)


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds, for state the stand-in does not
    announce (the plugin's servicers, files); raises TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - nothing announces this state: poll it
            await asyncio.sleep(0.01)
