"""Every benchmark runs in its --quick mode (numbers are never asserted), and the
getting-started TensorFlow example runs."""

import subprocess
import sys

import pytest

from launch import ROOT, horovodrun


def test_selection_cost_quick():
    out = subprocess.run([sys.executable, "benchmarks/selection_cost.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "exdyna/pass" in out and "1,000,000" in out


@pytest.mark.horovod
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_convergence_quick(framework):
    out = horovodrun(2, "benchmarks/convergence.py", "--quick", "--framework", framework,
                     "--methods", "none,exdyna")
    assert "exdyna: accuracy" in out


@pytest.mark.horovod
def test_synthetic_quick():
    out = horovodrun(2, "benchmarks/synthetic.py", "--quick", "--compression", "exdyna")
    assert "Total img/sec on 2 worker(s)" in out and "Step breakdown" in out


def test_rebalance_quick():
    out = subprocess.run([sys.executable, "benchmarks/rebalance.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "exdyna/proportional" in out


@pytest.mark.horovod
def test_threshold_control_quick():
    out = horovodrun(2, "benchmarks/threshold_control.py", "--quick")
    assert "exdyna  adaptive" in out


@pytest.mark.horovod
def test_sparse_allreduce_quick():
    out = horovodrun(2, "benchmarks/sparse_allreduce.py", "--quick")
    assert "exdyna" in out and "dense" in out


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
