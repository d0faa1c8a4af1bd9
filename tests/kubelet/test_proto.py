"""The wire contract: the committed stubs are fresh, and v1beta1 names and numbers match
the kubelet's api.proto (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from numa_device_plugin.api.deviceplugin.v1beta1 import api_pb2
from tests.conftest import REPO, load_script


def _load_generator() -> object:
    return load_script(REPO / "protos" / "generate.py", "protos_generate")


def test_committed_stubs_are_not_stale(tmp_path: Path) -> None:
    generator = _load_generator()
    written = generator.generate(tmp_path)  # type: ignore[attr-defined]
    assert written, "no .proto file under protos/"
    for fresh in written:
        committed = REPO / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run `make proto`"
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{committed.relative_to(REPO)} is stale: run `make proto` and commit the result"
        )


# message -> [(field name, number, repeated)], as the kubelet defines them.
MESSAGES: dict[str, list[tuple[str, int, bool]]] = {
    "DevicePluginOptions": [
        ("pre_start_required", 1, False),
        ("get_preferred_allocation_available", 2, False),
    ],
    "RegisterRequest": [
        ("version", 1, False),
        ("endpoint", 2, False),
        ("resource_name", 3, False),
        ("options", 4, False),
    ],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1, True)],
    "TopologyInfo": [("nodes", 1, True)],
    "NUMANode": [("ID", 1, False)],
    "Device": [("ID", 1, False), ("health", 2, False), ("topology", 3, False)],
    "PreStartContainerRequest": [("devices_ids", 1, True)],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [("container_requests", 1, True)],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, True),
        ("must_include_deviceIDs", 2, True),
        ("allocation_size", 3, False),
    ],
    "PreferredAllocationResponse": [("container_responses", 1, True)],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, True)],
    "AllocateRequest": [("container_requests", 1, True)],
    "ContainerAllocateRequest": [("devices_ids", 1, True)],
    "CDIDevice": [("name", 1, False)],
    "AllocateResponse": [("container_responses", 1, True)],
    "ContainerAllocateResponse": [
        ("envs", 1, True),
        ("mounts", 2, True),
        ("devices", 3, True),
        ("annotations", 4, True),
        ("cdi_devices", 5, True),
    ],
    "Mount": [("container_path", 1, False), ("host_path", 2, False), ("read_only", 3, False)],
    "DeviceSpec": [
        ("container_path", 1, False),
        ("host_path", 2, False),
        ("permissions", 3, False),
    ],
}

SERVICES = {
    "Registration": [("Register", "RegisterRequest", "Empty", False)],
    "DevicePlugin": [
        ("GetDevicePluginOptions", "Empty", "DevicePluginOptions", False),
        ("ListAndWatch", "Empty", "ListAndWatchResponse", True),
        (
            "GetPreferredAllocation",
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
            False,
        ),
        ("Allocate", "AllocateRequest", "AllocateResponse", False),
        ("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", False),
    ],
}


def test_package_is_v1beta1() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"


@pytest.mark.parametrize("message", sorted(MESSAGES))
def test_message_fields(message: str) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    fields = [(f.name, f.number, f.is_repeated) for f in descriptor.fields]
    assert sorted(fields, key=lambda f: f[1]) == MESSAGES[message]


def test_no_extra_messages() -> None:
    assert sorted(api_pb2.DESCRIPTOR.message_types_by_name) == sorted(MESSAGES)


def test_map_fields_are_string_maps() -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name["ContainerAllocateResponse"]
    for name in ("envs", "annotations"):
        entry = descriptor.fields_by_name[name].message_type
        assert entry is not None
        assert entry.GetOptions().map_entry
        assert [f.type for f in entry.fields] == [FieldDescriptor.TYPE_STRING] * 2


def test_numa_node_id_is_int64() -> None:
    field = api_pb2.DESCRIPTOR.message_types_by_name["NUMANode"].fields_by_name["ID"]
    assert field.type == FieldDescriptor.TYPE_INT64


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_services(service: str) -> None:
    descriptor = api_pb2.DESCRIPTOR.services_by_name[service]
    methods = [
        (m.name, m.input_type.name, m.output_type.name, m.server_streaming)
        for m in descriptor.methods
    ]
    assert methods == SERVICES[service]
    assert not any(m.client_streaming for m in descriptor.methods)
