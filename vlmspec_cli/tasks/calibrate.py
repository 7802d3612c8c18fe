"""``vlmspec calibrate``: choose the method and its parameters for this hardware and task.

1. Latency model: T_p(k) (the target verifying k tokens) and T_q(B) (one draft-model step
   for B rows) from the profile's ``hardware:`` section when it holds ``vlmspec profile``
   tables, else measured now. A method without a separate draft-model step (hidden-state
   head, twig, ADT-Tree and image trees, whose guided steps run two rows per node) costs
   L ms per draft level: ``hardware.measurements.draft_level_ms[method]`` (or the
   ``rounds`` that ``vlmspec profile`` timed for the profile's own method) when given,
   else the probe's own rounds, timed (runtime/round/round_timing.py). With every cost from the
   hardware profile, the choice is deterministic: at T = 0 acceptance is too.
2. Acceptance: every probe (tasks/calibrate_space.py says which) decodes the samples once.
   A chain-like probe at the largest γ stands for every γ: τ(γ) = 1 + E[min(k, γ)] over
   its rounds' accepted counts k. A tree or ADT-Tree probe's τ is measured as decoded.
3. Model (Eq. 1 with the measured verification cost): speedup = τ·T_p(1) / round, where
   a round costs levels·T_q(rows) + T_p(nodes + 1) for a draft model (a chain: γ levels of
   one row, γ nodes; an ensemble: rows = its inputs; a tree of depth d, top_k k and n
   nodes: d levels of k rows, n nodes), and levels·L + T_p(nodes + 1) otherwise (levels
   and nodes as the probe's rounds drafted them, a chain's capped at γ), taken over whole
   requests with the hardware profile's prefill time (``LatencyModel.with_prefill``).
   With latency measured now (no hardware profile), each probe's own timed rounds price
   its candidates instead (``RoundsModel``: whole rounds and the prefills, as the engine
   runs them; the tables only give a shorter γ's round as a share of the probe's), so
   what the tables leave out, the engine's own time per round, is in the prediction.
4. The best ``top`` candidates and the profile's own configuration are decoded for real,
   against target-only decoding on the same samples, each sample by both back to back
   (``_paired``: the same moment on a shared machine) (each one's speedup, and its spread
   over the samples: min, median, max; predicted ÷ measured − 1 is the model's error);
   the winner is the fastest measured of those equal to target-only (target-only decoding,
   method none, among them), unless the modelled best measured within ``margin`` of it
   (timing noise must not flip what the model chose; the note says so). For a folder
   (caption, several samples) the winner is then decoded with ``generation.batch_size`` 2
   and 4 and the batch size kept only if faster by ``margin``. Nothing the budget skipped
   is hidden: ``Calibration.skipped`` lists it.
5. The budget (tasks/calibrate_plan.py ``SearchClock``): every method family is probed at
   least once, the likeliest first, each on as many samples as the time left allows; the
   other probes follow the family modelled fastest so far while whole probes fit; the
   probing leaves time for two finalists; the whole ends within the budget and one
   finalist's decode.

A base profile with ``drafting.length: auto`` is probed and modelled at fixed γ (its
probes and candidates pin ``drafting.length: fixed``: a probe's rounds must all draft the
largest γ to stand for every γ); the profile as it is, auto, is a candidate modelled as
its best fixed γ up to its ceiling, and decoded for real as the profile's own.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from vlmspec_cli.drafters import method_class
from vlmspec_cli.profile import with_settings
from vlmspec_cli.runtime.fast.latency import measure_tables, time_extend
from vlmspec_cli.runtime.limits import prompt_tokens
from vlmspec_cli.runtime.models.loading import ModelLoadError
from vlmspec_cli.runtime.request import Request
from vlmspec_cli.runtime.round.round_timing import time_rounds
from vlmspec_cli.session import SessionError, build_session
from vlmspec_cli.tasks.calibrate_model import LatencyModel, RoundsModel, Run, tau_for_gamma
from vlmspec_cli.tasks.calibrate_plan import SearchClock, paired_repeats
from vlmspec_cli.tasks.calibrate_space import Probe, next_probe, probes


@dataclass
class Candidate:
    method: str
    label: str
    settings: dict                  # dotted profile keys the written profile sets
    gamma: int = 5
    inputs: list[str] = field(default_factory=list)
    tree: tuple[int, int, int] | None = None    # a fixed tree: (depth, top_k, total_tokens)
    tau_model: float = 0.0          # τ estimated from the probe
    predicted: float = 0.0          # modelled speedup
    cost: str = "table"             # the drafting cost: table | timed (a head's levels) |
    #                                 rounds (the probe's own rounds: latency measured here)
    tau: float | None = None        # measured
    speedup: float | None = None    # measured, vs target-only on the same samples
    tokens_per_s: float | None = None
    mismatches: int = 0             # samples whose tokens differ from target-only (T = 0)
    # measured, per sample: target-only's wall ÷ this one's (the spread behind speedup)
    speedup_min: float | None = None
    speedup_median: float | None = None
    speedup_max: float | None = None
    prediction_error: float | None = None   # predicted ÷ measured speedup − 1
    probe_samples: int = 0          # the samples its probe decoded (fewer than all: the budget)


@dataclass
class Calibration:
    candidates: list[Candidate]
    winner: Candidate
    skipped: list[str]              # what was not tried, and why (the --budget, the method)
    latency: str                    # "hardware profile" or "measured"
    target_only: dict = field(default_factory=dict)   # its tokens/s and per-sample walls
    note: str = ""                  # why the winner won, when it is not the modelled best

    def prediction_errors(self) -> dict:
        """How far the model was from what was measured, over the candidates decoded for
        real one request at a time (predicted ÷ measured − 1: > 0 predicted too much)."""
        errors = [c.prediction_error for c in self.candidates if c.prediction_error is not None]
        if not errors:
            return {"measured": 0}
        return {"measured": len(errors), "mean": round(statistics.fmean(errors), 4),
                "mean_abs": round(statistics.fmean(abs(e) for e in errors), 4),
                "max_abs": round(max(abs(e) for e in errors), 4)}


# drafting.length: auto decodes each γ as the rounds go: a probe that stands for every γ,
# and a candidate of one γ, decode at that γ
FIXED_LENGTH = {"drafting.length": "fixed"}


def _decode(engine, requests: list[Request]) -> Run:
    from vlmspec_cli.runtime.stats import SpecStats

    stats, outputs, walls = SpecStats(), [], []
    captioner = getattr(engine.drafter, "captioner", None)
    t0 = time.perf_counter()
    for req in requests:
        t1 = time.perf_counter()
        if captioner is not None:   # each request pays for its captions, warm-up or not
            captioner.forget()
        res = engine.generate(req)
        walls.append(time.perf_counter() - t1)
        stats.merge(res.state.stats)
        outputs.append(res.tokens)
    return Run(time.perf_counter() - t0, walls, outputs, stats)


def _pinned(base) -> dict:
    """What a probe or a candidate of one γ adds to ``base``'s settings: the fixed length,
    when the base chooses γ per round."""
    return FIXED_LENGTH if method_class(base.method).draft_length(base) == "auto" else {}


def measure_latency(session, draft, requests: list[Request], all_probes: list[Probe],
                    gammas: list[int]) -> LatencyModel:
    """The latency tables this search needs, timed now at the first sample's length: the
    target verifying 1, 2, the widest round and one between (``LatencyModel`` interpolates
    and fits a line through them: every width timed cost 48 s of a 60 s budget at load 6),
    and a draft step for one row and the most rows a probe runs."""
    target = session.target
    if session.profile.task == "image":
        from vlmspec_cli.tasks.hwprofile_image import image_tables

        tables = image_tables(session, warmup=2, repeats=5)
        return LatencyModel(next(iter(tables.target_verify_ms.values())), {}, measured=True)
    s0 = prompt_tokens(target, requests[0].messages)
    # the decoding rounds' thread count: timed on every core beside two busy processes, a
    # forward waited for its slowest thread and the tables took many times as long
    session.threads.enter("decode", s0)
    widest = max([g + 1 for g in gammas] + [p.tree[2] + 1 for p in all_probes if p.tree])
    ks = sorted({1, 2, (2 + widest) // 2, widest})
    rows = sorted({1, max([p.rows for p in all_probes if p.rows], default=1)})
    tables = measure_tables(target, None, [s0], ks, [], warmup=2, repeats=5)
    draft_ms = {} if draft is None else {b: time_extend(draft, s0, 1, b, 2, 5) for b in rows}
    return LatencyModel(tables.target_verify_ms[s0], draft_ms, measured=True)


def _mismatches(outputs, reference, greedy: bool) -> int:
    return sum(a != b for a, b in zip(outputs, reference)) if greedy else 0


def probe_candidates(base, probe: Probe, requests, gammas: list[int], model: LatencyModel,
                     base_run: Run, greedy: bool, target=None) -> list[Candidate]:
    """Decode the samples once with the probe's configuration; its candidates, modelled.
    ``target``: the base session's target, reused (build_session)."""
    gamma = max(gammas) if probe.replay else None
    settings = dict(probe.settings, **({"drafting.gamma": gamma} if gamma else {}))
    pin = _pinned(base)
    profile = with_settings(base, {**settings, **pin})
    session = build_session(profile, target=target)
    timed = time_rounds(session.engine, requests, warmup=0)
    summary = timed.summary()
    mismatches = _mismatches(timed.outputs, base_run.outputs, greedy)
    if not model.draft_ms:    # no draft-model table (a hardware profile of a head): timed
        probe = dataclasses.replace(probe, rows=0)
    level_ms = model.level_ms.get(probe.method)
    cost = "table" if probe.rows or level_ms is not None else "timed"
    if level_ms is None:
        level_ms = summary.get("draft_ms_per_level", 0.0)
    rounds = RoundsModel.of_probe(base_run, summary) if model.measured else None
    cost = "rounds" if rounds is not None else cost
    inputs = method_class(probe.method).drafting_inputs(profile)
    common = dict(inputs=inputs, cost=cost, mismatches=mismatches, probe_samples=len(requests))
    # the tables' Eq. 1 over whole requests: the samples' prefills (a hardware profile's
    # prefill_ms; the tokens target-only decoded: the same at T = 0, so still deterministic)
    whole = lambda s: model.with_prefill(s, len(base_run.walls), base_run.stats.new_tokens)  # noqa: E731
    if not probe.replay:
        tau = timed.stats.mean_accept_len
        if rounds is not None:   # as its own rounds decoded
            predicted = rounds.speedup(tau)
        elif probe.rows:         # a draft model's tree: d levels of top_k rows, n nodes
            predicted = whole(model.predicted_tree_speedup(tau, *probe.tree))
        else:                    # as the rounds drafted them
            predicted = whole(model.speedup(tau, summary.get("levels_per_round", 0.0),
                                            summary.get("drafted_per_round", 0.0), level_ms))
        return [Candidate(probe.method, probe.label, dict(probe.settings, **pin),
                          method_class(profile.method).gamma(profile), tree=probe.tree,
                          tau_model=round(tau, 4), predicted=round(predicted, 4), **common)]
    # the probe's rounds (at the largest γ; fewer near a request's end, or a twig stopping
    # early): a candidate of γ drafts min(γ, that) levels and proposals
    step = model.step_ms(probe.rows) if probe.rows else level_ms
    levels = summary.get("levels_per_round", gamma)
    nodes = summary.get("drafted_per_round", levels)
    out = []
    for g in gammas:
        tau = tau_for_gamma(timed.stats.accept_len_hist, g)
        if rounds is not None:   # the probe's round, shortened as the tables say γ's is
            share = (model.line_round_ms(min(g, levels), min(g, nodes), step)
                     / model.line_round_ms(levels, nodes, step))
            predicted = rounds.speedup(tau, share)
        elif probe.rows:
            predicted = whole(model.predicted_speedup(tau, g, probe.rows))
        else:   # an early-stopping twig drafts fewer levels than γ
            predicted = whole(model.speedup(tau, min(g, levels), min(g, levels), level_ms))
        out.append(Candidate(probe.method, f"{probe.label} γ={g}",
                             dict(probe.settings, **{"drafting.gamma": g}, **pin), g,
                             tau_model=round(tau, 4), predicted=round(predicted, 4), **common))
    return out


