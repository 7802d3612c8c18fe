"""Model loading: zoo names, local dirs and hub ids share one from_pretrained path; early,
clear failures for unknown names, an unreachable hub and incompatible drafts."""

from __future__ import annotations

import pytest
import torch

from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.adapters.base import cache_length, truncate_cache
from vlmspec_cli.runtime.models import (
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


def test_unreachable_hub_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        load_model(ModelSpec(model="llava-hf/llava-1.5-7b-hf"), "target")
    msg = str(err.value)
    assert "llava-hf/llava-1.5-7b-hf" in msg and "unreachable" in msg and "target.model" in msg


def test_missing_local_path_is_named():
    with pytest.raises(ModelLoadError, match="not a model directory"):
        load_model(ModelSpec(model="./no/such/dir"), "draft")


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
