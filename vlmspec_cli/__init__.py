"""vlmspec: lossless speculative decoding for vision-language models."""

import os as _os

__version__ = "0.1.0"


def _default_compile_cache() -> None:
    """Compiled steps (runtime/fast/compiled_step.py) keep inductor's kernels between runs, under
    the user's cache directory unless TORCHINDUCTOR_CACHE_DIR is set. Set here, before any
    torch import: torch writes its own default (a temp directory) into the environment the
    first time anything asks for the cache directory, and importing some transformers
    models already does. Where that directory cannot be made (a file in the way, no
    permission) torch's default stays: nothing is removed, and no command fails for it."""
    if "TORCHINDUCTOR_CACHE_DIR" in _os.environ:
        return
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    path = _os.path.join(base, "vlmspec", "inductor")
    try:
        _os.makedirs(path, exist_ok=True)
    except OSError:
        return
    _os.environ["TORCHINDUCTOR_CACHE_DIR"] = path


_default_compile_cache()
