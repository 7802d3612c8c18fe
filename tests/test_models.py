"""Model loading: zoo names, local dirs and hub ids share one from_pretrained path; early,
clear failures for unknown names, an unreachable hub and incompatible drafts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from PIL import Image

from corpus import (CORRUPT_CONFIGS, CORRUPT_WEIGHTS, make_broken_model_dir,
                    make_corrupt_model, make_pickle_only_model)
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.adapters.base import cache_length, truncate_cache
from vlmspec_cli.runtime.models.loading import (
    ModelLoadError,
    check_compatible,
    load_model,
    pick_device,
    pick_dtype,
    resolve_model_source,
    zoo_models,
)


def test_zoo_names_resolve_to_packaged_directories():
    assert {"zoo:tinyworld/llava-target", "zoo:tinyworld/llava-draft"} <= set(zoo_models())
    with pytest.raises(ModelLoadError, match="available: .*zoo:tinyworld/llava-target"):
        resolve_model_source("zoo:tinyworld/nope")


def test_local_directory_loads_like_zoo_name(zoo_target):
    local = load_model(ModelSpec(model=resolve_model_source("zoo:tinyworld/llava-target"), device="cpu"))
    assert type(local.model) is type(zoo_target.model)
    for a, b in zip(local.model.parameters(), zoo_target.model.parameters()):
        assert torch.equal(a, b)


def test_a_folder_without_tokenizer_files_is_said_so_in_a_whole_sentence(tmp_path):
    """transformers' own text ends in "... from one of: " (a list it leaves empty)."""
    import shutil

    folder = tmp_path / "draft"
    shutil.copytree(resolve_model_source("zoo:tinyworld/llava-draft"), folder)
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            f.unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(ModelSpec(model=str(folder), device="cpu"), "draft")
    assert str(info.value) == (f"cannot load draft model '{folder}': it holds no tokenizer "
                               "transformers can load (tokenizer.json, or tokenizer.model, or "
                               "vocab.json with merges.txt)")


def test_unreachable_hub_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelSpec(model="llava-hf/llava-1.5-7b-hf"), "target")
    msg = str(err.value)
    assert "llava-hf/llava-1.5-7b-hf" in msg and "unreachable" in msg and "target.model" in msg


def test_missing_local_path_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match=r"draft model './no/such/dir': no such directory"):
        load_model(ModelSpec(model="./no/such/dir"), "draft")
    with pytest.raises(ModelLoadError, match="not a model directory .no config.json."):
        load_model(ModelSpec(model=str(tmp_path)), "draft")      # a folder, but no model


def test_device_and_dtype_auto_on_cpu():
    dev = pick_device("auto")
    if not torch.cuda.is_available():
        assert dev.type in ("cpu", "mps")
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError):
        if torch.cuda.is_available():
            pytest.skip("has CUDA")
        pick_device("cuda")


def test_compatible_pair_passes(zoo_target, zoo_draft):
    check_compatible(zoo_target, zoo_draft, needs_images=True)


def test_incompatible_tokenizer_fails_with_remedy(zoo_target, zoo_draft, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "</s>": 1, "hello": 2}, unk_token="<unk>")),
        eos_token="</s>", unk_token="<unk>")
    fake = type(zoo_draft)(**{**zoo_draft.__dict__, "tokenizer": other, "name": "other-draft"})
    with pytest.raises(ModelLoadError, match="do not share a tokenizer"):
        check_compatible(zoo_target, fake, needs_images=False)


def test_text_only_draft_cannot_draft_multimodal(zoo_target, zoo_draft):
    from vlmspec_cli.runtime.adapters.causal_lm import CausalLMAdapter

    text_only = type(zoo_draft)(**{**zoo_draft.__dict__, "adapter": CausalLMAdapter()})
    with pytest.raises(ModelLoadError, match="drafting.inputs: \\[text\\]"):
        check_compatible(zoo_target, text_only, needs_images=True)


def test_cache_rollback(zoo_target):
    lm = zoo_target
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    cache = lm.adapter.new_cache(lm)
    lm.adapter.extend(lm, ids, cache)
    assert cache_length(cache) == 6
    truncate_cache(cache, 4)
    assert cache_length(cache) == 4
    # after rollback, continuing gives the same logits as a fresh run of the same prefix
    again = lm.adapter.extend(lm, torch.tensor([[11]]), cache)[0, -1]
    fresh_cache = lm.adapter.new_cache(lm)
    fresh = lm.adapter.extend(lm, torch.tensor([[5, 6, 7, 8, 11]]), fresh_cache)[0, -1]
    assert torch.allclose(again, fresh, atol=1e-5)
    with pytest.raises(ValueError):
        truncate_cache(cache, 9)


