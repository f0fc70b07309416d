"""Every benchmark runs in its --quick mode (numbers are never asserted), and the
getting-started TensorFlow example runs."""

import os
import re
import subprocess
import sys

import pytest

from launch import ROOT, horovodrun, mpirun


def test_selection_cost_quick():
    out = subprocess.run([sys.executable, "benchmarks/selection_cost.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    header = out.splitlines()[0].split()
    assert {"topk", "gtopk", "randomk", "threshold", "dgc", "cltk", "gssgd", "micro", "exdyna",
            "deft"} <= set(header) and "200,000" in out


def test_sketch_recall_quick():
    out = subprocess.run([sys.executable, "benchmarks/sketch_recall.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert [line.split(":")[1].strip() for line in out.splitlines() if line.startswith("step 5")] \
        == ["C = 4k = 340", "C = 16k = 1,360", "C = 64k = 5,440"]
    assert "test accuracy" in out


def test_benchmark_rows_name_variants_and_settings():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from common import row_options
    finally:
        sys.path.pop(0)
    assert row_options("exdyna") == ("exdyna", {})
    assert row_options("deft/paper") == ("deft", {"budget": "paper"})
    assert row_options("gssgd:columns=1360:merge=tree") == ("gssgd", {"columns": 1360,
                                                                       "merge": "tree"})
    with pytest.raises(SystemExit, match="key=value"):
        row_options("gssgd:columns")


@pytest.mark.horovod
@pytest.mark.parametrize("task", [["--framework", "torch"], ["--framework", "tensorflow"],
                                  ["--task", "charlm"]], ids=["torch", "tensorflow", "charlm"])
def test_convergence_quick(task):
    out = horovodrun(2, "benchmarks/convergence.py", "--quick", *task, "--methods", "dense,exdyna")
    assert f"exdyna: {'bpc' if 'charlm' in task else 'accuracy'}" in out


@pytest.mark.horovod
def test_synthetic_quick():
    out = horovodrun(2, "benchmarks/synthetic.py", "--quick", "--compression", "none,exdyna")
    assert "Floors: accumulate over n" in out
    for method in ("dense", "exdyna"):  # none: the dense baseline, shown as dense
        section = out.split(f"compression: {method}")[1]
        assert "Total img/sec on 2 worker(s)" in section and "Step breakdown" in section
    assert "(dense, alternating: " in out.split("compression: exdyna")[1]  # paired iterations


def test_memory_quick():
    out = subprocess.run([sys.executable, "benchmarks/memory.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    methods = [line.split(":")[0].strip() for line in out.splitlines()]
    assert sorted(methods) == sorted(["topk", "gtopk", "randomk", "threshold", "dgc", "cltk",
                                      "gssgd", "micro", "exdyna", "deft"])


def test_rebalance_quick():
    out = subprocess.run([sys.executable, "benchmarks/rebalance.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "exdyna/proportional" in out and "exdyna, paper mode" in out
    padded_over_exact = [float(line.split("padded / exact: ")[1].split(";")[0])
                         for line in out.splitlines() if "padded / exact" in line]
    assert len(padded_over_exact) == 4 and min(padded_over_exact) >= 1.0


@pytest.mark.horovod
def test_threshold_control_quick():
    out = horovodrun(2, "benchmarks/threshold_control.py", "--quick")
    assert "exdyna  adaptive" in out


@pytest.mark.horovod
def test_sparse_allreduce_quick():
    out = horovodrun(2, "benchmarks/sparse_allreduce.py", "--quick")
    model, synthetic = out.split("# synthetic gradients")
    for method in ("dense", "topk", "topk/union", "gtopk", "randomk", "threshold", "dgc", "cltk",
                   "gssgd", "micro", "exdyna", "deft"):
        assert f"{method} " in model and f"{method} " in synthetic


@pytest.mark.horovod
def test_sparse_allreduce_quick_mpi4py():
    out = mpirun(2, "benchmarks/sparse_allreduce.py", "--quick", "--communicator", "mpi",
                 "--sources", "synthetic", "--methods", "exdyna")
    assert "# synthetic gradients" in out and "exdyna " in out


@pytest.mark.horovod
def test_gossip_quick():
    out = horovodrun(4, "benchmarks/gossip.py", "--quick", "--methods", "hierarchical")
    assert "Crossover-SGD, 2 groups @   64" in out


@pytest.mark.horovod
def test_soak_quick():
    out = horovodrun(2, "benchmarks/soak.py", "--quick", "--methods", "exdyna,gssgd")
    assert "exdyna: RSS" in out and "gssgd: RSS" in out


@pytest.mark.horovod
def test_tensorflow_getting_started_example_runs():
    out = horovodrun(2, "examples/tensorflow_tape.py")
    assert "; density 0.0" in out and "bytes sent per step" in out  # ExDyna at d = 0.001


def test_time_to_quality_interpolates_between_evaluations():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from time_to_quality import seconds_to_reach
    curve = [{"seconds": 0.0, "bpc": 8.0}, {"seconds": 10.0, "bpc": 4.0},
             {"seconds": 20.0, "bpc": 3.0}, {"seconds": 30.0, "bpc": 3.2}]
    assert seconds_to_reach(curve, 3.5) == 15.0
    assert seconds_to_reach(curve, 4.0) == 10.0
    assert seconds_to_reach(curve, 3.0) == 20.0
    assert seconds_to_reach(curve, 9.0) == 0.0
    assert seconds_to_reach(curve, 2.9) is None


@pytest.mark.horovod
def test_dense_below_quick():
    out = horovodrun(2, "benchmarks/dense_below.py", "--quick")
    assert "every gradient sparsified: accuracy" in out and "dense_1d=True: accuracy" in out


@pytest.mark.horovod
def test_demo_explains_a_sparse_row_slower_than_dense():
    out = horovodrun(2, "examples/demo.py", "--epochs", 1, "--methods", "dense,exdyna")
    rates = {method: float(rate.replace(",", "")) for method, rate in
             re.findall(r"\s(dense|exdyna)\s+[\d.]+%\s+([\d,.]+)\s", out)}
    assert set(rates) == {"dense", "exdyna"}, out[-2000:]
    assert ("Why is exdyna slower here" in out) == (rates["exdyna"] < rates["dense"]), out[-2000:]


@pytest.mark.horovod
def test_fallback_benchmark_quick():
    """Two epochs of the digits on 2 ranks: the method as it is and with fallback="auto",
    whose probe ends within the first epoch and then sends some steps densely."""
    out = horovodrun(2, "benchmarks/fallback.py", "--methods", "exdyna", "--epochs", 2,
                     "--repeats", 1, "--no-docs")
    shares = dict(re.findall(r"fallback=\s*(None|auto):.*dense steps (\d+)%", out))
    assert shares.get("None") == "0" and "auto" in shares, out[-2000:]


@pytest.mark.horovod
def test_fallback_steady_state_quick():
    """The steady-state measurement: once its first check has decided, the fallback
    steps densely (Top-k's sparse step costs several dense ones), in turn with two
    dense runs, in two blocks of fresh runs."""
    out = horovodrun(2, "benchmarks/fallback.py", "--methods", "topk", "--steady", 30,
                     "--blocks", 2, "--no-docs")
    number = r"\s+([\d.]+)"
    row = re.search("topk" + number * 5 + r"\s+([\d.]+)%", out)
    assert row and all(float(x) > 0 for x in row.groups()[:5]), out[-2000:]
    _, ratio, *blocks, _, share = map(float, row.groups())
    assert min(blocks) <= ratio <= max(blocks), out[-2000:]
    assert share == 100.0, out[-2000:]
    pooled = re.search(r"Pooled over all 2 blocks: the fallback's step ([\d.]+)x", out)
    assert pooled and float(pooled.group(1)) == pytest.approx(sum(blocks) / 2, abs=1e-3), out[-2000:]
