"""Independent, obviously-correct numpy references of every method.

Each function simulates ``P`` workers in one process with plain loops over
workers and coordinates, written from the methods' specifications
(docs/methods.md, docs/methods/) without using
``horovod_sparse``.  Input: ``grads[t][r]``, the flat float32 gradient of
worker ``r`` at step ``t``, the model's tensor ``shapes`` and the core's own
keyword arguments (:data:`REFERENCES`: one per method name, called by
:func:`run`).  Output: one record per step with the averaged aggregate,
every worker's residual, and the method's control state.

Arithmetic is float32 like the real path; tests feed dyadic gradients (whole
multiples of 2**-8), on which sums are exact in any order, so the comparison
can be bit-for-bit even where the real allreduce adds in ring order.
"""

import math

import numpy as np

TINY = float(np.finfo(np.float32).tiny)


def k_of(density, n):
    return max(1, math.floor(density * n))


def top_magnitudes(acc, k, start, stop):
    """Indices of the k largest |acc| in [start, stop), ties to the lower index, ascending."""
    ranked = sorted(range(start, stop), key=lambda i: (-abs(float(acc[i])), i))
    return sorted(ranked[:max(k, 0)])


def even_partitions(n, P):
    base, extra = divmod(n, P)
    bounds, start = [], 0
    for j in range(P):
        length = base + (1 if j < extra else 0)
        bounds.append((start, start + length))
        start += length
    return bounds


def _record(aggregate, residuals, **state):
    return dict(aggregate=aggregate, residuals=[r.copy() for r in residuals], **state)


# -- Top-k ---------------------------------------------------------------------
def topk(grads, density, shapes, variant="gather"):
    """``"gather"``: each worker's list added, value / P, in worker order; a worker
    zeroes what it sent.  ``"union"``: every worker's acc summed at the union of
    the lists, / P; every worker zeroes the whole union."""
    P, n = len(grads[0]), grads[0][0].size
    k = k_of(density, n)
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []
    for step_grads in grads:
        accs = [g + e for g, e in zip(step_grads, residuals)]
        selections = [top_magnitudes(acc, k, 0, n) for acc in accs]
        union = sorted(set(i for s in selections for i in s))
        if variant == "union":
            aggregate = _average_union(accs, union)
        else:
            aggregate = np.zeros(n, np.float32)
            for acc, selected in zip(accs, selections):  # each value / P, in worker order
                for i in selected:
                    aggregate[i] = np.float32(aggregate[i] + acc[i] / np.float32(P))
            for acc, selected in zip(accs, selections):
                acc[selected] = 0
        residuals = accs
        records.append(_record(aggregate, residuals, counts=[len(s) for s in selections],
                               nnz=len(union)))
    return records


def _average_union(accs, union):
    """Rank-order float32 sum of every worker's acc at ``union``, / P; zero union everywhere."""
    P, n = len(accs), accs[0].size
    aggregate = np.zeros(n, np.float32)
    for i in union:
        total = np.float32(0)
        for acc in accs:
            total = np.float32(total + acc[i])
        aggregate[i] = total / np.float32(P)
    for acc in accs:
        acc[list(union)] = 0
    return aggregate


# -- threshold control (docs/methods/threshold_control_rules.md: the papers' rule and ours) ----
def paper_next(thr, K, k):
    """The released code: x1.005 above 1.1 k, x1.00125 above 0.909 k, else x0.995."""
    r = K / k
    if r > 1.1:
        return thr * 1.005
    if r > 0.909:
        return thr * 1.00125
    return thr * 0.995


def ladder(thr, low, fall):
    """Our controller's rungs: every 0.004 in log from log(low * fall) to 0.7, then 8 up to log 4."""
    floor = math.log(low * fall)
    count = int((0.7 - floor) / 0.004) + 1
    logs = [floor + 0.004 * j for j in range(count)]
    logs += list(np.linspace(0.7, math.log(4.0), 9)[1:])
    return [max(float(r), TINY) for r in thr * np.exp(np.array(logs))]


def nearest_rung(totals, k):
    best, best_distance = 0, None
    for j, total in enumerate(totals):
        if total > 0:
            distance = abs(math.log(total / k))
            if best_distance is None or distance < best_distance:
                best, best_distance = j, distance
    return best


def first_threshold(accs, owned, k):
    """k-th largest magnitude over every worker's k largest in its own partition."""
    candidates = []
    for acc, (start, stop) in zip(accs, owned):
        picked = top_magnitudes(acc, k, start, stop)
        candidates += [abs(float(acc[i])) for i in picked] + [0.0] * (k - len(picked))
    return max(sorted(candidates, reverse=True)[k - 1], TINY)