# ------------------------------------------------------------ safetensors only (never unpickle)
def _no_torch_load(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("torch.load was called: vlmspec must never unpickle weights")
    monkeypatch.setattr(torch, "load", refuse)


@pytest.mark.parametrize("role,zoo", [("target", "tinyworld/llava-target"), ("draft", "tinyworld/llava-draft"),
                                      ("captioner", "tinyworld/captioner")])
def test_pickle_only_model_dir_is_refused_without_unpickling(tmp_path, monkeypatch, role, zoo):
    path = make_pickle_only_model(tmp_path / "pickled", zoo)
    _no_torch_load(monkeypatch)
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelSpec(model=str(path), device="cpu"), role)
    msg = str(err.value)
    assert str(path) in msg and "pytorch_model.bin" in msg and "safetensors only" in msg
    assert f"{role}.model" in msg and "\n" not in msg


@pytest.mark.parametrize("kind,zoo", [("twig", "tinyworld/llava-twig"), ("hidden", "tinyworld/llava-hidden")])
def test_pickle_only_twig_and_hidden_head_are_refused(zoo_target, tmp_path, monkeypatch, kind, zoo):
    from vlmspec_cli.runtime.models.loading import load_hidden_head, load_twig

    path = make_pickle_only_model(tmp_path / kind, zoo)
    _no_torch_load(monkeypatch)
    with pytest.raises(ModelLoadError, match=f"{kind} model directory .*pytorch_model.bin"):
        (load_twig if kind == "twig" else load_hidden_head)(str(path), zoo_target)


def test_cli_pickle_only_draft_refused_before_any_model_loads(tmp_path):
    """One line, exit 2, before the target loads (the target here is broken: loading it
    first would report that instead)."""
    pickled = make_pickle_only_model(tmp_path / "pickled")
    broken = make_broken_model_dir(tmp_path / "broken")
    image = tmp_path / "a.png"
    Image.new("RGB", (16, 16), "red").save(image)
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(image), "-q",
                           "--set", f"target.model={broken}", "--set", f"draft.model={pickled}",
                           "--max-new-tokens", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "weights_only" not in proc.stderr
    assert str(pickled) in lines[0] and "pytorch_model.bin" in lines[0] and "safetensors" in lines[0]


def test_cli_empty_draft_folder_refused_before_any_model_loads(tmp_path):
    """A folder with no config.json is named before the (broken) target would load."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli

    broken, empty = make_broken_model_dir(tmp_path / "broken"), tmp_path / "empty"
    empty.mkdir()
    image = tmp_path / "a.png"
    Image.new("RGB", (16, 16), "red").save(image)
    res = CliRunner().invoke(cli, ["caption", str(image), "-q", "--set", f"target.model={broken}",
                                   "--set", f"draft.model={empty}", "--max-new-tokens", "2"])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert line == f"error: draft model '{empty}': not a model directory (no config.json)"


# ------------------------------------------------------------ corrupt model files (issue 40)
def _md5s(folder) -> dict:
    import hashlib

    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file()}


@pytest.mark.parametrize("case", [*CORRUPT_WEIGHTS, "link-to-text"])
def test_corrupt_safetensors_is_one_line_naming_the_file(tmp_path, case):
    """A safetensors header that lies (length 2**63, past the end, not JSON, offsets out of
    the file), a truncated or empty file, a link to a text file: "corrupt safetensors file:
    PATH: reason" from the check every model gets before any loads, not a SafetensorError."""
    from vlmspec_cli.runtime.models.loading import require_safetensors

    folder = make_corrupt_model(tmp_path / case, case)
    before = _md5s(folder)
    reason = CORRUPT_WEIGHTS[case][1] if case in CORRUPT_WEIGHTS else "more than the"
    with pytest.raises(ModelLoadError) as err:
        require_safetensors(str(folder), "draft")
    msg = str(err.value)
    assert msg.startswith(f"corrupt safetensors file: {folder / 'model.safetensors'}: ")
    assert reason in msg and "\n" not in msg
    assert _md5s(folder) == before


@pytest.mark.parametrize("case", sorted(CORRUPT_CONFIGS))
def test_config_that_does_not_fit_its_weights_is_refused_before_building(tmp_path, monkeypatch,
                                                                         case):
    """config.json nested 100k deep, vocab_size 2**31, a million layers: one ModelLoadError
    naming the folder before transformers builds anything (it recursed, built a
    mismatched model, or built layers for minutes)."""
    import transformers

    folder = make_corrupt_model(tmp_path / case, case)
    before = _md5s(folder)

    def never(*_a, **_k):
        raise AssertionError("the model was built from a config that does not fit")
    monkeypatch.setattr(transformers.LlavaForConditionalGeneration, "from_pretrained", never)
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelSpec(model=str(folder), device="cpu"), "draft")
    msg = str(err.value)
    assert str(folder) in msg and CORRUPT_CONFIGS[case][1] in msg and "\n" not in msg
    assert _md5s(folder) == before


def test_cli_corrupt_draft_weights_and_config_exit_2_in_one_line(tmp_path):
    image = tmp_path / "a.png"
    Image.new("RGB", (16, 16), "red").save(image)
    for case in ("header-length-2**63", "million-layers"):
        folder = make_corrupt_model(tmp_path / case, case)
        proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(image), "-q",
                               "--set", f"draft.model={folder}", "--max-new-tokens", "2",
                               "--device", "cpu"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "Traceback" not in proc.stderr and str(folder) in line, line
        assert proc.stdout == ""

