"""Auto draft length against every fixed γ, replayed without the machine's noise (issue 34).

bench/auto_gamma.py times the CLI: on the 2-core CPU two runs of one configuration differ
by 3-8%, more than the policies differ. This script takes the timing noise out, to say
whether the auto policy itself chooses well:

1. **Record** (each in its own process, the CLI users run): the set decoded at fixed γ 10
   and at γ 9, every round's (proposals, kept) read where the engine commits it. At T = 0
   a round from output position t keeps the proposals up to the first position where the
   draft's greedy token differs from the target's, so these give, for every output
   position t, whether the draft predicts it given the target's own prefix (m_t); the
   round starting at t then keeps a(t) = the run of predicted positions from t, whatever γ
   chose it. (The position after a round that kept all its proposals is not told; the
   other run tells it, else it is taken as predicted.)
2. **Costs**: the first set decoded once more with ``drafting.length=auto``, each round's
   k drawn at random from 1..10 (the policy's choice replaced), so that this process's
   own round timing (``RoundCosts``) sees every size; its lines D(k) and V(n) and the plain
   step V(1) at the end are the replay's costs.
3. **Replay** each set: fixed γ 1..10, ``AutoGamma`` with each ceiling (the shipped class,
   its costs told the lines' times, its choices made on the acceptance it saw), the best
   fixed γ per request (an oracle that knows each request's outputs), and the best k per
   round (an oracle that knows a(t): no policy can beat it), and the fixed γ Eq. 1' picks
   at the set's own pooled rates (known only in hindsight: how close choosing by the cost
   model comes to the best fixed γ, with no request's rates to learn). Speedup = the plain
   steps' time over the rounds' (decoding only: the prefills are the same for every policy).

Sets: ``mixed`` (bench/auto_gamma.py's: the demo's scenes, crops of real photos, the
first chats of examples/mmspec), ``other`` (other crops, the other chats, the scenes
asked another question, another order) and ``demo`` (the demo's six scenes alone, asked the
default profile's prompt).

    python bench/auto_gamma_replay.py [--photos-from DIR] [--ceilings 7,8,10] [--json OUT]
                                      [--profile NAME] [--set KEY=VALUE ...] [--competitors N]
    python bench/auto_gamma_replay.py --from RECORDED.json [--ceilings 7,8,10] [--json OUT]

(``--profile`` / ``--set`` choose the pair and the method replayed: a chain's rounds keep
the run of predicted positions; a tree's do not follow that rule, so replay chains.
``--competitors N``: step 2 runs beside N CPU-bound processes, so the replay prices rounds
as a busy machine does; what the draft predicts does not depend on the load. ``--from``:
step 3 alone, on the rounds and costs an earlier run's ``--json`` recorded.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_K = 16        # the longest round priced (costs recorded over 1..10 are extended as lines)
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


# -- 1, 2: record (run in a child process: ``--record OUT -- CLI ARGS``) -------------------
class ConfidenceRecorder:
    """A draft_stop.ChainStop that never stops a chain and keeps the draft's confidence in
    each proposal (c_j = S_j / S_{j-1}): what the replay's confidence stop reads."""

    def __init__(self) -> None:
        self.last: list[float] = []

    def more(self, drafted: int, survival: float) -> bool:
        return True

    def keep(self, survivals: list[float]) -> int:
        self.last = [s / (survivals[i - 1] if i else 1.0) for i, s in enumerate(survivals)]
        return len(survivals)


