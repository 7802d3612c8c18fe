"""Run profiles: which target/draft models, which method, which parameters.

A profile is a YAML file whose keys map one-to-one onto the dataclasses below.
Everything here is generic over ``dataclasses.fields`` and
``typing.get_type_hints``: adding a section means adding a dataclass and a
field on :class:`Profile`; per-field constraints live in field metadata
(see :func:`_rule`).  Fields with ``metadata={"yaml": False}`` are not YAML
keys (e.g. ``Profile.source``).

Precedence, highest first: ``cli`` dict > ``--set`` overrides > profile YAML
(the including file over its includes) > dataclass defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS

DEFAULT_PROFILE = "tinyworld-caption"
ENV_VAR = "VLMSPEC_PROFILES"
_SUFFIXES = (".yaml", ".yml")


class ProfileError(Exception):
    """A user-facing profile problem; the message names the file and key path."""


def _rule(*, choices=None, pattern=None, allowed=None, ge=None, gt=None, le=None,
          nonempty=False) -> dict:
    """Field metadata describing value constraints (applied to each list item)."""
    return {"choices": choices, "pattern": pattern, "allowed": allowed,
            "ge": ge, "gt": gt, "le": le, "nonempty": nonempty}


# --------------------------------------------------------------------- schema
@dataclass
class ModelSpec:
    model: str | None = None
    dtype: str = field(default="auto", metadata=_rule(
        choices=("auto", "float32", "float16", "bfloat16")))
    device: str = field(default="auto", metadata=_rule(
        pattern=r"auto|cpu|cuda|cuda:\d+|mps", allowed="auto, cpu, cuda, cuda:N, mps"))
    quantize: str = field(default="none", metadata=_rule(choices=("none", "int8", "nf4", "fp4")))
    # int8 only. 0: plain int8 with per-token activation scales, so a token's result does
    # not depend on the other tokens of a forward and speculative/batched decoding equals
    # the int8 model's own decoding. > 0 (LLM.int8's 6.0): outlier columns, picked over
    # all tokens of a forward, run in fp16 -- better quality on large models, but the
    # int8 target's output then depends on how many tokens it sees at once (lossy).
    int8_threshold: float = field(default=0.0, metadata=_rule(ge=0))
    revision: str | None = None
    trust_remote_code: bool = False


@dataclass
class DraftingSpec:
    gamma: int = field(default=5, metadata=_rule(ge=1))
    inputs: list[str] = field(default_factory=lambda: ["multimodal"], metadata=_rule(
        choices=DRAFTING_INPUTS, nonempty=True))


@dataclass
class TreeSpec:
    """method: tree — EAGLE-2 dynamic draft trees (runtime/tree.py)."""

    depth: int = field(default=5, metadata=_rule(ge=1))          # expansion levels
    top_k: int = field(default=4, metadata=_rule(ge=1))          # children per node, frontier size
    total_tokens: int = field(default=20, metadata=_rule(ge=1))  # nodes verified per round
    # dynamic: EAGLE-2 (expand the best-scoring nodes, rerank at T = 0); static: a fixed
    # shape (a spine of depth nodes, top_k - 1 alternatives per level)
    policy: str = field(default="dynamic", metadata=_rule(choices=("dynamic", "static")))


@dataclass
class AdaptiveTreeSpec:
    """method: adt — ADT-Tree (runtime/tree_shape.py): each tree's depth and top_k start
    from a neighbouring image token's tree (init) and move by Eq. 2: deeper and narrower
    (+step_depth, -step_top_k) when that tree's acceptance rate α = accepted / depth
    reached beta, else shallower and wider; the first tree uses tree.depth / tree.top_k."""

    init: str = field(default="horizontal", metadata=_rule(
        choices=("horizontal", "vertical", "random")))
    beta: float = field(default=1.0, metadata=_rule(gt=0))
    step_depth: int = field(default=1, metadata=_rule(ge=0))
    step_top_k: int = field(default=2, metadata=_rule(ge=0))
    min_depth: int = field(default=1, metadata=_rule(ge=1))
    max_depth: int = field(default=8, metadata=_rule(ge=1))
    min_top_k: int = field(default=1, metadata=_rule(ge=1))
    max_top_k: int = field(default=10, metadata=_rule(ge=1))


@dataclass
class RelaxedSpec:
    """acceptance: relaxed — LANTERN-style latent proximity (LOSSY): a draft image token's
    target probability is raised by the target mass of its nearest VQ codes, nearest
    first, up to delta in total."""

    neighbours: int = field(default=8, metadata=_rule(ge=1))     # k nearest codes
    delta: float = field(default=0.3, metadata=_rule(ge=0, le=1))


@dataclass
class ImageSpec:
    """generate-image: classifier-free guidance and images per prompt."""

    cfg: float | None = field(default=None, metadata=_rule(ge=0))   # None: the model's own
    images_per_prompt: int = field(default=1, metadata=_rule(ge=1))


@dataclass
class CaptionerSpec(ModelSpec):
    """The lightweight image-to-text model behind caption drafting (C)."""

    prompt: str = "describe the image."
    max_new_tokens: int = field(default=48, metadata=_rule(ge=1))


@dataclass
class EnsembleSpec:
    """TABED weights (method ``tabed``): how the members' drafts are mixed each block."""

    # grid: w_j = [1-j/n, j/n] (n = grid; for m > 2 members, every point of the simplex
    # with step 1/n); softmax: w = softmax(1/e; temperature), e = each member's own
    # distance; static: equal weights, never adapted (MT, MTCP).
    policy: str = field(default="grid", metadata=_rule(choices=("grid", "softmax", "static")))
    distance: str = field(default="kl", metadata=_rule(choices=("kl", "tvd")))
    # verified positions the distance is summed over: a count h, or all of them
    window: int | str = field(default="all", metadata=_rule(
        pattern=r"all|[1-9][0-9]*", allowed="all or a positive count"))
    grid: int = field(default=10, metadata=_rule(ge=1))
    temperature: float = field(default=1.0, metadata=_rule(gt=0))


