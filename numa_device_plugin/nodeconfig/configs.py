"""Per-node configuration: a file of named configurations, one chosen by a node label.

The file (``--config-file``, YAML; the chart renders it from ``config.named``)::

    default: pool-a          # optional: for nodes without the label
    configs:
      pool-a: {}             # the flags and variables as given
      pool-b:
        capacity: cpus
        reserved-cpus: "0-1"
        near:                # resources that follow a device: NAME: SELECTOR
          data-disk: "serial:S3EVNX0K123"

A configuration overrides the settings given by flags and variables, key by key; its
keys are the flags' names without the dashes in front: :data:`SETTINGS`. The node's
label ``numa-align/config`` (:data:`CONFIG_LABEL`) names the configuration; a node
without it gets ``default``, or, without a default, the flags alone.

Strict by design: a file that does not parse, has an unknown key or a bad value in any
configuration, or a label naming no configuration, is a :class:`NodeConfigError`. The
plugin then serves nothing and is unready (:mod:`numa_device_plugin.nodeconfig.supervisor`): it
never falls back to another configuration silently. Everything here is pure apart
from reading the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from numa_device_plugin.ops.bounded import BoundError, read_file
from numa_device_plugin.ops.yamlfile import UniqueKeyLoader
from numa_device_plugin.plugin.settings.config import Config

# The node label naming the configuration (fixed, whatever --resource-prefix says: the
# operator labels nodes before any resource exists).
CONFIG_LABEL = "numa-align/config"
# Limits of the file, far above any real use: a ConfigMap holds at most 1 MiB.
MAX_FILE_BYTES = 1 << 20
# Characters of a NodeConfigError's one line (it is logged and shown by /readyz).
MAX_MESSAGE = 360
# Nesting of the YAML document (a real file nests 3 deep: configs, name, setting).
MAX_DEPTH = 16
# Characters of one YAML scalar (a cpulist of 1,024 CPUs is ~4,000 at worst).
MAX_SCALAR = 8192


class NodeConfigError(Exception):
    """Why no configuration can be served on this node, one line naming the file or the
    label, on one line of at most :data:`MAX_MESSAGE` characters. ``transient``: the
    node's labels could not be read (an API server outage), so a configuration already
    served may stay."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        message = " ".join(message.split())
        if len(message) > MAX_MESSAGE:  # a value echoed from a hostile file
            message = f"{message[: MAX_MESSAGE - 3]}..."
        super().__init__(message)
        self.transient = transient


