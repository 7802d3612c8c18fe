"""An EAGLE-3 head trained by vlmspec (zoo/eagle3_train.py), written in the published
layout (runtime/models/eagle3_format.py), so vLLM, SGLang and SpecForge load it as they load the
heads they publish, and vlmspec's ``method: eagle3`` loads it back.

What is written, and why each choice (the public files each key was checked against are
listed in ARCHITECTURE.md, "EAGLE-3 heads"):

* config.json: ``architectures: ["LlamaForCausalLMEagle3"]``, ``model_type: llama``, the
  layer's sizes, ``vocab_size`` (the target's) and ``draft_vocab_size``, rope settings
  (an M-RoPE target's sections as ``rope_scaling: {type: mrope, mrope_section}``, as
  SpecForge's Qwen2.5-VL config); no layer-id key: the head was trained on the layers
  every engine reads by default (2, L // 2, L − 3), and the engines disagree on what an
  explicit id means (a layer's input in vLLM, its output in SpecForge and SGLang);
* model.safetensors: fc, midlayer.*, norm, lm_head, d2t (int64), t2d (bool), by those
  names; no embed_tokens (the engines share the target's, as SpecForge exports);
* BUILD_REPORT.json: how it was trained; it also marks the folder as vlmspec's own, the
  only kind ``--force`` replaces.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from vlmspec_cli.runtime.models.eagle3_format import ARCHITECTURE

WRITTEN_BY = "vlmspec zoo.hidden --arch eagle3"


def config_json(head) -> dict:
    c = head.config
    config = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
        "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "rope_scaling": c.rope_scaling, "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size,
        "attention_bias": False, "tie_word_embeddings": False, "pretraining_tp": 1,
        "torch_dtype": str(head.dtype).removeprefix("torch."),
    }
    if c.target_hidden_size != c.hidden_size:
        config["target_hidden_size"] = c.target_hidden_size
    if c.raw.get("target_model_type"):
        config["target_model_type"] = c.raw["target_model_type"]
    return config


def is_ours(folder: Path) -> bool:
    """A head directory this exporter wrote (``--force`` may replace it)."""
    try:
        config = json.loads((folder / "config.json").read_text())
        report = json.loads((folder / "BUILD_REPORT.json").read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict) and config.get("architectures") == [ARCHITECTURE]
            and isinstance(report, dict) and report.get("written_by") == WRITTEN_BY)


def write_head_dir(head, report: dict, out: Path) -> None:
    """config.json, model.safetensors and BUILD_REPORT.json into a temporary sibling
    folder, then moved into place (``out``: new, empty, or checked as ours by the caller)."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()
             if not k.startswith("embed_tokens.")}
    state["d2t"] = state["d2t"].long()
    state["t2d"] = state["t2d"].bool()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config_json(head), indent=2) + "\n")
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "BUILD_REPORT.json").write_text(
            json.dumps({"written_by": WRITTEN_BY, **report}, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def train_eagle3(lm, requests, answers, *, steps: int, ttt: int, draft_vocab: int, seed: int,
                 fresh=None, log=print) -> tuple[object, dict]:
    """Collect the target's states on ``requests`` with ``answers``, pick the draft
    vocabulary, train (``steps`` steps of a ``ttt``-step training-time test); returns the
    head and its report (``fresh``: requests to measure acceptance on, default the first
    eight training ones)."""
    from vlmspec_cli.zoo import eagle3_train as et

    torch.manual_seed(seed)
    layers = et.default_layers(lm)
    t0 = time.time()
    data = et.collect(lm, requests, answers, layers)
    collect_s = time.time() - t0
    ids = et.draft_vocabulary(data, lm.vocab_size, draft_vocab)
    head = et.new_head(lm, ids, seed)
    t1 = time.time()
    et.train(head, lm.model.get_input_embeddings(), data, steps, ttt, 16, 2e-3, seed, log)
    report = {"target_layers": list(layers), "draft_vocab_size": len(ids),
              "samples": len(requests), "steps": steps, "ttt_steps": ttt,
              "collect_s": round(collect_s, 1), "train_s": round(time.time() - t1, 1),
              "params": sum(p.numel() for p in head.parameters()),
              "measured_on": "fresh requests" if fresh else "training requests",
              "chain_gamma5": et.measure(lm, head, fresh or requests[:8])}
    return head, report
