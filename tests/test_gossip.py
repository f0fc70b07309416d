"""Crossover-SGD and SGP through Horovod's alltoall on real ranks, against numpy
references (bit for bit), plus the plans' properties."""

from fractions import Fraction

import numpy as np
import pytest

import reference
from gradients import dyadic_gradient
from horovod_sparse.core.gossip import (balanced_segments, derangement, hierarchical_groups,
                                        named_segments, roulette_derangement, sgp_distances,
                                        sgp_one_peer_offsets)
from launch import horovodrun, mpirun
from records import read_reports

SHAPES = [(6, 5), (6,), (40,), (3, 3)]
MODULE_SEGMENTS = [(0, 36), (36, 76), (76, 85)]  # a.weight + a.bias, b.weight, c.weight
SEED = 11


@pytest.mark.parametrize("size", [2, 3, 4, 5, 7, 16])
def test_derangements_have_no_fixed_point_and_are_permutations(size):
    for step in range(50):
        perm = derangement(SEED, step, step % 3, size)
        assert sorted(perm) == list(range(size))
        assert all(perm[i] != i for i in range(size))
        assert perm == derangement(SEED, step, step % 3, size)  # reproducible from the seed


def test_sgp_distances_and_groups():
    assert [sgp_distances(t, 4) for t in range(3)] == [(1, 2), (3, 2), (1, 2)]
    assert sgp_distances(0, 2) == (1, 0)
    assert hierarchical_groups(4, 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="does not divide"):
        hierarchical_groups(6, 4)
    with pytest.raises(ValueError, match="groups"):
        hierarchical_groups(4, 0)
    assert balanced_segments([10, 1, 10, 1, 100, 5], 3) == [[0, 1, 2, 3], [4], [5]]
    with pytest.raises(ValueError, match="segments"):
        balanced_segments([1, 2], 0)


def _expected(mode, size, steps, lr, segments=MODULE_SEGMENTS):
    n = sum(int(np.prod(s)) for s in SHAPES)
    params = [dyadic_gradient(SEED, 1000, r, SHAPES) for r in range(size)]
    grads = [[dyadic_gradient(SEED, t, r, SHAPES) if lr else np.zeros(n, np.float32)
              for r in range(size)] for t in range(steps)]
    if mode == "sgp":
        return reference.sgp(params, grads, lr)
    if mode == "sgp_one_peer":
        return reference.sgp_one_peer(params, grads, lr)
    return reference.crossover(params, grads, lr, SEED, segments,
                               groups=2 if mode == "hierarchical" else None,
                               topology="paper" if mode == "crossover_paper" else "uniform")


def _run(launcher, size, tmp_path, mode, steps, lr, segments=None):
    extra = [] if segments is None else [segments]
    launcher(size, "tests/workers/gossip_exchange.py", tmp_path, mode, steps, lr, *extra)
    return read_reports(tmp_path, size)


def _assert_matches(got, expected):
    for rank, saved in enumerate(got):
        for step, want in enumerate(expected):
            np.testing.assert_array_equal(saved["params"][step], want[rank],
                                          err_msg=f"rank {rank} step {step}")


@pytest.mark.horovod
@pytest.mark.parametrize("mode", ["crossover", "sgp"])
def test_horovodrun_four_ranks_match_reference(mode, tmp_path):
    got = _run(horovodrun, 4, tmp_path, mode, 8, 0.5)
    _assert_matches(got, _expected(mode, 4, 8, 0.5))
    if mode == "crossover":
        perms = got[0]["perms"]
        for saved in got[1:]:
            np.testing.assert_array_equal(saved["perms"], perms)  # one plan on every rank


@pytest.mark.horovod
def test_hierarchical_two_groups_of_two_match_reference(tmp_path):
    got = _run(horovodrun, 4, tmp_path, "hierarchical", 6, 0.5)
    _assert_matches(got, _expected("hierarchical", 4, 6, 0.5))
    for step in range(6):  # group members are identical after the broadcast
        np.testing.assert_array_equal(got[0]["params"][step], got[1]["params"][step])
        np.testing.assert_array_equal(got[2]["params"][step], got[3]["params"][step])


@pytest.mark.horovod
@pytest.mark.parametrize("mode", ["crossover", "sgp"])
def test_mpirun_three_ranks_match_reference(mode, tmp_path):
    got = _run(mpirun, 3, tmp_path, mode, 6, 0.5, segments=2 if mode == "crossover" else None)
    segments = [(0, 36), (36, 85)]  # two size-balanced runs: a.*, then b.weight + c.weight
    _assert_matches(got, _expected(mode, 3, 6, 0.5, segments))


