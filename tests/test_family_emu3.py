"""Emu3 image generation (Emu3ForConditionalGeneration): tiny random-weight models saved to
folders and loaded by path. Target-only decoding equals transformers' generate() with
Emu3's negative-prompt guidance and its row constraints, token for token; draft trees
and ADT-Tree equal target-only at T = 0; at T = 1 the first image token follows the
target's guided distribution; the CLI writes the PNG through the VQ-VAE; relaxed
acceptance is refused with its reason; the real-model profile fails offline in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from scipy.stats import chisquare

from families import TOKENIZER_SOURCE
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities
from vlmspec_cli.session import build_session
from vlmspec_cli.tasks.imagegen import ImageJob, image_request, render

CODES = 32                  # VQ codebook size: <|visual token000000|> … 000031
IMAGE_AREA = 48 * 48        # with ratio 4:3 and 8 px per token: 5 rows of 7 visual tokens
SPECIAL = {"image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
           "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"}
NEGATIVE = "lowres, bad anatomy, worst quality, blurry."
PROMPTS = ["a red circle", "a small yellow square at the top left on a green background, "
           "drawn with thick lines, film grained, best quality"]


def _tokenizer(folder: Path):
    """The tinyworld BPE tokenizer with Emu3's visual, end-of-line and named image tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER_SOURCE)
    tok.add_tokens([f"<|visual token{i:06d}|>" for i in range(CODES)] + ["<|extra_200|>"]
                   + list(SPECIAL.values()), special_tokens=True)
    tok.save_pretrained(folder / "tok")
    return AutoTokenizer.from_pretrained(folder / "tok", extra_special_tokens=SPECIAL)


def emu3(folder: Path, seed: int, layers: int = 2) -> Path:
    """A few-layer Emu3 decoder (width 64) and a tiny VQ-VAE (8 px per token), its
    processor, and a generation config naming the size (ratio, image_area), the guidance
    scale and a short negative prompt."""
    from transformers import (Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor,
                              Emu3Processor, GenerationConfig)

    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(folder)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, attention_dropout=0.0, initializer_range=0.1)
    vq = dict(codebook_size=CODES, embed_dim=4, latent_channels=4, base_channels=32,
              channel_multiplier=[1, 1, 1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32)
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=tok.get_vocab())
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        guidance_scale=3.0, ratio="4:3", image_area=IMAGE_AREA, negative_prompt=NEGATIVE)
    model.save_pretrained(folder)
    Emu3Processor(Emu3ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64), tok).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Width-64 forwards gain nothing from a second thread, and on a busy machine its
    synchronisation costs more than the work; the suite's setting is restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("emu3")
    return emu3(root / "target", seed=1), emu3(root / "draft", seed=2, layers=1)


_SESSIONS: dict[tuple, object] = {}


def _session(target, draft, method: str, *sets: str):
    key = (target, draft, method, *sets)
    if key not in _SESSIONS:
        profile = load_profile("tinyworld-image", [f"target.model={target}", f"draft.model={draft}",
                                                   "target.device=cpu", "draft.device=cpu",
                                                   f"method={method}", *sets])
        _SESSIONS[key] = build_session(profile)
    return _SESSIONS[key]


def _generate(session, prompt: str, seed: int = 0):
    return session.engine.generate(image_request(session, ImageJob("t", prompt, 0, 0, seed)))


def _hf_generate(lm, prompt: str) -> list[int]:
    """transformers' own decoding: generate() with the negative prompt as
    negative_prompt_ids and the row rule of transformers' Emu3 example as
    prefix_allowed_tokens_fn (written out here, apart from the adapter's)."""
    ad, tok = lm.adapter, lm.tokenizer
    cond, neg = ad.row_ids(lm, prompt)
    (h, w), = lm.processor(text=[prompt], return_for_image_generation=True,
                           **ad.size_kwargs(lm))["image_sizes"]
    visual = lm.model.vocabulary_mapping.image_tokens
    after = [tok.eof_token_id, tok.eoi_token_id, tok.eos_token_id]

    def rule(_, ids):
        offset = len(ids) - ids.tolist().index(tok.image_wrapper_token_id)
        if offset % (w + 1) == 0:
            return [lm.model.vocabulary_mapping.eol_token_id]
        if 0 < offset - (w + 1) * h <= 3:
            return [after[offset - (w + 1) * h - 1]]
        return [tok.pad_token_id] if offset > (w + 1) * h else visual

    ids = torch.tensor([cond])
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            negative_prompt_ids=torch.tensor([neg]), guidance_scale=ad.guidance_scale(lm),
                            prefix_allowed_tokens_fn=rule, max_new_tokens=(w + 1) * h + 3)
    return out[0, len(cond):].tolist()


