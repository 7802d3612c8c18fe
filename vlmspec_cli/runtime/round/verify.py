"""The one place where draft tokens are accepted or rejected.

Notation (Leviathan et al. 2023; TABED §3.2): the draft proposed tokens x_1..x_n, token x_i
sampled from the draft distribution q_i(·); verifying them in one target forward gives the
target distributions p_1..p_{n+1}, where p_i is the target's next-token distribution before
x_i and p_{n+1} the one after the whole chain.

* Greedy (temperature 0): accept the longest prefix with x_i == argmax p_i; the next token
  is argmax p_{n'+1} at the first mismatch (or the bonus after a fully accepted chain).
  The output is token-identical to the target's own greedy decoding.
* Speculative sampling (temperature > 0): accept x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample the replacement from the
  residual norm(max(0, p_i − q_i)); if every x_i is accepted, sample a bonus token from
  p_{n+1}. Each emitted token is then distributed exactly as p — the target's own
  sampling distribution — whatever q is.
* A draft of another vocabulary: a head smaller than the target's has q = 0 on the ids it
  lacks (``align_vocab``); a larger one is cut to the target's ids when it loads, so q is
  renormalised over them and is what the draft samples from; a head with a draft
  vocabulary of its own (EAGLE-3's d2t map) has q = 0 off the target ids it maps to
  (``draft_vocab_logits``); a draft of another tokenizer proposes re-tokenised text,
  verified as draws from a point mass (``point_mass``).

Both branches return (number of accepted draft tokens, the token the target adds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def scoring(self) -> "SamplingParams":
        """The warp for a draft distribution that is used as a distribution (tree scores,
        distances between distributions, confidence thresholds): these settings, or the
        plain softmax (``UNIT_TEMPERATURE``) when decoding greedily, since the argmax
        ignores temperature and those uses do not."""
        return UNIT_TEMPERATURE if self.greedy else self


# the plain softmax, softmax(logits) (T = 1, no nucleus)
UNIT_TEMPERATURE = SamplingParams(temperature=1.0)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution for ``logits`` (…, V): softmax(logits / T), restricted to
    the top-p nucleus and renormalised. The same warp is applied to p and q, so speculative
    sampling reproduces the warped target distribution exactly."""
    probs = torch.softmax(logits.float() / max(params.temperature, 1e-6), dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest set whose mass reaches top_p (the first token always stays)
        outside = sorted_p.cumsum(-1) - sorted_p >= params.top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from ``probs`` (V,). The request's generators are CPU ones (a seed gives one
    stream on every device: request.make_generators), and torch draws only on the
    generator's own device, so a GPU distribution comes to the CPU for the draw (the first
    GPU run failed here: "Expected a 'cuda' device type for generator")."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from the target alone (baseline decoding and the prefill token)."""
    if params.greedy:
        return int(logits.argmax(-1).item())
    return sample(probabilities(logits, params), generator)


