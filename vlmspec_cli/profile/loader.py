"""Load profiles: find the YAML file, follow ``include:``, apply ``--set`` overrides and
command-line values, and validate every key against the schema (``schema.py``) with
errors that name the file and key (and suggest the key meant).

Everything here is generic over ``dataclasses.fields`` and ``typing.get_type_hints``.
Precedence, highest first: ``cli`` dict > ``--set`` overrides > profile YAML (the
including file over its includes) > dataclass defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from vlmspec_cli.profile.schema import Profile
from vlmspec_cli.profile.values import (ProfileError, _check, _coerce, _is_optional,
                                        _section_type, _type_name, _union_args)
from vlmspec_cli.profile.yaml_file import YamlFileError, load_file, load_text
from vlmspec_cli.suggest import did_you_mean

DEFAULT_PROFILE = "tinyworld-caption"
ENV_VAR = "VLMSPEC_PROFILES"
_SUFFIXES = (".yaml", ".yml")


# ------------------------------------------------------------ schema helpers
def _yaml_fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)}


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def profile_keys(cls=Profile, prefix: str = "") -> list[str]:
    """All valid dotted leaf keys, e.g. ``drafting.gamma``."""
    out = []
    for name in _yaml_fields(cls):
        sect = _section_type(_hints(cls)[name])
        out += profile_keys(sect, _join(prefix, name)) if sect else [_join(prefix, name)]
    return out


def key_rows(profile: Profile | None = None, cls=Profile, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted key, what it takes, its value in ``profile``) for every key ``--set`` takes
    (``vlmspec profiles --keys``): the type, or the choices, with its bounds."""
    out = []
    profile = Profile() if profile is None and cls is Profile else profile
    for name, f in _yaml_fields(cls).items():
        tp, key = _hints(cls)[name], _join(prefix, name)
        value = getattr(profile, name, None) if profile is not None else None
        sect = _section_type(tp)
        if sect is not None:
            out += key_rows(value if value is not None else sect(), sect, key)
            continue
        rule = f.metadata
        what = ("|".join(map(str, rule["choices"])) if rule.get("choices")
                else rule.get("allowed") or _type_name(tp))
        if rule.get("choices") and _is_optional(tp):
            what += " or null"
        if rule.get("choices") and typing.get_origin(tp) is list:
            what = f"list of {what}"
        bounds = [f"{op} {rule[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="))
                  if rule.get(k) is not None]
        out.append((key, what + (f" ({', '.join(bounds)})" if bounds else ""), value))
    return out


def _leaf_type(parts: list[str]):
    cls, tp = Profile, None
    for part in parts:
        if cls is None or part not in _yaml_fields(cls):
            return None
        tp = _hints(cls)[part]
        cls = _section_type(tp)
    return tp


# ---------------------------------------------------------------- validation
# what an unknown key is shown as; anything else (a file that is no profile, ``include:
# /etc/shadow``, whose first line became a key) is not echoed
_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def _unknown_key(cls, key, prefix: str, source: str) -> ProfileError:
    valid = list(_yaml_fields(cls))
    if not _KEY_NAME.fullmatch(str(key)):
        return ProfileError(f"{source}: unknown key, not shown: it is no key name "
                            f"({len(str(key))} characters); is this file a vlmspec profile?")
    msg = f"{source}: unknown key '{_join(prefix, key)}'"
    hint = did_you_mean(key, valid, show=lambda k: f"'{_join(prefix, k)}'")
    if hint:
        return ProfileError(msg + hint)
    # Maybe the key belongs to another section (e.g. top-level 'temperature').
    by_leaf: dict[str, list[str]] = {}
    for k in profile_keys():
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    # a leaf in several sections (temperature): name them all
    hint = did_you_mean(key, by_leaf, cutoff=0.8,
                        show=lambda leaf: " or ".join(f"'{k}'" for k in by_leaf[leaf]))
    if hint:
        return ProfileError(msg + hint)
    where = f"under '{prefix}'" if prefix else "at top level"
    return ProfileError(f"{msg}; valid keys {where}: {', '.join(valid)}")


