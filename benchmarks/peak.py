"""A command's own peak RSS, for the benchmarks that run one as a process.

``ru_maxrss`` of a child (``wait4``, ``RUSAGE_CHILDREN``) is not it: Linux carries a
process's high-water mark across ``exec``, so a command started by a benchmark that holds
512 MB reports at least 512 MB. The fleet benchmark's hostile states (64 lists of a
million entries in the benchmark's own process) made ``devices`` look like 550 MB when
it used 60. The command is run under :data:`WRAPPER`, which writes ``VmHWM`` of its
own process image (``/proc/self/status``, reset at ``exec``) to a file as it exits.
"""

from __future__ import annotations

from pathlib import Path

# python -c WRAPPER PEAK_FILE MODULE ARGS...: runs MODULE as -m would, with ARGS, and
# writes its VmHWM (kB) to PEAK_FILE at exit (sys.exit and SystemExit included).
WRAPPER = """\
import atexit, runpy, sys
out = sys.argv.pop(1)
module = sys.argv.pop(1)
def _peak():
    with open('/proc/self/status') as status, open(out, 'w') as written:
        written.write(next(line.split()[1] for line in status if line.startswith('VmHWM:')))
atexit.register(_peak)
sys.argv[0] = module
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""


def wrapped(python: list[str], peak_file: Path, module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m module args`` under :data:`WRAPPER`."""
    return [*python, "-c", WRAPPER, str(peak_file), module, *args]


def peak_mb(peak_file: Path) -> float:
    """The peak RSS in MB the wrapped command wrote; NaN when it wrote none (killed, or
    ended by ``os._exit``)."""
    try:
        return int(peak_file.read_text()) / 1024
    except (OSError, ValueError):
        return float("nan")
