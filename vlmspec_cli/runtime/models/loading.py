"""Load target / draft models: hub id, local directory or ``zoo:`` name.

Every source goes through the same ``from_pretrained`` call; ``zoo:tinyworld/x`` is only a
name for a directory shipped inside the package. Device and dtype are picked here, and
draft/target compatibility is checked before any decoding starts.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ZOO_ROOT = Path(__file__).resolve().parents[2] / "zoo" / "weights"


class ModelLoadError(Exception):
    """A model could not be loaded; the message says why and what to do."""


@dataclass
class LoadedModel:
    """A model ready for decoding, with its processor and family adapter."""

    name: str
    model: Any
    processor: Any
    tokenizer: Any
    adapter: Any
    device: torch.device
    dtype: torch.dtype
    # runtime/fast_decoder.FastDecoder when decoding steps take the fast path
    fast: Any = None
    fast_off_reason: str | None = None   # why not, when the fast path was asked for
    role: str = "target"   # what it was loaded as ("draft": its fast path runs packed layers)
    # what is read once per model and kept, by name: its family adapter's settings (read
    # from the model's processor configs), the tokenizer's longest token (runtime/limits.py);
    # vlmspec's own, never set as attributes of transformers' objects
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])


def zoo_models() -> list[str]:
    if not ZOO_ROOT.is_dir():
        return []
    return sorted(
        f"zoo:{p.parent.relative_to(ZOO_ROOT).as_posix()}"
        for p in ZOO_ROOT.rglob("config.json")
    )


def resolve_model_source(name: str) -> str:
    """Map ``zoo:…`` to its packaged directory; hub ids and local paths pass through."""
    if name.startswith("zoo:"):
        path = ZOO_ROOT / name[4:]
        if not (path / "config.json").is_file():
            available = ", ".join(zoo_models()) or "none (run: python -m vlmspec_cli.zoo.build)"
            raise ModelLoadError(f"unknown zoo model '{name}'; available: {available}")
        return str(path)
    return name


def looks_local(name: str) -> bool:
    """A model name written as a path (``./m``, ``../m``, ``/abs``, ``~/m``), never a hub id."""
    return name.startswith(("./", "../", "/", "~", ".\\", "..\\")) or name in (".", "..")


# weight files that would be unpickled (torch.load): never read, even with weights_only
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def require_safetensors(name: str | None, role: str) -> None:
    """A local model directory must hold safetensors weights: vlmspec never unpickles, so a
    directory with only pickle weights (pytorch_model.bin …) is refused before anything of
    it loads. Hub ids are loaded with use_safetensors=True, which refuses them as well.
    Its safetensors headers and config.json are checked here too (runtime/models/weights_check.py:
    "corrupt safetensors file: PATH: reason" rather than a traceback from the loader)."""
    if not name:
        return
    path = Path(resolve_model_source(name))
    if not path.is_dir():
        if looks_local(str(path)) and not os.path.lexists(path):
            raise ModelLoadError(f"{role} model '{name}': no such directory"
                                 + (f" ({path})" if str(path) != name else ""))
        return
    if any(path.glob("*.safetensors")) or any(path.glob("*.safetensors.index.json")):
        _checked_files(path)
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise ModelLoadError(
            f"{role} model directory {path}: holds {pickles[0]} (pickle weights) and no "
            "*.safetensors; vlmspec loads safetensors only (it never unpickles): convert it "
            "where you trust it (save_pretrained(..., safe_serialization=True)) and point "
            f"'{role}.model' at the result")
    if not (path / "config.json").is_file():   # an empty or unrelated folder
        raise ModelLoadError(f"{role} model '{name}': not a model directory (no config.json)")


def _checked_files(path: Path):
    """(config.json's object or None, the tensors' shapes) of a local model folder, each
    file checked bounded; ModelLoadError naming the file that is corrupt."""
    from vlmspec_cli.runtime.models.weights_check import CorruptModelFile, folder_shapes, read_json

    try:
        config = read_json(path / "config.json", "config.json") if (path / "config.json").exists() else None
        return config, folder_shapes(path)
    except CorruptModelFile as exc:
        raise ModelLoadError(f"corrupt {exc.kind}: {exc}") from None


def require_config_fits(source: str, role: str) -> None:
    """A local model folder's config.json must describe its weights (layer counts, vocab
    and hidden sizes against the tensor shapes) before transformers builds the model from
    it: a config asking for a million layers builds for minutes before any check."""
    from vlmspec_cli.runtime.models.weights_check import config_problem

    path = Path(source)
    if not path.is_dir():
        return
    config, shapes = _checked_files(path)
    problem = config_problem(config, shapes) if isinstance(config, dict) else None
    if problem:
        raise ModelLoadError(f"{role} model {path}: config.json does not fit its weights: "
                             f"{problem}")


def pick_device(spec: str = "auto") -> torch.device:
    """``auto`` prefers cuda, then mps, then cpu."""
    if spec != "auto":
        dev = torch.device(spec)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ModelLoadError(f"device '{spec}' requested but CUDA is not available here")
        if dev.type == "mps" and not torch.backends.mps.is_available():
            raise ModelLoadError(f"device '{spec}' requested but MPS is not available here")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on GPUs that support it, float16 on other GPUs, float32 on CPU."""
    if spec != "auto":
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[spec]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connect to the hub endpoint, instead of from_pretrained's slow retries."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    from huggingface_hub import constants

    url = urllib.parse.urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def missing_offline(named) -> str | None:
    """One message naming every hub model of ``named`` ((role, name) pairs) that is not in
    the local Hugging Face cache while the hub is unreachable, or None: the first load named
    only the target, and a user who downloaded it met the missing draft or head next run."""
    from transformers import AutoConfig

    missing = []
    for role, name in named:
        source = resolve_model_source(name) if name else None
        if not source or Path(source).exists() or looks_local(source):
            continue
        try:
            AutoConfig.from_pretrained(source, local_files_only=True)
        except (OSError, ValueError):
            missing.append((role, source))
    if not missing or _hub_reachable():
        return None
    named_list = ", ".join(f"{role} '{source}'" for role, source in missing)
    return (f"not in the local Hugging Face cache, and the hub is unreachable (offline?): "
            f"{named_list}. Download them where there is network ("
            + ", ".join(f"`hf download {s}`" for s in dict.fromkeys(s for _, s in missing))
            + ") and copy the cache, or set each role's model to a local directory.")