class _StrictLoader(UniqueKeyLoader):
    """PyYAML's safe loader that refuses a key named twice in a mapping
    (:class:`~numa_device_plugin.ops.yamlfile.UniqueKeyLoader`) and what no
    configuration needs and a hostile file uses: aliases and anchors (an alias bomb
    expands a few hundred bytes to gigabytes), nesting deeper than :data:`MAX_DEPTH`
    (recursion) and scalars longer than :data:`MAX_SCALAR` (an integer of thousands of
    digits). The document is refused while it is composed, before anything is built."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.MarkedYAMLError(
                problem="anchors and aliases are not allowed here", problem_mark=mark
            )
        if isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_SCALAR:
            raise yaml.MarkedYAMLError(
                problem=f"a value of over {MAX_SCALAR} characters", problem_mark=mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(
                    problem=f"nested over {MAX_DEPTH} deep", problem_mark=mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _shown(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _switch(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{_shown(value)} is not true or false")
    return value


def _text(convert: Callable[[str], Any]) -> Callable[[Any], Any]:
    """A flag's conversion, for a YAML scalar (numbers are taken as their text)."""

    def parse(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{_shown(value)} is not a text or a number")
        return convert(str(value))

    return parse


def _near(value: Any) -> tuple[Any, ...]:
    """``near:``, a mapping NAME -> SELECTOR (``{data-disk: "serial:S3EV"}``), or NAME ->
    a list of selectors that must all agree (``{osd: [path:/var/lib/ceph, net:ens1]}``),
    as the tuple of :class:`~numa_device_plugin.plugin.model.near.Near` that ``--near``
    gives."""
    from numa_device_plugin.plugin.model.near import merge_near, parse_near

    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of NAME: SELECTOR, got {_shown(value)}")
    found = []
    for name, given in value.items():
        selectors = given if isinstance(given, list) and given else [given]
        for selector in selectors:
            if not isinstance(name, str) or not isinstance(selector, str):
                raise ValueError(
                    f"{_shown(name)}: {_shown(given)} is not NAME: SELECTOR text (or a list)"
                )
            found.append(parse_near(f"{name}={selector}"))
    return merge_near(found)


def _settings() -> dict[str, tuple[str, Callable[[Any], Any]]]:
    from numa_device_plugin.plugin.model.names import validate_resource_prefix
    from numa_device_plugin.plugin.settings import values

    return {
        "capacity": ("capacity", _text(values.capacity)),
        "resource-prefix": ("resource_prefix", _text(validate_resource_prefix)),
        "reserved-cpus": ("reserved_cpus", _text(values.cpulist)),
        "pod-resources-interval": ("pod_resources_interval", _text(values.interval)),
        "allow-unaligned": ("allow_unaligned", _switch),
        "any-resource": ("any_resource", _text(values.any_resource)),
        "socket-resources": ("socket_resources", _text(values.any_resource)),
        "include-cpuless-nodes": ("include_cpuless_nodes", _switch),
        "memory-unit": ("memory_unit", _text(values.memory_unit)),
        "reserved-memory": ("reserved_memory", _text(values.reserved_memory)),
        "near": ("near", _near),
    }


# Key in the file -> (serve's parameter, conversion of the YAML value; ValueError).
SETTINGS: Mapping[str, tuple[str, Callable[[Any], Any]]] = _settings()


@dataclass(frozen=True)
class NodeConfigs:
    """A parsed configuration file: ``path``, the ``default`` name (None: the flags
    alone for unlabelled nodes) and ``configs``: name -> serve's parameters to
    override (converted values, e.g. ``{"capacity": "cpus", "reserved_cpus":
    frozenset({0, 1})}``)."""

    path: Path
    default: str | None
    configs: Mapping[str, Mapping[str, Any]]

    def choose(self, node: str, labels: Mapping[str, str]) -> tuple[str | None, Mapping[str, Any]]:
        """The name and overrides for a node with ``labels`` (None: no configuration
        named, the flags alone). Raises :class:`NodeConfigError` naming the label when
        it is empty or names no configuration."""
        if CONFIG_LABEL not in labels:
            if self.default is None:
                return None, {}
            return self.default, self.configs[self.default]
        name = labels[CONFIG_LABEL]
        if name not in self.configs:
            known = ", ".join(sorted(self.configs)) or "none"
            raise NodeConfigError(
                f"node {node}: label {CONFIG_LABEL}={name!r} names no configuration in "
                f"{self.path} (it has: {known})"
            )
        return name, self.configs[name]


def parse_node_configs(path: Path, text: str, base: Mapping[str, Any]) -> NodeConfigs:
    """Parse the file's ``text`` (read from ``path``, named in errors). Every
    configuration is checked in full, as a :class:`Config` made from ``base`` (serve's
    parameters from flags and variables, :func:`options.config_from_params`) with its
    overrides, so that a fault anywhere stops every node that reads the file (a rollout
    halts at its first node). Raises :class:`NodeConfigError` naming the file, the
    configuration, the key and the fault."""
    from numa_device_plugin.plugin.settings.config import config_from_params

    try:
        document = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise NodeConfigError(f"{path} is not YAML: {_one_line(str(exc))}") from None
    if not isinstance(document, dict):
        raise NodeConfigError(f"{path}: expected a mapping with 'configs', got {text[:60]!r}")
    unknown = sorted(set(map(str, document)) - {"default", "configs"})
    if unknown:
        raise NodeConfigError(f"{path}: unknown key {unknown[0]!r} (known: configs, default)")
    named = document.get("configs")
    if not isinstance(named, dict) or not named:
        raise NodeConfigError(f"{path}: 'configs' must map at least one name to its settings")
    configs: dict[str, Mapping[str, Any]] = {}
    for name, settings in named.items():
        where = f"{path}: configuration {_shown(name)}"
        if not isinstance(name, str) or not _label_value(name):
            raise NodeConfigError(f"{where}: a name must be a valid label value")
        if settings is None:
            settings = {}
        if not isinstance(settings, dict):
            raise NodeConfigError(
                f"{where}: expected a mapping of settings, got {_shown(settings)}"
            )
        overrides: dict[str, Any] = {}
        for key, value in settings.items():
            if not isinstance(key, str) or key not in SETTINGS:
                raise NodeConfigError(
                    f"{where}: unknown setting {_shown(key)} (known: {', '.join(SETTINGS)})"
                )
            param, convert = SETTINGS[key]
            try:
                overrides[param] = convert(value)
            except ValueError as exc:
                raise NodeConfigError(f"{where}: {key}: {exc}") from None
        try:
            config_from_params({**base, **overrides})
        except ValueError as exc:
            raise NodeConfigError(f"{where}: {exc}") from None
        configs[name] = overrides
    default = document.get("default")
    if default is not None and (not isinstance(default, str) or default not in configs):
        raise NodeConfigError(f"{path}: default {_shown(default)} names no configuration")
    return NodeConfigs(path, default, configs)


def load_node_configs(path: Path, base: Mapping[str, Any]) -> NodeConfigs:
    """Read and parse ``path`` (:func:`parse_node_configs`). Raises
    :class:`NodeConfigError` when it cannot be read, is not a regular file (a FIFO
    neither blocks the open nor a read), is over :data:`MAX_FILE_BYTES` or is
    malformed. A symlink is followed: a ConfigMap volume is made of them."""
    try:
        data = read_file(path, MAX_FILE_BYTES)
    except BoundError as exc:
        raise NodeConfigError(str(exc)) from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise NodeConfigError(f"{path} is not UTF-8: {exc}") from None
    return parse_node_configs(path, text, base)


def resolve(
    configs: NodeConfigs, node: str, labels: Mapping[str, str], base: Mapping[str, Any]
) -> tuple[str | None, Config]:
    """The configuration for ``node`` with ``labels``: its name and the :class:`Config`
    from ``base`` with its overrides. Raises :class:`NodeConfigError` (label)."""
    from numa_device_plugin.plugin.settings.config import config_from_params

    name, overrides = configs.choose(node, labels)
    return name, config_from_params({**base, **overrides})


def _label_value(text: str) -> bool:
    """Kubernetes label value syntax: at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at
    both ends, not empty (an empty label value could name nothing here)."""
    if not 0 < len(text) <= 63 or not (text[0].isalnum() and text[-1].isalnum()):
        return False
    return all(c.isascii() and (c.isalnum() or c in "._-") for c in text)


def _one_line(text: str) -> str:
    """``text`` on one line, cut to 300 characters (a log line stays a line)."""
    return " ".join(text.split())[:300]
