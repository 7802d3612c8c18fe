"""ADT-Tree's shape policy (Eq. 2) on scripted acceptance sequences, static tree shapes,
and LANTERN's relaxed acceptance -- no models."""

from __future__ import annotations

import pytest
import torch

from vlmspec_cli.runtime.round.tree_growth import expand_tree
from vlmspec_cli.runtime.round.tree_shape import (AdjacencyAdaptive, AdtBounds, FixedShape, RoundLog,
                                            TreeRound)
from vlmspec_cli.runtime.round.verify import Relaxation, SamplingParams, verify_tree

COLS = 4


def _play(policy, accepted_script, positions=16):
    """Run the policy over a token grid: each round drafts at the next free position and
    gets ``accepted_script(depth, top_k, position)`` tokens accepted. Returns the rounds."""
    log, pos = RoundLog(), 0
    gen = torch.Generator().manual_seed(0)
    while pos < positions:
        d, k = policy.choose(log, pos, gen)
        acc = min(accepted_script(d, k, pos), d, positions - pos - 1)
        log.add(TreeRound(pos, d, k, acc))
        pos += acc + 1
    return log


def test_eq2_positive_and_negative_steps_and_bounds():
    a = AdjacencyAdaptive(COLS, beta=1.0, step_depth=1, step_top_k=3,
                          bounds=AdtBounds(1, 6, 2, 11), depth=3, top_k=5)
    # α = accepted / depth >= β: deeper by l_d, narrower by l_k
    assert a.adapt(3, 5, 1.0) == (4, 2)
    # α < β: shallower and wider
    assert a.adapt(3, 5, 0.66) == (2, 8)
    # clamped to [d_min, d_max] x [k_min, k_max]
    assert a.adapt(6, 2, 1.0) == (6, 2)
    assert a.adapt(1, 11, 0.0) == (1, 11)
    assert a.adapt(1, 10, 0.0) == (1, 11)
    # a start outside the bounds is clamped too
    assert AdjacencyAdaptive(COLS, bounds=AdtBounds(2, 4, 3, 5), depth=9, top_k=1).start == (4, 3)