def _quantization_config(quantize: str, adapter, int8_threshold: float = 0.0):
    """bitsandbytes settings for ``quantize`` (int8 | nf4 | fp4): the decoder's linear
    layers are quantized; the adapter's ``quant_skip_modules`` (vision tower, projector,
    LM head) stay in the model's dtype, as is usual for LLaVA-class models."""
    if quantize == "none":
        return None
    try:
        from transformers import BitsAndBytesConfig
        import bitsandbytes  # noqa: F401
        import accelerate  # noqa: F401
    except ImportError as exc:
        raise ModelLoadError(
            f"quantize: {quantize} needs bitsandbytes and accelerate ({exc}); "
            "install them with: pip install 'vlmspec[quant]'"
        ) from exc
    import logging
    import warnings

    # per-forward chatter on CPU (fp32 inputs cast to fp16 for int8; optional kernels)
    warnings.filterwarnings("ignore", message=".*MatMul8bitLt.*")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    skip = list(adapter.quant_skip_modules)
    if quantize == "int8":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip,
                                  llm_int8_threshold=float(int8_threshold))
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quantize,
                              llm_int8_skip_modules=skip)


def load_model(spec, role: str = "target", fast_path: str = "auto") -> LoadedModel:
    """Load one model from a profile ``ModelSpec`` (fields: model, dtype, device, quantize,
    revision, trust_remote_code). ``fast_path`` (profile key ``runtime.fast_path``): auto
    decodes on runtime/fast/fast_decoder.py where the family supports it, on requires it, off
    keeps transformers' own forward."""
    import transformers
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    from vlmspec_cli.runtime.adapters import adapter_for

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if not spec.model:
        raise ModelLoadError(f"no {role} model set (profile key '{role}.model')")
    require_safetensors(spec.model, role)
    source = resolve_model_source(spec.model)
    is_local = Path(source).is_dir()
    if is_local and not (Path(source) / "config.json").is_file():   # weights, no config
        raise ModelLoadError(f"{role} model '{source}': not a model directory (no config.json)")
    if is_local:
        require_config_fits(source, role)
    common: dict[str, Any] = {"trust_remote_code": bool(spec.trust_remote_code)}
    if spec.revision:
        common["revision"] = spec.revision
    if not is_local:
        if not Path(source).exists() and looks_local(source):
            raise ModelLoadError(f"{role} model '{source}': no such directory")
        if Path(source).exists() or looks_local(source):
            raise ModelLoadError(f"{role} model '{source}': not a model directory (no config.json)")
        # Use the local HF cache when it has the files; only then go to the network.
        try:
            AutoConfig.from_pretrained(source, local_files_only=True, **common)
        except (OSError, ValueError):
            if not _hub_reachable():
                raise ModelLoadError(
                    f"{role} model '{source}' is not in the local Hugging Face cache and the hub "
                    "is unreachable (offline?). Download it where there is network "
                    f"(`hf download {source}`) and copy the cache, or set '{role}.model' "
                    "to a local directory."
                ) from None
    device = pick_device(spec.device)
    dtype = pick_dtype(spec.dtype, device)
    try:
        config = AutoConfig.from_pretrained(source, **common)
        adapter = adapter_for(config, role)
        kwargs: dict[str, Any] = dict(common, dtype=dtype, use_safetensors=True)
        qconf = _quantization_config(getattr(spec, "quantize", "none"), adapter,
                                     getattr(spec, "int8_threshold", 0.0))
        if qconf is not None:
            kwargs["quantization_config"] = qconf
            kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}
        model = adapter.model_class.from_pretrained(source, **kwargs)
        try:
            processor = AutoProcessor.from_pretrained(source, **common)
        except (OSError, ValueError, TypeError, ImportError):
            processor = None
        tokenizer = getattr(processor, "tokenizer", None) or AutoTokenizer.from_pretrained(source, **common)
        if processor is not None and not hasattr(processor, "tokenizer"):
            processor = None
    except ModelLoadError:
        raise
    except (OSError, ValueError, RuntimeError, RecursionError, SafetensorError) as exc:
        # RuntimeError: a size mismatch, a SafetensorError the header checks did not foresee
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if first.startswith("Couldn't instantiate the backend tokenizer"):   # a half sentence
            first = ("it holds no tokenizer transformers can load (tokenizer.json, or "
                     "tokenizer.model, or vocab.json with merges.txt)")
        raise ModelLoadError(f"cannot load {role} model '{spec.model}': {first}") from exc
    if qconf is None:
        model.to(device)
    model.eval()
    lm = LoadedModel(spec.model, model, processor, tokenizer, adapter, device, dtype, role=role)
    use_fast_path(lm, fast_path, role)
    return lm