# -- ExDyna's block partition ---------------------------------------------------
def initial_blocks(n, P, target=1024, exact=False):
    """Ours: n // block blocks (the remainder under one block); ``exact`` (ExDyna's
    code): exactly ``target`` blocks, the whole remainder in the last partition."""
    block = (n // target) // 32 * 32
    if block > 0:
        num_blocks = target if exact else n // block
    else:
        block = 32 if n >= 32 * P else 1
        num_blocks = n // block
    per, extra = divmod(num_blocks, P)
    edges = [0]
    for j in range(P):
        edges.append(edges[-1] + per + (1 if j < extra else 0))
    return block, num_blocks, edges


def block_bounds(n, block, edges):
    starts = [e * block for e in edges[:-1]]
    return [(s, e) for s, e in zip(starts, starts[1:] + [n])]


def min_blocks(num_blocks, P, rule):
    """ExDyna's num_blocks/(4P), a real number, for the paper rule; 1 for ours
    (never over an even share)."""
    if num_blocks < P:
        return 0
    wanted = max(1, num_blocks / (4 * P)) if rule != "proportional" else 1
    return min(wanted, num_blocks // P)


def paper_rebalance(edges, loads, block, num_blocks, n):
    """ExDyna's released sweep: mean int(K/P), ratios load/mean against 1.05 and
    0.95238, one block per pair if the giver keeps min_blocks after it,
    loads moved by int(block * K / n)."""
    P = len(loads)
    edges, loads = list(edges), [int(x) for x in loads]
    K = sum(loads)
    if K <= 0 or P == 1 or int(K / P) == 0:
        return edges
    mean, shift, least = int(K / P), int(block * (K / n)), min_blocks(num_blocks, P, "paper")
    for j in range(P - 1):
        left, right = edges[j + 1] - edges[j], edges[j + 2] - edges[j + 1]
        high_left, high_right = loads[j] / mean > 1.05, loads[j + 1] / mean > 1.05
        low_left, low_right = loads[j] / mean < 0.95238, loads[j + 1] / mean < 0.95238
        if high_left and low_right:
            if left - 1 >= least:
                edges[j + 1] -= 1
                loads[j] -= shift
                loads[j + 1] += shift
        elif low_left and high_right and right - 1 >= least:
            edges[j + 1] += 1
            loads[j] += shift
            loads[j + 1] -= shift
    return edges


def proportional_rebalance(edges, loads, block, num_blocks, n, estimate):
    """Ours: rescale a per-block load estimate to the reported partition loads,
    then cut its running sum into P equal shares.  Returns (edges, estimate)."""
    rule = "proportional"
    P = len(loads)
    if float(sum(loads)) <= 0 or P == 1:
        return list(edges), estimate
    prior = estimate if estimate is not None else [1.0] * num_blocks
    floor = 1e-3 * (math.fsum(prior) / num_blocks)
    weights = [w + floor for w in prior]
    new_estimate = [0.0] * num_blocks
    for j in range(P):
        blocks = range(edges[j], edges[j + 1])
        if len(blocks):
            scale = loads[j] / math.fsum(weights[b] for b in blocks)
            for b in blocks:
                new_estimate[b] = weights[b] * scale
    cumulative = [0.0]
    for value in new_estimate:
        cumulative.append(cumulative[-1] + value)
    least, new = min_blocks(num_blocks, P, rule), [0]
    for j in range(1, P):
        target = cumulative[-1] * j / P
        edge = next((e for e, c in enumerate(cumulative) if c >= target), num_blocks)
        if edge > 0 and target - cumulative[edge - 1] < cumulative[edge] - target:
            edge -= 1
        edge = min(max(edge, new[-1] + least), num_blocks - (P - j) * least)
        new.append(edge)
    new.append(num_blocks)
    return new, new_estimate


# -- MiCRO and ExDyna ----------------------------------------------------------
def exclusive(grads, density, control="adaptive", rebalance=None, initial="estimate",
              blocks=1024):
    """MiCRO (``rebalance=None``) or ExDyna (``"paper"``, ``"proportional"``, ``"none"``).
    ``initial="paper"``: first threshold 1/(2 sqrt k).  With ``control="paper"`` a
    worker that selects nothing sends coordinate start + t mod (its partition's
    length), as the released code does."""
    P, n = len(grads[0]), grads[0][0].size
    k = k_of(density, n)
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    thr, low, fall, records, last_counts = None, 0.5, 1.0, [], None
    if initial == "paper":
        thr = 1.0 / (2.0 * math.sqrt(k))
    if rebalance is not None:
        block, num_blocks, edges = initial_blocks(n, P, blocks, exact=rebalance == "paper")
        estimate = None
    for t, step_grads in enumerate(grads):
        accs = [g + e for g, e in zip(step_grads, residuals)]
        if rebalance is None:
            bounds = even_partitions(n, P)
        else:
            if t > 0 and rebalance != "none":
                # partition j was owned at t-1 by worker (j - (t-1)) mod P
                loads = [last_counts[(j - (t - 1)) % P] for j in range(P)]
                if rebalance == "paper":
                    edges = paper_rebalance(edges, loads, block, num_blocks, n)
                else:
                    edges, estimate = proportional_rebalance(edges, loads, block, num_blocks, n,
                                                             estimate)
            bounds = block_bounds(n, block, edges)
        owned = [bounds[(t + r) % P] for r in range(P)]
        if thr is None:
            thr = first_threshold(accs, owned, k)
        rungs = [max(thr, TINY)] if control == "paper" else ladder(thr, low, fall)
        rungs32 = [np.float32(r) for r in rungs]
        per_worker = []  # per worker: count at every rung
        for acc, (start, stop) in zip(accs, owned):
            per_worker.append([sum(1 for i in range(start, stop) if abs(acc[i]) >= r)
                               for r in rungs32])
        chosen = 0
        selections = [[i for i in range(start, stop) if abs(acc[i]) >= rungs32[0]]
                      for acc, (start, stop) in zip(accs, owned)]
        if control == "paper":
            for r, (start, stop) in enumerate(owned):
                if not selections[r] and stop > start:
                    selections[r] = [start + t % (stop - start)]
                    per_worker[r] = [1]
        totals = [sum(w[j] for w in per_worker) for j in range(len(rungs))]
        if control != "paper":
            chosen = nearest_rung(totals, k)
            selections = [[i for i in range(start, stop) if abs(acc[i]) >= rungs32[chosen]]
                          for acc, (start, stop) in zip(accs, owned)]
        union = [i for chosen_indices in selections for i in chosen_indices]
        aggregate = _average_union(accs, union)
        residuals = accs
        counts = [len(c) for c in selections]
        state = dict(counts=counts, nnz=len(union), threshold=rungs[chosen])
        if rebalance is not None:
            state["edges"] = list(edges)
        records.append(_record(aggregate, residuals, **state))
        last_counts = counts
        K = totals[chosen]
        if control == "paper":
            thr = max(paper_next(rungs[0], K, k), TINY)
            continue
        if chosen > 0 and totals[chosen] > 0:
            a = math.log(totals[0] / totals[chosen]) / math.log(rungs[chosen] / rungs[0])
            low = min(max(4.0 ** (-1.0 / max(a, 1e-3)), 0.5), 0.9)
        else:
            low = 0.5
        fall = min(1.0, thr / rungs[chosen])
        thr = max(rungs[chosen], TINY) if k / 16 <= K <= 16 * k else None
    return records


# -- DEFT ----------------------------------------------------------------------
def deft(grads, density, shapes, budget="exact"):
    """``budget="paper"``: the released code's budgets (every segment at least 1,
    nothing handed on; the total may exceed k)."""
    sizes = [int(np.prod(shape)) for shape in shapes]
    P, n = len(grads[0]), grads[0][0].size
    k = k_of(density, n)
    paper = budget == "paper"
    segments, offset = [], 0
    for size in sizes:
        if size > n / P:
            base, extra = divmod(size, P)
            for j in range(P):
                piece = base + (1 if j < extra else 0)
                if piece:
                    segments.append((offset, offset + piece))
                offset += piece
        elif size:
            segments.append((offset, offset + size))
            offset += size
    lengths = [e - s for s, e in segments]
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []

    def paper_budgets_of(acc):
        norms = [math.sqrt(sum(float(x) * float(x) for x in acc[s:e])) for s, e in segments]
        budget, k_rem, norm_rem = [0] * len(segments), k, 0.0
        for norm in norms:
            norm_rem += norm
        for l in np.argsort(np.array(norms))[::-1]:  # the code's order, ties included
            share = int(k_rem * norms[l] / norm_rem) if norm_rem > 0 else 0
            budget[l] = lengths[l] if lengths[l] < share else max(1, share)
            k_rem -= budget[l]
            norm_rem -= norms[l]
        return budget

    def budgets_of(acc):
        if paper:
            return paper_budgets_of(acc)
        norms = [math.sqrt(sum(float(x) * float(x) for x in acc[s:e])) for s, e in segments]
        order = sorted(range(len(segments)), key=lambda l: (-norms[l], l))
        budget, k_rem, norm_rem = [0] * len(segments), k, math.fsum(norms)
        for l in order:
            if k_rem <= 0:
                break
            share = math.floor(k_rem * norms[l] / norm_rem) if norm_rem > 0 else 0
            budget[l] = min(lengths[l], max(1, share))
            k_rem -= budget[l]
            norm_rem -= norms[l]
        for l in order:
            if k_rem <= 0:
                break
            extra = min(k_rem, lengths[l] - budget[l])
            budget[l] += extra
            k_rem -= extra
        return budget

    for t, step_grads in enumerate(grads):
        accs = [g + e for g, e in zip(step_grads, residuals)]
        budgets = [budgets_of(acc) for acc in accs]
        leader = budgets[t % P]
        bins = {}
        loads = [0.0] * P
        cost = [lengths[l] * math.log2(leader[l]) if leader[l] > 1 else float(lengths[l])
                for l in range(len(segments))]
        packable = [l for l in range(len(segments)) if 0 < leader[l] < lengths[l]]
        for l in sorted(packable, key=lambda l: (-cost[l], l)):
            target = loads.index(min(loads))
            bins[l] = target
            loads[target] += cost[l]
        common = [l for l in range(len(segments)) if leader[l] == lengths[l]]
        selections = []
        for r, acc in enumerate(accs):
            mine = [l for l in sorted(bins) if bins[l] == (t + r) % P]
            chosen = []
            for l in mine:
                chosen += top_magnitudes(acc, budgets[r][l], *segments[l])
            selections.append(chosen)
        union = [i for chosen in selections for i in chosen]
        union += [i for l in common for i in range(*segments[l])]
        aggregate = _average_union(accs, union)
        residuals = accs
        records.append(_record(aggregate, residuals, counts=[len(c) for c in selections],
                               nnz=len(union), budgets=budgets))
    return records


# -- baselines with a shared union: Random-k, hard threshold, CLT-k --------------
def randomk(grads, density, shapes, seed=0):
    P, n = len(grads[0]), grads[0][0].size
    k = k_of(density, n)
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []
    for t, step_grads in enumerate(grads):
        accs = [g + e for g, e in zip(step_grads, residuals)]
        chosen = sorted(int(i) for i in np.random.default_rng([seed, t]).choice(n, k, replace=False))
        aggregate = _average_union(accs, chosen)
        residuals = accs
        records.append(_record(aggregate, residuals, counts=[k] * P, nnz=k))
    return records


def hard_threshold(grads, density, shapes, threshold=None):
    P, n = len(grads[0]), grads[0][0].size
    k = k_of(density, n)
    thr = threshold if threshold is not None else 1 / (2 * math.sqrt(k))
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []
    for step_grads in grads:
        accs = [g + e for g, e in zip(step_grads, residuals)]
        selections = [[i for i in range(n) if abs(acc[i]) >= np.float32(thr)] for acc in accs]
        union = sorted(set(i for s in selections for i in s))
        aggregate = _average_union(accs, union)
        residuals = accs
        records.append(_record(aggregate, residuals, counts=[len(s) for s in selections],
                               nnz=len(union), threshold=thr))
    return records


def cltk(grads, density, shapes):
    P, n = len(grads[0]), grads[0][0].size
    k = min(k_of(density, n), n)
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []
    for t, step_grads in enumerate(grads):
        accs = [g + e for g, e in zip(step_grads, residuals)]
        leader = t % P
        chosen = top_magnitudes(accs[leader], k, 0, n)
        aggregate = _average_union(accs, chosen)
        residuals = accs
        records.append(_record(aggregate, residuals, counts=[k if r == leader else 0 for r in range(P)],
                               nnz=k))
    return records


# -- gTop-k ----------------------------------------------------------------------
def gtopk(grads, density, shapes):
    """Binary tree of pairwise merges toward worker 0; values then summed from every
    worker's own local selections on the final set (our Decision, docs/methods.md)."""
    P, n = len(grads[0]), grads[0][0].size
    k = min(k_of(density, n), n)
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []
    for step_grads in grads:
        accs = [g + e for g, e in zip(step_grads, residuals)]
        local = [top_magnitudes(acc, k, 0, n) for acc in accs]
        held = [{i: acc[i] for i in chosen} for acc, chosen in zip(accs, local)]
        stride = 1
        while stride < P:
            for receiver in range(0, P, 2 * stride):
                sender = receiver + stride
                if sender < P:
                    merged = dict(held[receiver])
                    for i, value in held[sender].items():
                        merged[i] = np.float32(merged[i] + value) if i in merged else value
                    best = sorted(merged, key=lambda i: (-abs(float(merged[i])), i))[:k]
                    held[receiver] = {i: merged[i] for i in best}
                    held[sender] = {}
            stride *= 2
        final = sorted(held[0])
        aggregate = np.zeros(n, np.float32)
        for i in final:
            total = np.float32(0)
            for acc, chosen in zip(accs, local):
                total = np.float32(total + (acc[i] if i in chosen else np.float32(0)))
            aggregate[i] = total / np.float32(P)
        for acc, chosen in zip(accs, local):
            acc[[i for i in chosen if i in final]] = 0
        residuals = accs
        records.append(_record(aggregate, residuals, counts=[k] * P, nnz=len(final)))
    return records


# -- momentum correction (DGC, gs-SGD): u = m u + g, v = v + u --------------------
def _velocities(momentum, velocities):
    return {"velocities": [u.copy() for u in velocities]} if momentum else {}


def _clipped(g, clip_norm, P):
    if clip_norm is None:
        return g
    norm = math.sqrt(math.fsum(float(x) * float(x) for x in g))
    coefficient = clip_norm / math.sqrt(P) / (norm + 1e-6)
    return g * np.float32(coefficient) if coefficient < 1 else g


def nesterov_accumulate(velocities, residuals, grads, momentum):
    """Nesterov momentum correction as the core keeps it: ``u = m u + g``, ``acc =
    v + (m u + g)``.  Returns (velocities, accs)."""
    m = np.float32(momentum)
    velocities = [m * u + g for u, g in zip(velocities, grads)]
    return velocities, [v + (m * u + g) for v, u, g in zip(residuals, velocities, grads)]


def released_nesterov_accumulate(momentums, residuals, grads, momentum):
    """The released DGC memory's Nesterov form, line for line: ``mmt = (mmt + g) m``,
    ``v = v + mmt + g`` (``mmt = m u``: the same in exact arithmetic)."""
    momentums = [(mmt + g) * np.float32(momentum) for mmt, g in zip(momentums, grads)]
    return momentums, [(v + mmt) + g for v, mmt, g in zip(residuals, momentums, grads)]


def warmup_density(t, density, warmup_steps, warmup_densities):
    """DGC's sparsity warm-up: the stage's density for the first steps, never below ``density``."""
    if warmup_steps and t < warmup_steps * len(warmup_densities):
        return max(density, warmup_densities[t // warmup_steps])
    return density


def dgc_model(grads, density, shapes, momentum=0.9, sample_ratio=0.01, overshoot=1.3,
              clip_norm=None, warmup_steps=0, warmup_densities=(0.25, 0.0625, 0.015625, 0.004),
              seed=0, nesterov=False):
    P, n = len(grads[0]), grads[0][0].size
    velocities = [np.zeros(n, np.float32) for _ in range(P)]
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []
    for t, step_grads in enumerate(grads):
        d = warmup_density(t, density, warmup_steps, warmup_densities)
        k = max(1, math.floor(d * n))
        clipped = [_clipped(g, clip_norm, P) for g in step_grads]
        if nesterov:
            velocities, accs = nesterov_accumulate(velocities, residuals, clipped, momentum)
        else:
            velocities = [np.float32(momentum) * u + g for u, g in zip(velocities, clipped)]
            accs = [v + u for v, u in zip(residuals, velocities)]
        selections, thresholds = [], []
        for r, acc in enumerate(accs):
            samples = min(n, max(1, math.ceil(sample_ratio * n)))
            positions = np.random.default_rng([seed, t, r]).integers(0, n, samples)
            sampled = sorted((abs(float(acc[i])) for i in positions), reverse=True)
            thr = sampled[max(1, math.ceil(d * samples)) - 1]
            chosen = [i for i in range(n) if abs(float(acc[i])) >= thr]
            if len(chosen) > overshoot * k:
                chosen = sorted(sorted(chosen, key=lambda i: (-abs(float(acc[i])), i))[:k])
            selections.append(chosen)
            thresholds.append(thr)
        aggregate = np.zeros(n, np.float32)
        for acc, chosen in zip(accs, selections):
            for i in chosen:
                aggregate[i] = np.float32(aggregate[i] + acc[i] / np.float32(P))
        for acc, u, chosen in zip(accs, velocities, selections):
            acc[chosen] = 0
            u[chosen] = 0
        residuals = accs
        nnz = len(set(i for s in selections for i in s))
        records.append(_record(aggregate, residuals, counts=[len(s) for s in selections], nnz=nnz,
                               thresholds=thresholds, **_velocities(momentum, velocities)))
    return records


def dgc_sampling(numel, d, sample_ratio):
    """The released DGC compressor's ``initialize``, line for line: (elements to
    select, samples, sample rank of the threshold, stride)."""
    sample_ratio = min(max(sample_ratio, 0.01), 1.0)
    if sample_ratio < 1.0:
        pct_numel = int(math.ceil(numel * sample_ratio))
        cpr_numel = int(math.ceil(2 / d))
        if numel <= cpr_numel:
            sample_stride, num_samples = 1, numel
        else:
            sample_stride = int(math.ceil(numel / max(pct_numel, cpr_numel) / 32)) * 32 + 1
            num_samples = numel // sample_stride
            while num_samples < max(pct_numel, cpr_numel):
                sample_stride = sample_stride - 8
                num_samples = numel // sample_stride
    else:
        sample_stride, num_samples = 1, numel
    return (int(math.ceil(numel * d)), num_samples, int(math.ceil(num_samples * d)),
            sample_stride)


def dgc_paper(grads, density, shapes, momentum=0.9, sample_ratio=0.01, overshoot=1.3,
              warmup_steps=0, warmup_densities=(0.25, 0.0625, 0.015625, 0.004), seed=0,
              nesterov=False):
    """``dgc(variant="paper")``: the released compressor per tensor of more than one
    dimension; 1-D tensors averaged densely (each rank sends its velocity ``u``,
    Nesterov ``m u + g``: by linearity the released code's momentum applied
    to the average).  The
    aggregate is in model order; residuals and velocities hold the compressed
    tensors only."""
    P = len(grads[0])
    bounds, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        bounds.append((offset, offset + size, len(shape) > 1))
        offset += size
    compressed = [(a, b) for a, b, many in bounds if many]
    dense = [(a, b) for a, b, many in bounds if not many]
    n_sparse = sum(b - a for a, b in compressed)
    n_dense = sum(b - a for a, b in dense)
    velocities = [np.zeros(n_sparse, np.float32) for _ in range(P)]
    dense_velocities = [np.zeros(n_dense, np.float32) for _ in range(P)]
    residuals = [np.zeros(n_sparse, np.float32) for _ in range(P)]
    records = []
    for t, step_grads in enumerate(grads):
        d = warmup_density(t, density, warmup_steps, warmup_densities)
        sparse_grads = [np.concatenate([g[a:b] for a, b in compressed]) for g in step_grads]
        dense_grads = [np.concatenate([g[a:b] for a, b in dense] or [np.zeros(0, np.float32)])
                       for g in step_grads]
        if momentum:
            dense_velocities = [np.float32(momentum) * u + g
                                for u, g in zip(dense_velocities, dense_grads)]
            sent_dense = dense_velocities
            if nesterov:
                velocities, accs = nesterov_accumulate(velocities, residuals, sparse_grads,
                                                       momentum)
                sent_dense = [np.float32(momentum) * u + g
                              for u, g in zip(dense_velocities, dense_grads)]
            else:
                velocities = [np.float32(momentum) * u + g
                              for u, g in zip(velocities, sparse_grads)]
                accs = [v + u for v, u in zip(residuals, velocities)]
        else:
            accs = [v + g for v, g in zip(residuals, sparse_grads)]
            sent_dense = dense_grads
        selections = []
        for r, acc in enumerate(accs):
            chosen, start = [], 0
            for position, (a, b) in enumerate(compressed):
                numel = b - a
                k, num_samples, k_samples, stride = dgc_sampling(numel, d, sample_ratio)
                tensor = [abs(float(acc[start + i])) for i in range(numel)]
                if num_samples == numel:
                    samples = tensor
                else:
                    first = int(np.random.default_rng([seed, t, r, position]).integers(0, stride))
                    samples = tensor[first::stride]
                threshold = np.float32(sorted(samples, reverse=True)[k_samples - 1])
                picked = [i for i in range(numel) if tensor[i] >= threshold]
                if numel > num_samples:
                    for _ in range(10):
                        if len(picked) > k:
                            if len(picked) > k * overshoot:
                                picked = sorted(sorted(picked, key=lambda i: (-tensor[i], i))[:k])
                            break
                        if len(picked) < 0.8 * k:
                            threshold = np.float32(threshold * np.float32(0.8))
                        else:
                            break
                        picked = [i for i in range(numel) if tensor[i] >= threshold]
                chosen += [start + i for i in picked[:k]]
                start += numel
            selections.append(chosen)
        sparse_aggregate = np.zeros(n_sparse, np.float32)
        for acc, chosen in zip(accs, selections):
            for i in chosen:
                sparse_aggregate[i] = np.float32(sparse_aggregate[i] + acc[i] / np.float32(P))
        total = sent_dense[0].copy()
        for u in sent_dense[1:]:
            total = total + u
        dense_aggregate = total / np.float32(P)
        aggregate = np.zeros(offset, np.float32)
        for part, runs in ((sparse_aggregate, compressed), (dense_aggregate, dense)):
            start = 0
            for a, b in runs:
                aggregate[a:b] = part[start:start + b - a]
                start += b - a
        for r, chosen in enumerate(selections):
            accs[r][chosen] = 0
            if momentum:
                velocities[r][chosen] = 0
        residuals = accs
        nnz = len(set(i for chosen in selections for i in chosen))
        records.append(_record(aggregate, residuals, counts=[len(c) for c in selections],
                               nnz=nnz, **_velocities(momentum, velocities)))
    return records


def gssgd(grads, density, shapes, rows=None, columns=None, candidates=4, momentum=0.9, seed=0,
          merge="allreduce"):
    P, n = len(grads[0]), grads[0][0].size
    k = min(k_of(density, n), n)
    rows = rows if rows is not None else max(3, math.ceil(math.log2(n) / 4))
    C = columns if columns is not None else 4 * k
    prime = 2 ** 31 - 1
    coefficients = np.random.default_rng(seed).integers(1, prime, size=(rows, 6)).tolist()
    bucket = [[((a * i + b) % prime) * C // 2 ** 31 for i in range(n)]
              for a, b, *_ in coefficients]
    sign = [[-1 if (c * i ** 3 + d * i ** 2 + e * i + f) % prime % 2 else 1 for i in range(n)]
            for _, _, c, d, e, f in coefficients]
    velocities = [np.zeros(n, np.float32) for _ in range(P)]
    residuals = [np.zeros(n, np.float32) for _ in range(P)]
    records = []
    for step_grads in grads:
        velocities = [np.float32(momentum) * u + g for u, g in zip(velocities, step_grads)]
        accs = [v + u for v, u in zip(residuals, velocities)]
        sketches = []
        for acc in accs:
            sketch = np.zeros((rows, C), np.float32)
            for r in range(rows):
                for i in range(n):
                    sketch[r, bucket[r][i]] = np.float32(sketch[r, bucket[r][i]] + sign[r][i] * acc[i])
            sketches.append(sketch)
        table = sum_sketches(sketches, merge)
        top = float(np.abs(table).max())
        rungs = [0.0] + sorted(math.ldexp(top * (1 - f / 16), -o) for o in range(40) for f in range(8))
        shares = even_partitions(n, P)
        estimates = {}
        for start, stop in shares:
            for i in range(start, stop):
                row_values = sorted(np.float32(sign[r][i] * table[r, bucket[r][i]]) for r in range(rows))
                estimates[i] = row_values[(rows - 1) // 2]
        magnitudes = np.abs(np.array(list(estimates.values()), np.float32))
        totals = [int(np.count_nonzero(magnitudes >= np.float32(rung))) for rung in rungs]
        chosen = max([j for j, total in enumerate(totals) if total >= candidates * k], default=0)
        rung = np.float32(rungs[chosen])
        per_worker = [[i for i in range(start, stop) if abs(estimates[i]) >= rung]
                      for start, stop in shares]
        pool = [i for share in per_worker for i in share]
        exact = {}
        for i in pool:
            total = np.float32(0)
            for acc in accs:
                total = np.float32(total + acc[i])
            exact[i] = total
        selected = sorted(sorted(pool, key=lambda i: (-abs(float(exact[i])), i))[:k])
        aggregate = np.zeros(n, np.float32)
        for i in selected:
            aggregate[i] = exact[i] / np.float32(P)
        for acc, u in zip(accs, velocities):
            acc[selected] = 0
            u[selected] = 0
        residuals = accs
        records.append(_record(aggregate, residuals, counts=[len(s) for s in per_worker],
                               nnz=len(selected), threshold=rungs[chosen],
                               **_velocities(momentum, velocities)))
    return records


def sum_sketches(sketches, merge):
    """The ranks' summed sketch: in rank order (allreduce), or pairwise over a
    tree (rank r adds rank r XOR 2^j's partial sum in round j), then checked
    to be the same on every rank."""
    if merge == "allreduce":
        return sum(sketches[1:], sketches[0])
    partial = list(sketches)
    distance = 1
    while distance < len(partial):
        partial = [partial[r] + partial[r ^ distance] for r in range(len(partial))]
        distance *= 2
    assert all(np.array_equal(table, partial[0]) for table in partial)
    return partial[0]


def micro(grads, density, shapes, threshold_control="adaptive", initial_threshold="estimate",
          allgather="exact"):
    """MiCRO (``allgather="padded"`` changes the traffic only, not what arrives)."""
    return exclusive(grads, density, control=threshold_control, initial=initial_threshold)


def exdyna(grads, density, shapes, threshold_control="adaptive", rebalance="proportional",
           blocks=1024, initial_threshold="estimate", allgather="exact"):
    return exclusive(grads, density, control=threshold_control, rebalance=rebalance,
                     initial=initial_threshold, blocks=blocks)


def dgc(grads, density, shapes, variant="model", **options):
    """DGC over the whole model, or per tensor as the released code (``"paper"``)."""
    return (dgc_paper if variant == "paper" else dgc_model)(grads, density, shapes, **options)


REFERENCES = {"topk": topk, "micro": micro, "exdyna": exdyna, "deft": deft, "gtopk": gtopk,
              "randomk": randomk, "threshold": hard_threshold, "dgc": dgc, "cltk": cltk,
              "gssgd": gssgd}


def run(method, grads, density, shapes, **options):
    """The reference of ``method``, called with the core's own keyword arguments;
    ``shapes``: the model's tensor shapes, in the flat vector's order (every
    reference takes them; DEFT and DGC's paper variant read them)."""
    return REFERENCES[method](grads, density, shapes, **options)


# -- gossip (Crossover-SGD, SGP) ---------------------------------------------------
def draw_derangement(seed, step, segment, members):
    rng = np.random.default_rng([seed, step, segment])
    while True:
        perm = [int(j) for j in rng.permutation(members)]
        if all(perm[i] != i for i in range(members)):
            return perm


def draw_roulette_derangement(seed, step, segment, members):
    """The authors' Crossover-SGD sampler: member ``i`` in turn picks whom it hears
    from among the members that are neither itself nor taken (``G - 2`` takes
    ``G - 1`` if nobody has); returned as whom each member sends to."""
    rng = np.random.default_rng([seed, step, segment])
    heard = []
    for i in range(members):
        if i == members - 2 and members - 1 not in heard:
            heard.append(members - 1)
        else:
            free = [j for j in range(members) if j != i and j not in heard]
            heard.append(free[int(rng.integers(len(free)))])
    return [heard.index(sender) for sender in range(members)]


def crossover(params, grads, lr, seed, segments, groups=None, topology="uniform"):
    """Every rank's flat parameters after each step.

    ``params[r]`` initial flat vectors, ``grads[t][r]`` flat gradients,
    ``segments`` a list of (start, stop) runs of the flat vector; ``groups``
    ``None`` (flat) or the number of contiguous groups (hierarchical)."""
    P = len(params)
    G = P if groups is None else groups
    per = P // G
    x = [p.copy() for p in params]
    history = []
    for t, step_grads in enumerate(grads):
        leaders = []
        for g in range(G):
            members = range(g * per, (g + 1) * per)
            mean = step_grads[g * per].copy()
            for r in list(members)[1:]:
                mean = mean + step_grads[r]
            mean = mean / np.float32(per)
            leaders.append(x[g * per] - np.float32(lr) * mean)
        if G >= 2:
            mixed = [leader.copy() for leader in leaders]
            for s, (start, stop) in enumerate(segments):
                draw = draw_roulette_derangement if topology == "paper" else draw_derangement
                perm = draw(seed, t, s, G)
                for sender in range(G):
                    receiver = perm[sender]
                    mixed[receiver][start:stop] = (np.float32(0.5) * leaders[receiver][start:stop]
                                                   + np.float32(0.5) * leaders[sender][start:stop])
            leaders = mixed
        x = [leaders[r // per].copy() for r in range(P)]
        history.append([v.copy() for v in x])
    return history


def sgp_one_peer(params, grads, lr):
    """One peer a step: +1, -1, +2, -2, +4, ... (mod P, repeats skipped), in turn;
    each rank averages its model with the one it hears."""
    P = len(params)
    offsets = []
    for i in range(P):
        if 2 ** i > P - 1:
            break
        for d in (2 ** i, -(2 ** i)):
            if all((d - e) % P for e in offsets):
                offsets.append(d)
    x = [p.copy() for p in params]
    history = []
    for t, step_grads in enumerate(grads):
        x = [v - np.float32(lr) * g for v, g in zip(x, step_grads)]
        d = offsets[t % len(offsets)]
        x = [(x[r] + x[(r - d) % P]) / np.float32(2) for r in range(P)]
        history.append([v.copy() for v in x])
    return history


def sgp(params, grads, lr):
    P = len(params)
    exponent = 0
    while 3 ** (exponent + 1) <= P - 1:
        exponent += 1
    x = [p.copy() for p in params]
    history = []
    for t, step_grads in enumerate(grads):
        x = [v - np.float32(lr) * g for v, g in zip(x, step_grads)]
        i = t % (exponent + 1)
        d1, d2 = 3 ** i % P, 2 * 3 ** i % P
        x = [((x[r] + x[(r - d1) % P]) + x[(r - d2) % P]) / np.float32(3) for r in range(P)]
        history.append([v.copy() for v in x])
    return history
