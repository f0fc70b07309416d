"""The one report format of rank programs, and the one way tests read it back.

A rank program ends with ``report(out, rank, [name,] **record)``: the file
``<out>/<name>.rank<r>.npz`` (``name`` is ``report`` unless given) holds the
record's numpy arrays as they are and every other value (numbers, strings,
lists, and ``checks``: ``{name: true | message}``) as JSON in one entry.
Files, not stdout: launchers prefix and interleave the ranks' lines.
"""

import json
import os

import numpy as np

JSON = "__json__"


def report(out, rank, name="report", /, **record):
    """Save one rank's ``record`` to ``<out>/<name>.rank<rank>.npz`` (``name`` is
    positional only: a record may have a field called ``name``)."""
    arrays = {key: value for key, value in record.items() if isinstance(value, np.ndarray)}
    fields = {key: value for key, value in record.items() if key not in arrays}
    np.savez(os.path.join(out, f"{name}.rank{rank}.npz"), **arrays, **{JSON: json.dumps(fields)})


def read_report(out, rank, name="report"):
    """The record rank ``rank`` saved with :func:`report`: arrays and JSON values alike."""
    with np.load(os.path.join(out, f"{name}.rank{rank}.npz")) as saved:
        record = {key: saved[key] for key in saved.files if key != JSON}
        record.update(json.loads(str(saved[JSON])))
    return record


def read_reports(out, size, name="report"):
    """Every rank's record, in rank order."""
    return [read_report(out, rank, name) for rank in range(size)]


def assert_rank_checks(out, size, name="report"):
    """Every rank reported ``checks``, and every check is ``true``; returns the records."""
    records = read_reports(out, size, name)
    for rank, record in enumerate(records):
        failed = {key: value for key, value in record["checks"].items() if value is not True}
        assert record["checks"] and not failed, f"rank {rank}: {failed or 'no checks'}"
    return records