def record(out: str, cli_args: list[str], random_k: bool) -> None:
    from vlmspec_cli.drafters.chain import ChainDrafter
    from vlmspec_cli.runtime.length import draft_length, engine

    rounds: dict[int, tuple[object, list]] = {}
    commit = engine.commit
    recorder = ConfidenceRecorder()

    def counted(state, verdict, drafter, eos_ids, drops=None):
        seen = rounds.setdefault(id(state), (state, []))[1]
        seen.append((verdict.drafted, len(verdict.accepted), recorder.last))
        recorder.last = []
        return commit(state, verdict, drafter, eos_ids, drops)

    engine.commit = counted
    propose_rows = ChainDrafter.propose_rows

    def confident(self, states, budgets):   # a fixed γ's chain, its confidences kept
        if len(states) == 1 and states[0].draft_stop is None:
            states[0].draft_stop = recorder
        return propose_rows(self, states, budgets)

    ChainDrafter.propose_rows = confident
    policies = []
    init = draft_length.AutoGamma.__init__

    def kept(self, *a, **k):
        init(self, *a, **k)
        policies.append(self)

    draft_length.AutoGamma.__init__ = kept
    if random_k:   # every size, drafted whole (no confidence stop): the costs' lines
        rng = random.Random(1)
        draft_length.AutoGamma._decide = lambda self, ls, budget: rng.randint(1, budget)
        draft_length.AutoGamma.stop_rule = lambda self, state, k: None
    from vlmspec_cli.cli import cli

    try:
        cli(cli_args, standalone_mode=False)
    except SystemExit:
        pass
    requests = [{"id": st.request.request_id, "rounds": rs, "tokens": len(st.tokens)}
                for st, rs in rounds.values()]
    costs = None
    if policies:
        c = policies[-1].costs
        costs = {"draft_s": [c.draft_s(k) for k in range(1, MAX_K + 1)],
                 "verify_s": [c.verify_s(n) for n in range(1, MAX_K + 2)], "plain_s": c.plain_s()}
    Path(out).write_text(json.dumps({"requests": requests, "costs": costs}))