def test_horizontal_init_follows_the_left_neighbour_then_eq2():
    """Scripted: every tree is fully accepted in the left half of each row and nothing is
    accepted in the right half. Check every round's (d, k) against Eq. 2 applied to the
    tree that produced the token to the left (above, at column 0)."""
    cols = 8
    a = AdjacencyAdaptive(cols, beta=1.0, step_depth=1, step_top_k=2,
                          bounds=AdtBounds(1, 5, 1, 9), depth=2, top_k=3)
    log = _play(a, lambda d, k, pos: d if pos % cols < cols // 2 else 0, positions=48)
    assert log.rounds[0].depth == 2 and log.rounds[0].top_k == 3
    for r in log.rounds[1:]:
        i, j = divmod(r.position, cols)
        ref_pos = r.position - 1 if j > 0 else r.position - cols
        ref = log.rounds[max(n for n, q in enumerate(log.rounds)
                             if q.position <= ref_pos <= q.position + q.accepted)]
        expect_d = ref.depth + 1 if ref.alpha >= 1.0 else ref.depth - 1
        expect_k = ref.top_k - 2 if ref.alpha >= 1.0 else ref.top_k + 2
        assert (r.depth, r.top_k) == (min(max(expect_d, 1), 5), min(max(expect_k, 1), 9))
        assert 1 <= r.depth <= 5 and 1 <= r.top_k <= 9
    # deep and narrow where the draft is right, shallow and wide where it is not
    left = [r for r in log.rounds if r.position % cols < cols // 2]
    right = [r for r in log.rounds if r.position % cols >= cols // 2]
    assert max(r.depth for r in left) == 5 and min(r.top_k for r in left) == 1
    # four rejected rounds per row widen the tree from 1 by l_k each: 3, 5, 7
    assert min(r.depth for r in right) == 1 and max(r.top_k for r in right) == 7


def test_vertical_init_reads_the_row_above():
    a = AdjacencyAdaptive(COLS, init="vertical", beta=0.5, depth=2, top_k=4,
                          bounds=AdtBounds(1, 8, 1, 10))
    log = RoundLog()
    log.add(TreeRound(0, 3, 4, 3))        # produced positions 0..3 (the whole first row)
    log.add(TreeRound(4, 2, 6, 0))        # position 4
    # position 5 = (1, 1): above is position 1, made by round 0 (α = 1 ≥ 0.5)
    assert a.neighbour(log, 5) is log.rounds[0]
    assert a.choose(log, 5, None) == (4, 2)
    # first row: no row above, falls back to the left neighbour
    assert a.neighbour(log, 1) is log.rounds[0]
    h = AdjacencyAdaptive(COLS, init="horizontal", beta=0.5, depth=2, top_k=4)
    assert h.neighbour(log, 5) is log.rounds[1]          # left of (1,1) is position 4
    assert h.choose(log, 5, None) == (1, 8)              # α = 0 < 0.5: shallower, wider
    assert h.choose(RoundLog(), 0, None) == (2, 4)       # no neighbour: the start shape


def test_random_init_stays_in_bounds_and_is_seeded():
    a = AdjacencyAdaptive(COLS, init="random", bounds=AdtBounds(2, 5, 3, 7))
    runs = []
    for _ in range(2):
        log = _play(a, lambda d, k, pos: pos % 3, positions=40)
        assert all(2 <= r.depth <= 5 and 3 <= r.top_k <= 7 for r in log.rounds)
        runs.append([(r.depth, r.top_k) for r in log.rounds])
    assert runs[0] == runs[1] and len(set(runs[0])) > 2
    with pytest.raises(ValueError, match="init"):
        AdjacencyAdaptive(COLS, init="diagonal")


def test_round_log_summary_is_the_depth_matrix():
    log = RoundLog()
    for r in (TreeRound(0, 4, 2, 3), TreeRound(4, 2, 4, 0), TreeRound(5, 3, 3, 1)):
        log.add(r)
    s = log.summary(8)
    assert s["accept_lengths"] == [4, 4, 4, 4, 1, 2, 2, 1]   # last token: no round yet
    assert s["mean_depth"] == 3.0 and s["depths"] == [4, 2, 3] and s["top_ks"] == [2, 4, 3]
    assert FixedShape(5, 4).choose(log, 3, None) == (5, 4)


def _fake_step(vocab=6):
    def step(tree, nodes):
        # each node prefers token (its token + 1) % vocab, then the rest
        rows = []
        for n in nodes:
            row = torch.full((vocab,), -2.0)
            row[(tree.tokens[n] + 1) % vocab] = 2.0
            row[(tree.tokens[n] + 2) % vocab] = 1.0
            rows.append(row)
        return torch.stack(rows)
    return step


@pytest.mark.parametrize("greedy", [True, False])
def test_static_tree_is_a_spine_with_alternatives(greedy):
    params = SamplingParams(0.0 if greedy else 1.0)
    root = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    gen = torch.Generator().manual_seed(1)
    tree = expand_tree(root, _fake_step(), 4, 3, 100, params, gen, static=True)
    assert len(tree) == 12 and tree.depth == [d for d in range(4) for _ in range(3)]
    for level in range(1, 4):   # every level hangs under the previous level's first node
        assert {tree.parents[i] for i in range(3 * level, 3 * level + 3)} == {3 * (level - 1)}


def test_relaxed_acceptance_adds_neighbour_mass_up_to_delta():
    # code 0's neighbours, nearest first: 1, 2, 3
    neighbours = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 1, 0]])
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    assert Relaxation(neighbours, 0.25).raised(p, 0) == pytest.approx(0.3)   # + p1 only
    assert Relaxation(neighbours, 0.5).raised(p, 0) == pytest.approx(0.6)    # + p1 + p2
    assert Relaxation(neighbours, 0.0).raised(p, 0) == pytest.approx(0.1)
    # greedy: the target wants code 3 (p=0.4); a child with code 2 is accepted only when
    # its neighbourhood holds as much mass (0.3 + p1 0.2 ≥ 0.4 at δ = 0.2)
    from vlmspec_cli.runtime.round.tree import DraftTree

    tree = DraftTree([2], [-1], [0])
    root = torch.log(p)
    nodes = torch.zeros(1, 4)
    assert verify_tree(tree, root, nodes, SamplingParams(0.0), None) == ([], 3)
    assert verify_tree(tree, root, nodes, SamplingParams(0.0), None,
                       Relaxation(neighbours, 0.2)) == ([0], 0)
    assert verify_tree(tree, root, nodes, SamplingParams(0.0), None,
                       Relaxation(neighbours, 0.1)) == ([], 3)


def test_relaxed_sampling_accepts_more_often():
    neighbours = torch.tensor([[1], [0], [3], [2]])
    p_logits = torch.log(torch.tensor([0.05, 0.45, 0.25, 0.25]))
    q = torch.tensor([0.9, 0.0, 0.05, 0.05])
    from vlmspec_cli.runtime.round.tree import DraftTree

    counts = {"exact": 0, "relaxed": 0}
    for name, relax in (("exact", None), ("relaxed", Relaxation(neighbours, 0.5))):
        gen = torch.Generator().manual_seed(0)
        for _ in range(2000):
            tree = DraftTree([0], [-1], [0], {-1: q})
            path, _ = verify_tree(tree, p_logits, torch.zeros(1, 4), SamplingParams(1.0), gen, relax)
            counts[name] += len(path)
    # exact: P(accept) = 0.05/0.9 ≈ 0.056; relaxed: (0.05 + 0.45)/0.9 ≈ 0.556
    assert abs(counts["exact"] / 2000 - 0.056) < 0.02
    assert abs(counts["relaxed"] / 2000 - 0.556) < 0.04