def exact_roulette_probabilities(members):
    """Every outcome of the authors' sampler with its exact probability, by walking
    the tree of its choices (``Fraction``s): {whom each member hears: probability}."""
    outcomes = {}

    def walk(heard, probability):
        i = len(heard)
        if i == members:
            outcomes[tuple(heard)] = outcomes.get(tuple(heard), 0) + probability
        elif i == members - 2 and members - 1 not in heard:
            walk(heard + [members - 1], probability)
        else:
            free = [j for j in range(members) if j != i and j not in heard]
            for j in free:
                walk(heard + [j], probability * Fraction(1, len(free)))
    walk([], Fraction(1))
    return outcomes


@pytest.mark.parametrize("members", [3, 4, 5])
def test_paper_topology_draws_the_authors_distribution(members):
    exact = exact_roulette_probabilities(members)
    assert sum(exact.values()) == 1
    draws = 20_000
    counts = {}
    for step in range(draws):
        target = roulette_derangement(SEED, step, 0, members)
        assert sorted(target) == list(range(members)) and all(
            target[i] != i for i in range(members))
        heard = tuple(target.index(i) for i in range(members))
        counts[heard] = counts.get(heard, 0) + 1
    assert set(counts) <= set(exact)
    for outcome, probability in exact.items():
        assert abs(counts.get(outcome, 0) / draws - float(probability)) < 0.015, outcome
    if members == 4:  # not uniform over the 9 derangements: 1/12 to 1/6
        assert (min(exact.values()), max(exact.values())) == (Fraction(1, 12), Fraction(1, 6))


def test_sgp_one_peer_offsets():
    assert [sgp_one_peer_offsets(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [
        [], [1], [1, -1], [1, -1, 2], [1, -1, 2, -2], [1, -1, 2, -2, 4], [1, -1, 2, -2, 4, -4]]  # 9: +-8 = -+1


@pytest.mark.horovod
def test_sgp_one_peer_matches_reference(tmp_path):
    got = _run(horovodrun, 4, tmp_path, "sgp_one_peer", 6, 0.5)
    _assert_matches(got, _expected("sgp_one_peer", 4, 6, 0.5))


@pytest.mark.horovod
def test_paper_topology_matches_reference(tmp_path):
    got = _run(horovodrun, 4, tmp_path, "crossover_paper", 6, 0.5)
    _assert_matches(got, _expected("crossover_paper", 4, 6, 0.5))


@pytest.mark.horovod
def test_segments_by_name_pattern_match_reference(tmp_path):
    """The paper's per-block split, in small: segments chosen by parameter name."""
    got = _run(horovodrun, 4, tmp_path, "crossover", 6, 0.5, segments="a.weight;a.bias+b.*;*")
    assert list(got[0]["segments"]) == [1, 2, 1]
    _assert_matches(got, _expected("crossover", 4, 6, 0.5, [(0, 30), (30, 76), (76, 85)]))


def test_named_segments_take_every_parameter_once():
    names = ["a.weight", "a.bias", "b.weight", "c.weight"]
    assert named_segments(names, ["a.weight", ["a.bias", "b.*"], "*"]) == [[0], [1, 2], [3]]
    assert named_segments(names, ["*.weight", "*"]) == [[0, 2, 3], [1]]
    with pytest.raises(ValueError, match="match no segment"):
        named_segments(names, ["a.*"])
    with pytest.raises(ValueError, match="matches no parameter"):
        named_segments(names, ["a.*", "z.*", "*"])
    with pytest.raises(TypeError, match="segments"):
        named_segments(names, "a.*")
    with pytest.raises(TypeError, match="segment"):
        named_segments(names, [3])


@pytest.mark.horovod
def test_gossip_without_gradients_reaches_consensus_geometrically(tmp_path):
    got = _run(horovodrun, 4, tmp_path, "crossover", 30, 0.0)
    stacked = np.stack([saved["params"] for saved in got])  # rank, step, element
    spread = np.abs(stacked - stacked.mean(axis=0)).max(axis=(0, 2))
    initial = np.abs(np.stack([dyadic_gradient(SEED, 1000, r, SHAPES) for r in range(4)])
                     ).max()
    assert np.all(np.diff(spread) <= 1e-6 * initial)  # mixing never increases disagreement
    assert spread[9] < 0.05 * initial and spread[29] < 1e-5 * initial, spread
