"""Rank program (horovodrun -np 2): the TensorFlow adapter's behaviour beyond exactness.

``python tf_behaviour.py <scenario> <dir>``; every rank reports ``checks``:
``{name: true | message}`` to ``<dir>`` (``records.report``).

* ``errors``: no ``groups=1`` raises while tracing; NaN on one rank raises on
  every rank (policy ``raise``) or skips on every rank (``skip``) with the
  residual untouched; models that differ across ranks raise on every rank;
  float16 gradients come back as float16, averaged exactly; the consistency
  guard (by hand, and every ``check_every`` steps) names a variable that differs.
* ``checkpoint``: resuming from a ``tf.train.Checkpoint`` (model variables
  and the compressor) reproduces the uninterrupted run bit for bit, with
  per-rank checkpoints and with one gathered checkpoint written by rank 0.
* ``keras``: ``model.fit`` with Horovod's Keras ``DistributedOptimizer`` and
  callbacks, ExDyna at density 0.01: learns, ranks end identical.
* ``user_script``: what a tape user meets, beside dense Horovod (see there).
* ``process_set`` (3 ranks): a tape reducing within ranks 0 and 1.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import sys  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from gradients import dyadic_gradient  # noqa: E402
from records import report  # noqa: E402

import horovod_sparse.tensorflow as hs  # noqa: E402
from horovod_sparse.core import ParameterDivergenceError  # noqa: E402

SHAPES = [(12, 10), (10,), (10, 3)]


_TRACED = {}


def exchange(compression, targets, variables, groups=1, process_set=hvd.global_process_set):
    """The tape's averaged gradients of ``sum(v * target)``, in one ``tf.function``
    per compressor (traced once: later steps only feed new targets)."""
    key = (id(compression), tuple(id(v) for v in variables))
    if key not in _TRACED:
        @tf.function
        def gradients(targets):
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(v * tf.cast(g, v.dtype))
                                 for v, g in zip(variables, targets)])
            return hvd.DistributedGradientTape(tape, compression=compression, groups=groups,
                                               process_set=process_set).gradient(loss, variables)
        _TRACED[key] = (gradients, compression, variables)  # keep them alive: ids stay unique
    return _TRACED[key][0](targets)


def targets_of(step, rank, shapes=SHAPES):
    flat, out, offset = dyadic_gradient(11, step, rank, shapes=shapes), [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append(tf.constant(flat[offset:offset + size].reshape(shape)))
        offset += size
    return out


def raises(call, text):
    """True if ``call()`` raises an error whose message contains ``text``, else a message."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 (TensorFlow wraps ours in tf.errors)
        return True if text in str(error) else f"{type(error).__name__}: {str(error)[:300]}"
    return f"no error (expected {text!r})"


def residuals(compression):
    return np.concatenate([np.ravel(v) for v in compression.state_dict()["residuals"].values()])


def errors(rank, _):
    checks = {}
    variables = variables_of(SHAPES)
    checks["no groups=1 raises while tracing"] = raises(
        lambda: exchange(hs.Compression.exdyna(density=0.1), targets_of(0, rank), variables,
                         groups=None), "groups=1")

    for policy in ("raise", "skip"):
        compression = hs.Compression.create("exdyna", density=0.1, nonfinite=policy)
        exchange(compression, targets_of(0, rank), variables)
        before = residuals(compression)
        bad = targets_of(1, rank)
        if rank == 1:
            bad[0] = tf.tensor_scatter_nd_update(bad[0], [[0, 0]], [np.nan])
        if policy == "raise":
            checks["NaN on rank 1 raises on every rank"] = raises(
                lambda: exchange(compression, bad, variables), "non-finite")
        else:
            out = exchange(compression, bad, variables)
            checks["NaN skipped on every rank: zero gradient"] = all(
                not np.any(g.numpy()) for g in out)
            checks["skip is recorded"] = compression.metrics().skipped
        checks[f"residual untouched ({policy})"] = bool(np.array_equal(before, residuals(compression)))
        out = exchange(compression, targets_of(2, rank), variables)  # training goes on
        checks[f"next step is finite ({policy})"] = all(np.isfinite(g.numpy()).all() for g in out)

    shapes = SHAPES if rank == 0 else [(12, 10), (10,), (3, 10)]
    mismatched = variables_of(shapes)
    checks["models that differ raise on every rank"] = raises(
        lambda: exchange(hs.Compression.topk(density=0.1), targets_of(0, rank, shapes), mismatched),
        "differ")

    halves = [tf.Variable(tf.zeros(shape, dtype=tf.float16)) for shape in SHAPES]
    out = exchange(hs.Compression.topk(density=1.0), targets_of(3, rank), halves)
    expected = [(targets_of(3, 0)[i].numpy() + targets_of(3, 1)[i].numpy()) / 2
                for i in range(len(SHAPES))]
    checks["float16 in, float16 out"] = all(g.dtype == tf.float16 for g in out)
    checks["float16 averaged exactly"] = all(
        np.array_equal(g.numpy(), e.astype(np.float16)) for g, e in zip(out, expected))

    drifting = [tf.Variable(tf.ones([4]), name="w"), tf.Variable(tf.ones([3]) * (1 + rank),
                                                                  name="drifting")]
    try:
        hs.check_parameters(drifting)
        checks["consistency guard names the variable"] = "no error"
    except ParameterDivergenceError as error:
        checks["consistency guard names the variable"] = "drifting" in str(error) or str(error)

    same = [tf.Variable(tf.ones(shape), name=f"same{i}") for i, shape in enumerate(SHAPES)]
    guarded = hs.Compression.create("topk", density=0.5, check_every=2)
    checks["check_every passes identical variables"] = all(
        exchange(guarded, targets_of(step, rank), same) is not None for step in range(3))
    apart = [tf.Variable(tf.ones(shape) * (1 + rank * i), name=f"apart{i}")
             for i, shape in enumerate(SHAPES)]
    checks["check_every names the differing variable on every rank"] = raises(
        lambda: exchange(hs.Compression.create("topk", density=0.5, check_every=2),
                         targets_of(0, rank), apart), "apart1")
    return checks


