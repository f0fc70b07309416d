"""Horovod jobs across two emulated hosts (``benchmarks/testbed.py``).

Elastic training: a host leaves and comes back under ``horovodrun``'s elastic
mode; the compressor's per-rank state follows (``core.elastic``).

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

from launch import BIN, ROOT, horovodrun, mpirun, run
from records import read_report

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
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
        hosts = [read_report(tmp_path, r, f"case{index}")["host"] for r in range(4)]
        assert hosts == ["hs-node1", "hs-node1", "hs-node2", "hs-node2"], hosts
        for rank in range(4):
            across = read_report(tmp_path, rank, f"case{index}")
            local = read_report(single_host, rank, f"case{index}")
            for key in KEYS:
                np.testing.assert_array_equal(across[key], local[key], f"{CASES[index]} {key}")


def test_bed_is_idempotent(bed):
    before = bed.status()
    bed.up()
    assert bed.status() == before and all(s["sshd_pid"] for s in before.values()), before


def test_bed_refuses_without_root():
    # The script reaches the unprivileged user on stdin, run by the system interpreter
    # from "/": the checkout may sit in a directory only root can enter (mktemp -d).
    with open(os.path.join(ROOT, "benchmarks", "testbed.py")) as f:
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


DISCOVERY = """#!/bin/sh
# Host 2 leaves when rank 0 has reached step {leave} and comes back at step {back}.
step=$(cat {out}/progress 2>/dev/null || echo 0)
echo {host1}:1
if [ "$step" -lt {leave} ] || [ "$step" -ge {back} ]; then echo {host2}:1; fi
"""


def test_elastic_host_removed_and_added_back(bed, tmp_path):
    """Elastic horovodrun, one rank per host, ExDyna's compressor in ``hvd.elastic.TorchState``:
    host 2 leaves after step 10 and comes back after step 20.  Training goes on to step
    30; ranks hold identical parameters at every step; across each restart the pending
    update ``(1/P) sum_r e_r`` is what it was at the last commit (the removed host's
    residual is not lost, the new worker does not start from zero)."""
    bed.up()  # the benchmark tests above take the bed down when they finish
    leave, back, steps = 10, 20, 30
    discovery = tmp_path / "discover.sh"
    discovery.write_text(DISCOVERY.format(out=tmp_path, leave=leave, back=back,
                                          host1=bed.HOSTS[0][1], host2=bed.HOSTS[1][1]))
    discovery.chmod(0o755)
    command = [os.path.join(BIN, "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
               "--host-discovery-script", str(discovery), *bed.horovodrun_link_args(),
               sys.executable, "tests/workers/torch_elastic.py", "--out", str(tmp_path),
               "--steps", str(steps), "--change-at", f"{leave},{back}"]
    run(bed.on_host1(command), timeout=300)
    records = [json.loads(line) for path in tmp_path.glob("*.jsonl")
               for line in path.read_text().splitlines()]
    events = {kind: [r for r in records if r["event"] == kind]
              for kind in ("enter", "commit", "done", "raised")}

    for step in range(1, steps + 1):
        commits = [r for r in events["commit"] if r["step"] == step]
        size = 1 if leave < step <= back else 2
        assert [r["size"] for r in commits] == [size] * size, (step, commits)
        assert len({r["params"] for r in commits}) == 1, f"ranks differ at step {step}"
    assert [(r["step"], r["size"]) for r in events["done"]] == [(steps, 2)] * 2
    assert len({r["params"] for r in events["done"]}) == 1
    restarts = sorted((r["step"], r["size"]) for r in events["enter"])
    assert restarts == [(0, 2), (0, 2), (leave, 1), (back, 2), (back, 2)], restarts
    assert all("HostsUpdatedInterrupt" in r["error"] for r in events["raised"]), events["raised"]

    for step, size_before in ((leave, 2), (back, 1)):
        before = [r for r in events["commit"] if r["step"] == step]
        after = [r for r in events["enter"] if r["step"] == step]
        assert {r["size"] for r in before} == {size_before} and after
        pending = np.array(before[0]["pending"])
        assert np.abs(pending).sum() > 1.0, "nothing pending: the check would be vacuous"
        for record in after:
            assert record["params"] == before[0]["params"]
            np.testing.assert_allclose(record["pending"], pending, rtol=1e-6, atol=1e-7)