def _same_config(base, a: dict, b: dict) -> bool:
    """Whether two probes' settings give the same profile (γ aside: a probe picks its own)."""
    one = {"drafting.gamma": 1}
    return with_settings(base, {**a, **one}) == with_settings(base, {**b, **one})


def _paired(baseline, engine, requests: list[Request]) -> tuple[Run, Run]:
    """Each sample decoded by target-only (``baseline``) and by ``engine`` back to back,
    which goes first alternating, so that both are timed at the same moment: timed minutes
    apart, a busy stretch on a shared machine fell on one side alone, and a finalist's
    measured speedup (what the winner is picked by) moved with it."""
    from vlmspec_cli.runtime.stats import SpecStats

    sides: tuple[list[Run], list[Run]] = ([], [])
    for i, req in enumerate(requests):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            sides[side].append(_decode((baseline, engine)[side], [req]))

    def joined(runs: list[Run]) -> Run:
        stats = SpecStats()
        for r in runs:
            stats.merge(r.stats)
        return Run(sum(r.wall for r in runs), [w for r in runs for w in r.walls],
                   [o for r in runs for o in r.outputs], stats)
    return joined(sides[0]), joined(sides[1])


def _measure(base, cand: Candidate, requests, base_run: Run, greedy: bool,
             target=None, baseline=None) -> None:
    """Decode the samples with the candidate's profile (after one warm-up request), each
    beside target-only (``baseline``: its engine) decoding it again (``_paired``); without
    a baseline engine, against ``base_run`` as timed at the start."""
    session = build_session(with_settings(base, cand.settings), target=target)
    _decode(session.engine, requests[:1])
    if baseline is not None:   # (short samples: decoded a few times over, calibrate_plan.py)
        reference, run = _paired(baseline, session.engine,
                                 requests * paired_repeats(base_run.wall))
    else:
        reference, run = base_run, _decode(session.engine, requests)
    cand.tau = round(run.stats.mean_accept_len, 4)
    cand.speedup = round(reference.wall / run.wall, 4) if run.wall > 0 else None
    cand.tokens_per_s = round(run.stats.new_tokens / run.wall, 2) if run.wall > 0 else None
    cand.mismatches = _mismatches(run.outputs, base_run.outputs, greedy)
    per_sample = [b / w for b, w in zip(reference.walls, run.walls) if w > 0]
    if per_sample:
        cand.speedup_min, cand.speedup_median, cand.speedup_max = (
            round(x, 4) for x in (min(per_sample), statistics.median(per_sample), max(per_sample)))
    if cand.speedup and cand.predicted:
        cand.prediction_error = round(cand.predicted / cand.speedup - 1.0, 4)