@dataclass
class TwigSpec:
    """Self-speculation (method ``twig``, TwigVLM): the draft is the target's first K
    layers + a twig (T trained layers, norm, head). ``model: none`` = plain layer-skip
    (first K layers + the target's own head, training-free)."""

    model: str | None = "zoo:tinyworld/llava-twig"
    # K: target layers the draft shares; default: the layer the twig was trained on
    layers: int | None = field(default=None, metadata=_rule(ge=1))
    # θ: stop drafting early after a token whose draft probability is below this (0: off);
    # the number of tokens per draft is capped by drafting.gamma (δ)
    threshold: float = field(default=0.6, metadata=_rule(ge=0, le=1))


@dataclass
class HiddenSpec:
    """Hidden-state draft head (method ``hidden``, HiViS / Sparrow): reads the target's
    text-position hidden states and attends over text positions only."""

    model: str | None = "zoo:tinyworld/llava-hidden"
    # which target hidden_states the head reads (-1: last layer, HiViS; -2: Sparrow);
    # default: the layer the head was trained on (a different one is an error)
    layer: int | None = None
    # draft as an EAGLE-2 tree (tree: section) instead of a chain of drafting.gamma tokens
    tree: bool = False


@dataclass
class VideoSpec:
    """How describe-video samples a video (CLI --frames / --fps / --max-pixels)."""

    frames: int | None = field(default=8, metadata=_rule(ge=1))     # uniform sampling
    fps: float | None = field(default=None, metadata=_rule(gt=0))    # or by time
    max_pixels: int | None = field(default=None, metadata=_rule(ge=1))
    folder_fps: float = field(default=2.0, metadata=_rule(gt=0))     # a folder of frames


