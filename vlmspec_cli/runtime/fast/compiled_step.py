"""Compiled decoding steps for the fast path (``runtime.compile``).

``FastDecoder.run`` in eager mode is already lean, but each layer is still a dozen small
PyTorch calls, and for the small drafts and mid-size targets speculation uses those calls'
fixed cost is most of a step. ``CompiledSteps`` runs the same layers through
``torch.compile`` (inductor; CUDA graphs via ``mode="reduce-overhead"`` on GPU) so a step
is a few fused kernels.

What makes it compile once and not every round:

* **Fixed shapes.** The new rows are padded to a bucket (1, 2, 4, 8, 12, …, 64 tokens); the padded
  rows only see themselves and their keys/values are never written to the cache. The
  cache's capacity is marked dynamic, so requests of different lengths share one graph.
* **No mutation inside the graph.** The compiled function reads the cache and returns the
  new rows' keys and values; the caller writes the ``n`` real ones in place afterwards.
  (Writing into a graph input from inside the graph made inductor copy whole buffers
  every step — slower than eager.) Attention is therefore split in two parts over the
  same softmax: the cached positions ``[0, start)`` and the new rows ``[start, start+n)``,
  concatenated only as scores (B, heads, n, capacity + n), never as keys.

The maths is the eager step's: softmax(q·kᵀ·scale + mask)·v over the same visible
positions, in float32 for the softmax; only rounding differs. The losslessness tests run
with compile on as well as off.
"""

from __future__ import annotations

import time

import torch

from vlmspec_cli.runtime.adapters.base import pick_layers
from vlmspec_cli.runtime.fast.fast_decoder import additive, layer_indices, project_qkv

# row counts steps are padded to: powers of two, and between them from 8 on (a 20-node
# tree verifies 21 rows: padded to 24, not 32)
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
_LOW = torch.finfo(torch.float32).min   # an additive mask's "not visible"


