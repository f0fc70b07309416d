"""Run the core through the in-process simulator and compare with the references."""

import numpy as np

import reference
from gradients import SHAPES
from horovod_sparse.core import GradientExchange, Layout, NumpyOps, create, run_simulated
from horovod_sparse.core.fallback import AutoFallback
from records import read_reports

PARTITION_CASES = [
    ("topk", {}),
    ("topk", {"variant": "union"}),
    ("micro", {}),
    ("micro", {"threshold_control": "paper"}),
    ("exdyna", {}),
    ("exdyna", {"rebalance": "paper"}),
    ("exdyna", {"threshold_control": "paper", "rebalance": "none"}),
    ("micro", {"threshold_control": "paper", "initial_threshold": "paper", "allgather": "padded"}),
    ("exdyna", {"threshold_control": "paper", "rebalance": "paper", "initial_threshold": "paper",
                "allgather": "padded", "blocks": 16}),
    ("deft", {}),
    ("deft", {"budget": "paper"}),
]
# Every case must match bit for bit whatever order a real allreduce adds in, so
# a momentum that makes values non-dyadic only appears where no allreduce sums
# them (DGC gathers) or in SIMULATED_ONLY (rank-order sums, like the references).
BASELINE_CASES = [
    ("gtopk", {}),
    ("randomk", {"seed": 3}),
    ("threshold", {}),
    ("threshold", {"threshold": 1.0}),
    ("dgc", {}),
    ("dgc", {"momentum": 0.5, "clip_norm": 20.0, "warmup_steps": 3, "sample_ratio": 0.05}),
    ("dgc", {"variant": "paper", "momentum": 0.0}),
    ("dgc", {"momentum": 0.5, "nesterov": True}),
    ("cltk", {}),
    ("gssgd", {"momentum": 0.0}),
    ("gssgd", {"momentum": 0.0, "rows": 4, "columns": 97, "candidates": 2}),
]
# (DGC's paper variant under momentum allreduces its 1-D tensors' velocities.)
SIMULATED_ONLY = [("gssgd", {}), ("dgc", {"variant": "paper"}),
                  ("dgc", {"variant": "paper", "sample_ratio": 0.2, "warmup_steps": 2}),
                  ("dgc", {"variant": "paper", "momentum": 0.5, "nesterov": True})]
CASES = PARTITION_CASES + BASELINE_CASES


def layout_of(shapes):
    return Layout(names=tuple(f"p{i}" for i in range(len(shapes))), shapes=tuple(shapes),
                  dtypes=("float32",) * len(shapes))


def run_core(method, options, grads, density, shapes=SHAPES):
    """Every simulated rank's per-step records (see :func:`record_of`)."""
    layout = layout_of(shapes)

    def worker(comm):
        exchange = GradientExchange(create(method, density=density, **options), NumpyOps(), comm)
        records = []
        for step_grads in grads:
            flat = step_grads[comm.rank]
            aggregate = exchange.step([flat[s:e] for s, e in layout.bounds], layout)
            records.append(record_of(exchange, aggregate, layout))
        return records

    return run_simulated(len(grads[0]), worker)


def record_of(exchange, aggregate, layout):
    """The comparable outcome of one step on one rank (the aggregate in ``layout``'s
    order: a method that sends some tensors densely puts them last in its output)."""
    metrics, state = exchange.metrics, exchange.sparsifier.state_dict()
    aggregate = np.concatenate([np.asarray(aggregate)[start:stop]
                                for start, stop in exchange.split(layout).output_bounds])
    record = dict(aggregate=aggregate, residual=np.array(exchange.feedback.residual),
                  counts=list(metrics.counts), nnz=metrics.nnz, threshold=metrics.threshold,
                  elements_received=metrics.elements_received)
    if state.get("partition"):
        record["edges"] = list(state["partition"]["edges"])
    if exchange.feedback.velocity is not None:
        record["velocity"] = np.array(exchange.feedback.velocity)
    return record


def assert_matches_reference(method, options, per_rank, grads, density, shapes=SHAPES):
    """Bit-for-bit comparison of every rank's per-step records (:func:`record_of` in the
    simulator, :func:`steps_of` a rank program's report) with the numpy reference,
    which it returns."""
    expected = reference.run(method, grads, density, shapes, **options)
    for rank, records in enumerate(per_rank):
        assert len(records) == len(expected), f"{method} {options} rank {rank}: {len(records)} steps"
        for step, (got, want) in enumerate(zip(records, expected)):
            where = f"{method} {options} rank {rank}/{len(per_rank)} step {step}"
            np.testing.assert_array_equal(got["aggregate"], want["aggregate"], err_msg=where)
            np.testing.assert_array_equal(got["residual"], want["residuals"][rank], err_msg=where)
            assert list(got["counts"]) == want["counts"], where
            assert int(got["nnz"]) == want["nnz"], where
            check_extras(got, want, rank, where)
    return expected


def steps_of(record):
    """A rank program's report (arrays with a leading step axis) as per-step records."""
    arrays = {key: value for key, value in record.items() if isinstance(value, np.ndarray)}
    return [{key: value[step] for key, value in arrays.items()}
            for step in range(len(record["aggregate"]))]


def check_rank_files(out, cases, grads, density):
    """Every rank's report of case ``i`` (``case<i>``, see ``records.report``) equals
    the reference."""
    for index, (method, options) in enumerate(cases):
        reports = read_reports(out, len(grads[0]), f"case{index}")
        assert_matches_reference(method, options, [steps_of(r) for r in reports], grads, density)


def check_extras(got, want, rank, where):
    """Thresholds, partitions and velocities, where the method has them."""
    if "threshold" in want:
        assert float(got["threshold"]) == want["threshold"], where
    if "thresholds" in want:
        assert float(got["threshold"]) == want["thresholds"][rank], where
    if "edges" in want:
        assert list(got["edges"]) == want["edges"], where
    if "velocities" in want:
        np.testing.assert_array_equal(got["velocity"], want["velocities"][rank], err_msg=where)


class FixedSchedule(AutoFallback):
    """``fallback="auto"`` with sparse (``s``) and dense (``D``) steps in a fixed,
    repeating ``pattern`` from step ``step``: for tests of the switch itself, not
    of the timing (it never decides)."""

    def __init__(self, pattern, step=0):
        super().__init__()
        self.pattern, self.step = pattern, step - 1

    @property
    def kind(self):
        return "dense" if self.pattern[self.step % len(self.pattern)] == "D" else "sparse"

    def begin_step(self, last_period):
        self.step += 1
