"""The test cluster of ``make test-e2e-local WORKERS=2``: what it looks like, as data and
commands, with no side effects (:mod:`cluster` runs them).

- **The control plane** (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
  and the registry run on this machine, in the harness's private mount, PID and network
  namespace, on the bridge :data:`BRIDGE` at :data:`CONTROL_PLANE_IP`.
- **Each worker** is a qemu guest booting Debian's stock kernel, its NIC a tap device on
  that bridge. It runs containerd and a kubelet that joins the API server over the
  bridge, and pulls the plugin's image from the registry. Worker A (the first) has two
  NUMA nodes of CPUs and a memory-only node; the others have two NUMA nodes of CPUs.
- **Pods** of worker *i* get addresses from ``10.88.<i+1>.0/24`` on the guest's own CNI
  bridge; every worker routes the other workers' pod subnets to them, so the tests in
  worker A reach a plugin pod on worker B by its pod IP.
- **The tests** run in worker A, which is then a node like the one-node harness's (its
  kubelet can be killed, its pod-resources socket read); worker B is reached through the
  API server and pod IPs only.

The guests and the host meet on the results shares (one writable 9p folder per guest):
the host writes ``spec.json`` before boot, ``go`` when the plugin is installed (worker A
then runs pytest) and ``stop`` when the tests are done; each guest writes ``up`` when its
node joined, ``exit-code`` and its ``logs/`` at the end.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass
from typing import Any

import shipped

BRIDGE = "ndp0"
CONTROL_PLANE_IP = "10.99.0.1"
PREFIX = 24
SERVICE_IP = "10.96.0.1"  # the ``kubernetes`` Service's ClusterIP (shipped.SERVICE_RANGE)
REGISTRY_HOST = "registry.local"
REGISTRY_PORT = 5000
MAX_WORKERS = 8
QMP_PORT = 4440  # worker i's qemu monitor listens on CONTROL_PLANE_IP:QMP_PORT+i
# The control plane stops after every guest is off: a kubelet outliving its API server
# only logs errors, but a guest killed while its kubelet still runs loses its logs.
STOP_ORDER = (
    "guests", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd",
    "docker-registry",
)  # fmt: skip


@dataclass(frozen=True)
class Worker:
    """One worker guest: its node name, address on :data:`BRIDGE`, NIC (tap device on
    the host side, MAC in the guest), pod subnet and the CNI bridge's gateway there, and
    whether it has a memory-only NUMA node. ``tests``: pytest runs in this guest."""

    index: int
    name: str
    ip: str
    tap: str
    mac: str
    pod_subnet: str
    pod_gateway: str
    memory_only_node: bool
    tests: bool

    @property
    def qmp_port(self) -> int:
        """The port of its qemu's monitor (QMP) on :data:`CONTROL_PLANE_IP`: the tests
        remove and add devices there."""
        return QMP_PORT + self.index

    @property
    def letter(self) -> str:
        return string.ascii_lowercase[self.index]

    def public(self) -> dict[str, Any]:
        """What the e2e tests read of it (``NUMA_E2E_LOCAL``'s ``workers``): its fields
        and ``qmp`` (``host:port`` of its qemu monitor)."""
        return {**asdict(self), "qmp": f"{CONTROL_PLANE_IP}:{self.qmp_port}"}


def workers(count: int, prefix: str = "numa-e2e") -> list[Worker]:
    """``count`` workers named ``<prefix>-a``, ``<prefix>-b``, …; the first has the
    memory-only node and runs the tests. Raises ValueError unless 1 ≤ count ≤
    :data:`MAX_WORKERS`."""
    if not 1 <= count <= MAX_WORKERS:
        raise ValueError(f"WORKERS={count}: use 1 to {MAX_WORKERS}")
    found = []
    for index in range(count):
        letter = string.ascii_lowercase[index]
        found.append(
            Worker(
                index=index,
                name=f"{prefix}-{letter}",
                ip=f"10.99.0.{11 + index}",
                tap=f"ndp-tap-{letter}",
                mac=f"52:54:00:99:00:{11 + index:02x}",
                pod_subnet=f"10.88.{index + 1}.0/24",
                pod_gateway=f"10.88.{index + 1}.1",
                memory_only_node=index == 0,
                tests=index == 0,
            )
        )
    return found


def host_network_commands(found: list[Worker]) -> list[list[str]]:
    """In the control plane's network namespace: loopback, the bridge with the control
    plane's address, one persistent tap device per worker on it (qemu opens it by name),
    and a route to each worker's pod subnet through that worker."""
    commands = [
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "addr", "add", f"{CONTROL_PLANE_IP}/{PREFIX}", "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
    ]
    for worker in found:
        commands += [
            ["ip", "tuntap", "add", "dev", worker.tap, "mode", "tap"],
            ["ip", "link", "set", worker.tap, "master", BRIDGE],
            ["ip", "link", "set", worker.tap, "up"],
        ]
    for worker in found:
        commands.append(["ip", "route", "add", worker.pod_subnet, "via", worker.ip])
    return commands


def guest_network_commands(
    me: Worker, found: list[Worker], interface: str, apiserver_port: int
) -> list[list[str]]:
    """In worker ``me``'s guest (its own kernel): the NIC ``interface`` with the worker's
    address and the control plane as default route, the CNI bridge ``cni0`` with the pod
    gateway, routes to the other workers' pod subnets, forwarding on, and the
    ``kubernetes`` Service's ClusterIP sent to the API server (what kube-proxy would do
    for that one Service)."""
    target = f"{CONTROL_PLANE_IP}:{apiserver_port}"
    commands = [
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", f"{me.ip}/{PREFIX}", "dev", interface],
        ["ip", "link", "set", interface, "up"],
        ["ip", "route", "add", "default", "via", CONTROL_PLANE_IP],
        ["ip", "link", "add", "cni0", "type", "bridge"],
        ["ip", "addr", "add", f"{me.pod_gateway}/24", "dev", "cni0"],
        ["ip", "link", "set", "cni0", "up"],
        ["sysctl", "-w", "net.ipv4.ip_forward=1"],
    ]
    for other in found:
        if other.name != me.name:
            commands.append(["ip", "route", "add", other.pod_subnet, "via", other.ip])
    for chain in ("PREROUTING", "OUTPUT"):
        commands.append(
            ["iptables", "-t", "nat", "-A", chain, "-d", f"{SERVICE_IP}/32", "-p", "tcp",
             "--dport", "443", "-j", "DNAT", "--to-destination", target]
        )  # fmt: skip
    return commands


def etc_hosts(found: list[Worker]) -> str:
    """``/etc/hosts`` of the control plane's namespace and of every guest: the registry
    and the control plane on the bridge, each worker by its node name (``kubectl
    logs``/``exec`` and the registry's name resolve the same everywhere)."""
    lines = ["127.0.0.1 localhost", f"{CONTROL_PLANE_IP} {REGISTRY_HOST} numa-e2e-control-plane"]
    lines += [f"{w.ip} {w.name}" for w in found]
    return "\n".join(lines) + "\n"


def cni_network(me: Worker) -> dict[str, Any]:
    """Worker ``me``'s pod network: the one-node harness's bridge network
    (:func:`shipped.cni_network`, bridge ``cni0``) with the worker's pod subnet and
    gateway."""
    return shipped.cni_network(me.pod_subnet, me.pod_gateway)


def qemu_nic(me: Worker) -> list[str]:
    """qemu arguments for the worker's NIC: virtio-net on the tap device the host made
    (no scripts: the harness already put it on the bridge)."""
    return [
        "-netdev", f"tap,id=n0,ifname={me.tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=n0,mac={me.mac}",
    ]  # fmt: skip


def interface_by_mac(addresses: dict[str, str], mac: str) -> str:
    """The name of the network interface whose address (``/sys/class/net/*/address``,
    given as ``{name: address}``) is ``mac``. Raises LookupError naming what was found."""
    for name, address in sorted(addresses.items()):
        if address.strip().lower() == mac.lower():
            return name
    raise LookupError(f"no network interface has MAC {mac}; found {addresses}")


# KUBE_ROUTER=<kube-router binary>: each worker runs kube-router with only its firewall
# on, so that NetworkPolicy is enforced (the bridge CNI plugin enforces none). Its rules
# are iptables rules matching ipsets; bridged pod-to-pod traffic reaches them through
# br_netfilter and the physdev match. Its version must speak networking.k8s.io/v1
# (kube-router 1.x does).
NETWORK_POLICY_MODULES = (
    "br_netfilter", "ip_set", "ip_set_hash_ip", "ip_set_hash_net", "ip_set_hash_ipport",
    "xt_set", "xt_physdev", "xt_comment", "xt_mark", "xt_addrtype", "xt_multiport",
    "xt_limit", "xt_conntrack", "xt_NFLOG", "nfnetlink_log", "nft_reject_ipv4", "xt_REJECT",
    "ipt_REJECT",
)  # fmt: skip
# The programs kube-router runs (it finds them on PATH), with their Debian packages; the
# guests run the host's root, so the host must have them.
NETWORK_POLICY_TOOLS = {
    "ipset": "ipset", "iptables": "iptables", "iptables-save": "iptables",
    "iptables-restore": "iptables",
}  # fmt: skip
NETWORK_POLICY_HEALTH_PORT = 20244


def network_policy_argv(binary: str, kubeconfig: str, me: Worker) -> list[str]:
    """kube-router's command line in worker ``me``: the firewall (NetworkPolicy) only,
    no routing or service proxy (the harness routes pod subnets itself), this node's
    name, the cluster's Service range, the health endpoint on
    :data:`NETWORK_POLICY_HEALTH_PORT` and no metrics."""
    return [
        binary, "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
        f"--kubeconfig={kubeconfig}", f"--hostname-override={me.name}",
        f"--service-cluster-ip-range={shipped.SERVICE_RANGE}",
        f"--health-port={NETWORK_POLICY_HEALTH_PORT}", "--metrics-port=0",
    ]  # fmt: skip
