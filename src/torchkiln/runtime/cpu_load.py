"""How busy the rest of the machine is: the share of its CPU time that other processes use while this one times
something (the benchmark's load warning, and the onnxruntime backend's session settings, which are not measured
on a loaded machine)."""
from __future__ import annotations

import os
import time

LOADED = 0.10  # share of the machine's CPU time other processes may use before a timing is called loaded


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is counted in user time already
    return total - idle, total


class LoadMeter:
    """The share of the machine's CPU time that other processes used between `start` and `stop` (/proc/stat's busy
    time less this process's own; a window shorter than MIN_WINDOW is extended by an idle wait, as /proc/stat counts
    in clock ticks); without /proc/stat, the 1-minute load average per core at `stop`."""

    MIN_WINDOW = 0.5  # seconds

    def start(self) -> LoadMeter:
        self._ticks, self._own, self._start = _cpu_ticks(), time.process_time(), time.perf_counter()
        return self

    def stop(self) -> float:
        time.sleep(max(0.0, self.MIN_WINDOW - (time.perf_counter() - self._start)))
        ticks, own = _cpu_ticks(), time.process_time()
        if ticks is None or self._ticks is None or ticks[1] <= self._ticks[1]:
            return os.getloadavg()[0] / max(os.cpu_count() or 1, 1) if hasattr(os, "getloadavg") else 0.0
        busy, total = ticks[0] - self._ticks[0], ticks[1] - self._ticks[1]
        own_ticks = (own - self._own) * os.sysconf("SC_CLK_TCK")
        return min(1.0, max(0.0, (busy - own_ticks) / total))