def use_fast_path(lm: LoadedModel, mode: str, role: str | None = None) -> None:
    """Turn the fast path on or off for ``lm`` (``mode``: auto | on | off); ``role``: what
    it decodes as (default: what it was loaded as)."""
    role = role or lm.role
    from vlmspec_cli.runtime.fast.fast_decoder import FastDecoder, reason_unsupported

    lm.fast, lm.fast_off_reason = None, None
    if mode == "off":
        lm.fast_off_reason = "runtime.fast_path is off"
        return
    reason = reason_unsupported(lm)
    if reason is not None:
        if mode == "on":
            raise ModelLoadError(f"{role} model '{lm.name}' cannot use runtime.fast_path: on: "
                                 f"{reason}")
        lm.fast_off_reason = reason
        return
    # a draft's layers packed into fewer operators (its proposals are verified: rounding
    # differences cannot change an output); a target's steps stay op for op the eager ones,
    # its verifications (several new rows) on a CPU take its weights laid out (in, out)
    # (runtime/fast/wide_rows.py)
    lm.fast = FastDecoder.for_model(lm, packed=role == "draft", wide=role == "target")


def load_twig(name: str, target: LoadedModel):
    """A twig block (TwigVLM): a small ``*ForCausalLM`` whose layers run on the target's
    layer-K hidden states; loaded with from_pretrained onto the target's device and dtype."""
    from transformers import AutoModelForCausalLM

    require_safetensors(name, "twig")
    source = resolve_model_source(name)
    if not Path(source).is_dir() and not _hub_reachable():
        raise ModelLoadError(f"twig '{name}' is not a local directory and the hub is unreachable "
                             "(offline?); set twig.model to a directory, or to none for layer-skip")
    try:
        twig = AutoModelForCausalLM.from_pretrained(source, dtype=target.dtype, trust_remote_code=False,
                                                    use_safetensors=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load twig '{name}': {exc}") from exc
    return twig.to(target.device).eval()


def load_hidden_head(name: str, target: LoadedModel):
    """A hidden-state draft head (HiViS / Sparrow, runtime/models/hidden_head.py): config +
    safetensors, loaded with from_pretrained onto the target's device and dtype."""
    from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead

    require_safetensors(name, "hidden")
    source = resolve_model_source(name)
    if not Path(source).is_dir() and not _hub_reachable():
        raise ModelLoadError(f"hidden head '{name}' is not a local directory and the hub is "
                             "unreachable (offline?); set hidden.model to a directory")
    try:
        head = HiddenDraftHead.from_pretrained(source, dtype=target.dtype, use_safetensors=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load hidden head '{name}': {exc}") from exc
    return head.to(target.device).eval()


def load_eagle3_head(name: str, target: LoadedModel):
    """A published EAGLE-3 head (runtime/models/eagle3_head.py): a directory as SpecForge writes it,
    or a hub id (config.json and safetensors only are downloaded), checked and loaded onto
    the target's device and dtype. A head not in the layout fails in one line naming the
    key (``eagle3_format``)."""
    from vlmspec_cli.runtime.models.eagle3_format import Eagle3FormatError
    from vlmspec_cli.runtime.models.eagle3_head import load_head_dir

    source = resolve_model_source(name)
    if not Path(source).is_dir():
        if Path(source).exists() or source.startswith((".", "/", "~")):
            raise ModelLoadError(f"EAGLE-3 head '{name}': not a directory")
        if not _hub_reachable():
            raise ModelLoadError(f"EAGLE-3 head '{name}' is not a local directory and the hub is "
                                 "unreachable (offline?); set eagle3.model to a directory")
        from huggingface_hub import snapshot_download

        try:
            source = snapshot_download(name, allow_patterns=[
                "config.json", "*.safetensors", "model.safetensors.index.json"])
        except Exception as exc:   # the hub client's many error types: one line
            raise ModelLoadError(f"cannot download EAGLE-3 head '{name}': {exc}") from exc
    try:
        return load_head_dir(source, target.device, target.dtype, target.vocab_size)
    except Eagle3FormatError as exc:
        raise ModelLoadError(f"EAGLE-3 head '{name}': {exc}") from exc


def tokenizer_mismatch(target_tokenizer, draft_tokenizer) -> str | None:
    """Why a draft's token ids are not the target's (None when they are: the same
    tokenizer, perhaps with fewer or more ids than the target's table)."""
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    shared = set(t_vocab) & set(d_vocab)
    mismatched = [t for t in shared if t_vocab[t] != d_vocab[t]]
    missing = [t for t in d_vocab if t not in t_vocab]
    if mismatched or missing or len(shared) < 0.95 * len(t_vocab) - 512:
        return (f"{len(mismatched)} tokens with different ids, {len(missing)} draft tokens "
                "unknown to the target")
    if target_tokenizer.eos_token_id != draft_tokenizer.eos_token_id:
        return (f"end-of-sequence tokens differ ({draft_tokenizer.eos_token_id} vs "
                f"{target_tokenizer.eos_token_id})")
    return None


def load_tokenizer(spec, role: str):
    """The tokenizer of a model spec alone (no weights), from a local directory or the
    local hub cache; None where only ``load_model`` can tell what is wrong."""
    from transformers import AutoTokenizer

    if not spec.model:
        return None
    try:
        source = resolve_model_source(spec.model)
        return AutoTokenizer.from_pretrained(source, local_files_only=True,
                                             trust_remote_code=bool(spec.trust_remote_code),
                                             **({"revision": spec.revision} if spec.revision else {}))
    except (OSError, ValueError, TypeError, ModelLoadError):
        return None


def peek_adapter(spec, role: str):
    """The family adapter of a model spec from its config alone (no weights), from a local
    directory or the local hub cache; None where only ``load_model`` can tell (not on this
    machine, no adapter, an unreadable config)."""
    from transformers import AutoConfig

    from vlmspec_cli.runtime.adapters import adapter_for

    if not getattr(spec, "model", None):
        return None
    try:
        source = resolve_model_source(spec.model)
        config = AutoConfig.from_pretrained(source, local_files_only=True,
                                            trust_remote_code=bool(spec.trust_remote_code),
                                            **({"revision": spec.revision} if spec.revision else {}))
        return adapter_for(config, role)
    except (OSError, ValueError, TypeError, KeyError, ModelLoadError):
        return None


def check_compatible(target: LoadedModel, draft: LoadedModel, needs_images: bool,
                     retokenized: bool = False) -> None:
    """Fail before decoding when draft and target cannot speculate together.
    ``retokenized``: the draft's proposals reach the target as text (drafters/retokenized.py),
    so its tokenizer may differ."""
    reason = None if retokenized else tokenizer_mismatch(target.tokenizer, draft.tokenizer)
    if reason is not None:
        raise ModelLoadError(
            f"draft '{draft.name}' and target '{target.name}' do not share a tokenizer "
            f"({reason}). Draft with the target's tokenizer, or use method chain with "
            "drafting.inputs [text] or [caption]: its proposals are then re-tokenised "
            "through text."
        )
    if needs_images:
        t_img = target.adapter.image_token_id(target)
        d_img = draft.adapter.image_token_id(draft)
        if d_img is None:
            raise ModelLoadError(
                f"drafting input 'multimodal' needs a draft that takes images, but "
                f"'{draft.name}' is a text-only model. Use drafting.inputs: [text]."
            )
        if t_img != d_img:
            raise ModelLoadError(
                f"draft and target use different image token ids ({d_img} vs {t_img}); "
                "the draft must come from the same model family and tokenizer."
            )