STEPS, SPLIT = 10, 6


def build(method):
    tf.keras.utils.set_random_seed(0)
    variables = [tf.Variable(tf.random.normal(shape, seed=i)) for i, shape in enumerate(SHAPES)]
    compression = hs.Compression.create(method, density=0.1)
    return variables, compression


def train(variables, compression, steps):
    for step in steps:
        grads = exchange(compression, targets_of(step, hvd.rank()), variables)
        for variable, grad in zip(variables, grads):
            variable.assign_sub(0.5 * grad)


def checkpoint(rank, directory):
    checks = {}
    for method in ("exdyna", "deft", "dgc", "gtopk"):
        variables, compression = build(method)
        train(variables, compression, range(STEPS))
        straight = [v.numpy() for v in variables]

        for mode in ("per-rank", "gathered"):
            variables, compression = build(method)
            train(variables, compression, range(SPLIT))
            saver = tf.train.Checkpoint(variables=variables, compression=compression)
            prefix = os.path.join(directory, f"{method}-{mode}")
            if mode == "gathered":
                compression.gather_for_checkpoint()  # every rank; rank 0 alone writes
                path = saver.write(prefix) if rank == 0 else None
                path = hvd.broadcast_object(path, root_rank=0, name=f"{method}.path")
            else:
                path = saver.write(f"{prefix}.rank{rank}")
            variables, compression = build(method)
            tf.train.Checkpoint(variables=variables, compression=compression).read(path) \
                .assert_consumed()
            train(variables, compression, range(SPLIT, STEPS))
            checks[f"{method} {mode} resume bit-identical"] = all(
                np.array_equal(a, v.numpy()) for a, v in zip(straight, variables))
    return checks


def keras(rank, _):
    from digits_keras import train as fit

    summary, model = fit("exdyna", density=0.01, epochs=3, verbose=False)
    checks = {"ExDyna Keras fit learns (test accuracy > 0.85)":
              summary["accuracy"] > 0.85 or summary["accuracy"],
              "density error below 10 %": summary["density_error_mean"] < 0.1 or summary}
    try:
        hs.check_parameters(model.trainable_variables)
        checks["ranks identical after fit"] = True
    except ParameterDivergenceError as error:
        checks["ranks identical after fit"] = str(error)
    return checks


