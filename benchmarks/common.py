"""Plumbing the benchmarks share: timing and the one-rank-per-core rule."""

import os
import time


def best_ms(function, repeats=7):
    """The fastest of ``repeats`` calls of ``function``, in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def oversubscription_note(ranks_on_host):
    """A sentence for the log when a host runs more ranks than it has cores, else ``None``.

    Per-element passes timed while another rank holds the core measure the
    scheduler, not the method: timings want at most one rank per core."""
    cores = os.cpu_count() or 1
    if ranks_on_host <= cores:
        return None
    return (f"Note: {ranks_on_host} ranks share this host's {cores} cores: every per-element pass "
            "is timed while another rank holds the core (use at most one rank per core for "
            "timings)")
