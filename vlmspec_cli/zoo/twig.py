"""Grow a twig on the tinyworld Llava target (TwigVLM §3.1, App. A).

The twig is T decoder layers + a norm + an LM head on top of the frozen target's first K
layers. Only the twig trains, with the plain autoregressive loss on the target's own
training conversations; its layers start as copies of the target's layers[K:K+T]
(``init="next"``, the paper's choice), of layers[L−T:L] (``"last"``) or random
(``"random"``); norm and head start as the target's. It is saved as a T-layer
``LlamaForCausalLM`` whose config records ``twig_from_layer: K``, so it loads with a plain
``from_pretrained`` (its embedding table is unused: tokens enter through the target).

``build_twig`` trains the shipped twig and, with ``ablation``, the paper's Table 7
comparison: token acceptance rate (TokAR) for each init and for T = 1..4. ``build.py``
grows ``llava-twig`` on the 8-layer target; ``python -m vlmspec_cli.zoo.deep_twig`` grows
``llava-deep-twig`` on the 32-layer target (``zoo/deepen.py``; K = 2, T = 1 from its
ablation, ``--ablation``: K = 2, 4, 8 and T = 1, 2, 3).
"""

from __future__ import annotations

import copy
import json
import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.train import batches, collate, optimize, warmup_cosine

TWIG_K = 2          # shared target layers
TWIG_T = 1          # twig layers (chosen from the ablation: see BUILD_REPORT.json)
INITS = ("next", "last", "random")


def make_twig(target, k: int, t: int, init: str, seed: int) -> LlamaForCausalLM:
    text = target.model.language_model
    layers = text.layers
    n = len(layers)
    if not 1 <= k < n or k + t > n:
        raise ValueError(f"twig K={k}, T={t} does not fit a {n}-layer target")
    config = LlamaConfig(**{**text.config.to_dict(), "num_hidden_layers": t,
                            "tie_word_embeddings": False, "architectures": ["LlamaForCausalLM"]})
    config.twig_from_layer = k
    config.twig_init = init
    torch.manual_seed(seed)
    twig = LlamaForCausalLM(config)
    if init != "random":
        source = range(k, k + t) if init == "next" else range(n - t, n)
        for i, j in enumerate(source):
            twig.model.layers[i].load_state_dict(layers[j].state_dict())
    twig.model.norm.load_state_dict(text.norm.state_dict())
    twig.lm_head.load_state_dict(target.lm_head.state_dict())
    twig.model.embed_tokens.load_state_dict(text.embed_tokens.state_dict())
    return twig


@torch.no_grad()
def hidden_after(target, k: int, **inputs) -> torch.Tensor:
    """X^(K): the frozen target's hidden states after its first ``k`` decoder layers,
    running only those (a hook on layer k reads them; transformers' own
    ``output_hidden_states`` records through hooks it installs once, on the layers present
    at the first call, so it cannot follow a temporarily shortened stack)."""
    text = target.model.language_model
    layers, captured = text.layers, {}
    hook = layers[k - 1].register_forward_hook(
        lambda module, args, out: captured.__setitem__("h", out[0] if isinstance(out, tuple) else out))
    text.layers = layers[:k]
    try:
        target(**inputs, logits_to_keep=1)
    finally:
        text.layers = layers
        hook.remove()
    return captured["h"]


def train_twig(target, twig, data, k: int, steps: int, lr: float, batch_tokens: int, seed: int,
               pad_id: int, label: str):
    """Only the twig's layers, norm and head learn; X^(K) comes from the frozen target."""
    target.eval().requires_grad_(False)
    twig.model.embed_tokens.requires_grad_(False)
    twig.train()
    it = batches(data, batch_tokens, seed)

    def batch_loss(step):
        ids, labels, mask, pix = collate(data, next(it), pad_id)
        kwargs = {"pixel_values": pix} if pix is not None else {}
        hidden_k = hidden_after(target, k, input_ids=ids, attention_mask=mask, **kwargs)
        return twig(inputs_embeds=hidden_k, attention_mask=mask, labels=labels).loss

    # App. A: AdamW, no weight decay, linear warm-up over 3% of the steps, cosine decay
    optimize([p for p in twig.parameters() if p.requires_grad], steps, batch_loss, label,
             lr=lr, weight_decay=0.0, schedule=warmup_cosine(max(1, int(steps * 0.03)), steps))
    twig.eval()
    return twig


