"""``vlmspec calibrate``: choose the drafting method, inputs and γ for this hardware.

1. Latency model: T_p(k) (target verifying k tokens) and T_q(B) (one draft step for B rows)
   from the profile's ``hardware:`` section when it holds ``vlmspec profile`` tables (then
   the choice is deterministic), else measured now.
2. Acceptance: every chain or ensemble variant decodes the samples once at the largest γ;
   the histogram of accepted counts k per round estimates τ(γ) = 1 + E[min(k, γ)] for
   every smaller γ without decoding again. A draft tree's acceptance cannot be replayed
   that way (which nodes a smaller tree keeps changes what is accepted), so every tree
   shape in TREE_SHAPES decodes the samples itself: its τ is measured, not estimated.
3. Model: speedup(γ) = τ(γ)·T_p(1) / (γ·T_q(B) + T_p(γ+1)) (Eq. 1 with the measured
   verification cost); for a tree of depth d, top_k k and n nodes,
   τ·T_p(1) / (d·T_q(k) + T_p(n+1)) (a level drafts from up to k frontier rows, and the
   target verifies the pending token and n nodes). The best ``top`` candidates and the
   profile's own configuration are then decoded for real, against target-only decoding
   on the same samples.
4. The winner is the best modelled candidate among those measured, unless another one was
   measured more than ``margin`` faster (timing noise must not flip the choice).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vlmspec_cli.drafters import create_drafter
from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS, letters
from vlmspec_cli.runtime.engine import SpeculativeEngine
from vlmspec_cli.runtime.latency import measure_tables
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.stats import SpecStats
from vlmspec_cli.tasks.output_files import (OutputRefused, check_output, is_profile, same_file,
                                            write_checked)


# draft-tree shapes calibrate decodes: (depth, top_k, total_tokens)
TREE_SHAPES = ((3, 2, 8), (4, 4, 12), (5, 4, 20), (6, 4, 30), (5, 8, 40))


@dataclass
class Candidate:
    method: str
    inputs: list[str]
    policy: str | None = None
    gamma: int = 5
    tau_model: float = 0.0          # τ estimated from the acceptance probe
    predicted: float = 0.0          # modelled speedup
    tau: float | None = None        # measured
    speedup: float | None = None    # measured, vs target-only on the same samples
    tokens_per_s: float | None = None
    mismatches: int = 0
    tree: tuple[int, int, int] | None = None   # method tree: (depth, top_k, total_tokens)

    @property
    def label(self) -> str:
        if self.tree is not None:
            d, k, n = self.tree
            return f"tree {letters(self.inputs)} d={d} k={k} n={n}"
        star = "*" if self.policy in ("grid", "softmax") else ""
        return f"{self.method} {letters(self.inputs)}{star} γ={self.gamma}"

    def key(self) -> tuple:
        return (self.method, tuple(self.inputs), self.policy, self.tree)


def variants(profile, session, captioner_ok: bool) -> list[tuple[str, list[str], str | None]]:
    """(method, inputs, policy) worth probing with these models."""
    images = session.draft is not None and session.draft.adapter.takes_images
    singles = [i for i in DRAFTING_INPUTS
               if (i not in ("multimodal", "pooled") or images) and (i != "caption" or captioner_ok)]
    out = [("chain", [i], None) for i in singles]
    if images:
        out.append(("tabed", ["multimodal", "text"], "grid"))
        if captioner_ok:
            out.append(("tabed", list(DRAFTING_INPUTS), "softmax"))
    own = (profile.method, list(profile.drafting.inputs),
           profile.ensemble.policy if profile.method == "tabed" else None)
    if profile.method in ("chain", "tabed") and own not in out:
        out.append(own)
    return out


class LatencyModel:
    def __init__(self, verify_ms: dict[int, float], draft_ms: dict[int, float]) -> None:
        self.verify_ms = dict(sorted(verify_ms.items()))
        self.draft_ms = dict(sorted(draft_ms.items()))

    @staticmethod
    def _at(table: dict[int, float], x: int) -> float:
        """Linear interpolation in a table keyed by int (clamped at its ends)."""
        keys = list(table)
        if x <= keys[0]:
            return table[keys[0]]
        for lo, hi in zip(keys, keys[1:]):
            if x <= hi:
                return table[lo] + (table[hi] - table[lo]) * (x - lo) / (hi - lo)
        return table[keys[-1]]

    def predicted_speedup(self, tau: float, gamma: int, rows: int) -> float:
        t_p = self._at(self.verify_ms, 1)
        return tau * t_p / (gamma * self._at(self.draft_ms, rows) + self._at(self.verify_ms, gamma + 1))

    def predicted_tree_speedup(self, tau: float, depth: int, top_k: int, nodes: int) -> float:
        """A round drafts ``depth`` levels of up to ``top_k`` rows and verifies nodes + 1."""
        t_p = self._at(self.verify_ms, 1)
        return tau * t_p / (depth * self._at(self.draft_ms, top_k) + self._at(self.verify_ms, nodes + 1))

    @classmethod
    def from_hardware(cls, hardware) -> "LatencyModel | None":
        m = hardware.measurements if hardware is not None else None
        if not isinstance(m, dict) or not m.get("target_verify_ms") or not m.get("draft_step_ms"):
            return None
        verify = next(iter(m["target_verify_ms"].values()))       # the sample prompt's S
        draft = {int(b): next(iter(row.values())) for b, row in m["draft_step_ms"].items()}
        return cls({int(k): float(v) for k, v in verify.items()}, draft)


def tau_for_gamma(hist: list[int], gamma: int) -> float:
    """1 + E[min(k, γ)] over rounds that accepted k proposals (probed at a larger γ)."""
    rounds = sum(hist)
    return 1.0 + sum(n * min(k, gamma) for k, n in enumerate(hist)) / rounds if rounds else 1.0


def _drafter(session, captioner, method: str, inputs: list[str], policy: str | None,
             tree: tuple[int, int, int] | None = None):
    common = dict(draft=session.draft, sampling=session.sampling, captioner=captioner,
                  image_token=session.target.adapter.image_token(session.target))
    if method == "chain":
        return create_drafter("chain", drafting_input=inputs[0], **common)
    if method == "tree":
        from vlmspec_cli.runtime.engine import eos_token_ids

        depth, top_k, total = tree
        return create_drafter("tree", drafting_input=inputs[0], depth=depth, top_k=top_k,
                              total_tokens=total, eos_ids=eos_token_ids(session.target), **common)
    return create_drafter(method, inputs=inputs, policy=policy or "grid", **common)


def tree_input(profile, session) -> str:
    """The drafting input trees use: the profile's own single input, else multimodal when the
    draft reads images, else text."""
    own = list(profile.drafting.inputs)
    if len(own) == 1:
        return own[0]
    return "multimodal" if session.draft.adapter.takes_images else "text"


def _decode(engine, requests: list[Request]) -> tuple[SpecStats, float, list[list[int]]]:
    stats, outputs = SpecStats(), []
    t0 = time.perf_counter()
    for req in requests:
        res = engine.generate(req)
        stats.merge(res.state.stats)
        outputs.append(res.tokens)
    return stats, time.perf_counter() - t0, outputs


def calibrate(session, requests: list[Request], *, gammas: list[int], captioner=None,
              top: int = 3, budget_s: float = 120.0, margin: float = 0.10,
              progress: Callable[[str], None] | None = None) -> tuple[list[Candidate], Candidate]:
    profile = session.profile
    say = progress or (lambda _msg: None)
    t_start = time.perf_counter()
    model = LatencyModel.from_hardware(profile.hardware)
    if model is None and session.draft is not None:
        say("latency model")
        prompt = session.target.adapter.prompt_text(session.target, requests[0].messages)
        s0 = int(session.target.adapter.encode(session.target, prompt, requests[0].images)["input_ids"].shape[1])
        tables = measure_tables(session.target, session.draft, [s0], sorted({1, *[g + 1 for g in gammas]}),
                                [1, 2, 3, 4], warmup=2, repeats=7)
        model = LatencyModel(tables.target_verify_ms[s0], {b: r[s0] for b, r in tables.draft_step_ms.items()})
    baseline = SpeculativeEngine(session.target, create_drafter("none"), 1, session.sampling)
    _decode(baseline, requests[:1])  # warm-up
    base_stats, base_wall, reference = _decode(baseline, requests)

    candidates: list[Candidate] = []
    probe_gamma = max(gammas)
    for n, (method, inputs, policy) in enumerate(variants(profile, session, captioner is not None)):
        if n > 0 and time.perf_counter() - t_start > budget_s:
            say("budget spent: the remaining drafting variants are left unprobed")
            break
        say(f"acceptance of {method} {inputs}")
        engine = SpeculativeEngine(session.target, _drafter(session, captioner, method, inputs, policy),
                                   probe_gamma, session.sampling)
        stats, _, _ = _decode(engine, requests)
        rows = len(inputs) if method == "tabed" else 1
        for g in gammas:
            tau = tau_for_gamma(stats.accept_len_hist, g)
            candidates.append(Candidate(method, list(inputs), policy, g, round(tau, 4),
                                        round(model.predicted_speedup(tau, g, rows), 4)))
    tree_in = [tree_input(profile, session)]
    for shape in TREE_SHAPES:
        if time.perf_counter() - t_start > budget_s:
            say("budget spent: the remaining tree shapes are left unprobed")
            break
        say(f"acceptance of tree {shape}")
        # a tree's depth bounds a round as γ bounds a chain (TreeDrafter.gamma)
        engine = SpeculativeEngine(session.target, _drafter(session, captioner, "tree", tree_in,
                                                            None, shape), shape[0], session.sampling)
        stats, _, _ = _decode(engine, requests)
        tau = stats.mean_accept_len
        candidates.append(Candidate("tree", tree_in, None, shape[0], round(tau, 4),
                                    round(model.predicted_tree_speedup(tau, *shape), 4), tree=shape))
    candidates.sort(key=lambda c: (-c.predicted, c.label))
    own_tree = ((profile.tree.depth, profile.tree.top_k, profile.tree.total_tokens)
                if profile.method == "tree" else None)
    own_key = (profile.method, tuple(profile.drafting.inputs),
               profile.ensemble.policy if profile.method == "tabed" else None, own_tree)
    default = next((c for c in candidates if c.key() == own_key
                    and (c.tree is not None or c.gamma == profile.drafting.gamma)), None)
    finalists = candidates[:top] + ([default] if default is not None and default not in candidates[:top] else [])
    for i, cand in enumerate(finalists):
        if i > 0 and time.perf_counter() - t_start > budget_s:
            say("budget spent: the remaining finalists are left unmeasured")
            break
        say(f"measuring {cand.label}")
        engine = SpeculativeEngine(session.target, _drafter(session, captioner, cand.method, cand.inputs,
                                                            cand.policy, cand.tree),
                                   cand.gamma, session.sampling)
        _decode(engine, requests[:1])  # warm-up
        stats, wall, outputs = _decode(engine, requests)
        cand.tau = round(stats.mean_accept_len, 4)
        cand.speedup = round(base_wall / wall, 4) if wall > 0 else None
        cand.tokens_per_s = round(stats.new_tokens / wall, 2) if wall > 0 else None
        if session.sampling.greedy:
            cand.mismatches = sum(a != b for a, b in zip(outputs, reference))
    measured = [c for c in candidates if c.speedup is not None and c.mismatches == 0]
    winner = measured[0] if measured else candidates[0]
    fastest = max(measured, key=lambda c: c.speedup, default=winner)
    if fastest.speedup and winner.speedup and fastest.speedup > winner.speedup * (1 + margin):
        winner = fastest
    return candidates, winner


def winner_yaml(winner: Candidate, base_source: str, name: str, include: str, table: list[Candidate]) -> str:
    """A profile that includes the base one and sets the chosen method, inputs and γ."""
    import yaml

    data: dict = {"include": include, "name": name,
                  "description": f"calibrated from {base_source}: {winner.label}",
                  "method": winner.method,
                  "drafting": {"gamma": winner.gamma, "inputs": list(winner.inputs)}}
    if winner.method == "tabed":
        data["ensemble"] = {"policy": winner.policy}
    if winner.tree is not None:   # its depth is its γ: the profile's drafting.gamma stays
        d, k, n = winner.tree
        del data["drafting"]["gamma"]
        data["tree"] = {"depth": d, "top_k": k, "total_tokens": n, "policy": "dynamic"}
    lines = ["# written by `vlmspec calibrate`; candidates (τ model, predicted, measured):"]
    for c in table[:12]:
        measured = f"{c.speedup:.2f}x" if c.speedup is not None else "-"
        lines.append(f"#   {c.label:<28} τ≈{c.tau_model:.2f}  pred {c.predicted:.2f}x  meas {measured}")
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def as_dicts(candidates: list[Candidate]) -> list[dict]:
    return [dict(dataclasses.asdict(c), label=c.label) for c in candidates]


# ------------------------------------------------------------------ samples and models
def sample_requests(profile, items) -> tuple[list[Request], list[str]]:
    """One request per usable sample image (expanded input items), and the one-line error
    of each unusable one."""
    from vlmspec_cli.tasks.inputs import InputError, load_image

    requests, errors = [], []
    for item in items:
        try:
            if item.error:
                raise InputError(item.path, item.error)
            image = load_image(item.path)
        except InputError as exc:
            errors.append(str(exc))
            continue
        requests.append(Request([Message("user", profile.generation.prompt, (image,))],
                                max_new_tokens=profile.generation.max_new_tokens,
                                seed=profile.sampling.seed, request_id=item.path))
    return requests, errors


def calibration_session(profile):
    """(session, captioner or None, why caption drafting was left out or None): calibrating
    needs the draft, so method none is measured as chain."""
    from vlmspec_cli.runtime.captioner import Captioner
    from vlmspec_cli.runtime.models import ModelLoadError, load_model
    from vlmspec_cli.session import build_session

    if profile.method == "none":
        profile.method = "chain"
    session = build_session(profile)
    captioner, note = None, None
    if profile.captioner.model:
        try:
            captioner = Captioner(load_model(profile.captioner, "captioner"), profile.captioner.prompt,
                                  profile.captioner.max_new_tokens)
        except ModelLoadError as exc:
            note = f"caption drafting left out: {exc}"
    return session, captioner, note


# ------------------------------------------------------------------ the written profile
def profile_write_path(name: str) -> Path:
    """``--write NAME`` -> profiles/NAME.yaml; FILE.yaml or a path as given."""
    if name.endswith((".yaml", ".yml")) or os.sep in name or "/" in name:
        return Path(name)
    return Path("profiles") / f"{name}.yaml"


def include_for(profile_arg: str | None, base_source: str, path: Path) -> str:
    """How the written profile names its base: by name if the base was given by name, else
    by its path relative to the new file (absolute when that climbs out of its folder)."""
    by_name = profile_arg is None or not (profile_arg.endswith((".yaml", ".yml"))
                                          or os.sep in profile_arg)
    if by_name:
        return Path(base_source).stem
    rel = os.path.relpath(base_source, path.parent.resolve())
    return base_source if rel.startswith("..") else rel


def _profile_rules(force: bool, inputs) -> dict:
    return dict(force=force, ours=is_profile, what="vlmspec profile", inputs=list(inputs))


def check_profile_write(path: Path, base_source: str, *, force: bool, inputs=()) -> None:
    """Before anything is measured: OutputRefused (one line) unless the calibrated profile
    may be written to ``path``. Never the base profile, nor a profile it includes, nor under
    the name of one (``--write tinyworld-caption`` would shadow the include and loop), even
    with ``force``; never over an input (``inputs``: the samples); an existing file only
    with ``force``, and only if it is a vlmspec profile."""
    from vlmspec_cli.profile import include_chain

    label = f"--write {path}"
    chain = include_chain(base_source)
    if same_file(path, chain[0]):
        raise OutputRefused(f"{label}: is the base profile, which the new profile includes: "
                            "pick another name")
    for included in chain:
        if same_file(path, included) or path.stem == included.stem:
            raise OutputRefused(f"{label}: would shadow profile '{included.stem}' ({included}), "
                                "which the new profile includes: pick another name")
    check_output(path, label, **_profile_rules(force, inputs))


def write_profile(path: Path, text: str, *, force: bool, inputs=()) -> None:
    """Write the calibrated profile (checked again, atomic, the folder created)."""
    write_checked(path, text.encode("utf-8"), f"--write {path}", **_profile_rules(force, inputs))
