"""Communication plans of the gossip optimizers (framework-agnostic, host only).

* Crossover-SGD (Yeo et al.): for every segment ``s`` and step ``t`` all ranks
  derive the same random *derangement* ``pi`` of the ``G`` gossip members from
  ``default_rng([seed, t, s])`` (permutations drawn until one has no fixed
  point; about ``e`` draws on average): member ``i`` sends segment ``s`` to
  ``pi[i]`` and receives it from ``pi^-1[i]``.  Every member sends exactly one
  copy and receives exactly one (load balanced), without any coordination
  message; the new segment is ``0.5 own + 0.5 received``.  ``topology="paper"``
  draws the authors' sequential sampler instead (:func:`roulette_derangement`).
* SGP's exponential graph (Assran et al., ICML 2019), as its paper states
  it: at step ``t`` member ``r`` receives from ``r - 3^i`` and ``r - 2*3^i``
  (mod ``G``), ``i = t mod (floor(log3(G - 1)) + 1)``, and averages the three
  copies.  (For ``G = 2`` the second peer is the member itself.)
  ``schedule="one_peer"``: the official SGP code's one-peer graph
  (:func:`sgp_one_peer_offsets`), ``x = (x + x_{r - d}) / 2``.
* Hierarchical groups: ``P`` ranks in ``G`` contiguous groups of ``P/G``;
  the first rank of each group is its leader.
"""

import fnmatch

import numpy as np

from .arguments import check_integer


def derangement(seed, step, segment, size):
    """A permutation of ``range(size)`` without fixed points, identical on every rank."""
    if size < 2:
        raise ValueError(f"a derangement needs at least 2 members, got {size}")
    rng = np.random.default_rng([seed, step, segment])
    while True:
        candidate = rng.permutation(size)
        if not (candidate == np.arange(size)).any():
            return [int(j) for j in candidate]


def roulette_derangement(seed, step, segment, size):
    """The authors' sampler (``topology="paper"``): member ``i = 0, 1, ...`` in turn
    draws the member it receives from, uniformly among those that are neither
    itself nor taken; member ``G - 2`` takes ``G - 1`` if nobody has.  A
    derangement, not uniform (at ``G = 4``: 1/12 to 1/6 each, uniform 1/9).
    Returned as :func:`derangement`'s ``pi`` (member ``i`` sends to ``pi[i]``)."""
    if size < 2:
        raise ValueError(f"a derangement needs at least 2 members, got {size}")
    rng = np.random.default_rng([seed, step, segment])
    source = []
    for member in range(size):
        if member == size - 2 and size - 1 not in source:
            source.append(size - 1)
            continue
        allowed = [j for j in range(size) if j != member and j not in source]
        source.append(allowed[int(rng.integers(len(allowed)))])
    target = [0] * size
    for member, sender in enumerate(source):
        target[sender] = member
    return target


TOPOLOGIES = {"uniform": derangement, "paper": roulette_derangement}


def crossover_routes(seed, step, segments, size, member, topology="uniform"):
    """``(send_to, receive_from)``: per segment, where ``member`` sends and whom it hears."""
    draw = TOPOLOGIES[topology]
    send_to, receive_from = [], []
    for segment in range(segments):
        target = draw(seed, step, segment, size)
        send_to.append(target[member])
        receive_from.append(target.index(member))
    return send_to, receive_from


def sgp_distances(step, size):
    """The two peer distances of SGP's exponential graph at ``step``."""
    if size < 2:
        return ()
    exponent, power = 0, 3
    while power <= size - 1:  # floor(log3(size - 1)), in integers
        exponent, power = exponent + 1, power * 3
    i = step % (exponent + 1)
    return (3 ** i % size, 2 * 3 ** i % size)


SGP_SCHEDULES = ("two_peer", "one_peer")


def sgp_one_peer_offsets(size):
    """The official SGP code's one-peer exponential graph (facebookresearch/
    stochastic_gradient_push, ``DynamicDirectedExponentialGraph`` with one peer
    per iteration): the signed distances ``+1, -1, +2, -2, +4, ...`` up to
    ``2^floor(log2(size - 1))``, each skipped when it reaches (mod ``size``) a
    member an earlier one reached; step ``t`` sends to ``r + d`` and hears
    ``r - d`` for ``d = offsets[t mod len]``.  Uniform weights 1/2 on a regular
    graph keep every push-sum weight at 1, so none is sent."""
    offsets, reached, power = [], set(), 1
    while power <= size - 1:
        for distance in (power, -power):
            if distance % size not in reached:
                reached.add(distance % size)
                offsets.append(distance)
        power *= 2
    return offsets


def sgp_peer_distances(step, size, schedule="two_peer"):
    """The distances member ``r`` sends to (``r + d``) and hears from (``r - d``)
    at ``step``; the new model is the mean of its own and the copies heard."""
    if schedule == "one_peer":
        offsets = sgp_one_peer_offsets(size)
        return (offsets[step % len(offsets)],) if offsets else ()
    return sgp_distances(step, size)


def hierarchical_groups(size, groups):
    """``groups`` contiguous rank lists of equal length (``groups`` must divide ``size``)."""
    check_integer("groups", groups)
    if size % groups:
        raise ValueError(f"groups={groups} does not divide the {size} ranks")
    per = size // groups
    return [list(range(g * per, (g + 1) * per)) for g in range(groups)]


def named_segments(names, patterns):
    """Segments chosen by parameter name: ``patterns[j]`` -- a pattern or a list of
    patterns (``fnmatch``, e.g. ``"layer1.0.*"``) -- takes, in model order, every
    parameter whose name it matches that no earlier segment took.  The paper's
    "fine" split of ResNet-50 is one pattern per bottleneck block.  Every
    parameter must be taken (end with ``"*"`` for the rest) and every segment
    must take one; returns lists of parameter positions."""
    if isinstance(patterns, (str, bytes)) or not patterns:
        raise TypeError(f"segments must be a non-empty list of name patterns, got {patterns!r}")
    taken, runs = set(), []
    for entry in patterns:
        group = [entry] if isinstance(entry, str) else (
            list(entry) if isinstance(entry, (list, tuple)) else None)
        if not group or not all(isinstance(pattern, str) for pattern in group):
            raise TypeError(f"a segment is a name pattern or a list of them, got {entry!r}")
        run = [i for i, name in enumerate(names) if i not in taken
               and any(fnmatch.fnmatchcase(name, pattern) for pattern in group)]
        if not run:
            raise ValueError(f"segment {entry!r} matches no parameter left (names: {list(names)})")
        taken.update(run)
        runs.append(run)
    missed = [name for i, name in enumerate(names) if i not in taken]
    if missed:
        raise ValueError(f"parameters {missed} match no segment: add \"*\" as the last segment "
                         "to gather the rest")
    return runs


def balanced_segments(sizes, count):
    """Cut consecutive tensors (``sizes`` elements each) into ``count`` runs of
    nearly equal total size (each cut where the running total is nearest its
    share); returns lists of tensor positions, none empty."""
    check_integer("segments", count)
    count = min(count, len(sizes))
    total, runs, current, done = sum(sizes), [], [], 0
    for position, size in enumerate(sizes):
        target = total * (len(runs) + 1) / count
        must_cut = len(sizes) - position == count - len(runs) - 1  # one tensor per run left
        if current and len(runs) < count - 1 and (must_cut or done + size - target > target - done):
            runs.append(current)
            current = []
        current.append(position)
        done += size
    runs.append(current)
    return runs
