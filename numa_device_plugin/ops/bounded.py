"""Bounded reads of inputs the plugin does not control: one place for each bound.

- :func:`read_file`: a file expected to be a regular file (a kubeconfig, a token, a
  CA bundle, the per-node configuration), read up to a byte cap; a FIFO, a device
  (``/dev/zero``) or a folder is refused without blocking;
  :func:`~numa_device_plugin.ops.yamlfile.read_yaml` parses it (a module of its own:
  PyYAML is imported only where YAML is read).
- :func:`~numa_device_plugin.ops.httpget.http_get`: one HTTP(S) GET within a total
  deadline, with an answer cap (a module of its own: :mod:`http.client` is imported
  only where one is made, not by ``serve`` at start).
- :func:`run_command`: a command (a kubeconfig's exec credential plugin) with a total
  deadline and an output cap, in its own process group, killed with its children when
  either bound is passed.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class BoundError(Exception):
    """An input could not be read within its bounds; the message says what and why, in
    one line. ``timed_out`` is True when the deadline passed."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, control characters shown as ``\\xNN`` escapes, at most
    ``limit`` characters (an error message that echoes an input)."""
    flat = " ".join(text.split())
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in flat[: limit + 1])
    return shown if len(shown) <= limit else shown[:limit] + "..."


def read_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` bytes. Raises
    :class:`BoundError` naming the file when it cannot be opened, is not a regular
    file (a FIFO is opened non-blocking, so it never waits for a writer) or is larger
    than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BoundError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BoundError(f"cannot read {path}: not a regular file")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise BoundError(f"{path} is over {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise BoundError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Finished:
    """A command that ended: ``returncode``, ``stdout`` (at most the cap) and the last
    ``stderr`` bytes (at most the cap)."""

    returncode: int
    stdout: bytes
    stderr: bytes


def run_command(
    argv: Sequence[str], env: Mapping[str, str], *, deadline: float, limit: int
) -> Finished:
    """Run ``argv`` with ``env``, stdin from ``/dev/null``, in a process group of its
    own. Raises :class:`BoundError` when it cannot start, when it has not ended within
    ``deadline`` seconds (``timed_out``) or prints more than ``limit`` bytes on stdout;
    in both cases the whole process group is killed (SIGKILL) first."""
    end = time.monotonic() + deadline
    try:
        process = subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise BoundError(f"cannot run {argv[0]!r}: {one_line(str(exc))}") from None
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        out, err, returncode = _collect(process, argv[0], end, deadline, limit)
    except BaseException:  # a bound passed, or the caller's own deadline (a signal)
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    finally:
        process.stdout.close()
        process.stderr.close()
    return Finished(returncode, out, err)


def _collect(
    process: subprocess.Popen[bytes], name: str, end: float, deadline: float, limit: int
) -> tuple[bytes, bytes, int]:
    """Read ``process``'s stdout (at most ``limit`` bytes) and the end of its stderr
    until both close and it exits, by ``end`` (monotonic); raises :class:`BoundError`."""
    assert process.stdout is not None
    assert process.stderr is not None
    out, err = bytearray(), bytearray()
    late = BoundError(f"{name!r} did not end within {deadline:g} s", timed_out=True)
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = end - time.monotonic()
            if left <= 0:
                raise late
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                buffer += chunk
                if buffer is out and len(out) > limit:
                    raise BoundError(f"{name!r} printed more than {limit} bytes")
                if buffer is err and len(err) > limit:
                    del err[: len(err) - limit]
    try:
        returncode = process.wait(max(0.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise late from None
    return bytes(out), bytes(err), returncode
