"""The profile schema: one dataclass per YAML section, one field per key.

This is where a profile key is defined, with its type, default and constraints (field
metadata from :func:`_rule`). Reading, merging and validating YAML against it is
``loader.py``. Adding a section means adding a dataclass here and a field on
:class:`Profile`; fields with ``metadata={"yaml": False}`` are not YAML keys (e.g.
``Profile.source``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS, LETTERS


# Upper bounds of sizes (a profile error names the key and the range): a round past them
# would allocate gigabytes and decode no faster. The fast path's compiled steps take up to
# 64 new tokens (runtime/fast/compiled_step.py BUCKETS); a draft tree of more than a few
# hundred nodes costs more to verify than it can save; torch cannot start 10^5 threads.
MAX_GAMMA = 64             # drafting.gamma: draft tokens per round
MAX_TREE_SIDE = 64         # tree.depth / tree.top_k, adaptive_tree's depth and top_k bounds
MAX_TREE_TOKENS = 512      # tree.total_tokens: nodes verified per round
MAX_THREADS = 1024         # runtime.threads / prefill_threads, hardware's measured counts


def _rule(*, choices=None, pattern=None, allowed=None, ge=None, gt=None, le=None,
          nonempty=False, shorthand=None) -> dict:
    """Field metadata describing value constraints (applied to each list item).
    ``shorthand``: a command line option's short forms of the choices (letter → choice),
    which a refused value's error then explains."""
    return {"choices": choices, "pattern": pattern, "allowed": allowed,
            "ge": ge, "gt": gt, "le": le, "nonempty": nonempty, "shorthand": shorthand}


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
    # draft tokens per round (fixed); with length auto, the most a round may draft
    gamma: int = field(default=5, metadata=_rule(ge=1, le=MAX_GAMMA))
    # auto (the default): each round's γ (1..gamma) is chosen from this request's acceptance
    # and this process's measured round costs, and drafting is off (plain target steps,
    # probing again later) while it does not pay (runtime/length/draft_length.py), so a
    # draft that does not fit the target or the machine never makes decoding slower than
    # the target alone; fixed: every round drafts gamma. Chains and trees (tree, adt: each
    # round's depth ≤ tree.depth, adt's ≤ adaptive_tree.max_depth); hidden-state heads'
    # trees keep theirs, batches gamma
    length: str = field(default="auto", metadata=_rule(choices=("fixed", "auto")))
    inputs: list[str] = field(default_factory=lambda: ["multimodal"], metadata=_rule(
        choices=DRAFTING_INPUTS, nonempty=True, shorthand={v: k for k, v in LETTERS.items()}))


@dataclass
class TreeSpec:
    """method: tree — EAGLE-2 dynamic draft trees (runtime/round/tree.py)."""

    depth: int = field(default=5, metadata=_rule(ge=1, le=MAX_TREE_SIDE))  # expansion levels
    top_k: int = field(default=4, metadata=_rule(ge=1, le=MAX_TREE_SIDE))  # children per node
    # nodes verified per round
    total_tokens: int = field(default=20, metadata=_rule(ge=1, le=MAX_TREE_TOKENS))
    # dynamic: EAGLE-2 (expand the best-scoring nodes, rerank at T = 0); static: a fixed
    # shape (a spine of depth nodes, top_k - 1 alternatives per level)
    policy: str = field(default="dynamic", metadata=_rule(choices=("dynamic", "static")))


@dataclass
class AdaptiveTreeSpec:
    """method: adt — ADT-Tree (runtime/round/tree_shape.py): each tree's depth and top_k start
    from a neighbouring image token's tree (init) and move by Eq. 2: deeper and narrower
    (+step_depth, -step_top_k) when that tree's acceptance rate α = accepted / depth
    reached beta, else shallower and wider; the first tree uses tree.depth / tree.top_k."""

    init: str = field(default="horizontal", metadata=_rule(
        choices=("horizontal", "vertical", "random")))
    beta: float = field(default=1.0, metadata=_rule(gt=0))
    step_depth: int = field(default=1, metadata=_rule(ge=0))
    step_top_k: int = field(default=2, metadata=_rule(ge=0))
    min_depth: int = field(default=1, metadata=_rule(ge=1, le=MAX_TREE_SIDE))
    max_depth: int = field(default=8, metadata=_rule(ge=1, le=MAX_TREE_SIDE))
    min_top_k: int = field(default=1, metadata=_rule(ge=1, le=MAX_TREE_SIDE))
    max_top_k: int = field(default=10, metadata=_rule(ge=1, le=MAX_TREE_SIDE))


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
class Eagle3Spec:
    """A published EAGLE-3 head (method ``eagle3``): a directory as SpecForge writes it
    (config.json with architectures LlamaForCausalLMEagle3, model.safetensors) or its hub id.
    It reads three of the target's layers (those its config names, else the engines'
    default 2, L/2, L-3) and drafts over its own vocabulary, mapped by d2t."""

    model: str | None = None
    # draft as an EAGLE-2 tree (tree: section) instead of a chain of drafting.gamma tokens
    tree: bool = False