def decode_batched(session, requests: list[Request]) -> list:
    """``requests`` decoded ``generation.batch_size`` at a time: each one's Result (or the
    exception that failed it), in request order."""
    done = {id(req): res for req, res in session.batched_engine().run(requests, lambda r: r)}
    return [done[id(req)] for req in requests]


def _batch_candidates(base, winner: Candidate, requests, base_wall: float, reference,
                      greedy: bool, sizes=(2, 4), target=None) -> list[Candidate]:
    """The winner decoding the samples ``generation.batch_size`` at a time (a folder)."""
    if base.task != "caption" or not method_class(winner.method).batches or winner.speedup is None:
        return []
    out = []
    # (an auto winner's rows each choose their own length: round_policy.AutoLength.admit)
    label = f"{winner.label} batch={{}}"
    for b in [b for b in sizes if b <= len(requests)]:
        settings = dict(winner.settings, **{"generation.batch_size": b})
        session = build_session(with_settings(base, settings), target=target)
        decode_batched(session, requests[:b])   # warm-up
        t0 = time.perf_counter()
        outputs = [getattr(res, "tokens", None) for res in decode_batched(session, requests)]
        wall = time.perf_counter() - t0
        cand = dataclasses.replace(winner, label=label.format(b), settings=settings,
                                   tau=None, speedup=round(base_wall / wall, 4) if wall > 0 else None,
                                   tokens_per_s=None, mismatches=_mismatches(outputs, reference, greedy),
                                   # rows overlap in time: no per-sample walls; not modelled
                                   speedup_min=None, speedup_median=None, speedup_max=None,
                                   prediction_error=None)
        out.append(cand)
    return out


