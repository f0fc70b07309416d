"""Horovod jobs across two emulated hosts (``tests/multihost/testbed.py``).

Top-k and ExDyna through Horovod's own ``DistributedOptimizer`` on 4 ranks,
2 on each host, under horovodrun (Gloo, over ssh) and mpirun (MPI, over ssh):
every rank's aggregate, residual, counts, thresholds and partitions equal the
single-host run on the same seeds, bit for bit.  Needs root (the bed makes
network namespaces and runs sshd); skipped otherwise.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from launch import ROOT, horovodrun, mpirun

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost"))
import testbed  # noqa: E402

pytestmark = [pytest.mark.horovod,
              pytest.mark.skipif(os.geteuid() != 0, reason="the multi-host bed needs root")]
CASES = [["topk", {}], ["exdyna", {}]]
ARGS = ["--cases", json.dumps(CASES), "--steps", 10, "--seed", 7, "--density", 0.02]
WORKER = "tests/workers/torch_exchange.py"
KEYS = ("aggregate", "residual", "counts", "nnz", "threshold", "edges")


@pytest.fixture(scope="module")
def bed():
    testbed.up()
    yield testbed
    testbed.down()
    assert not any(state["namespace"] or state["sshd_pid"] for state in testbed.status().values())


@pytest.fixture(scope="module")
def single_host(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    horovodrun(4, WORKER, "--out", out, *ARGS)
    return out


@pytest.mark.parametrize("launcher", [horovodrun, mpirun], ids=["horovodrun", "mpirun"])
def test_two_hosts_equal_one_host(launcher, bed, single_host, tmp_path):
    launcher(4, WORKER, "--out", tmp_path, *ARGS, testbed=bed)
    for index in range(len(CASES)):
        hosts = [str(np.load(tmp_path / f"case{index}.rank{r}.npz")["host"]) for r in range(4)]
        assert hosts == ["hs-node1", "hs-node1", "hs-node2", "hs-node2"], hosts
        for rank in range(4):
            across = np.load(tmp_path / f"case{index}.rank{rank}.npz")
            local = np.load(single_host / f"case{index}.rank{rank}.npz")
            for key in KEYS:
                np.testing.assert_array_equal(across[key], local[key], f"{CASES[index]} {key}")


def test_bed_is_idempotent(bed):
    before = bed.status()
    bed.up()
    assert bed.status() == before and all(s["sshd_pid"] for s in before.values()), before


def test_bed_refuses_without_root():
    # The script reaches the unprivileged user on stdin, run by the system interpreter
    # from "/": the checkout may sit in a directory only root can enter (mktemp -d).
    with open(os.path.join(ROOT, "tests", "multihost", "testbed.py")) as f:
        source = f.read()
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             os.path.realpath(sys.executable), "-", "up"], cwd="/", input=source,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "needs root" in result.stderr, result.stderr


def test_time_to_quality_quick():
    """The time-to-quality benchmark end to end, unshaped and short: it brings the bed
    up, trains the language model with one rank per host, and takes the bed down."""
    out = subprocess.run([sys.executable, "benchmarks/time_to_quality.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "exdyna:" in out.stdout and "bits/char after" in out.stdout, out.stdout
    assert not any(state["namespace"] or state["sshd_pid"] for state in testbed.status().values())


def test_demo_across_hosts():
    """``make demo``'s second part: dense and ExDyna across the 1 Gbit/s link, side by side."""
    out = subprocess.run([sys.executable, "benchmarks/multihost.py", "--demo"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 Gbit/s link" in out.stdout and "   dense" in out.stdout and "  exdyna" in out.stdout
    assert not any(state["namespace"] or state["sshd_pid"] for state in testbed.status().values())