def eval_requests(n: int, seed: int):
    """Fresh single-image requests, half caption prompts, half questions."""
    from vlmspec_cli.runtime.request import Message, Request

    rng = random.Random(seed)
    out = []
    for i in range(n):
        scene = world.sample_scene(rng)
        prompt = rng.choice(world.CAPTION_PROMPTS) if i % 2 == 0 else rng.choice(world.qa_pairs(scene, rng))[0]
        out.append(Request([Message("user", prompt, (world.render(scene),))], max_new_tokens=48))
    return out


def measure_tokar(target_lm, twig, k: int, requests, gamma: int = 5) -> dict:
    """TokAR (accepted / drafted) and mean acceptance length of greedy twig drafting with
    no early exit, so every round drafts γ tokens (Table 7's setting)."""
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine
    from vlmspec_cli.runtime.stats import SpecStats
    from vlmspec_cli.runtime.round.verify import SamplingParams

    greedy = SamplingParams(0.0)
    engine = SpeculativeEngine(target_lm, create_drafter("twig", target=target_lm, sampling=greedy,
                                                         layers=k, twig=twig), gamma, greedy)
    total = SpecStats()
    for req in requests:
        total.merge(engine.generate(req).state.stats)
    return {"tokar": round(total.draft_accept_rate, 4), "mean_acceptance_length": round(total.mean_accept_len, 3)}


def build_twig(out, processor, data, report: dict, steps: int, seed: int, batch_tokens: int,
               ablation: bool, eval_requests_n: int = 40, variants_dir=None,
               target_name: str = "llava-target", name: str = "llava-twig", k: int = TWIG_K,
               t: int = TWIG_T, other_ks=(1, 3), ts=(1, 2, 3, 4), inits=INITS) -> None:
    """Train and save ``name`` on ``target_name`` (K = ``k``, T = ``t``, init next); with
    ``ablation``, also train and measure the other ``inits``, T in ``ts`` and K in
    ``other_ks`` (saved under ``variants_dir`` as K{k}-T{t}-{init} when given, for
    bench/twig.py)."""
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import load_model

    target_lm = load_model(ModelSpec(model=str(out / target_name), device="cpu", dtype="float32"),
                           "target")
    target = target_lm.model
    pad_id = processor.tokenizer.pad_token_id
    requests = eval_requests(eval_requests_n, seed=20_000 + seed)
    variants = [(k, t, "next")]
    if ablation:
        variants += [(k, tt, "next") for tt in ts if tt != t]
        variants += [(k, t, init) for init in inits if init != "next"]
        variants += [(kk, t, "next") for kk in other_ks if kk != k]
    rows = []
    layer_skip = {k: measure_tokar(target_lm, None, k, requests) for k in sorted({v[0] for v in variants})}
    for vk, vt, init in variants:
        twig = make_twig(target, vk, vt, init, seed)
        before = measure_tokar(target_lm, twig, vk, requests)
        train_twig(target, twig, data, vk, steps, 1e-3, batch_tokens, seed, pad_id,
                   f"twig K={vk} T={vt} {init}")
        after = measure_tokar(target_lm, twig, vk, requests)
        rows.append({"K": vk, "T": vt, "init": init, "untrained": before, **after})
        print(f"[twig] {json.dumps(rows[-1])}", flush=True)
        dests = [out / name] if (vk, vt, init) == (k, t, "next") else []
        if variants_dir is not None:
            dests.append(variants_dir / f"K{vk}-T{vt}-{init}")
        for dest in dests:
            dest.mkdir(parents=True, exist_ok=True)
            copy.deepcopy(twig).save_pretrained(dest)
    entry = report.setdefault(name, {})
    entry.update({"target": target_name, "K": k, "T": t, "init": "next", "steps": steps,
                  "eval_requests": eval_requests_n,
                  "layer_skip": {f"K={kk}": v for kk, v in layer_skip.items()}, **rows[0]})
    if ablation:
        entry["ablation"] = rows