def calibrate(base, requests: list[Request], *, gammas: list[int], captioner_ok: bool = False,
              hidden=(), twigs=(), eagle3=(), top: int = 3, budget_s: float = 60.0,
              margin: float = 0.03, progress: Callable[[str], None] | None = None,
              session=None, started: float | None = None) -> Calibration:
    """Search the configurations of ``base`` (a profile whose method drafts) on ``requests``
    within about ``budget_s`` (tasks/calibrate_plan.py); ``session``: ``base``'s, if built;
    ``started``: when the budget began (``time.perf_counter()``; the command's start, so
    that loading the models and samples counts), else now."""
    say = progress or (lambda _msg: None)
    session = session or build_session(base)
    greedy = session.sampling.greedy
    draft = session.draft
    if draft is None and base.draft.model:   # a hidden or twig profile names one it does not load
        from vlmspec_cli.runtime.models.loading import load_model

        draft = load_model(base.draft, "draft")
    all_probes = probes(base, draft, captioner_ok=captioner_ok, hidden=hidden, twigs=twigs,
                        eagle3=eagle3)
    own = all_probes.pop()
    # first: no --budget leaves out the configuration the user runs now: the search's probe
    # of it, moved to the front (tinyworld-video's head came second, and a budget skipped
    # it), or its own probe (a method no probe list knows, one added in one file, is then
    # searched as it stands)
    same = next((p for p in all_probes if _same_config(base, own.settings, p.settings)), None)
    if same is not None:
        all_probes.remove(same)
    all_probes.insert(0, same or own)
    model = LatencyModel.from_hardware(base.hardware, base)
    latency = "hardware profile"
    clock = SearchClock(budget_s, say, samples=len(requests), start=started or time.perf_counter())
    if model is None:
        say("latency tables")
        model, latency = measure_latency(session, draft, requests, all_probes, gammas), "measured"
    baseline = session.baseline_engine()
    say("target-only decoding")
    _decode(baseline, requests[:1])  # warm-up
    base_run = _decode(baseline, requests)
    clock.base_wall_s, clock.first_sample_s = base_run.wall, base_run.walls[0]
    batching = base.task == "caption" and len(requests) > 1
    clock.steps = len(all_probes) + top + 1 + (2 if batching else 0)
    candidates, skipped = _probe_all(base, all_probes, requests, gammas, model, base_run, greedy,
                                     session.target, clock, top + 1)
    auto = _auto_candidate(base, candidates)
    candidates += [auto] if auto is not None else []
    candidates.sort(key=lambda c: (-c.predicted, c.label))
    default = next((c for c in candidates if with_settings(base, c.settings) == base), None)
    finalists = candidates[:top] + ([default] if default is not None and default not in candidates[:top] else [])
    # the profile's own and the modelled best are always decoded (the probing left them
    # time: SearchClock.reserve); the others while one more fits in the budget
    for i, cand in enumerate(finalists):
        if i > 0 and cand is not default and not clock.finalist_fits():
            skipped.append(f"{cand.label} (budget: modelled, not measured)")
            continue
        clock.step(f"measuring {cand.label}", 0, len(finalists) - i)
        _measure(base, cand, requests, base_run, greedy, session.target, baseline)
    none = _target_only(base_run)
    winner, note = _pick(candidates, none, margin)
    candidates = sorted(candidates + [none], key=lambda c: (-c.predicted, c.label))
    winner, note = _try_batches(base, winner, note, candidates, skipped, requests, base_run,
                                greedy, session.target, clock, margin)
    walls = base_run.walls
    target_only = {"tokens_per_s": none.tokens_per_s, "wall_s": round(base_run.wall, 4),
                   "sample_wall_s": {"min": round(min(walls), 4), "median": round(statistics.median(walls), 4),
                                     "max": round(max(walls), 4)}}
    return Calibration(candidates, winner, skipped, latency, target_only, note)