@dataclass
class PruneSpec:
    """Twig-guided visual-token pruning (TwigVLM TTP, method ``twig``). Opt-in and LOSSY:
    setting keep or final_wipe makes records say lossless: false."""

    keep: int | None = field(default=None, metadata=_rule(ge=0))        # R visual tokens
    layer: int | None = field(default=None, metadata=_rule(ge=1))       # first pruned layer (default K)
    final_wipe: int | None = field(default=None, metadata=_rule(ge=1))  # K_f: no visual tokens from here

    @property
    def active(self) -> bool:
        return self.keep is not None or self.final_wipe is not None


@dataclass
class SamplingSpec:
    temperature: float = field(default=0.0, metadata=_rule(ge=0))
    top_p: float = field(default=1.0, metadata=_rule(gt=0, le=1))
    seed: int = 0


@dataclass
class GenerationSpec:
    max_new_tokens: int = field(default=64, metadata=_rule(ge=1))
    prompt: str = "describe the image."
    batch_size: int = field(default=1, metadata=_rule(ge=1))   # requests decoded together


@dataclass
class HardwareSpec:
    """Written by ``vlmspec profile`` (a hardware profile other profiles ``include:``)."""

    latency_ratio: float | None = field(default=None, metadata=_rule(gt=0))  # T_q / T_p
    device: str | None = None            # e.g. "cuda:0 (NVIDIA H100)" or "cpu (2 threads)"
    dtype: str | None = None
    torch: str | None = None
    transformers: str | None = None
    date: str | None = None
    target_ms: float | None = None       # T_p(1, S, 1): one target decoding step
    target_verify_ms: float | None = None  # T_p(1, S, γ): the target verifying γ tokens
    draft_ms: float | None = None        # T_q(B, S, 1): one draft step, B = drafting rows
    prefill_ms: float | None = None      # target prefill of the sample request
    # the full tables: target_verify_ms[S][k], draft_step_ms[B][S], remarks
    measurements: Any = None


@dataclass
class Profile:
    name: str = "default"
    description: str = ""
    task: str = field(default="caption", metadata=_rule(choices=("caption", "image", "video")))
    target: ModelSpec = field(default_factory=lambda: ModelSpec(model="zoo:tinyworld/llava-target"))
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(model="zoo:tinyworld/llava-draft"))
    captioner: CaptionerSpec = field(
        default_factory=lambda: CaptionerSpec(model="zoo:tinyworld/captioner"))
    method: str = "chain"
    drafting: DraftingSpec = field(default_factory=DraftingSpec)
    tree: TreeSpec = field(default_factory=TreeSpec)
    adaptive_tree: AdaptiveTreeSpec = field(default_factory=AdaptiveTreeSpec)
    # exact: speculative decoding's own test (lossless); relaxed: see RelaxedSpec (lossy)
    acceptance: str = field(default="exact", metadata=_rule(choices=("exact", "relaxed")))
    relaxed: RelaxedSpec = field(default_factory=RelaxedSpec)
    image: ImageSpec = field(default_factory=ImageSpec)
    ensemble: EnsembleSpec = field(default_factory=EnsembleSpec)
    twig: TwigSpec = field(default_factory=TwigSpec)
    hidden: HiddenSpec = field(default_factory=HiddenSpec)
    video: VideoSpec = field(default_factory=VideoSpec)
    prune: PruneSpec = field(default_factory=PruneSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    generation: GenerationSpec = field(default_factory=GenerationSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    # Where the profile was loaded from. Not a YAML key, not compared, not dumped.
    source: str = field(default="<defaults>", init=False, repr=False, compare=False,
                        metadata={"yaml": False})

    @property
    def lossless(self) -> bool:
        # Every option that can change the output distribution makes this False:
        # visual-token pruning changes the target that drafts are verified against, and an
        # int8 target with outlier decomposition computes a token differently depending on
        # the other tokens verified (or batched) with it; relaxed acceptance accepts
        # draft tokens the target would not have emitted.
        t = self.target
        return (not self.prune.active and self.acceptance == "exact"
                and not (t.quantize == "int8" and t.int8_threshold > 0))


# ------------------------------------------------------------ schema helpers
def _yaml_fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)}


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _union_args(tp) -> tuple | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _section_type(tp):
    """The dataclass behind a section type (``X`` or ``X | None``), else None."""
    args = _union_args(tp)
    if args is not None:
        rest = [a for a in args if a is not type(None)]
        tp = rest[0] if len(rest) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _is_optional(tp) -> bool:
    args = _union_args(tp)
    return args is not None and type(None) in args


