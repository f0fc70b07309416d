"""How the benchmarks report: the provenance line, tables, figures, pages and
summaries of per-step metric histories."""

import contextlib
import csv
import os
import platform
import time

import numpy as np

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def provenance(command, *details):
    """How a page was made: ``command`` in backticks, then the machine, its cores,
    ``details`` and the date in parentheses."""
    where = [platform.machine(), f"{os.cpu_count()} cores", *details, time.strftime("%Y-%m-%d")]
    return f"`{command}` ({', '.join(where)})"


class Table:
    """A table described once, printed to the terminal and as markdown.

    Each column is ``(header, value, spec)``: ``value`` a row's key or a function
    of the row, ``spec`` its format (empty: text, left-aligned in markdown;
    ``">"`` right-aligns text).  Terminal columns are right-aligned, each at
    least 9 characters wide."""

    def __init__(self, *columns):
        self.columns = columns

    def cells(self, row):
        """``row``'s cells, formatted."""
        return [format(value(row) if callable(value) else row[value], spec).strip()
                for _, value, spec in self.columns]

    def markdown(self, rows):
        """The markdown lines of the table of ``rows``."""
        return ["| " + " | ".join(header for header, _, _ in self.columns) + " |",
                "|" + "".join("---:|" if spec else "---|" for _, _, spec in self.columns),
                *("| " + " | ".join(self.cells(row)) + " |" for row in rows)]

    def _line(self, cells):
        return " ".join(cell.rjust(max(9, len(header)))
                        for cell, (header, _, _) in zip(cells, self.columns))

    def header(self):
        """The terminal header line."""
        return self._line([header for header, _, _ in self.columns])

    def line(self, row):
        """One row as a terminal line."""
        return self._line(self.cells(row))


def percent(key):
    """A table cell: ``row[key]`` in percent, e.g. ``1.25 %``."""
    return lambda row: f"{100 * row[key]:.2f} %"


@contextlib.contextmanager
def figure(name, *grid, **options):
    """The axes of a matplotlib figure (``plt.subplots(*grid, **options)``), saved
    as ``docs/name`` (tight layout, 100 dpi) when the block ends."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **options)
    yield axes
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, name), dpi=100)
    plt.close(fig)


def write_page(name, lines):
    """Write ``lines`` to ``docs/name``."""
    with open(os.path.join(DOCS, name), "w") as f:
        f.write("\n".join(lines))


def write_csv(name, header, rows):
    """Write ``header`` and ``rows`` (lists of cells) to ``docs/name``."""
    with open(os.path.join(DOCS, name), "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def summarize(history, times=np.mean):
    """A method's per-step metrics (``StepMetrics``) over ``history``: its timers in
    milliseconds by ``times`` (``np.mean`` or ``np.median``), the rest by their mean."""
    def over(value, how=np.mean):
        return float(how([value(m) for m in history]))
    return {"selection_ms": 1e3 * over(lambda m: m.selection_time, times),
            "communication_ms": 1e3 * over(lambda m: m.communication_time, times),
            "exchange_ms": 1e3 * over(lambda m: m.selection_time + m.communication_time, times),
            "total_ms": 1e3 * over(lambda m: m.total_time, times),
            "bytes_per_step": over(lambda m: m.bytes_sent + m.bytes_received),
            "dense_step_share": over(lambda m: m.extra.get("fallback", False)),
            **{key: over(lambda m, key=key: getattr(m, key))
               for key in ("density", "density_error", "buildup", "imbalance")}}


def error_summary(errors):
    """Density errors per step after the first 5 (all of them in a shorter run): their
    mean, their max and the max of each tenth of the run (the bound holds throughout,
    not only on average)."""
    late = np.asarray(errors[5:] if len(errors) > 5 else errors)
    return {"error_mean": float(late.mean()), "error_max": float(late.max()),
            "tenth_max": [float(t.max()) if t.size else 0.0 for t in np.array_split(late, 10)]}