def _try_batches(base, winner, note, candidates, skipped, requests, base_run, greedy, target,
                 clock: SearchClock, margin: float) -> tuple[Candidate, str]:
    """A folder's winner decoded ``generation.batch_size`` 2 and 4 at a time, when its method
    batches and the budget leaves time (two more target-only runs' worth); a batch size is
    kept when measured more than ``margin`` faster."""
    if base.task != "caption" or len(requests) < 2:
        return winner, note
    if not method_class(winner.method).batches:
        skipped.append(f"batch sizes (method {winner.method} decodes one request at a time)")
        return winner, note
    if clock.left() < 2 * base_run.wall:
        skipped.append("batch sizes (budget)")
        return winner, note
    clock.step("batch sizes", 0, 1)
    try:
        batched = _batch_candidates(base, winner, requests, base_run.wall, base_run.outputs,
                                    greedy, target=target)
    except (ModelLoadError, SessionError, ValueError) as exc:   # a drafter that cannot batch
        batched = []
        skipped.append(f"batch sizes ({exc})")
    for cand in batched:
        candidates.append(cand)
        if cand.mismatches == 0 and cand.speedup > winner.speedup * (1 + margin):
            winner, note = cand, ""
    return winner, note


def _probe_all(base, all_probes, requests, gammas, model, base_run: Run, greedy: bool, target,
               clock: SearchClock, finalists: int) -> tuple[list[Candidate], list[str]]:
    """Every probe's candidates, modelled, in the order ``next_probe`` chooses (the first, the
    profile's own configuration, on every sample; the others sized to the budget by
    ``clock``), and what was skipped."""
    candidates, skipped = [], []
    cannot: dict[str, list[str]] = {}      # why a probe cannot run -> the probes
    queue, best = list(all_probes), {}
    while queue:
        first = len(queue) == len(all_probes)
        probe = queue[0] if first else next_probe(queue, clock.probed, best)
        queue.remove(probe)
        fresh = {p.method for p in queue} | {probe.method}
        n = len(requests) if first else clock.probe_samples(probe.method, len(fresh - clock.probed))
        if n == 0:
            clock.done += 1
            skipped.append(f"{probe.label} (budget)")
            continue
        part = f" ({n} of {len(requests)} samples)" if n < len(requests) else ""
        clock.step(f"acceptance of {probe.label}{part}", len(queue) + 1, finalists)
        t0 = time.perf_counter()
        try:
            found = probe_candidates(base, probe, requests[:n], gammas, model, base_run, greedy, target)
        except (ModelLoadError, SessionError, ValueError) as exc:
            # a draft of another tokenizer, a family refusing the probe's inputs (Qwen's
            # 3-D positions: no ensemble with M, no P), a model refusing it as it decodes
            cannot.setdefault(str(exc).split(": ")[0].split(" (")[0], []).append(probe.label)
            continue
        clock.probed_family(probe.method, time.perf_counter() - t0, n)
        best[probe.method] = max([best.get(probe.method, 0.0)] + [c.predicted for c in found])
        candidates += found
    skipped += [f"{', '.join(labels)} ({reason})" for reason, labels in cannot.items()]
    return candidates, skipped


