"""bench/auto_gamma_replay.py's arithmetic: acceptance runs rebuilt from recorded rounds,
fixed γ and the oracles replayed by hand (no model: the recorded rounds are made up)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import auto_gamma_replay as replay  # noqa: E402

# D(k) = k ms, V(n) = 10 + n ms, a plain step 10 ms
COSTS = {"draft_s": [k * 1e-3 for k in range(1, 11)],
         "verify_s": [(10 + n) * 1e-3 for n in range(1, 12)], "plain_s": 10e-3}


def test_marks_from_two_recorded_runs():
    # the outputs' truth: 1 1 0 1 1 1 0 1 0 (1: the draft predicts the position)
    # γ 3: kept 2 of 3 (0, 1; 2 not), kept 3 of 3 (3-5; 6 untold), kept 1 (7; 8 not)
    run_3 = {"requests": [{"id": "r", "rounds": [(3, 2), (3, 3), (3, 1)]}]}
    # γ 2: kept 2 of 2 (0, 1; 2 untold), 2 of 2 (3, 4; 5 untold), 0 (6 not), 1 (7; 8 not)
    run_2 = {"requests": [{"id": "r", "rounds": [(2, 2), (2, 2), (2, 0), (2, 1)]}]}
    assert replay.predicted(run_3, run_2)["r"] == [1, 1, 0, 1, 1, 1, 0, 1, 0]
    # told by neither: taken as predicted (it followed a round that kept everything)
    run_1 = {"requests": [{"id": "r", "rounds": [(1, 1), (1, 1)]}]}
    assert replay.predicted(run_1, run_1)["r"] == [1, 1, 1, 1]


def test_fixed_gamma_and_the_oracles_by_hand():
    marks = {"s#demo-a": [1, 1, 0, 1, 0, 0]}
    r = replay.Replay(marks, ["s#demo-a"], COSTS)
    # γ 2: t=0 keeps 2 (D(2) 2 + V(3) 13 = 15 ms), t=3 keeps 1 (15 ms),
    # t=5 has no budget: a plain step (10 ms). 6 tokens: 60 ms plain over 40 ms
    assert r.fixed(2)[0] == pytest.approx(60 / 40, abs=1e-4)
    # γ 1: t=0 keeps 1 (1 + 12 = 13), t=2 keeps 0 (13), t=3 keeps 1 (13), t=5 plain (10)
    assert r.fixed(1)[0] == pytest.approx(60 / 49, abs=1e-4)
    # the per-round oracle drafts 2 at t=0, 1 at t=3 and nothing where nothing is kept
    assert r.best_per_round(10) == pytest.approx(60 / 38, abs=1e-4)
    fixed = [r.fixed(g)[0] for g in range(1, 11)]
    assert r.best_per_request() == pytest.approx(max(fixed + [1.0]), abs=1e-4)
    assert r.best_per_round(10) >= r.best_per_request() >= max(fixed)
    assert r.best_per_round(10) >= r.auto(10)[0]


def test_speedup_per_kind_sums_to_the_whole():
    marks = {"s#demo-a": [1, 1, 1, 0], "s#chat-b": [0, 0, 1, 0, 0]}
    r = replay.Replay(marks, ["s#demo-a", "s#chat-b"], COSTS)
    total, kinds = r.fixed(3)
    assert set(kinds) == {"demo", "chat"}
    assert min(kinds.values()) <= total <= max(kinds.values())


def test_model_gamma_is_eq1_at_the_sets_own_round_rates():
    # every position predicted but every 4th: rounds of γ 10 from t = 0 keep 3 and stop
    # (the 4th is not predicted), so at the set's rates h_1..h_3 = 1 and h_4 = 0: three
    # proposals emit 4 tokens for D(3) + V(4) = 17 ms (0.235 a ms), more drafts emit
    # nothing more and cost more, fewer emit less (γ 2: 3 tokens for 15 ms, 0.2 a ms)
    marks = {"s#demo-a": [1, 1, 1, 0] * 6}
    r = replay.Replay(marks, ["s#demo-a"], COSTS)
    assert r.model_gamma(10) == 3
    assert r.fixed(3)[0] == max(r.fixed(g)[0] for g in range(1, 11))


def test_replay_from_a_recorded_json(tmp_path, capsys):
    run = {"requests": [{"id": "s#demo-a", "rounds": [(10, 3), (10, 3), (10, 3)]}]}
    recorded = {"costs": COSTS, "runs": {"mixed": {"10": run, "9": run}}}
    src, out = tmp_path / "rec.json", tmp_path / "again.json"
    src.write_text(replay.json.dumps(recorded))
    args = replay.argparse.Namespace(from_json=str(src), ceilings="7", json=str(out))
    replay.replay_recorded(args)
    again = replay.json.loads(out.read_text())["results"]["mixed"]
    assert again["model_gamma"] == 3 and again["positions"] == 12
    assert again["rows"]["γ=3"][0] == pytest.approx(120 / (3 * 17), abs=1e-4)
    assert "hindsight: γ 3" in capsys.readouterr().out


class _Half:
    """A stop rule by hand: draft on while S ≥ 0.5, verify the proposals with S ≥ 0.5."""

    def more(self, drafted, survival):
        return survival >= 0.5

    def keep(self, survivals):
        return sum(s >= 0.5 for s in survivals)


def test_confidences_their_calibration_and_a_chain_ended_by_them():
    # γ 3 from 0: kept 2 of 3 (confidences 0.9, 0.8 on the target's prefix, 0.2 in the
    # proposal it did not keep); from 3: kept 2 of 3 (0.95, 0.6; 0.1 not kept, then its own
    # continuation, none here); from 6: kept 1 of 1 (0.99; position 7 untold)
    run = {"requests": [{"id": "s#photo-a", "rounds": [
        (3, 2, [0.9, 0.8, 0.2]), (3, 2, [0.95, 0.6, 0.1]), (1, 1, [0.99])]}]}
    confs = replay.confidences(run)
    c, after = confs["s#photo-a"]
    assert c == [0.9, 0.8, 0.2, 0.95, 0.6, 0.1, 0.99, None]
    assert after == {2: [], 5: []}
    # recorded before confidences were kept: none
    assert replay.confidences({"requests": [{"id": "r", "rounds": [(3, 2)]}]}) == {}
    marks = replay.predicted(run, run)
    assert marks["s#photo-a"] == [1, 1, 0, 1, 1, 0, 1, 1]
    bins = {(r["from"], r["to"]): (r["proposals"], r["kept"])
            for r in replay.calibration(marks, confs)}
    assert bins[(0.0, 0.3)] == (2, 0) and bins[(0.5, 0.7)] == (1, 1)
    assert bins[(0.7, 0.9)] == (1, 1) and bins[(0.9, 0.99)] == (2, 2)
    r = replay.Replay(marks, ["s#photo-a"], COSTS, confs)
    # from 0 with k = 3 (the target keeps 2): S = 0.9, 0.72, then 0.144 at the budget;
    # two verified, three drafted, the third's confidence reported
    assert r.stopped("s#photo-a", 0, 3, 2, _Half()) == (2, 3, 0.2)
    # from 3 with k = 3: S = 0.95, 0.57, 0.057: the same
    assert r.stopped("s#photo-a", 3, 3, 2, _Half()) == (2, 3, 0.1)
    # a round verifying 2 of 3 drafted costs D(3) + V(3); none of 1 drafted, D(1) + a plain step
    assert r.cost(2, 3) == pytest.approx((3 + 13) * 1e-3)
    assert r.cost(0, 1) == pytest.approx((1 + 10) * 1e-3)
    # the shipped policy with the stop replays without error and no faster than the oracle
    assert r.best_per_round(10) >= r.auto(10, stop=True)[0] > 0