def user_script(rank, _):
    """What a tape user meets (checked beside dense Horovod): a branch
    whose variable gets no gradient on some steps, op=hvd.Sum, a NaN at the first
    step, another method on one rank, and nonfinite="propagate"."""
    checks = {}

    def run(compression, steps=4, op=hvd.Average, nan_at=None):
        tf.keras.utils.set_random_seed(0)
        trunk, branch = tf.Variable(tf.ones([5, 3])), tf.Variable(tf.ones([4]))
        seen = []
        for step in range(steps):
            with tf.GradientTape() as tape:
                x = tf.ones([2, 5]) * (rank + 1 + step)
                if nan_at == step and rank == 1:
                    x = x * np.nan
                loss = tf.reduce_sum(tf.matmul(x, trunk))
                if step % 2:  # the branch: no gradient on even steps
                    loss += tf.reduce_sum(branch * branch)
            tape = hvd.DistributedGradientTape(tape, groups=1, compression=compression, op=op)
            try:
                grads = tape.gradient(loss, [trunk, branch])
            except Exception as error:  # noqa: BLE001 (TensorFlow wraps ours)
                seen.append(str(error))
                continue
            seen.append([None if g is None else g.numpy() for g in grads])
            for variable, grad in zip((trunk, branch), grads):
                if grad is not None:
                    variable.assign_sub(0.01 * grad)
        return seen, (trunk.numpy(), branch.numpy())

    def equal(a, b):
        return len(a) == len(b) and all(
            (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
            for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))

    for op, name in ((hvd.Average, "average"), (hvd.Sum, "sum")):
        dense, _ = run(hvd.Compression.none, op=op)
        sparse, _ = run(hs.Compression.topk(density=1.0), op=op)
        checks[f"branch without gradient, {name}: same as dense"] = equal(dense, sparse) or (
            f"{sparse} vs {dense}")
        if op == hvd.Average:  # the 1-D branch sent densely: exactly dense's gradient
            split, _ = run(hs.Compression.exdyna(density=0.3, dense_1d=True), op=op)
            checks["dense_1d: the branch averaged exactly"] = all(
                (s[1] is None and d[1] is None) or np.array_equal(s[1], d[1])
                for s, d in zip(split, dense)) or f"{split} vs {dense}"
    compression = hs.Compression.exdyna(density=0.3)
    seen, _ = run(compression, steps=3)
    held = compression.state_dict()["residuals"]["grad.1"]
    checks["branch's residual held on steps without gradient"] = bool(
        seen[2][1] is None and np.any(held)) or str(held)
    for method in ("micro", "exdyna", "deft"):
        seen, _ = run(hs.Compression.create(method, density=0.3), steps=2, nan_at=0)
        checks[f"{method}: NaN at the first step raises on every rank"] = (
            "non-finite" in str(seen[0]) and not isinstance(seen[1], str)) or str(seen)
        seen, _ = run(hs.Compression.create(method, density=0.3, nonfinite="propagate"),
                      steps=2, nan_at=0)
        checks[f"{method}: propagate gives NaN on every rank"] = bool(
            np.isnan(seen[0][0]).all() and np.isfinite(seen[1][0]).all()) or str(seen)
    seen, _ = run(hs.Compression.create(("topk", "gtopk")[rank], density=0.3), steps=1)
    checks["another method on one rank raises on every rank"] = (
        "compression" in str(seen[0]) and "differs from rank" in str(seen[0])) or str(seen)
    extra = [tf.Variable(tf.ones([4])) for _ in range(2 + rank)]  # one more on rank 1
    checks["an extra variable on one rank raises on every rank, no hang"] = raises(
        lambda: exchange(hs.Compression.exdyna(density=0.5), [tf.ones([4])] * len(extra), extra),
        "differs from rank")

    shared = hs.Compression.exdyna(density=0.5)  # two models of one shape, one compressor
    exchange(shared, targets_of(0, rank), variables_of(SHAPES))
    checks["one compressor for two tapes raises on every rank"] = raises(
        lambda: exchange(shared, targets_of(1, rank), variables_of(SHAPES)),
        "one compressor per DistributedGradientTape")
    return checks


def variables_of(shapes):
    return [tf.Variable(tf.zeros(shape)) for shape in shapes]


PAIR = hvd.ProcessSet([0, 1])  # registered by main for ``process_set`` (3 ranks)


def process_set(rank, _):
    """Tapes reducing within ranks 0 and 1 (Horovod's tape runs on its members only):
    the exchange runs within the tape's set, as dense's allreduce does, and does
    not wait for rank 2; a compressor given another set raises there."""
    checks = {}
    if rank in PAIR.ranks:
        dense = exchange(hvd.Compression.none, targets_of(0, rank), variables_of(SHAPES),
                         process_set=PAIR)
        sparse = exchange(hs.Compression.topk(density=1.0), targets_of(0, rank),
                          variables_of(SHAPES), process_set=PAIR)
        checks["within the tape's set: same as dense"] = all(
            np.array_equal(a.numpy(), b.numpy()) for a, b in zip(sparse, dense))
        conflict = hs.Compression.exdyna(density=0.5, process_set=hvd.global_process_set)
        checks["a compressor given another set raises"] = raises(
            lambda: exchange(conflict, targets_of(0, rank), variables_of(SHAPES),
                             process_set=PAIR), "the same process_set")
    ranks = hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="process_set.end")
    checks["every rank reaches the end"] = float(ranks) == hvd.size()
    return checks


def main():
    scenario, directory = sys.argv[1], sys.argv[2]
    hvd.init(process_sets=[PAIR] if scenario == "process_set" else None)
    checks = {"errors": errors, "checkpoint": checkpoint, "keras": keras,
              "user_script": user_script, "process_set": process_set}[scenario](hvd.rank(),
                                                                                directory)
    report(directory, hvd.rank(), checks=checks)


if __name__ == "__main__":
    main()