def _normalize(cls, data, prefix: str, source: str) -> dict:
    """Validate one layer (nested dict) against ``cls``; returns checked values."""
    if not isinstance(data, dict):
        what = f"key '{prefix}'" if prefix else "top level"
        raise ProfileError(f"{source}: {what} must be a mapping, got {type(data).__name__}")
    fields, hints, out = _yaml_fields(cls), _hints(cls), {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(cls, key, prefix, source)
        tp, path = hints[key], _join(prefix, key)
        sect = _section_type(tp)
        if sect is not None and isinstance(value, dict):
            out[key] = _normalize(sect, value, path, source)
        elif sect is not None and value is None:
            # An empty section (all keys commented out) means "no changes".
            out[key] = None if _is_optional(tp) else {}
        elif sect is not None:
            raise ProfileError(f"{source}: key '{path}' must be a mapping, "
                               f"got {type(value).__name__} {value!r}")
        else:
            out[key] = _coerce(value, tp, path, source)
            _check(out[key], fields[key].metadata, path, source)
    return out


def _merge(base: dict, top: dict) -> dict:
    """Deep merge: dicts merge recursively, everything else (lists too) is replaced."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _dotted_layer(key: str, value, source: str) -> dict:
    parts = str(key).split(".")
    if not all(parts):
        raise ProfileError(f"{source}: invalid key path '{key}'")
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    return _normalize(Profile, nested, "", source)


def _build(base, data: dict):
    kwargs = {}
    for name, f in _yaml_fields(type(base)).items():
        if name not in data or not f.init:
            continue
        value, sect = data[name], _section_type(_hints(type(base))[name])
        if sect is not None and isinstance(value, dict):
            value = _build(getattr(base, name) or sect(), value)
        kwargs[name] = list(value) if isinstance(value, list) else value
    return dataclasses.replace(base, **kwargs)


# ------------------------------------------------------------------- finding
def _display(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _packaged_dir() -> Path:
    try:
        from importlib.resources import files
        res = files("vlmspec_cli.profiles")
        if isinstance(res, Path) and res.is_dir():
            return res
    except (ImportError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "profiles"  # a source checkout


def is_shipped_profile(path: str | os.PathLike) -> bool:
    """``path`` is one of the profiles vlmspec ships: its name finds it from any folder."""
    return Path(path).resolve().parent == _packaged_dir().resolve()


def profile_search_path() -> list[Path]:
    """Directories where profile names resolve, highest priority first."""
    dirs = [Path(d) for d in os.environ.get(ENV_VAR, "").split(os.pathsep) if d]
    local = Path.cwd() / "profiles"
    if local.is_dir():
        dirs.append(local)
    dirs.append(_packaged_dir())
    seen, out = set(), []
    for d in dirs:
        real = d.resolve()
        if real not in seen:
            seen.add(real)
            out.append(d)
    return out


def _lookup_name(name: str) -> Path | None:
    stem = name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
    for d in profile_search_path():
        for suffix in _SUFFIXES:
            if _is_named_file(cand := d / f"{stem}{suffix}"):
                return cand
    return None


def _is_named_file(path: Path) -> bool:
    """Whether ``path`` names a file that reading will judge (a FIFO or device included,
    to be refused as such by name), rather than nothing or a directory."""
    return os.path.lexists(path) and not path.is_dir()


def resolve_profile_path(name_or_path: str | os.PathLike) -> Path:
    """An existing file path, or a profile name looked up in the search path."""
    text = os.fspath(name_or_path)
    if _is_named_file(Path(text)):
        return Path(text)
    if os.sep in text or "/" in text:
        raise ProfileError(f"profile file not found: {text}")
    found = _lookup_name(text)
    if found is None:  # the names only: no profile is read for the hint
        names = list(_profile_files())
        raise ProfileError(f"unknown profile '{text}'{did_you_mean(text, names)}; available: "
                           f"{', '.join(names) or '(none)'}")
    return found


def _read_yaml(path: Path):
    """The mapping in a profile file, read as profile/yaml_file.py does (a regular UTF-8
    file of at most 1 MiB, bounded nesting and aliases); ProfileError naming the file."""
    try:
        data = load_file(path, "profile")
    except YamlFileError as e:
        raise ProfileError(f"{_display(path)}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{_display(path)}: top level must be a mapping of keys, "
                           f"got {type(data).__name__}")
    return data


def _profile_files() -> dict[str, Path]:
    """Profile name -> file, for every YAML file on the search path; the first wins."""
    out: dict[str, Path] = {}
    for d in profile_search_path():
        files = sorted(p for s in _SUFFIXES for p in d.glob(f"*{s}")) if d.is_dir() else []
        for p in files:
            out.setdefault(p.stem, p)
    return out


def list_profiles() -> list[tuple[str, Path, str]]:
    """(name, path, description) of every profile on the search path; first wins. A file
    that cannot be read as a profile is listed with the reason as its description."""
    out = []
    for name, p in _profile_files().items():
        try:
            desc = str(_read_yaml(p).get("description", "") or "")
        except ProfileError as e:
            desc = f"(unreadable: {str(e).removeprefix(f'{_display(p)}: ')})"
        out.append((name, p, desc))
    return out


# ------------------------------------------------------------------- loading
def _includes(path: Path, data: dict) -> list[Path]:
    """The files ``data`` (read from ``path``, its ``include`` key popped) includes: each
    name next to the file first, else on the profile search path."""
    source = _display(path)
    includes = data.pop("include", None)
    if includes is None:
        includes = []
    elif isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ProfileError(f"{source}: key 'include' must be a file name or a list of them")
    out = []
    for inc in includes:
        cand = path.parent / inc
        target = cand if _is_named_file(cand) else _lookup_name(inc)
        if target is None:
            raise ProfileError(f"{source}: include '{inc}' not found next to the file "
                               f"or in the profile search path")
        out.append(target)
    return out


def _no_cycle(path: Path, chain: tuple[Path, ...]) -> Path:
    """``path`` resolved; ProfileError if the include chain that led here already holds it."""
    real = path.resolve()
    if real in chain:
        names = " -> ".join(_display(p) for p in (*chain, real))
        raise ProfileError(f"{_display(chain[-1])}: include cycle: {names}")
    return real


def _local_model(value, folder: Path):
    """A ``*.model`` value written in a profile file in ``folder``: a relative local path
    (``./m``, ``../m``, or a folder that exists there) is made absolute against the file's
    folder, as ``include:`` is; ``~`` is expanded. Hub ids (``org/name`` with no such
    folder), ``zoo:`` names, ``none`` and absolute paths stay as written. --set values are
    not files' values: they stay relative to the current directory."""
    if not isinstance(value, str) or not value or value.startswith("zoo:") or value == "none":
        return value
    if value.startswith("~"):
        return os.path.expanduser(value)
    if os.path.isabs(value):
        return value
    here = folder / value
    if value.startswith(("./", "../", ".\\", "..\\")) or value in (".", "..") or here.is_dir():
        return os.path.abspath(here)
    return value


def _resolve_models(data: dict, folder: Path) -> dict:
    """``data`` (one file's checked layer) with its sections' ``model`` values resolved."""
    out = dict(data)
    for key, section in data.items():
        if isinstance(section, dict) and "model" in section:
            out[key] = {**section, "model": _local_model(section["model"], folder)}
    return out


def _file_layer(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    real = _no_cycle(path, chain)
    data = dict(_read_yaml(path))
    merged: dict = {}
    for target in _includes(path, data):
        merged = _merge(merged, _file_layer(target, (*chain, real)))
    layer = _resolve_models(_normalize(Profile, data, "", _display(path)), path.parent)
    return _merge(merged, layer)


def include_chain(name_or_path: str | os.PathLike) -> list[Path]:
    """A profile's file and every file it includes, directly or not (resolved, each once,
    the profile's own first). Raises ProfileError as loading would."""
    out: list[Path] = []

    def walk(path: Path, chain: tuple[Path, ...]) -> None:
        real = _no_cycle(path, chain)
        if real not in out:
            out.append(real)
        for target in _includes(path, dict(_read_yaml(path))):
            walk(target, (*chain, real))

    walk(resolve_profile_path(name_or_path), ())
    return out


def load_profile(name_or_path: str | os.PathLike | None = None,
                 overrides: Iterable[str] = (),
                 cli: Mapping[str, Any] | None = None,
                 labels: Mapping[str, str] | None = None) -> Profile:
    """Load, merge and validate a profile. See the module docstring for precedence.
    ``labels``: how errors name where a ``cli`` key came from (the option the user typed,
    ``--inputs``; default "command line option 'KEY'")."""
    path = resolve_profile_path(DEFAULT_PROFILE if name_or_path is None else name_or_path)
    data = _file_layer(path)
    for item in overrides:
        source = f"--set {item}"
        key, sep, raw = str(item).partition("=")
        if not sep:
            raise ProfileError(f"{source}: expected KEY=VALUE (e.g. sampling.temperature=0.7)")
        key = key.strip()
        try:  # nesting and aliases bounded as in a profile file
            value, parse_error = load_text(raw), None
        except YamlFileError as e:
            value, parse_error = None, e
        tp = _leaf_type(key.split("."))
        # For string keys, take the text verbatim if YAML turned it into something the key
        # does not take (e.g. 'revision=1234', 'prompt=yes') or failed; a key of int or
        # text ('generation.batch_size=2', 'runtime.threads=auto') keeps YAML's int
        kinds = _union_args(tp) or (tp,)
        str_key = str in kinds
        fits = isinstance(value, tuple(k for k in kinds if isinstance(k, type)) + (type(None),)) \
            and not (isinstance(value, bool) and bool not in kinds)
        if str_key and (parse_error is not None or not fits):
            value, parse_error = raw, None
        if parse_error is not None:
            raise ProfileError(f"{source}: cannot parse value: {parse_error}")
        data = _merge(data, _dotted_layer(key, value, source))
    for key, value in (cli or {}).items():
        if value is not None:
            label = (labels or {}).get(key) or f"command line option '{key}'"
            data = _merge(data, _dotted_layer(key, value, label))
    profile = _build(Profile(), data)
    profile.source = str(path.resolve())
    return profile


def with_settings(profile: Profile, settings: Mapping[str, Any], source: str = "calibrate") -> Profile:
    """A copy of ``profile`` with dotted-key ``settings`` applied ({"tree.depth": 4}),
    checked as a profile's own keys are; the copy keeps the original's ``source``."""
    data: dict = {}
    for key, value in settings.items():
        data = _merge(data, _dotted_layer(key, value, f"{source}: {key}"))
    out = _build(profile, data)
    out.source = profile.source
    return out


# ------------------------------------------------------------------- dumping
def profile_to_dict(p) -> dict:
    """Plain nested dict of YAML keys (no ``source``); round-trips through load."""
    out = {}
    for name in _yaml_fields(type(p)):
        value = getattr(p, name)
        if dataclasses.is_dataclass(value):
            value = profile_to_dict(value)
        elif isinstance(value, list):
            value = list(value)
        out[name] = value
    return out


def profile_to_yaml(p) -> str:
    return yaml.safe_dump(profile_to_dict(p), sort_keys=False, allow_unicode=True)