def align_vocab(q: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Give draft probabilities the target's vocabulary size: a draft head smaller than the
    target's (padding rows, extra special tokens) has q = 0 on the missing ids."""
    if q.shape[-1] == vocab_size:
        return q
    if q.shape[-1] > vocab_size:
        return q[..., :vocab_size]
    pad = q.new_zeros(*q.shape[:-1], vocab_size - q.shape[-1])
    return torch.cat([q, pad], dim=-1)


def draft_vocab_logits(logits: torch.Tensor, target_ids: torch.Tensor,
                       vocab_size: int) -> torch.Tensor:
    """Logits over a draft vocabulary (…, V_d) put on the target's ids (…, V): draft id d
    becomes target id ``target_ids[d]`` (EAGLE-3: d + d2t[d]); every other target id
    gets −∞, so every distribution made from them has q = 0 there.

    Why verification stays exact. ``target_ids`` is one-to-one (checked when the head
    loads), so softmax of the scattered logits (with the same temperature and top-p warp
    as p) is the draft distribution q_d carried over to the target ids:
        q(y) = q_d(d)  if y = target_ids[d],   q(y) = 0  otherwise,
    and the proposals are drawn from exactly this q (chains, and trees' draws without
    replacement). Speculative sampling is exact for any q, so also for one with zeros:
    a proposal x has q(x) > 0 and is accepted with probability min(1, p(x) / q(x)); on
    rejection the replacement comes from norm(max(0, p − q)), which equals p on every id
    the draft vocabulary lacks. So
        P(y) = q(y) min(1, p(y)/q(y)) + (1 − Σ_x min(q(x), p(x))) · max(0, p(y) − q(y)) / Z
             = min(q(y), p(y)) + max(0, p(y) − q(y)) = p(y),
    with Z = Σ_y max(0, p(y) − q(y)) = 1 − Σ_x min(q(x), p(x)): target tokens outside the
    draft vocabulary are emitted as often as p says, through the residual and the bonus
    token. At temperature 0 the proposal is argmax q = target_ids[argmax q_d], verified by
    equality with the target's argmax as any other."""
    out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    out[..., target_ids.to(logits.device)] = logits
    return out


def point_mass(tokens: list[int], vocab_size: int) -> torch.Tensor:
    """q_i = δ(x_i), (n, V): the draft distributions of proposals that are a function of
    the draft's own randomness but have no q over the target's vocabulary (a draft with
    another tokenizer, whose sampled text is re-tokenised for the target).

    Speculative sampling is exact for *any* proposal law Q that does not depend on the
    target's randomness, when the q handed to verification is a point mass on x:
        P(accept x)  = min(1, p(x) / δ_x(x)) = p(x),
        on rejection y ~ norm(max(0, p − δ_x)), i.e. p(y) / (1 − p(x)) for y ≠ x,
    so  P(y) = Q(y) p(y) + Σ_{x≠y} Q(x) (1 − p(x)) · p(y) / (1 − p(x)) = p(y).
    Each later position is the same argument conditioned on the accepted prefix."""
    q = torch.zeros(len(tokens), vocab_size)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return q


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """``target_logits``: (n+1, V). Longest prefix with x_i == argmax p_i, then the
    target's argmax at the first mismatch (or after the chain: the bonus token). One
    operator on the logits' device (the argmax of every row), read back once; the prefix is
    compared on the host (n ≤ 64 integers). Each further small operator right after the
    target's forward cost tens of microseconds on the CPU (its code and data out of cache
    by then): the tensor version of this comparison took about 1% of a target step a round
    (by hand, not recorded)."""
    target_choice = target_logits.argmax(-1).tolist()                       # (n+1,)
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_choice[n]:
        n += 1
    return n, target_choice[n]


def verify_sampling(
    draft_tokens: list[int],
    draft_probs: torch.Tensor,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative sampling over a chain. ``draft_probs``: (n, V') the q_i each x_i was
    sampled from; ``target_logits``: (n+1, V)."""
    p = probabilities(target_logits, params)                      # (n+1, V)
    n_draft = len(draft_tokens)
    if n_draft == 0:
        return 0, sample(p[0], generator)
    q = align_vocab(draft_probs.float().to(p.device), p.shape[-1])  # (n, V)
    idx = torch.arange(n_draft, device=p.device)
    tok = torch.tensor(draft_tokens, device=p.device)
    p_x, q_x = p[idx, tok], q[idx, tok]
    # u_i ~ U(0,1) from the target's generator; accept x_i iff u_i <= p_i(x_i) / q_i(x_i).
    # (q_i(x_i) > 0 because x_i was drawn from q_i; written as u*q <= p to avoid 0/0.)
    u = torch.rand(n_draft, generator=generator, device="cpu").to(p.device)
    accepted = (u * q_x <= p_x).tolist()
    n = 0
    while n < n_draft and accepted[n]:
        n += 1
    if n == n_draft:
        # every draft token accepted: the bonus token comes from p_{n+1} directly
        return n, sample(p[n], generator)
    # rejection at position n: resample from the residual norm(max(0, p_n − q_n)).
    residual = (p[n] - q[n]).clamp_min(0.0)
    total = residual.sum()
    if total <= 0:
        # p_n == q_n up to rounding: the residual is empty and rejection had probability 0
        # in exact arithmetic; fall back to p_n itself.
        residual, total = p[n], p[n].sum()
    return n, sample(residual / total, generator)


def verify_chain(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Dispatch: greedy match at temperature 0, speculative sampling otherwise."""
    if params.greedy:
        return verify_greedy(draft_tokens, target_logits)
    if draft_tokens and draft_probs is None:
        raise ValueError("speculative sampling needs the draft probabilities q")
    return verify_sampling(draft_tokens, draft_probs, target_logits, params, generator)


@dataclass(frozen=True)
class Relaxation:
    """LANTERN-style relaxed acceptance (opt-in, LOSSY): image tokens whose VQ codes lie
    close in latent space look alike, so a draft token x is judged by the target mass of
    its neighbourhood instead of its own,

        p~(x) = p(x) + sum of p(x') over x' in B_{k,δ}(x),

    B_{k,δ}(x) = the longest nearest-first prefix of x's k nearest codes whose mass stays
    within δ (the distance, in total variation, the relaxation may move p by at x).
    ``neighbours``: (V, k) code ids, nearest first, excluding the code itself."""

    neighbours: torch.Tensor
    delta: float

    def raised(self, p: torch.Tensor, x: int) -> float:
        if x >= self.neighbours.shape[0]:
            return float(p[x])
        mass = p[self.neighbours[x].to(p.device)].cumsum(0)
        within = mass[mass <= self.delta]
        return float(p[x]) + (float(within[-1]) if within.numel() else 0.0)


def verify_tree(tree, root_logits: torch.Tensor, node_logits: torch.Tensor,
                params: SamplingParams, generator: torch.Generator | None,
                relax: Relaxation | None = None) -> tuple[list[int], int]:
    """Walk a draft tree (runtime/round/tree.py) from the root. ``root_logits`` (V,) is p at the
    root, ``node_logits`` (N, V) p after each node. Returns the accepted root-to-node path
    (node indices) and the token the target adds after it.

    * Greedy: at each node follow the child whose token is argmax p; stop where none is.
    * Sampling — multi-candidate speculative sampling (SpecInfer/EAGLE's recursive
      rejection), for children x_1..x_m of a node drawn from q *without replacement*: with
      q_1 = q and p_1 = p, accept x_j with probability min(1, p_j(x_j) / q_j(x_j)); on
      rejection p_{j+1} = norm(max(0, p_j − q_j)) and q_{j+1} = q_j with x_j removed,
      renormalised (x_{j+1} was drawn from exactly that). Each step is a chain speculative
      sampling step with proposal q_j, so the token emitted at a node is distributed as p.
      If every child is rejected (or there is none) the token comes from the last p_j.
    * ``relax`` (lossy): p_j(x_j) in the test becomes p~_j(x_j) (``Relaxation``); at
      temperature 0 a child is also accepted when p~(x) ≥ max p (its neighbourhood holds
      as much target mass as the target's own choice). Rejections and the emitted token
      are unchanged, so only accepted draft tokens can differ from the target's.
    """
    path: list[int] = []
    node = -1
    if params.greedy:   # the target's argmax at the root and after every node, one sync
        rows = root_logits[None].float()
        if node_logits is not None:
            rows = torch.cat([rows, node_logits.float().to(rows.device)])
        choices = rows.argmax(-1).tolist()
    while True:
        p_logits = root_logits if node < 0 else node_logits[node]
        kids = tree.children(node)
        if params.greedy:
            choice = choices[node + 1]
            nxt = next((c for c in kids if tree.tokens[c] == choice), None)
            if nxt is None and relax is not None and kids:
                p = probabilities(p_logits, UNIT_TEMPERATURE)
                top = float(p[choice])
                nxt = next((c for c in kids if relax.raised(p, tree.tokens[c]) >= top), None)
            if nxt is None:
                return path, choice
            path.append(nxt)
            node = nxt
            continue
        p = probabilities(p_logits, params)
        if not kids:
            return path, sample(p, generator)
        q = align_vocab(tree.q[node].float().to(p.device), p.shape[-1])
        accepted = None
        for c in kids:
            x = tree.tokens[c]
            u = float(torch.rand(1, generator=generator))
            p_x = float(p[x]) if relax is None else relax.raised(p, x)
            if u * float(q[x]) <= p_x:
                accepted = c
                break
            residual = (p - q).clamp_min(0.0)
            total = residual.sum()
            # p == q up to rounding: rejection had probability 0; keep p
            p = residual / total if total > 0 else p
            q = q.clone()
            q[x] = 0.0
            mass = q.sum()
            if mass <= 0:
                break
            q = q / mass
        if accepted is None:
            return path, sample(p, generator)
        path.append(accepted)
        node = accepted