def run_record(out: Path, cli_args: list[str], random_k: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--record", str(out)] + (["--random-k"] if random_k else [])
    proc = subprocess.run(cmd + ["--"] + cli_args, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"recording failed: {' '.join(cli_args)}\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def predicted(run_a: dict, run_b: dict) -> dict[str, list[int]]:
    """Per request, m_t for each output position t (1: the draft predicts it)."""
    def marks(run):
        out = {}
        for r in run["requests"]:
            m = []
            for drafted, kept, *_ in r["rounds"]:
                m += [1] * kept + [0 if kept < drafted else None]
            out[r["id"]] = m
        return out
    a, b = marks(run_a), marks(run_b)
    told = lambda x, y: x if x is not None else (y if y is not None else 1)   # noqa: E731
    return {rid: [told(x, y) for x, y in zip(a[rid], b[rid])] for rid in a}


# -- 3: replay ----------------------------------------------------------------------------
def confidences(run: dict) -> dict[str, tuple[list, dict]]:
    """Per request, from a fixed-γ run whose rounds carry the draft's confidences: c[t], its
    confidence in the proposal for output position t on the target's own prefix (None: not
    told), and after[p], its confidences in the proposals it drafted past a proposal at p
    that the target did not keep (its own continuation: the same whichever round reached p,
    at T = 0)."""
    out = {}
    for r in run["requests"]:
        c: list = []
        after: dict[int, list[float]] = {}
        for drafted, kept, *rest in r["rounds"]:
            conf = rest[0] if rest else []
            if len(conf) < drafted:
                return {}                          # recorded before confidences were kept
            if kept < drafted:
                after[len(c) + kept] = conf[kept + 1:]
                c += conf[:kept + 1]
            else:
                c += conf[:kept] + [None]
        out[r["id"]] = (c, after)
    return out


BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 1.01)


def calibration(marks: dict[str, list[int]], confs: dict) -> list[dict]:
    """How often the target kept a proposal the draft made at each confidence: over every
    output position whose proposal on the target's own prefix was recorded, by bins of c."""
    rows = [{"from": lo, "to": min(hi, 1.0), "proposals": 0, "kept": 0}
            for lo, hi in zip(BINS, BINS[1:])]
    for rid, m in marks.items():
        for t, c in enumerate(confs.get(rid, ([], {}))[0]):
            if c is None or t >= len(m):
                continue
            row = next(r for r, hi in zip(rows, BINS[1:]) if c < hi)
            row["proposals"] += 1
            row["kept"] += m[t]
    return rows


def _extended(line: list[float], n: int) -> list[float]:
    line = list(line)
    while len(line) < n:
        line.append(2 * line[-1] - line[-2])
    return line


class Replay:
    def __init__(self, marks: dict[str, list[int]], order: list[str], costs: dict,
                 confs: dict | None = None) -> None:
        self.marks, self.order = marks, order
        self.draft = [0.0] + _extended(costs["draft_s"], MAX_K)
        self.verify = _extended(costs["verify_s"], MAX_K + 1)   # [n - 1]: n tokens fed
        self.plain = costs["plain_s"]
        self.confs = confs or {}

    def cost(self, k: int, levels: int | None = None) -> float:
        """A round verifying k proposals of ``levels`` drafted (default k); none: plain."""
        levels = k if levels is None else levels
        if levels == 0:
            return self.plain
        return self.draft[levels] + (self.verify[k] if k else self.plain)

    def confidence(self, rid: str, t: int, j: int, kept: int) -> float:
        """The draft's confidence in proposal j (1-based) of a round from t that keeps
        ``kept``: on the target's prefix through j = kept + 1, its own continuation after."""
        c, after = self.confs[rid]
        if j <= kept + 1:
            x = c[t + j - 1] if t + j - 1 < len(c) else None
            return 1.0 if x is None else x
        rest = after.get(t + kept, [])
        return rest[j - kept - 2] if j - kept - 2 < len(rest) else 0.0

    def stopped(self, rid: str, t: int, k: int, kept: int, rule) -> tuple[int, int, float | None]:
        """A chain of at most k from t ended by ``rule`` (a ChainStop): (proposals verified,
        positions drafted, the confidence in the first not verified or None)."""
        conf, survivals = [], []
        while True:
            conf.append(self.confidence(rid, t, len(conf) + 1, kept))
            survivals.append(conf[-1] * (survivals[-1] if survivals else 1.0))
            if len(conf) == k or not rule.more(len(conf), survivals[-1]):
                break
        chain = rule.keep(survivals)
        return chain, len(conf), conf[chain] if chain < len(conf) else None

    @staticmethod
    def kept(m: list[int], t: int, k: int) -> int:
        n = 0
        while n < k and t + n < len(m) and m[t + n] == 1:
            n += 1
        return n

    def speedup(self, choose_for, free_first: bool = False) -> tuple[float, dict[str, float]]:
        """choose_for(request id) → choose(t, budget) → k, observe(k, kept, verified,
        levels, dropped), and optionally cut(t, k, a) → (verified, levels, dropped): a
        chain of k from t, whose first a proposals the target would keep, ended early.
        ``free_first``: a request's first token is the prefill's, at no cost and asked of
        no one (the first round under drafting.length auto: round_policy.AutoLength.plan)."""
        kinds: dict[str, list[float]] = {}
        for rid in self.order:
            m, t, spent = self.marks[rid], int(free_first), 0.0
            choose, observe, *cut = choose_for(rid)
            while t < len(m):
                budget = len(m) - t - 1
                k = max(0, min(choose(t, budget), budget))
                a = self.kept(m, t, k)
                verified, levels, dropped = cut[0](t, k, a) if cut and k else (k, k, None)
                n = min(a, verified)
                spent += self.cost(verified, levels)
                observe(k, n, verified, levels, dropped)
                t += n + 1
            kind = kinds.setdefault(rid.rsplit("#", 1)[-1].split("-", 1)[0], [0.0, 0.0])
            kind[0] += len(m) * self.plain
            kind[1] += spent
        plain, spent = sum(v[0] for v in kinds.values()), sum(v[1] for v in kinds.values())
        return round(plain / spent, 4), {k: round(a / b, 4) for k, (a, b) in sorted(kinds.items())}

    def fixed(self, gamma: int):
        return self.speedup(lambda rid: (lambda t, b: min(gamma, b), lambda *seen: None))

    def auto(self, ceiling: int, stop: bool = False):
        """The shipped AutoGamma (one per process, as the engine's); ``stop``: its chains
        ended by the draft's recorded confidences (draft_stop.py), as the chain drafter
        does with ``state.draft_stop``."""
        from vlmspec_cli.runtime.length.draft_length import AutoGamma

        policy = AutoGamma(ceiling)

        def for_request(rid):
            # the request's length and tokens so far: where a new request's probe comes
            state = types.SimpleNamespace(length=None, draft_deferred=False, tokens=range(0),
                                          stats=types.SimpleNamespace(),
                                          request=types.SimpleNamespace(
                                              max_new_tokens=len(self.marks[rid])))
            policy.start(state)

            def observe(k, n, verified, levels, dropped):
                draft = self.draft[levels]
                policy.observe(state, k, levels=levels, fed=verified + 1, drafted=verified,
                               accepted=n, draft_s=draft,
                               verify_s=self.cost(verified, levels) - draft, dropped=dropped)

            def cut(t, k, a):
                rule = policy.stop_rule(state, k)
                return (k, k, None) if rule is None else self.stopped(rid, t, k, a, rule)
            def choose(t, b):
                state.tokens = range(t)
                return policy.choose(state, min(b, ceiling)) if b > 0 else 0
            return (choose, observe, cut) if stop else (choose, observe)
        return self.speedup(for_request, free_first=True)

    def model_gamma(self, ceiling: int) -> int:
        """The fixed γ that Eq. 1' picks, E(k) / C(k) at its largest over 1..ceiling, at
        this set's own acceptance (the rounds of γ = ceiling, every request pooled: known
        only in hindsight) and these costs: what a policy that knew the set's rates, and
        no request's, would fix."""
        from vlmspec_cli.runtime.length.acceptance import Acceptance, expected_tokens

        seen = Acceptance(1.0)
        for m in self.marks.values():
            t = 0
            while t < len(m):
                k = min(ceiling, len(m) - t - 1)
                n = self.kept(m, t, k)
                if k:
                    seen.observe(k, n)
                t += n + 1
        rates = [kept / max(risk, 1e-9) for kept, risk in zip(seen.kept, seen.risk)]
        return max(range(1, ceiling + 1), key=lambda k: expected_tokens(rates, k) / self.cost(k))

    def best_per_request(self) -> float:
        plain = spent = 0.0
        for rid in self.order:
            m = self.marks[rid]
            plain += len(m) * self.plain
            spent += min(self._fixed_time(m, g) for g in range(0, 11))
        return round(plain / spent, 4)

    def _fixed_time(self, m: list[int], gamma: int) -> float:
        t, spent = 0, 0.0
        while t < len(m):
            k = min(gamma, len(m) - t - 1)
            spent += self.cost(k)
            t += self.kept(m, t, k) + 1
        return spent

    def best_per_round(self, ceiling: int) -> float:
        plain = spent = 0.0
        for rid in self.order:
            m = self.marks[rid]
            best = [0.0] * (len(m) + 1)          # best[t]: the least time from t to the end
            for t in range(len(m) - 1, -1, -1):
                best[t] = min(self.cost(k) + best[min(t + self.kept(m, t, k) + 1, len(m))]
                              for k in range(0, min(ceiling, len(m) - t - 1) + 1))
            plain += len(m) * self.plain
            spent += best[0]
        return round(plain / spent, 4)


# -- the sets -----------------------------------------------------------------------------
def demo_set(folder: Path) -> Path:
    """The demo alone: examples/images/ asked the default profile's prompt, in order."""
    out = folder / "demo.jsonl"
    out.write_text("".join(json.dumps({"id": f"demo-{f.stem}", "messages": [
        {"role": "user", "text": "describe the image.", "images": [str(f)]}]}) + "\n"
        for f in sorted((ROOT / "examples" / "images").glob("*.png"))))
    return out


def other_set(args, folder: Path) -> Path:
    """Other crops (seed 99), the chats mixed_set leaves out, the scenes asked another
    question; shuffled with another seed."""
    from benchlib import photo_set

    photos = photo_set(Path(args.photos_from), folder / "other-photos", args.other_photos, seed=99)
    ask = lambda kind, name, text, image: {"id": f"{kind}-{name}", "messages": [   # noqa: E731
        {"role": "user", "text": text, "images": [str(image)]}]}
    convs = [ask("photo", f.stem, "describe the image.", f) for f in sorted(photos.glob("*.png"))]
    mmspec = ROOT / "examples" / "mmspec"
    lines = [json.loads(x) for x in (mmspec / "mmspec.jsonl").read_text().splitlines() if x.strip()]
    convs += [ask("chat", x["id"], x["turns"][0], mmspec / "images" / x["image"])
              for x in lines[args.mixed_chats:]]
    convs += [ask("demo", f.stem, "what is in this picture?", f)
              for f in sorted((ROOT / "examples" / "images").glob("*.png"))]
    random.Random(7).shuffle(convs)
    out = folder / "other.jsonl"
    out.write_text("".join(json.dumps(c) + "\n" for c in convs))
    return out


def main() -> None:
    if "--record" in sys.argv:
        i = sys.argv.index("--")
        out = sys.argv[sys.argv.index("--record") + 1]
        record(out, sys.argv[i + 1:], "--random-k" in sys.argv[:i])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos-from", default=os.environ.get("VLMSPEC_PHOTOS", ""),
                    help="folder with scikit-learn's china.jpg and flower.jpg")
    ap.add_argument("--mixed-photos", type=int, default=8)
    ap.add_argument("--mixed-chats", type=int, default=8)
    ap.add_argument("--other-photos", type=int, default=12)
    ap.add_argument("--ceilings", default="7,8,10")
    ap.add_argument("--profile", help="the profile to replay (default: the CLI's default)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a profile override for every recorded run (repeatable)")
    ap.add_argument("--competitors", type=int, default=0,
                    help="time the costs (step 2) beside this many CPU-bound processes "
                         "(bench/load.py's), each stopping by itself after 600 s")
    ap.add_argument("--json", help="write the recorded rounds, the costs and the results here")
    ap.add_argument("--from", dest="from_json", metavar="JSON",
                    help="replay the rounds and costs this script recorded in an earlier "
                         "run's --json (decodes nothing)")
    args = ap.parse_args()
    if args.from_json:
        replay_recorded(args)
        return
    from auto_gamma import mixed_set
    from load import competitors

    folder = Path(tempfile.mkdtemp(prefix="vlmspec-replay-"))
    sets = {"mixed": mixed_set(args, folder), "other": other_set(args, folder),
            "demo": demo_set(folder)}
    chosen = (["--profile", args.profile] if args.profile else []) + [
        x for kv in args.sets for x in ("--set", kv)]
    fixed = lambda g: ["--set", f"drafting.gamma={g}", "--set", "drafting.length=fixed"]  # noqa: E731
    runs = {}
    for name, conv in sets.items():
        base = ["caption", "--chat", str(conv), "--json", *chosen]
        runs[name] = {g: run_record(folder / f"{name}-{g}.json", base + fixed(g)) for g in (10, 9)}
    base = ["caption", "--chat", str(sets["mixed"]), "--json", *chosen]
    auto = ["--set", "drafting.gamma=10", "--set", "drafting.length=auto"]
    procs = competitors(args.competitors, 600.0)
    try:
        if procs:
            time.sleep(2.0)   # let them take the cores before the costs are timed
        costs = run_record(folder / "costs.json", base + auto, random_k=True)["costs"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    ceilings = [int(c) for c in args.ceilings.split(",")]
    orders = {name: [f"{conv}#{json.loads(x)['id']}" for x in conv.read_text().splitlines()]
              for name, conv in sets.items()}
    results = replay_all(runs, orders, costs, ceilings)
    if args.json:
        Path(args.json).write_text(json.dumps({"costs": costs, "results": results,
                                               "runs": runs}, indent=1))


def replay_all(runs: dict, orders: dict, costs: dict, ceilings: list[int]) -> dict:
    """Replay every set (``runs[name][10]`` and ``[9]``: the recorded fixed-γ runs) at
    ``costs``; print each set's table and return the results."""
    results = {}
    print(f"# costs (ms): D(1..10) {[round(x * 1e3, 2) for x in costs['draft_s']]}")
    print(f"#   V(1..11) {[round(x * 1e3, 2) for x in costs['verify_s']]}, "
          f"plain step {costs['plain_s'] * 1e3:.2f}")
    for name, order in orders.items():
        replay = Replay(predicted(runs[name][10], runs[name][9]), order, costs,
                        confidences(runs[name][10]))
        rows = {f"γ={g}": replay.fixed(g) for g in range(1, 11)}
        rows |= {f"auto ≤{c}": replay.auto(c) for c in ceilings}
        if replay.confs:   # the rounds' confidences were recorded: chains ended by them
            rows |= {f"auto ≤{c}, confidence stop": replay.auto(c, stop=True) for c in ceilings}
        best = max((r for r in rows if r.startswith("γ")), key=lambda r: rows[r][0])
        model = replay.model_gamma(10)
        oracles = {"best fixed γ per request": replay.best_per_request(),
                   **{f"best k per round ≤{c}": replay.best_per_round(c) for c in ceilings}}
        positions = sum(len(m) for m in replay.marks.values())
        results[name] = {"rows": rows, "best_fixed": best, "oracles": oracles,
                         "model_gamma": model, "positions": positions, "requests": len(order)}
        if replay.confs:
            results[name]["calibration"] = calibration(replay.marks, replay.confs)
            print(f"\n## {name}: proposals kept by the draft's confidence c in them "
                  "(on the target's own prefix)\n| c | proposals | kept |\n|---|---|---|")
            for row in results[name]["calibration"]:
                share = row["kept"] / row["proposals"] if row["proposals"] else float("nan")
                print(f"| {row['from']}-{row['to']} | {row['proposals']} | {share:.2f} |")
        print(f"\n## {name}: {len(order)} requests, {positions} tokens; "
              f"decoding speedup over plain steps, replayed (best fixed: {best})")
        kinds = sorted(rows[best][1])
        print("| config | all | " + " | ".join(kinds) + " | vs best fixed |")
        print("|---|---|" + "---|" * len(kinds) + "---|")
        for label, (total, per) in rows.items():
            print(f"| {label} | {total:.3f}x | " + " | ".join(f"{per[k]:.3f}x" for k in kinds)
                  + f" | {100 * (total / rows[best][0] - 1):+.1f}% |")
        for label, value in oracles.items():
            print(f"| {label} (oracle) | {value:.3f}x |" + " |" * len(kinds)
                  + f" {100 * (value / rows[best][0] - 1):+.1f}% |")
        fixed_at = rows[f"γ={model}"][0]
        print(f"| Eq. 1' at the set's own rates, in hindsight: γ {model} | {fixed_at:.3f}x |"
              + " |" * len(kinds) + f" {100 * (fixed_at / rows[best][0] - 1):+.1f}% |")
    return results


def replay_recorded(args) -> None:
    """``--from``: the sets, rounds and costs of an earlier run's JSON, replayed again (by
    this file's policies: a changed AutoGamma, or a row added since)."""
    recorded = json.loads(Path(args.from_json).read_text())
    runs = {name: {int(g): run for g, run in by_gamma.items()}
            for name, by_gamma in recorded["runs"].items()}
    orders = {name: [r["id"] for r in by_gamma[10]["requests"]] for name, by_gamma in runs.items()}
    ceilings = [int(c) for c in args.ceilings.split(",")]
    results = replay_all(runs, orders, recorded["costs"], ceilings)
    if args.json:
        Path(args.json).write_text(json.dumps({"from": args.from_json, "costs": recorded["costs"],
                                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
