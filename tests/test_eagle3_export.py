"""``python -m vlmspec_cli.zoo.hidden --arch eagle3 --target DIR SAMPLES --out HEAD``: an
EAGLE-3 head trained on a user's target (a tiny random Qwen2.5-VL here) from its own
answers, written in the published layout — proven by reading it back as the public loaders
do: every name, shape and config key vLLM's, SGLang's and SpecForge's loader code expects
(the files are cited in ARCHITECTURE.md, "EAGLE-3 heads"), then decoding with it."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from safetensors import safe_open

from families import qwen2_5_vl
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.models.eagle3_format import check_head_dir
from vlmspec_cli.runtime.models.eagle3_head import load_head_dir
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session
from vlmspec_cli.zoo.hidden import main

TRAIN = ["--arch", "eagle3", "--stage1", "12", "--stage2", "0", "--feedback", "2",
         "--max-new-tokens", "8", "--prompt", "describe the image.", "--draft-vocab", "120",
         "--threads", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target, samples folder, head folder): the head trained through the CLI."""
    root = tmp_path_factory.mktemp("eagle3_export")
    target = qwen2_5_vl(root / "target", seed=2, layers=4)
    samples = root / "samples"
    samples.mkdir()
    for i, (size, colour) in enumerate([((56, 40), (200, 30, 30)), ((40, 72), (20, 160, 60))]):
        Image.new("RGB", size, colour).save(samples / f"shot{i}.png")
    head = root / "head"
    with pytest.raises(SystemExit) as done:
        main(["--target", str(target), str(samples), "--out", str(head), *TRAIN])
    assert done.value.code == 0
    return target, samples, head


# what each engine's loader reads (see ARCHITECTURE.md for the files)
VLLM_PARAMS = {"model.fc.weight", "model.layers.0.self_attn.qkv_proj.weight",
               "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
               "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
               "model.layers.0.hidden_norm.weight", "model.layers.0.post_attention_layernorm.weight",
               "model.norm.weight", "lm_head.weight", "draft_id_to_target_id"}
SPECFORGE_REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight", "t2d", "d2t")


def _vllm_name(name: str) -> str | None:
    """Where vLLM's Eagle3LlamaForCausalLM.load_weights puts a checkpoint tensor (None:
    skipped): t2d skipped, d2t → draft_id_to_target_id, 'model.' before all but lm_head,
    midlayer. → layers.0., q/k/v and gate/up stacked."""
    if "t2d" in name:
        return None
    if "d2t" in name:
        return "draft_id_to_target_id"
    if "lm_head" not in name:
        name = "model." + name
    name = name.replace("midlayer.", "layers.0.")
    for shard, stacked in ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"),
                           (".v_proj", ".qkv_proj"), (".gate_proj", ".gate_up_proj"),
                           (".up_proj", ".gate_up_proj")):
        name = name.replace(shard, stacked)
    return name


def _vllm_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The shapes vLLM's Eagle3LlamaForCausalLM gives its parameters, from the config keys
    it reads (hidden_size, num_attention_heads, num_key_value_heads, head_dim,
    intermediate_size, target_hidden_size if present, draft_vocab_size): written here from
    those keys, not from vlmspec's reader (runtime/models/eagle3_format.py)."""
    h, i = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // heads
    layer = "model.layers.0."
    return {"model.fc.weight": (h, 3 * config.get("target_hidden_size", h)),
            layer + "self_attn.qkv_proj.weight": ((heads + 2 * kv) * hd, 2 * h),
            layer + "self_attn.o_proj.weight": (h, heads * hd),
            layer + "mlp.gate_up_proj.weight": (2 * i, h), layer + "mlp.down_proj.weight": (h, i),
            layer + "input_layernorm.weight": (h,), layer + "hidden_norm.weight": (h,),
            layer + "post_attention_layernorm.weight": (h,), "model.norm.weight": (h,),
            "lm_head.weight": (config["draft_vocab_size"], h),
            "draft_id_to_target_id": (config["draft_vocab_size"],)}