def _auto_candidate(base, candidates: list[Candidate]) -> Candidate | None:
    """The base profile as it is, when it chooses γ per round (drafting.length auto): its
    configuration modelled at the best fixed γ up to its ceiling (what auto aims at), and,
    as the profile's own, always decoded for real."""
    method = method_class(base.method)
    if method.draft_length(base) != "auto":
        return None
    ceiling = method.gamma(base)
    same = [c for c in candidates if c.tree is None and c.gamma <= ceiling
            and _same_config(base, {}, {k: v for k, v in c.settings.items() if k not in FIXED_LENGTH})]
    if not same:
        return None
    best = max(same, key=lambda c: c.predicted)
    return dataclasses.replace(best, label=f"{base.name} (own) {base.method} γ auto ≤ {ceiling}",
                               settings={}, gamma=ceiling)


def _target_only(base_run: Run) -> Candidate:
    """Target-only decoding as a candidate (method none): the baseline, measured."""
    tps = round(base_run.stats.new_tokens / base_run.wall, 2) if base_run.wall > 0 else None
    return Candidate("none", "none (target only)", {"method": "none"}, 0, tau_model=1.0,
                     predicted=1.0, tau=1.0, speedup=1.0, tokens_per_s=tps, speedup_min=1.0,
                     speedup_median=1.0, speedup_max=1.0)


