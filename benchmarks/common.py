"""Plumbing the benchmarks share: benchmark rows, timing and the one-rank-per-core rule."""

import ast
import os
import time

from horovod_sparse.core import available, create

# The dense baseline's row: Horovod's allreduce of every coordinate (hvd.Compression.none).
DENSE = "dense"
# Benchmark rows for a method's variants: "method/variant" -> (method, options).
VARIANTS = {"topk/union": ("topk", {"variant": "union"}),
            "deft/paper": ("deft", {"budget": "paper"}),
            "dgc/paper": ("dgc", {"variant": "paper"}),
            "gssgd/tree": ("gssgd", {"merge": "tree"})}


def rows(text):
    """The benchmark rows of a comma-separated list, the dense baseline (``none`` or
    ``dense``) named ``dense``."""
    return [DENSE if row == "none" else row for row in text.split(",")]


def row_options(row):
    """``(method, options)`` of a benchmark row: ``dense``, a
    method's name, a ``VARIANTS`` key, or ``method:key=value[:key=value...]``
    (values as Python literals, e.g. ``gssgd:columns=1360``)."""
    if row == DENSE:
        return DENSE, {}
    if row in VARIANTS:
        return VARIANTS[row]
    method, *settings = row.split(":")
    options = {}
    for setting in settings:
        key, equals, value = setting.partition("=")
        if not equals:
            raise SystemExit(f"{row}: expected method:key=value, got {setting!r}")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return method, options


def method_rows():
    """Every method, each followed by its variants' rows."""
    return [row for name in available()
            for row in [name, *(v for v, (method, _) in VARIANTS.items() if method == name)]]


def create_row(row, **hyperparameters):
    """The sparsifier of a benchmark row (see :func:`row_options`)."""
    method, options = row_options(row)
    return create(method, **options, **hyperparameters)


def best_ms(function, repeats=7, before=None):
    """The fastest of ``repeats`` calls of ``function``, in milliseconds; ``before``,
    if given, is called (untimed) before each."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
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


FLOORS_NOTE = ("MiCRO and ExDyna collect their candidates inside the accumulating pass "
               "(in *other*); their selection is the ladder count over the candidates and the "
               "final pick.")


def relative_to_floors(results):
    """Add to each result (with ``floor_*_ms`` and a ``dense`` row among ``results``)
    its selection as a multiple of one read of the share and its "other" beyond
    dense's (the dense iterations that alternated with it, where they did) as a
    multiple of one accumulate pass over ``n``."""
    dense_other = next((r["other_ms"] for r in results if r["method"] == DENSE), None)
    for r in results:
        r["selection_x_read"] = r["selection_ms"] / r["floor_read_share_ms"]
        other = r.get("paired_dense_other_ms", dense_other)
        r["extra_other_x_accumulate"] = (float("nan") if other is None else
                                         (r["other_ms"] - other) / r["floor_accumulate_ms"])
    return results