def test_the_export_is_what_the_engines_load(trained):
    _, _, head = trained
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["draft_vocab_size"] == 120 < config["vocab_size"]
    # an M-RoPE target: its sections, as SpecForge's Qwen2.5-VL config writes them
    assert config["rope_scaling"]["type"] == "mrope" and len(config["rope_scaling"]["mrope_section"]) == 3
    # trained on the default layers, so no layer-id key the engines would read differently
    assert "eagle_aux_hidden_state_layer_ids" not in config and "eagle_config" not in config
    with safe_open(str(head / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        fc = f.get_slice("fc.weight").get_shape()
        stacked: dict[str, list[int]] = {}                               # vLLM's shards stacked
        for name in names:
            shape, into = list(f.get_slice(name).get_shape()), _vllm_name(name)
            if into in stacked:
                stacked[into][0] += shape[0]
            elif into:
                stacked[into] = shape
    assert {n for n in map(_vllm_name, names) if n} == VLLM_PARAMS       # vLLM, no embed_tokens
    assert {k: tuple(v) for k, v in stacked.items()} == _vllm_shapes(config)
    assert all(k in names for k in SPECFORGE_REQUIRED)                   # SpecForge → SGLang
    assert not any("embed" in n for n in names)                          # shared with the target
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    hot = d2t + torch.arange(len(d2t))                                   # SGLang's hot_token_id
    assert torch.equal(t2d.nonzero().flatten(), hot)                     # SpecForge's consistency rule
    assert fc == [config["hidden_size"], 3 * config["hidden_size"]]
    check_head_dir(head)                                                 # every shape, vlmspec's reader
    report = json.loads((head / "BUILD_REPORT.json").read_text())
    assert report["target_layers"] == [2, 2, 1] and report["samples"] == 2


def test_the_exported_head_drafts_for_its_target(trained):
    target, samples, head = trained
    session = build_session(load_profile("tinyworld-caption", [
        f"target.model={target}", "method=eagle3", f"eagle3.model={head}", "drafting.gamma=3",
        "drafting.length=fixed"]))   # every round drafts (auto may go plain on a busy machine)
    assert session.engine.hidden_layer == (2, 2, 1)
    for path in sorted(samples.glob("*.png")):
        req = Request([Message("user", "describe the image.", (Image.open(path).convert("RGB"),))],
                      max_new_tokens=8)
        res = session.engine.generate(req)
        assert res.tokens == session.baseline_engine().generate(req).tokens
        assert res.state.stats.num_accepted_tokens > 0   # it learnt its target's answers


def test_writing_and_reading_back_is_exact(zoo_target, tmp_path):
    from vlmspec_cli.zoo.eagle3_export import write_head_dir
    from vlmspec_cli.zoo.eagle3_train import new_head

    head = new_head(zoo_target, torch.tensor([3, 7, 9, 200, 511]), seed=1)
    write_head_dir(head, {"note": "test"}, tmp_path / "head")
    back = load_head_dir(tmp_path / "head", "cpu", torch.float32)
    ours, theirs = head.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert back.target_ids.tolist() == [3, 7, 9, 200, 511]


def test_out_never_replaces_a_head_it_did_not_write(trained, tmp_path, capsys):
    """A published head in --out (no vlmspec BUILD_REPORT) is never replaced, --force or not;
    our own is replaced only with --force."""
    target, samples, head = trained
    published = tmp_path / "published"
    published.mkdir()
    for name in ("config.json", "model.safetensors"):
        (published / name).write_bytes((head / name).read_bytes())
    with pytest.raises(SystemExit) as done:
        main(["--target", str(target), str(samples), "--out", str(published), "--force", *TRAIN])
    assert done.value.code == 2 and "not an EAGLE-3 head vlmspec wrote" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["--target", str(target), str(samples), "--out", str(head), *TRAIN])
    assert done.value.code == 2 and "--force" in capsys.readouterr().err


def test_training_attends_as_decoding_does(zoo_target):
    """The training-time test's step j at position t (zoo/eagle3_train.py) is exactly what
    decoding computes there: the step-0 pairs up to t − j read into the head's cache, then
    a chain of j self-fed proposals (drafters/eagle3.py feeds them one by one)."""
    from vlmspec_cli.zoo.eagle3_train import new_head, ttt_outputs

    head = new_head(zoo_target, torch.arange(40), seed=3)
    embed = zoo_target.model.get_input_embeddings()
    g = torch.Generator().manual_seed(0)
    n = 6
    ids = torch.randint(0, 40, (1, n), generator=g)
    states = torch.randn(1, n, 3 * head.config.target_hidden_size, generator=g)
    positions = torch.arange(n)[None, None].expand(3, 1, n)
    with torch.no_grad():
        outs = ttt_outputs(head, embed(ids), states, positions, steps=3)
        z = head.project(states)
        for j in range(4):
            for t in range(j, n):
                cache = head.new_cache()
                start = t - j
                h = head(embed(ids[:, :start + 1]), z[:, :start + 1], positions[:, 0, :start + 1], cache)[:, -1:]
                for s in range(start + 1, t + 1):    # the chain: o at s - 1 feeds s
                    h = head(embed(ids[:, s:s + 1]), h, positions[:, 0, s:s + 1], cache)
                torch.testing.assert_close(outs[j][:, t], h[:, 0], rtol=1e-4, atol=1e-5)
