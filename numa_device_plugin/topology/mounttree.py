"""The mount tree of a mount table: which mount a process sees at a point (proc(5)'s
mount and parent IDs, as the kernel resolves a path), for one path
(:meth:`~.mounts.MountTable.holding`) and for every mount at once (:attr:`MountTree.visible`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Generic, Protocol, TypeVar


class Node(Protocol):
    """What the tree reads of a mount (:class:`~.mounts.Mount` is one)."""

    @property
    def mount_point(self) -> str: ...

    @property
    def mount_id(self) -> int: ...

    @property
    def parent_id(self) -> int: ...


Mount = TypeVar("Mount", bound=Node)


class MountTree(Generic[Mount]):
    """The mount tree of a table (:class:`~.mounts.MountTable` indexes it once): each
    (parent ID, mount point)'s child (the last listed
    of two at one point under one parent is the later), the root mount, and the mounts
    at each point."""

    def __init__(self, mounts: tuple[Mount, ...]) -> None:
        # children[parent ID][point]: no tuple key made per mount (a look at 65,536
        # mounts spent a third of its time making and collecting them)
        children: dict[int, dict[str, Mount]] = {}
        first: dict[str, Mount] = {}
        more: dict[str, list[Mount]] = {}
        ids = {mount.mount_id for mount in mounts}
        root = None
        roots = 0
        for mount in mounts:  # kept to locals: this loop is most of the index's time
            point = mount.mount_point
            if first.setdefault(point, mount) is not mount:
                more.setdefault(point, []).append(mount)
            parent = mount.parent_id
            if parent in ids and parent != mount.mount_id:
                under = children.get(parent)
                if under is None:
                    children[parent] = {point: mount}
                else:
                    under[point] = mount
            elif point == "/":
                roots += 1
                root = mount
        self.children = children
        self._first = first
        self._more = more
        # Two roots (mounts at / whose parents are not listed) are no table the kernel
        # writes (a mount over / has the one below as its parent): which holds a path
        # is open, so none does (MountTable.unheld says why).
        self.roots = roots
        self.root: Mount | None = root if roots == 1 else None

    def child(self, parent: Mount, point: str) -> Mount | None:
        """The mount at ``point`` whose parent is ``parent`` (the later of two)."""
        under = self.children.get(parent.mount_id)
        return None if under is None else under.get(point)

    def at(self, point: str) -> list[Mount]:
        """The mounts at ``point``, in the table's order."""
        found = self._first.get(point)
        return [] if found is None else [found, *self._more.get(point, ())]

    def top(self, mount: Mount, point: str) -> Mount:
        """The mount on top of the stack at ``point`` that ``mount`` is the bottom of."""
        return top_of(mount, point, self.children)

    @cached_property
    def visible(self) -> set[int]:
        """``id()`` of each mount visible at its own point. From the root's top down:
        of a visible mount's children (deeper points), those not below another of them
        (components compared in C, points in component order) are reached, each as the
        top of its stack; each mount is visited once, whatever loops a table has."""
        by_parent = {parent: list(under.values()) for parent, under in self.children.items()}
        found: set[int] = set()
        if self.root is None:
            return found
        pending = [self.top(self.root, "/")]
        seen = {id(pending[0])}
        while pending:
            mount = pending.pop()
            found.add(id(mount))
            here = parts_of(mount.mount_point)
            below = []
            for child in by_parent.get(mount.mount_id, ()):
                parts = parts_of(child.mount_point)
                # reached only at a deeper point under its parent's, written as a walk
                # writes it (a hostile table's /x//y or a point beside the parent's: never)
                if (len(parts) > len(here) and parts[: len(here)] == here
                        and child.mount_point == "/" + "/".join(parts)):  # fmt: skip
                    below.append((parts, child))
            below.sort(key=lambda pair: pair[0])
            kept: tuple[str, ...] | None = None
            for parts, child in below:
                if kept is not None and parts[: len(kept)] == kept:
                    continue  # below a nearer mount of the same parent: hidden by it
                kept = parts
                top = self.top(child, child.mount_point)
                if id(top) not in seen:
                    seen.add(id(top))
                    pending.append(top)
        return found


def parts_of(point: str) -> tuple[str, ...]:
    """A mount point's components: ``/a/b`` -> ``("a", "b")``, ``/`` -> ``()``."""
    return tuple(part for part in point.split("/") if part)


def top_of(mount: Mount, point: str, children: dict[int, dict[str, Mount]]) -> Mount:
    """The mount on top of the stack at ``point`` that ``mount`` is the bottom of."""
    seen = {mount.mount_id}
    while (above := children.get(mount.mount_id, {}).get(point)) is not None:
        if above.mount_id in seen:  # a loop in a hostile table
            break
        seen.add(above.mount_id)
        mount = above
    return mount
