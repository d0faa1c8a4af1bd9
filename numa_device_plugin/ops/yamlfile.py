"""YAML the plugin reads (a kubeconfig, the file of named configurations): PyYAML's
safe loader, refusing a key given twice, over a bounded read
(:func:`~numa_device_plugin.ops.bounded.read_file`). A module of its own so that
PyYAML is imported only by the commands and modes that read YAML, not by ``serve``
without a configuration file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from numa_device_plugin.ops.bounded import BoundError, one_line, read_file


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no Python tags) that refuses a mapping naming one key
    twice: YAML 1.2 requires keys to be unique, and PyYAML would silently keep the last
    (``{d: serial:S1, d: serial:S0}`` advertised only S0). Every YAML the plugin reads
    goes through it. Raises ``yaml.constructor.ConstructorError`` naming the key and
    where it appears again."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:
                continue  # an unhashable key: the base class refuses it
            if repeated:
                shown = repr(key) if len(repr(key)) <= 60 else f"{repr(key)[:57]}..."
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found the key {shown} twice",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, limit: int) -> Any:
    """The YAML document in the regular file ``path`` (:func:`read_file`, at most
    ``limit`` bytes). Raises :class:`BoundError` naming the file when it cannot be
    read, is not UTF-8, is not YAML, names a key twice in a mapping
    (:class:`UniqueKeyLoader`) or nests too deeply for the parser."""
    data = read_file(path, limit)
    try:
        return yaml.load(data.decode(), Loader=UniqueKeyLoader)  # a SafeLoader
    except UnicodeDecodeError:
        raise BoundError(f"cannot read {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise BoundError(f"cannot read {path}: {one_line(str(exc))}") from None
    except RecursionError:
        raise BoundError(f"cannot read {path}: nested too deeply") from None
