"""``vlmspec profiles new``: a profile for a model of the user's own, every key it sets
commented with what it is and what else it takes, so the next step is editing a file
rather than reading the schema.

The task and the family come from the model's config.json as ``--model`` reads it
(runtime/models/loading.py ``peek_adapter``: no weights load); the method from
``--method``, else the first of the task's that drafts with the models given (a
``--draft``: a draft-model method; none: a head shipped for the target, else ``none``).
The keys written are the profile's own (schema.py): the file loads as any profile does,
checked here before it is written. Written atomically and never over a file that
``profiles new`` did not write (tasks/output_files.py). Knows nothing of click or rich.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vlmspec_cli.tasks.output_files import check_output, is_profile, write_checked, written_by

MARK = "# written by `vlmspec profiles new`"
INPUTS = {"caption": "IMAGES", "video": "VIDEOS", "image": "PROMPT"}   # what each task reads
COMMENT_COLUMN = 34     # where the comments start, as in the shipped profiles
WIDTH = 96

# what each key the command writes is; its alternatives come from the schema (key_rows)
NOTES = {
    "name": "how -p and `vlmspec profiles` name it",
    "description": "the line `vlmspec profiles` shows beside the name",
    "task": "the command it serves: caption (caption, bench), video (describe-video), "
            "image (generate-image)",
    "target": "the model whose output is kept: at temperature 0 the output is "
              "token-identical to its own greedy decoding",
    "target.model": "a model folder or a hub id",
    "target.dtype": "the weights' number format (auto: the model's own, float32 on a CPU)",
    "target.device": "where it runs (auto: cuda, then mps, then cpu)",
    "draft": "the small model that proposes tokens for the target to verify",
    "draft.model": "a folder or a hub id with the target's tokenizer (null: none; methods "
                   "chain, tabed, tree and adt need one)",
    "method": "how drafts are made (`vlmspec {command} --help` says what each does)",
    "drafting": "how much is drafted per round",
    "drafting.gamma": "draft tokens per round; with length auto, the most a round drafts",
    "drafting.length": "auto: each round's length from the acceptance seen and the measured "
                       "costs, drafting off while it does not pay (never slower than the "
                       "target alone); fixed: every round drafts gamma",
    "drafting.inputs": "what the draft model sees: multimodal (image and text), text, caption "
                       "(a captioner's caption), pooled (pooled image features)",
    "hidden": "method hidden: a head on the target's hidden states",
    "hidden.model": "the head's folder or hub id, trained for this target (null: set it; "
                    "README, Your own models, trains one)",
    "eagle3": "method eagle3: a published EAGLE-3 head",
    "eagle3.model": "the head's folder or hub id, trained for this target (SpecForge's "
                    "layout; null: set it)",
    "twig": "method twig: self-speculation on the target's first layers",
    "twig.model": "the twig's folder, trained for this target (none: the target's first "
                  "layers and its own head, no training)",
    "captioner": "the image-to-text model behind drafting input caption",
    "captioner.model": "a folder or a hub id",
    "tree": "the draft trees' shape",
    "tree.depth": "levels per tree (with length auto, the most a round drafts)",
    "tree.top_k": "children per node",
    "tree.total_tokens": "nodes verified per round",
    "tree.policy": "dynamic: EAGLE-2 (expand the best-scoring nodes); static: a fixed shape",
    "video": "how describe-video samples a video",
    "video.frames": "frames sampled uniformly (null: by fps)",
    "video.fps": "or frames per second of video (null: by frames)",
    "image": "generate-image's guidance and images",
    "image.cfg": "classifier-free guidance scale (null: the model's own)",
    "image.images_per_prompt": "images per prompt",
    "generation": "what is asked and how long the answer may be",
    "generation.prompt": "the question or instruction for every input (--prompt)",
    "generation.max_new_tokens": "tokens per output at most (--max-new-tokens)",
    "sampling": "greedy or sampled",
    "sampling.temperature": "0: greedy, lossless (the target's own output); > 0: sampled from "
                            "the target's distribution",
    "sampling.seed": "the sampling seed (recorded in every record)",
}


class NewProfileError(Exception):
    """The profile cannot be written; the message is one line saying why."""


@dataclass
class NewProfile:
    """What ``profiles new`` writes: the profile, its text, and lines for the user."""

    profile: object
    text: str
    notes: list[str] = field(default_factory=list)


def out_path(name: str, out: str | None) -> Path:
    """--out FILE, else profiles/NAME.yaml (found by name from this folder)."""
    if out:
        return Path(out)
    if not name.strip() or "/" in name or os.sep in name or name.endswith((".yaml", ".yml")):
        raise NewProfileError(f"NAME '{name}': a profile name, not a file (the file is "
                              "--out FILE, default profiles/NAME.yaml)")
    from vlmspec_cli.fileio import same_file
    from vlmspec_cli.profile import ProfileError, resolve_profile_path

    path = Path("profiles") / f"{name}.yaml"
    try:
        found = resolve_profile_path(name)
    except (ProfileError, OSError):
        return path
    if not same_file(found, path):   # -p NAME would find one of the two only
        raise NewProfileError(f"NAME '{name}': is the name of profile {found}; pick another "
                              "(or write elsewhere: --out FILE)")
    return path


def _rules(force: bool) -> dict:
    return dict(force=force, what="profile written by `vlmspec profiles new`",
                ours=lambda p: written_by(p, "profiles new") and is_profile(p))


def check_path(path: Path, force: bool) -> None:
    """Before any model config is read: OutputRefused unless ``path`` may be written."""
    check_output(path, str(path), **_rules(force))


def write(path: Path, text: str, force: bool) -> None:
    write_checked(path, text.encode("utf-8"), str(path), **_rules(force))


def new_profile(name: str, model: str, draft: str | None, method: str | None,
                task: str | None, sets: list[str]) -> NewProfile:
    """The profile NAME for ``model`` (and ``draft``), ``--set`` applied, and its commented
    text; NewProfileError (one line) where it cannot be."""
    from vlmspec_cli.drafters import method_class
    from vlmspec_cli.profile import Profile, ProfileError, load_profile, with_settings
    from vlmspec_cli.session import SessionError, foreign_companions, match_companions
    from vlmspec_cli.tasks.calibrate_io import pinned_settings

    try:   # --set first: its method and task count as --method's and --task's
        pinned = pinned_settings(load_profile(None, sets), sets) if sets else {}
    except ProfileError as exc:
        raise NewProfileError(str(exc)) from None
    said = "--method " if method else "--set method="   # how its errors name it
    method, task = method or pinned.pop("method", None), task or pinned.pop("task", None)
    adapter = _family(model)
    task = _task(task, adapter, model)
    prof = with_settings(Profile(), {"name": name, "task": task, "target.model": _local(model),
                                     "draft.model": _local(draft) if draft else None},
                         source="profiles new")
    picked = method or _default_method(prof)
    try:
        cls = method_class(picked)
    except ValueError as exc:   # unknown: the valid names
        raise NewProfileError(f"{said}{picked}: {exc}") from None
    if task not in cls.tasks:
        raise NewProfileError(f"{said}{picked}: {cls.task_error(task, _methods(task))}")
    prof = with_settings(prof, {"method": picked,
                                "description": _description(model, adapter, picked)},
                         source=f"--method {picked}")
    notes = [] if method else [_why_method(prof, bool(draft))]
    if adapter is None:
        notes.append(f"the family of '{model}' is not known here (no config.json on this "
                     f"machine, or no vlmspec adapter reads it): task {task}")
    try:
        prof, _ = match_companions(with_settings(prof, cls.beside(prof), source="method"))
        prof = with_settings(prof, {f"{role}.model": None for role in foreign_companions(prof)}
                             | pinned, source="--set")
    except (ProfileError, SessionError, ValueError) as exc:
        raise NewProfileError(str(exc)) from None
    problem = _problem(prof)
    if problem:
        notes.append(f"before it decodes: {problem}")
    family = adapter.model_types[0] if adapter is not None else None
    return NewProfile(prof, render(prof, written_keys(prof, pinned), family), notes)


def _description(model: str, adapter, method: str) -> str:
    family = adapter.model_types[0] if adapter is not None else "family unknown"
    return f"{Path(model.rstrip('/')).name or model} ({family}), method {method}"


def _local(model: str) -> str:
    """A model folder of this machine as an absolute path (a profile's relative paths
    resolve against its own folder); hub ids and zoo: names as given."""
    folder = os.path.expanduser(model)
    return os.path.abspath(folder) if not model.startswith("zoo:") and os.path.isdir(folder) else model


def _family(model: str):
    """The model's family adapter from its config.json (``--model`` reads it so), or None
    where it cannot be read here; NewProfileError for a folder vlmspec cannot load."""
    from vlmspec_cli.profile import ModelSpec
    from vlmspec_cli.runtime.models.loading import ModelLoadError, peek_adapter, require_safetensors

    try:
        require_safetensors(model, "target")
    except ModelLoadError as exc:
        raise NewProfileError(str(exc)) from None
    return peek_adapter(ModelSpec(model=model), "target")


def _task(task: str | None, adapter, model: str) -> str:
    """--task, checked against what the family does; else image for a model that
    generates images, caption for the rest."""
    if adapter is None:
        return task or "caption"
    family = adapter.model_types[0]
    can = {"image": adapter.generates_images, "video": adapter.takes_videos,
           "caption": adapter.takes_images and not adapter.generates_images}
    if task is None:
        return "image" if adapter.generates_images else "caption"
    if not can[task]:
        does = [t for t, ok in can.items() if ok]
        raise NewProfileError(f"--task {task}: '{model}' (family {family}) is for task "
                              f"{' or '.join(does) or 'none of vlmspec' + chr(39) + 's'}")
    return task


def _methods(task: str) -> list[str]:
    from vlmspec_cli.drafters import method_class, method_names

    return [n for n in method_names() if task in method_class(n).tasks]


def _default_method(profile) -> str:
    """The first of the task's methods that drafts with what is given: a draft model's
    (``--draft``), else one whose model is shipped for the target, else none."""
    from vlmspec_cli.companions import SHIPPED_COMPANIONS
    from vlmspec_cli.drafters import method_class

    shipped = SHIPPED_COMPANIONS.get(profile.target.model, {})
    for name in _methods(profile.task):
        cls = method_class(name)
        if cls.drafts and (cls.uses_draft if profile.draft.model else name in shipped):
            return name
    return _methods(profile.task)[0]


def _why_method(profile, draft: bool) -> str:
    from vlmspec_cli.drafters import method_class

    if not method_class(profile.method).drafts:
        return (f"method {profile.method}: no --draft and no head shipped for this target; give "
                "--draft DIR, or --method with its model (--set hidden.model=HEAD)")
    why = "a method with a draft model" if draft else "a head shipped for this target"
    return f"method {profile.method} ({why}; --method picks another)"


def _problem(profile) -> str | None:
    """What the session would refuse before loading (a head not set), or None."""
    from vlmspec_cli.session import SessionError, validate_method

    try:
        validate_method(profile)
    except SessionError as exc:
        return str(exc)
    return None


def written_keys(profile, pinned: dict) -> list[str]:
    """The dotted keys the file sets, in order: what every profile needs, what its task and
    method read (the models its method loads, a tree's shape), and every --set key."""
    from vlmspec_cli.drafters import method_class

    cls = method_class(profile.method)
    keys = ["name", "description", "task", "target.model", "target.dtype", "target.device",
            "draft.model", "method"]
    if cls.drafts:
        keys += ["drafting.gamma", "drafting.length"]
        keys += ["drafting.inputs"] if cls.uses_draft and profile.task != "image" else []
    keys += [f"{role}.model" for role, _ in cls.models(profile) if role != "draft"]
    keys += [f"tree.{k}" for k in ("depth", "top_k", "total_tokens", "policy")] if cls.trees else []
    keys += {"video": ["video.frames", "video.fps"],
             "image": ["image.cfg", "image.images_per_prompt"]}.get(profile.task, [])
    keys += ["generation.prompt"] if profile.task != "image" else []
    keys += ["generation.max_new_tokens", "sampling.temperature", "sampling.seed"]
    return keys + [leaf for k in pinned for leaf in _leaves(k, pinned) if leaf not in keys]


def _leaves(key: str, pinned: dict) -> list[str]:
    """A --set key as the leaf keys it sets (``--set tree={depth: 3}`` sets tree.depth)."""
    from vlmspec_cli.profile import profile_keys

    if not isinstance(pinned[key], dict):
        return [key]
    return [k for k in profile_keys() if k.startswith(f"{key}.")]


def render(profile, keys: list[str], family: str | None) -> str:
    """The profile's text: ``keys`` (dotted) grouped by section in the order given, each
    with a comment saying what it is and what it takes."""
    from vlmspec_cli.drafters.base import TASK_COMMANDS
    from vlmspec_cli.profile import key_rows

    command = TASK_COMMANDS[profile.task]
    takes = {k: what.replace("|", " | ") for k, what, _ in key_rows(profile)}
    takes["method"] = " | ".join(_methods(profile.task))
    sections: dict[str, list[str]] = {}
    for key in keys:
        head, _, leaf = key.rpartition(".")
        if leaf not in sections.setdefault(head, []):
            sections[head].append(leaf)
    lines = [f"{MARK} for {profile.target.model}.",
             "# Every key below is commented: what it is, then what it takes. A key left out",
             "# takes its default (`vlmspec profiles --keys` lists every key).",
             f"# Use it: vlmspec {command} {INPUTS[profile.task]} -p {profile.name}"]
    for head, leaves in sections.items():
        if head:
            lines += _commented(f"{head}:", NOTES.get(head, ""))
        for leaf in leaves:
            key = f"{head}.{leaf}" if head else leaf
            note = NOTES.get(key, "set by --set (README, Profiles, and the section's "
                                  "comments in vlmspec_cli/profile/schema.py say what it "
                                  "does)").format(command=command)
            if key == "target.model" and family:
                note += f"; its family (model_type {family}) comes from its config.json"
            value = profile
            for part in key.split("."):
                value = getattr(value, part)
            lines += _commented(f"{'  ' if head else ''}{leaf}: {_yaml(value)}",
                                f"{note} [{takes[key]}]")
    return "\n".join(lines) + "\n"


def _yaml(value) -> str:
    """One value as YAML on one line (flow style: lists as [a, b])."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 20)
    return text.strip().removesuffix("\n...").strip()


def _commented(text: str, comment: str) -> list[str]:
    """``text`` with ``comment`` from COMMENT_COLUMN, wrapped onto comment lines below it."""
    if not comment:
        return [text]
    start = max(COMMENT_COLUMN, len(text) + 2)
    parts = textwrap.wrap(comment, max(40, WIDTH - start - 2))
    return ([text.ljust(start) + "# " + parts[0]]
            + [" " * start + "# " + part for part in parts[1:]])