def _type_name(tp) -> str:
    args = _union_args(tp)
    if args is not None:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (Any,)
        return f"list of {_type_name(item)}"
    if _section_type(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def profile_keys(cls=Profile, prefix: str = "") -> list[str]:
    """All valid dotted leaf keys, e.g. ``drafting.gamma``."""
    out = []
    for name in _yaml_fields(cls):
        sect = _section_type(_hints(cls)[name])
        out += profile_keys(sect, _join(prefix, name)) if sect else [_join(prefix, name)]
    return out


def _leaf_type(parts: list[str]):
    cls, tp = Profile, None
    for part in parts:
        if cls is None or part not in _yaml_fields(cls):
            return None
        tp = _hints(cls)[part]
        cls = _section_type(tp)
    return tp


# ---------------------------------------------------------------- validation
def _unknown_key(cls, key, prefix: str, source: str) -> ProfileError:
    valid = list(_yaml_fields(cls))
    msg = f"{source}: unknown key '{_join(prefix, key)}'"
    match = difflib.get_close_matches(str(key), valid, n=1)
    if match:
        return ProfileError(f"{msg} (did you mean '{_join(prefix, match[0])}'?)")
    # Maybe the key belongs to another section (e.g. top-level 'temperature').
    by_leaf: dict[str, list[str]] = {}
    for k in profile_keys():
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    match = difflib.get_close_matches(str(key), list(by_leaf), n=1, cutoff=0.8)
    if match:  # a leaf in several sections (temperature): name them all
        options = " or ".join(f"'{k}'" for k in by_leaf[match[0]])
        return ProfileError(f"{msg} (did you mean {options}?)")
    where = f"under '{prefix}'" if prefix else "at top level"
    return ProfileError(f"{msg}; valid keys {where}: {', '.join(valid)}")


def _coerce(value, tp, key: str, source: str):
    """Type-check ``value`` against ``tp``; only int->float is converted."""
    def bad():
        got = "null" if value is None else type(value).__name__
        return ProfileError(f"{source}: key '{key}' expects {_type_name(tp)}, "
                            f"got {got} {value!r}")

    args = _union_args(tp)
    if args is not None:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ProfileError:
                pass
        raise bad()
    if tp is Any:
        return value
    if typing.get_origin(tp) is list:
        if not isinstance(value, (list, tuple)):
            raise bad()
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad()
    if tp is int and isinstance(value, bool):
        raise bad()
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise bad()


def _check(value, meta: Mapping, key: str, source: str) -> None:
    if value is None or not meta:
        return
    if meta.get("nonempty") and isinstance(value, list) and not value:
        raise ProfileError(f"{source}: key '{key}' must not be empty")
    for item in value if isinstance(value, list) else [value]:
        choices, pattern = meta.get("choices"), meta.get("pattern")
        if (choices and item not in choices) or (pattern and not re.fullmatch(pattern, str(item))):
            allowed = meta.get("allowed") or ", ".join(map(str, choices))
            msg = f"{source}: key '{key}' must be one of: {allowed} (got {item!r})"
            close = difflib.get_close_matches(str(item), [str(c) for c in choices or ()], n=1)
            raise ProfileError(msg + (f"; did you mean '{close[0]}'?" if close else ""))
        for op, ok, sym in (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
                            ("le", lambda a, b: a <= b, "<=")):
            bound = meta.get(op)
            if bound is not None and not ok(item, bound):
                raise ProfileError(f"{source}: key '{key}' must be {sym} {bound} (got {item!r})")


def _normalize(cls, data, prefix: str, source: str) -> dict:
    """Validate one layer (nested dict) against ``cls``; returns checked values."""
    if not isinstance(data, dict):
        what = f"key '{prefix}'" if prefix else "top level"
        raise ProfileError(f"{source}: {what} must be a mapping, got {type(data).__name__}")
    fields, hints, out = _yaml_fields(cls), _hints(cls), {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(cls, key, prefix, source)
        tp, path = hints[key], _join(prefix, key)
        sect = _section_type(tp)
        if sect is not None and isinstance(value, dict):
            out[key] = _normalize(sect, value, path, source)
        elif sect is not None and value is None:
            # An empty section (all keys commented out) means "no changes".
            out[key] = None if _is_optional(tp) else {}
        elif sect is not None:
            raise ProfileError(f"{source}: key '{path}' must be a mapping, "
                               f"got {type(value).__name__} {value!r}")
        else:
            out[key] = _coerce(value, tp, path, source)
            _check(out[key], fields[key].metadata, path, source)
    return out


def _merge(base: dict, top: dict) -> dict:
    """Deep merge: dicts merge recursively, everything else (lists too) is replaced."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _dotted_layer(key: str, value, source: str) -> dict:
    parts = str(key).split(".")
    if not all(parts):
        raise ProfileError(f"{source}: invalid key path '{key}'")
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    return _normalize(Profile, nested, "", source)


def _build(base, data: dict):
    kwargs = {}
    for name, f in _yaml_fields(type(base)).items():
        if name not in data or not f.init:
            continue
        value, sect = data[name], _section_type(_hints(type(base))[name])
        if sect is not None and isinstance(value, dict):
            value = _build(getattr(base, name) or sect(), value)
        kwargs[name] = list(value) if isinstance(value, list) else value
    return dataclasses.replace(base, **kwargs)


# ------------------------------------------------------------------- finding
def _display(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _packaged_dir() -> Path:
    try:
        from importlib.resources import files
        res = files("vlmspec_cli.profiles")
        if isinstance(res, Path) and res.is_dir():
            return res
    except (ImportError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / "profiles"


def profile_search_path() -> list[Path]:
    """Directories where profile names resolve, highest priority first."""
    dirs = [Path(d) for d in os.environ.get(ENV_VAR, "").split(os.pathsep) if d]
    local = Path.cwd() / "profiles"
    if local.is_dir():
        dirs.append(local)
    dirs.append(_packaged_dir())
    seen, out = set(), []
    for d in dirs:
        real = d.resolve()
        if real not in seen:
            seen.add(real)
            out.append(d)
    return out


def _lookup_name(name: str) -> Path | None:
    stem = name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
    for d in profile_search_path():
        for suffix in _SUFFIXES:
            if (cand := d / f"{stem}{suffix}").is_file():
                return cand
    return None


def resolve_profile_path(name_or_path: str | os.PathLike) -> Path:
    """An existing file path, or a profile name looked up in the search path."""
    text = os.fspath(name_or_path)
    if Path(text).is_file():
        return Path(text)
    if os.sep in text or "/" in text:
        raise ProfileError(f"profile file not found: {text}")
    found = _lookup_name(text)
    if found is None:
        names = [n for n, _, _ in list_profiles()]
        close = difflib.get_close_matches(text, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ProfileError(f"unknown profile '{text}'{hint}; available: "
                           f"{', '.join(names) or '(none)'}")
    return found


def _read_yaml(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ProfileError(f"{_display(path)}: cannot read profile: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(f"{_display(path)}: invalid YAML{where}: "
                           f"{e.problem or e.context or e}") from e
    except yaml.YAMLError as e:
        raise ProfileError(f"{_display(path)}: invalid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{_display(path)}: top level must be a mapping of keys, "
                           f"got {type(data).__name__}")
    return data


def list_profiles() -> list[tuple[str, Path, str]]:
    """(name, path, description) of every profile on the search path; first wins."""
    out, seen = [], set()
    for d in profile_search_path():
        files = sorted(p for s in _SUFFIXES for p in d.glob(f"*{s}")) if d.is_dir() else []
        for p in files:
            if p.stem in seen:
                continue
            seen.add(p.stem)
            try:
                desc = str(_read_yaml(p).get("description", "") or "")
            except ProfileError as e:
                desc = f"(invalid: {e})"
            out.append((p.stem, p, desc))
    return out


# ------------------------------------------------------------------- loading
def _file_layer(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    real = path.resolve()
    if real in chain:
        names = " -> ".join(_display(p) for p in (*chain, real))
        raise ProfileError(f"{_display(chain[-1])}: include cycle: {names}")
    data = dict(_read_yaml(path))
    source = _display(path)
    includes = data.pop("include", None)
    if includes is None:
        includes = []
    elif isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ProfileError(f"{source}: key 'include' must be a file name or a list of them")
    merged: dict = {}
    for inc in includes:
        cand = path.parent / inc
        target = cand if cand.is_file() else _lookup_name(inc)
        if target is None:
            raise ProfileError(f"{source}: include '{inc}' not found next to the file "
                               f"or in the profile search path")
        merged = _merge(merged, _file_layer(target, (*chain, real)))
    return _merge(merged, _normalize(Profile, data, "", source))


def load_profile(name_or_path: str | os.PathLike | None = None,
                 overrides: Iterable[str] = (),
                 cli: Mapping[str, Any] | None = None) -> Profile:
    """Load, merge and validate a profile. See the module docstring for precedence."""
    path = resolve_profile_path(DEFAULT_PROFILE if name_or_path is None else name_or_path)
    data = _file_layer(path)
    for item in overrides:
        source = f"--set {item}"
        key, sep, raw = str(item).partition("=")
        if not sep:
            raise ProfileError(f"{source}: expected KEY=VALUE (e.g. sampling.temperature=0.7)")
        key = key.strip()
        try:
            value = yaml.safe_load(raw)
            parse_error = None
        except yaml.YAMLError as e:
            value, parse_error = None, e
        tp = _leaf_type(key.split("."))
        # For string keys, take the text verbatim if YAML turned it into
        # something else (e.g. 'revision=1234', 'prompt=yes') or failed.
        str_key = tp is str or (_union_args(tp) is not None and str in _union_args(tp))
        if str_key and (parse_error is not None or not isinstance(value, (str, type(None)))):
            value, parse_error = raw, None
        if parse_error is not None:
            raise ProfileError(f"{source}: cannot parse value: "
                               f"{getattr(parse_error, 'problem', None) or parse_error}")
        data = _merge(data, _dotted_layer(key, value, source))
    for key, value in (cli or {}).items():
        if value is not None:
            data = _merge(data, _dotted_layer(key, value, f"command line option '{key}'"))
    profile = _build(Profile(), data)
    profile.source = str(path.resolve())
    return profile


# ------------------------------------------------------------------- dumping
def profile_to_dict(p) -> dict:
    """Plain nested dict of YAML keys (no ``source``); round-trips through load."""
    out = {}
    for name in _yaml_fields(type(p)):
        value = getattr(p, name)
        if dataclasses.is_dataclass(value):
            value = profile_to_dict(value)
        elif isinstance(value, list):
            value = list(value)
        out[name] = value
    return out


def profile_to_yaml(p) -> str:
    return yaml.safe_dump(profile_to_dict(p), sort_keys=False, allow_unicode=True)