@dataclass
class VideoSpec:
    """How describe-video samples a video (CLI --frames / --fps / --max-pixels)."""

    frames: int | None = field(default=8, metadata=_rule(ge=1))     # uniform sampling
    fps: float | None = field(default=None, metadata=_rule(gt=0))    # or by time
    max_pixels: int | None = field(default=None, metadata=_rule(ge=1))
    folder_fps: float = field(default=2.0, metadata=_rule(gt=0))     # a folder of frames
    # the most frames one video may be sampled to (--fps on a long clip, --frames N): past
    # it the video fails with both numbers, before its frames are decoded
    max_frames: int = field(default=256, metadata=_rule(ge=1))


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
    # requests decoded together; auto: the largest count that fits the memory at hand and
    # still raises the throughput measured on the first requests (tasks/batch_auto.py)
    batch_size: int | str = field(default=1, metadata=_rule(
        pattern=r"auto|[1-9][0-9]*", allowed="auto or a positive count", ge=1))

    @property
    def rows(self) -> int:
        """``batch_size`` as a count: auto counts one until its count is measured."""
        return 1 if self.batch_size == "auto" else int(self.batch_size)


@dataclass
class RuntimeSpec:
    """How the engine runs the models' forwards (not what they compute: outputs are the
    same either way)."""

    # auto: decoding steps on vlmspec's static-cache fast path (runtime/fast/fast_decoder.py)
    # for every model whose family it supports, transformers' forward for the others;
    # on: the same, and a model it cannot take is an error; off: transformers throughout
    fast_path: str = field(default="auto", metadata=_rule(choices=("auto", "on", "off")))
    # the fast path's steps through torch.compile (runtime/fast/compiled_step.py; CUDA graphs on
    # GPU). auto: only where `vlmspec profile --compile` measured that compiled steps are
    # faster on this hardware (the hardware section) and the job is long enough to repay
    # the warm-up; on: always (the fast path must be on); off: never
    compile: str = field(default="auto", metadata=_rule(choices=("auto", "on", "off")))
    # CPU threads of torch's operators (torch.set_num_threads, runtime/threads.py) while
    # decoding (drafting and verifying rounds), and while prefilling a prompt. auto: the
    # count `vlmspec profile` measured fastest for this profile on this machine
    # (hardware.threads, hardware.prefill_threads), else torch's default (one per core),
    # lowered before each phase to the cores other processes leave free (at least 1); a
    # count is never changed. A small model's steps take microseconds per operator,
    # which threads can slow down; a long prompt's prefill gains from every core
    threads: int | str = field(default="auto", metadata=_rule(
        pattern=r"auto|[1-9][0-9]*", allowed="auto or a positive count", ge=1, le=MAX_THREADS))
    prefill_threads: int | str = field(default="auto", metadata=_rule(
        pattern=r"auto|[1-9][0-9]*", allowed="auto or a positive count", ge=1, le=MAX_THREADS))
    # a prompt of at least this many positions (a long video) decodes at prefill_threads:
    # its rounds' attention over the whole context is compute enough for every core.
    # null: rounds always at threads
    long_context: int | None = field(default=None, metadata=_rule(ge=1))


@dataclass
class HardwareSpec:
    """Written by ``vlmspec profile`` (a hardware profile other profiles ``include:``)."""

    latency_ratio: float | None = field(default=None, metadata=_rule(gt=0))  # T_q / T_p
    device: str | None = None            # e.g. "cuda:0 (NVIDIA H100)" or "cpu (2 threads)"
    dtype: str | None = None
    torch: str | None = None
    transformers: str | None = None
    date: str | None = None
    # timings in ms, >= 0:
    target_ms: float | None = field(default=None, metadata=_rule(ge=0))  # T_p(1, S, 1): one target step
    # T_p(1, S, γ): the target verifying γ tokens
    target_verify_ms: float | None = field(default=None, metadata=_rule(ge=0))
    # T_q(B, S, 1): one draft step, B = drafting rows
    draft_ms: float | None = field(default=None, metadata=_rule(ge=0))
    prefill_ms: float | None = field(default=None, metadata=_rule(ge=0))  # the sample request's
    # `vlmspec profile --compile`: one step compiled (runtime.compile), and the compile
    # warm-up (seconds) of the buckets the profile's method uses, as measured here
    compiled_target_ms: float | None = field(default=None, metadata=_rule(ge=0))
    compiled_draft_ms: float | None = field(default=None, metadata=_rule(ge=0))
    compile_warmup_s: float | None = field(default=None, metadata=_rule(ge=0))
    # the CPU thread counts that ran the sample requests' rounds and their prefills
    # fastest (runtime.threads / prefill_threads: auto use them)
    threads: int | None = field(default=None, metadata=_rule(ge=1, le=MAX_THREADS))
    prefill_threads: int | None = field(default=None, metadata=_rule(ge=1, le=MAX_THREADS))
    # the full tables: target_verify_ms[S][k], draft_step_ms[B][S], remarks
    measurements: Any = None


@dataclass
class Profile:
    name: str = "default"
    description: str = ""
    task: str = field(default="caption", metadata=_rule(choices=("caption", "image", "video")))
    target: ModelSpec = field(default_factory=lambda: ModelSpec(model="zoo:tinyworld/llava-target-deep"))
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(model="zoo:tinyworld/llava-deep-draft"))
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
    eagle3: Eagle3Spec = field(default_factory=Eagle3Spec)
    video: VideoSpec = field(default_factory=VideoSpec)
    prune: PruneSpec = field(default_factory=PruneSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    generation: GenerationSpec = field(default_factory=GenerationSpec)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
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