def _pick(candidates: list[Candidate], none: Candidate, margin: float) -> tuple[Candidate, str]:
    """The winner, target-only decoding (``none``, modelled and measured at its own speed)
    among the candidates: the fastest measured of those decoded equal to target-only,
    unless the modelled best measured within ``margin`` of it (timing noise must not flip a
    choice the model makes): then the modelled best, and the note says so in one line, as
    it says whenever the winner is not the modelled best."""
    measured = sorted([c for c in candidates if c.speedup is not None and c.mismatches == 0]
                      + [none], key=lambda c: (-c.predicted, c.label))
    modelled = measured[0]
    fastest = max(measured, key=lambda c: c.speedup)     # (ties: the better modelled)
    if fastest.speedup <= modelled.speedup * (1 + margin):
        winner = modelled
    else:
        winner = fastest
    if winner is none and modelled is not none:
        return none, (f"target-only decoding was measured fastest: {modelled.label}, modelled "
                      f"best, decoded at {modelled.speedup:.2f}x of its speed")
    if winner is none and len(measured) == 1:
        return none, "no candidate was decoded equal to target-only: target-only decoding"
    if winner is none and fastest is none:
        return none, "target-only decoding was modelled fastest, and no candidate measured faster"
    if winner is not fastest:
        kept = "target-only decoding was modelled fastest and is kept" if winner is none else \
            f"{winner.label}, modelled best, is kept at {winner.speedup:.2f}x"
        return winner, (f"{kept}: {fastest.label} measured {fastest.speedup:.2f}x, within "
                        f"--margin {margin:.0%} (timing noise)")
    if winner is not modelled:
        return winner, (f"measured fastest; {modelled.label}, modelled best, measured "
                        f"{modelled.speedup:.2f}x")
    return winner, ""


def as_dicts(candidates: list[Candidate]) -> list[dict]:
    return [dataclasses.asdict(c) for c in candidates]