def _cache_mask(keys: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """(1, 1, 1, capacity) additive: the cache's first ``start`` slots are visible."""
    slots = torch.arange(keys.shape[3], device=keys.device)
    return torch.where(slots < start, 0.0, _LOW).view(1, 1, 1, -1)


def bucket_for(n: int) -> int | None:
    """The padded length for ``n`` new rows, or None when too many (eager then)."""
    for b in BUCKETS:
        if n <= b:
            return b
    return None


def _allow_recompiles(limit: int = 64) -> None:
    """One graph per (bucket, hidden layer, mask batch) is expected; the default limit of
    eight per function would fall back to eager silently."""
    import torch._dynamo

    config = torch._dynamo.config   # the limit's name as this torch spells it (both in 2.x)
    if hasattr(config, "recompile_limit"):
        config.recompile_limit = max(limit, config.recompile_limit)
    if hasattr(config, "cache_size_limit"):
        config.cache_size_limit = max(limit, config.cache_size_limit)


class CompiledSteps:
    """The compiled step of one ``FastDecoder`` (its layers, its shapes)."""

    def __init__(self, decoder) -> None:
        self.decoder = decoder
        self.cuda = decoder.device.type == "cuda"
        _allow_recompiles()   # (the compile cache directory: vlmspec_cli/__init__.py)
        mode = "reduce-overhead" if self.cuda else None
        self.step = torch.compile(self._layers, mode=mode, fullgraph=True)
        self.chain = torch.compile(self._chain, mode=mode, fullgraph=True)
        self.shapes: set[tuple] = set()   # shapes compiled so far (one graph each)
        self.compile_s = 0.0              # wall time of the calls that compiled
        self.warm = False                 # set after warm-up: compiles after it are counted
        self.late_compiles = 0
        self.max_rows = BUCKETS[-1]

    def _layers(self, embeds, keys, values, position_ids, start, cache_mask, new_mask,
                want: tuple[int, ...]):
        """The decoder layers over ``embeds`` (B, nb, H) at ``position_ids``: returns the
        final-normed states, the ``want`` entries of hidden_states (as transformers numbers
        them; several are concatenated), and the new rows' keys and values (L, B, kv_heads, nb, head_dim). Without
        masks (plain causal decoding) they are built here from ``start`` (a 0-d tensor:
        the cached positions), so the common step is one graph end to end."""
        nb = embeds.shape[1]
        if cache_mask is None:
            cache_mask = _cache_mask(keys, start)
            # padded rows may see the real rows before them: nothing reads their outputs,
            # and no real row sees them
            rows = torch.arange(nb, device=embeds.device)
            new_mask = torch.where(rows[None, :] <= rows[:, None], 0.0, _LOW).view(1, 1, nb, nb)
        cos, sin = self.decoder.stack.rotary(embeds, position_ids)
        out, chosen, new_keys, new_values = self._stack(embeds, cos, sin, keys, values,
                                                        cache_mask, new_mask, None, want)
        return out, chosen, torch.stack(new_keys), torch.stack(new_values)

    def _stack(self, embeds, cos, sin, keys, values, cache_mask, new_mask, prefix,
               want: tuple[int, ...]):
        """The layers over ``embeds`` (B, nb, H): attention over the cache (``cache_mask``)
        and over the new rows — ``prefix`` (per layer, keys and values of rows computed
        earlier in the same graph, or None) then these — with ``new_mask``."""
        d = self.decoder
        batch, nb, _ = embeds.shape
        groups = d.heads // d.kv_heads
        cos, sin = cos[:, None], sin[:, None]
        cap = keys.shape[3]
        h = embeds
        picked = {0: embeds}
        new_keys, new_values = [], []
        for i, layer in enumerate(d.layers):
            attn = layer.self_attn
            q, k, v = project_qkv(layer, h, d.head_dim, cos, sin)
            new_keys.append(k)
            new_values.append(v)
            if prefix is not None:
                k = torch.cat([prefix[0][i], k], dim=2)
                v = torch.cat([prefix[1][i], v], dim=2)
            # query head j uses key/value head j // groups (as transformers' repeat_kv)
            qg = q.reshape(batch, d.kv_heads, groups, nb, d.head_dim).float()
            old = torch.matmul(qg, keys[i][:, :, None].float().transpose(-1, -2))
            new = torch.matmul(qg, k[:, :, None].float().transpose(-1, -2))
            # one softmax over [cached positions | new rows], masks additive (0 / -inf-ish)
            scores = torch.cat([old * d.scaling + cache_mask[:, :, None],
                                new * d.scaling + new_mask[:, :, None]], dim=-1)
            p = torch.softmax(scores, dim=-1)
            o = (torch.matmul(p[..., :cap], values[i][:, :, None].float())
                 + torch.matmul(p[..., cap:], v[:, :, None].float()))
            o = o.to(h.dtype).reshape(batch, d.heads, nb, d.head_dim)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(batch, nb, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if i + 1 in want:
                picked[i + 1] = h
        out = d.stack.norm(h)
        picked[len(d.layers)] = out
        chosen = pick_layers(picked, want if len(want) > 1 else want[0]) if want else embeds
        return out, chosen, new_keys, new_values

    def _chain(self, first, keys, values, start, steps: int):
        """Greedy drafting in one graph: ``first`` (B, 1) is the first proposal; each of the
        next ``steps - 1`` is the argmax of the draft's logits after feeding the one before.
        Returns the proposals (B, steps) and the keys/values of the ``steps - 1`` fed
        tokens (L, B, kv_heads, steps - 1, head_dim), as the step-by-step loop leaves them."""
        d = self.decoder
        cache_mask = _cache_mask(keys, start)
        token, tokens = first, [first]
        fed_k: list[list[torch.Tensor]] = [[] for _ in d.layers]
        fed_v: list[list[torch.Tensor]] = [[] for _ in d.layers]
        for j in range(steps - 1):
            h = d.stack.embed(token)
            pos = (start + j).view(1, 1).expand(token.shape[0], 1)
            cos, sin = d.stack.rotary(h, pos)
            prefix = None if j == 0 else ([torch.cat(x, dim=2) for x in fed_k],
                                          [torch.cat(x, dim=2) for x in fed_v])
            new_mask = torch.zeros(1, 1, 1, j + 1, device=h.device)
            out, _, nk, nv = self._stack(h, cos, sin, keys, values, cache_mask, new_mask,
                                         prefix, ())
            for i in range(len(d.layers)):
                fed_k[i].append(nk[i])
                fed_v[i].append(nv[i])
            token = d.stack.head(out[:, -1:]).argmax(-1)
            tokens.append(token)
        return (torch.cat(tokens, dim=1), torch.stack([torch.cat(x, dim=2) for x in fed_k]),
                torch.stack([torch.cat(x, dim=2) for x in fed_v]))

    @torch.inference_mode()
    def greedy_chain(self, first: torch.Tensor, cache, steps: int) -> torch.Tensor:
        """``steps`` greedy proposals from the draft in one compiled call (see ``_chain``);
        the cache gains the ``steps - 1`` fed tokens, as after ``steps - 1`` decoding
        steps. ``first``: (B, 1) token ids. Returns (B, steps) on the device."""
        start = cache.length
        cache.reserve(steps)
        tokens, new_k, new_v = self._call(("chain", first.shape[0], steps), self.chain, first,
                                          cache.keys, cache.values,
                                          torch.tensor(start, device=first.device), steps)
        _store(cache, start, steps - 1, new_k, new_v)
        return tokens.clone() if self.cuda else tokens

    def _call(self, shape: tuple, fn, *args):
        """``fn(*args)`` (a compiled function; the cache's capacity, args 1-2 after the
        first, is dynamic), counting a first call for ``shape`` as a compile: its time, and
        whether it came after the warm-up."""
        for t in args[1:3]:
            torch._dynamo.mark_dynamic(t, 3)
        fresh = shape not in self.shapes
        t0 = time.perf_counter()
        out = fn(*args)
        if fresh:
            self.shapes.add(shape)
            self.compile_s += time.perf_counter() - t0
            self.late_compiles += int(self.warm)
        return out

    def run(self, embeds, cache, attention_mask, position_ids, want: tuple[int, ...] | None):
        """As ``FastDecoder.run`` for n <= the largest bucket; ``want``: the hidden_states
        entries to return (concatenated), as indices in [0, layers] (None: none)."""
        batch, n, width = embeds.shape
        nb = bucket_for(n)
        start = cache.length
        cache.reserve(n)
        if position_ids is None:
            position_ids = torch.arange(start, start + n, device=embeds.device)[None].expand(batch, n)
        if nb > n:
            embeds = torch.cat([embeds, embeds.new_zeros(batch, nb - n, width)], dim=1)
            last = position_ids[..., -1:]
            extra = last + torch.arange(1, nb - n + 1, device=last.device)
            position_ids = torch.cat([position_ids, extra], dim=-1)
        cache_mask = new_mask = None
        if attention_mask is not None:
            cache_mask, new_mask = self._masks(attention_mask, batch, n, nb, start,
                                               cache.capacity, embeds)
            torch._dynamo.mark_dynamic(cache_mask, 3)
        w = () if want is None else tuple(want)
        lead = None if cache_mask is None else (cache_mask.shape[0], new_mask.shape[0])
        out, chosen, new_k, new_v = self._call(
            (batch, nb, lead, w, str(embeds.dtype)), self.step, embeds, cache.keys,
            cache.values, position_ids, torch.tensor(start, device=embeds.device), cache_mask,
            new_mask, w)
        _store(cache, start, n, new_k[:, :, :, :n], new_v[:, :, :, :n])
        out, chosen = out[:, :n], chosen[:, :n]
        if self.cuda:   # CUDA-graph outputs are overwritten by the next replay
            out, chosen = out.clone(), chosen.clone()
        return out, (chosen if want is not None else None)

    @staticmethod
    def _masks(attention_mask, batch: int, n: int, nb: int, start: int, capacity: int, like):
        """Additive masks for the padded rows: over the cache's ``capacity`` slots (only
        ``[0, start)`` can be visible) and among the ``nb`` new rows (a padded row sees
        only itself)."""
        dtype = torch.float32
        device = like.device
        low = torch.finfo(dtype).min
        slots = torch.arange(capacity, device=device)
        rows = torch.arange(nb, device=device)
        if attention_mask.dim() == 4:
            given = attention_mask   # bool (True = visible) or additive
            given = additive(given, dtype) if given.dtype == torch.bool else given.to(dtype)
            lead = given.shape[0]
            cache_mask = torch.full((lead, 1, nb, capacity), low, dtype=dtype, device=device)
            cache_mask[:, :, :n, :start] = given[..., :n, :start]
            new_mask = torch.full((lead, 1, nb, nb), low, dtype=dtype, device=device)
            new_mask[:, :, :n, :n] = given[..., :n, start:start + n]
            new_mask[:, :, rows[n:], rows[n:]] = 0.0
            return cache_mask, new_mask
        visible = (slots < start)[None, None, None, :].expand(1, 1, nb, capacity)
        causal = rows[None, :] <= rows[:, None]
        causal = causal & ((rows[:, None] < n) | (rows[None, :] == rows[:, None]))
        new_visible = causal[None, None]
        # (B, start + n) 0/1: left padding of some rows (plain causal steps carry no mask:
        # their masks are built inside the graph)
        pad = attention_mask.bool()
        cache_pad = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        cache_pad[:, :start] = pad[:, :start]
        visible = visible & cache_pad[:, None, None, :]
        new_pad = torch.ones(batch, nb, dtype=torch.bool, device=device)
        new_pad[:, :n] = pad[:, start:start + n]
        new_visible = new_visible & (new_pad[:, None, None, :] | torch.eye(
            nb, dtype=torch.bool, device=device))
        zero = torch.zeros((), dtype=dtype, device=device)
        return (torch.where(visible, zero, low).contiguous(),
                torch.where(new_visible, zero, low).contiguous())

    @torch.inference_mode()
    def warm_up(self, buckets, batch: int = 1, hidden_layer: int | tuple | None = None,
                masks=("causal",)) -> float:
        """Compile the steps for ``buckets`` (new-row counts) before decoding, on a scratch
        cache, for each kind of mask in ``masks`` (causal; tree: a 4-D mask; padded: 0/1
        rows of an ensemble); returns the seconds it took. Compiles after this are counted
        as late."""
        d = self.decoder
        # hidden_states entries as run() receives them (FastDecoder.run normalises -1 …)
        want = layer_indices(hidden_layer, len(d.layers))
        t0 = time.perf_counter()
        # every bucket up to the largest: a round that drafts fewer tokens (an early stop,
        # the last tokens before max_new_tokens) verifies fewer rows
        largest = max(bucket_for(b) or BUCKETS[-1] for b in buckets)
        for n in [b for b in BUCKETS if b <= largest]:
            for kind in masks:
                cache, past = self._scratch(batch, n), 8
                embeds = torch.zeros(batch, n, d.stack.config.hidden_size, device=d.device,
                                     dtype=d.dtype)
                mask = None
                if kind == "tree":   # one mask per request, expanded to its rows
                    mask = torch.zeros(batch, 1, n, past + n, device=d.device)
                elif kind == "padded":
                    mask = torch.ones(batch, past + n, dtype=torch.long, device=d.device)
                self.run(embeds, cache, mask, None, want)
        self.warm = True
        return time.perf_counter() - t0

    @torch.inference_mode()
    def warm_up_chain(self, gamma: int) -> float:
        """Compile the greedy draft chains of 2..``gamma`` proposals (a round near
        max_new_tokens drafts fewer); seconds."""
        d = self.decoder
        t0 = time.perf_counter()
        for steps in range(2, gamma + 1):
            self.greedy_chain(torch.zeros(1, 1, dtype=torch.long, device=d.device),
                              self._scratch(1, steps), steps)
        self.warm = True
        return time.perf_counter() - t0

    def _scratch(self, batch: int, n: int):
        """A warm-up cache: 8 cached positions and room for ``n`` more."""
        cache = self.decoder.new_cache(batch)
        cache.headroom = 0
        cache.reserve(64 + n)
        cache.length = 8
        return cache


def _store(cache, start: int, n: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Write n new rows' keys and values at ``start`` (outside the graph) and advance."""
    cache.keys[:, :, :, start:start + n] = keys
    cache.values[:, :, :, start:start + n] = values
    cache.length = start + n


def cache_dir_problem() -> str | None:
    """Why inductor cannot keep compiled kernels in TORCHINDUCTOR_CACHE_DIR (e.g. a file
    where its directory should be), or None. Nothing is removed or replaced."""
    import os

    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not path:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"the compile cache {path} cannot be a directory: {exc.strerror or exc}"
    if not os.access(path, os.W_OK):
        return f"the compile cache {path} is not writable"
    return None


def set_compiled(decoder, on: bool = True) -> None:
    """Turn compiled steps on (a fresh ``CompiledSteps``) or off for a ``FastDecoder``."""
    decoder.compiled = CompiledSteps(decoder) if on else None


def decide(mode: str, hardware, expected_tokens: int) -> tuple[bool, str]:
    """``runtime.compile`` for a job of about ``expected_tokens`` decoded tokens: whether to
    compile, and why (for the plan line). ``auto`` needs a measurement of this hardware
    (``vlmspec profile --compile`` writes ``compiled_target_ms`` and ``compile_warmup_s``):
    compiled steps must be faster than eager ones, and the time they save over the job
    must exceed the warm-up, so a one-liner never pays for a compile."""
    if mode == "off":
        return False, "runtime.compile is off"
    if mode == "on":
        return True, "runtime.compile is on"
    eager, fast = hardware.target_ms, hardware.compiled_target_ms
    warmup = hardware.compile_warmup_s
    if eager is None or fast is None or warmup is None:
        return False, ("auto: not measured on this hardware; `vlmspec profile --compile "
                       "--write hw.yaml`, then `include: hw.yaml`, measures it")
    saving_ms = eager - fast
    if saving_ms <= 0:
        return False, f"auto: a compiled target step was measured slower here ({fast:.2f} vs {eager:.2f} ms)"
    # at least one target forward per decoded token is saved (speculation verifies fewer
    # times than that, but its draft steps, compiled too, make up the difference)
    break_even = int(warmup * 1000 / saving_ms) + 1
    if expected_tokens < break_even:
        return False, (f"auto: ~{expected_tokens} tokens to decode, a {warmup:.0f} s warm-up "
                       f"pays back after ~{break_even}")
    return True, (f"auto: measured {eager:.2f} -> {fast:.2f} ms a target step; the "
                  f"{warmup:.0f} s warm-up pays back after ~{break_even} tokens")


def draft_pays(mode: str, hardware, plain_steps: bool = True) -> bool:
    """Whether the draft's steps are compiled too once the target's are: always with
    ``on``; with ``auto`` only where its compiled step was measured faster (a one-layer
    draft's step can be mostly the compiled call's own fixed cost) and its steps are
    plain causal ones (``plain_steps``): a tree's frontier or an ensemble's padded rows
    carry masks built per step, which made compiled draft steps slower on the 2-core CPU
    (bench/history/RESULTS-until-2026-12-07.md), and the measurement times plain steps only."""
    if mode == "on":
        return True
    eager, fast = hardware.draft_ms, hardware.compiled_draft_ms
    return plain_steps and eager is not None and fast is not None and fast < eager