def test_target_only_equals_hf_generate(models):
    target, draft = models
    lm = _session(target, draft, "none").target
    tok = lm.tokenizer
    assert lm.adapter.image_grid(lm) == (5, 8) and lm.adapter.num_image_tokens(lm) == 40
    for prompt in PROMPTS:
        cond, neg = lm.adapter.row_ids(lm, prompt)
        assert tok.decode(neg) == f"<s>{NEGATIVE}<|image start|>5*7<|image token|>"
        assert tok.decode(cond[-5:]) == "<|image start|>5*7<|image token|>"
        hf = _hf_generate(lm, prompt)
        ours = _generate(_session(target, draft, "none"), prompt).tokens
        assert ours == hf[:40] and hf[40:] == [tok.eof_token_id, tok.eoi_token_id, tok.eos_token_id]
        eol = lm.model.vocabulary_mapping.eol_token_id
        assert [i for i, t in enumerate(ours) if t == eol] == [7, 15, 23, 31, 39]
    # the prompts straddle the negative prompt's length: each row is padded once
    lengths = [len(r) for p in PROMPTS for r in lm.adapter.row_ids(lm, p)]
    assert lengths[0] < lengths[1] and lengths[2] > lengths[3]


METHODS = [
    ("tree", "tree.depth=3", "tree.top_k=2", "tree.total_tokens=6"),
    ("tree", "tree.depth=5", "tree.top_k=4", "tree.total_tokens=16"),
    ("tree", "tree.policy=static", "tree.depth=4", "tree.top_k=3"),
    ("adt", "adaptive_tree.init=horizontal"),
    ("adt", "adaptive_tree.init=vertical", "adaptive_tree.step_top_k=3"),
]


@pytest.mark.parametrize("same_draft", [False, True], ids=["random-draft", "target-as-draft"])
@pytest.mark.parametrize("method", METHODS, ids=lambda m: " ".join(m))
def test_methods_equal_target_only(models, method, same_draft):
    """The target as its own draft accepts its whole greedy path every round; another
    random model accepts little beyond the forced end-of-line tokens."""
    target, draft = models
    session = _session(target, target if same_draft else draft, *method)
    base = _session(target, draft, "none")
    accepted = rounds = 0
    for prompt in PROMPTS:
        res = _generate(session, prompt)
        assert res.tokens == _generate(base, prompt).tokens
        st = res.state.stats
        assert st.new_tokens == 40 and len(st.trees["accept_lengths"]) == 40
        accepted += st.num_accepted_tokens
        rounds += st.num_drafts
    if same_draft:   # EAGLE-2's node budget may cut the greedy path; a static tree keeps it
        assert accepted / rounds >= (4 if "tree.policy=static" in method else 2.4)
    else:
        assert accepted / rounds < 0.6


def test_first_token_follows_the_guided_distribution(models):
    """T = 1, a draft tree: the first image token over 300 seeds matches the target's
    guided, constrained prefill distribution (chi-square), and the test tells the draft's
    own distribution apart."""
    target, draft = models
    session = _session(target, draft, "tree", "sampling.temperature=1", "tree.depth=2",
                       "tree.top_k=3", "tree.total_tokens=6")
    prompt = PROMPTS[0]

    def exact(lm):
        inputs = lm.adapter.encode(lm, prompt, None)
        logits = lm.adapter.prefill(lm, inputs, lm.adapter.new_cache(lm))[0]
        return probabilities(logits, SamplingParams(1.0))

    p, q = exact(session.target), exact(session.draft)
    counts = torch.zeros_like(p)
    for seed in range(300):
        res = session.engine.generate(Request([Message("user", prompt)], seed=seed, max_new_tokens=2))
        counts[res.tokens[0]] += 1
    keep = p * 300 >= 5
    assert keep.sum() >= 3   # the tokens with enough mass; the rest share one bin

    def pvalue(dist):
        exp = torch.cat([dist[keep], dist[~keep].sum()[None]]) * 300
        obs = torch.cat([counts[keep], counts[~keep].sum()[None]])
        return chisquare(obs.numpy(), exp.numpy() / exp.sum().item() * 300).pvalue

    assert pvalue(p) > 1e-3
    assert pvalue(q) < 1e-3


def test_relaxed_acceptance_is_refused(models):
    target, draft = models
    with pytest.raises(ValueError, match="relaxed acceptance is not available for Emu3"):
        _session(target, draft, "adt", "acceptance=relaxed")


def test_cli_writes_the_png_through_the_vq_decoder(models, tmp_path):
    target, draft = models
    res = CliRunner().invoke(cli, ["generate-image", PROMPTS[0], "--set", f"target.model={target}",
                                   "--set", f"draft.model={draft}", "--device", "cpu", "-o",
                                   str(tmp_path), "--compare", "--json", "--heatmap"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout.strip().splitlines()[-1])
    assert record["compare"]["identical"] is True and record["stats"]["num_drafts"] > 0
    image = Image.open(record["file"])
    assert image.size == (56, 40) and image.mode == "RGB"
    session = _session(target, draft, "none")
    assert (np.asarray(image) == np.asarray(render(session, record["tokens"]))).all()
    assert Path(record["heatmap"]).is_file()   # one cell per token of the 5 x 8 grid


def test_real_model_profile_fails_offline_in_one_line(tmp_path):
    res = CliRunner(env={"HF_HUB_OFFLINE": "1"}).invoke(
        cli, ["generate-image", "a cat", "--profile", "emu3-gen", "-q", "-o", str(tmp_path)])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "BAAI/Emu3-Gen-hf" in res.stderr and "unreachable" in res.stderr
