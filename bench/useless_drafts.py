"""A useless draft on every shipped real-family profile, and the own-model walk's random
pair: never slower than the target alone (issue 60, "Done when" item 3: ≥ 0.95x of
target-only, idle and beside two busy processes, outputs identical).

For each shipped real-family profile, tiny random-weight models of its family (the family
tests' builders, tests/families.py) stand in for its models: a target of
``--target-layers`` layers and, as the draft, another random model of the family with
``--draft-layers`` layers (seed 2: it agrees with the target by chance only), or a random
EAGLE-3 head where the profile's method is ``eagle3`` (tests/eagle3_heads.py). The
profile runs with its own method and defaults; only the model paths are replaced
(``--set target.model=… --set draft.model=…`` / ``eagle3.model=…``). The own-model walk's
pair is docs/own-models.md's: a 4-layer Qwen2.5-VL and a 1-layer copy of its first layer,
with the walk's profile file (chain, γ 4, 16 new tokens).

Each row is ``vlmspec caption IMAGES -p PROFILE --compare --json`` in a fresh process (so a
process's first request, and what it pays before auto length learns that drafting does
not pay, is counted) beside ``--loads`` busy processes (bench/load.py's competitors), over
``--repeat`` passes (``--cold``: without ``--compare``, whose untimed warm-up decode
teaches auto length what drafting costs before any input is timed; the method and
target-only each in a fresh process instead, as a user's run times them): the speedup (target-only's wall ÷ the method's, summed over the
inputs), the first request's and each input's, identical/total and the auto length's
counters (rounds drafted, plain, probes).

    python bench/useless_drafts.py [--loads 0,2] [--repeat 2] [--rows llava15-7b,walk] [--control]
        [--images examples/images/scene1.png,...] [--json OUT.json]

Prints a markdown table; ``--json`` writes the raw rows with the machine, `uptime` before
and after, and the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import relative_ci  # noqa: E402
from load import machine, run_rows  # noqa: E402

# profile -> the family builder's name in tests/families.py
PROFILES = {
    "llava15-7b": "llava", "llava-next-7b": "llava_next", "llava-onevision-7b": "llava_onevision",
    "mistral3-24b": "mistral3", "qwen2-vl-7b": "qwen2_vl", "qwen25-vl-7b": "qwen2_5_vl",
    "qwen25-vl-7b-eagle3": "qwen2_5_vl", "qwen3-vl-8b": "qwen3_vl",
    "qwen3-vl-8b-eagle3": "qwen3_vl",
}
WALK = "walk"   # docs/own-models.md's random pair and profile
WALK_PROFILE = """name: my-vlm
description: my tiny Qwen2.5-VL pair
target: {model: ./target}
draft: {model: ./draft}
method: chain
drafting: {gamma: 4, inputs: [multimodal]}
generation: {max_new_tokens: 16}
"""
IMAGES = ",".join(f"examples/images/scene{i}.png" for i in range(1, 7))   # the six demo scenes


def walk_pair(folder: Path) -> Path:
    """docs/own-models.md's walk, as written there: its profile file."""
    import torch
    from transformers import (AutoConfig, AutoImageProcessor, AutoTokenizer,
                              Qwen2_5_VLForConditionalGeneration)

    from vlmspec_cli.runtime.models.loading import resolve_model_source

    source = resolve_model_source("zoo:tinyworld/qwen-video-target")

    def tiny(layers: int):
        config = AutoConfig.from_pretrained(source)
        config.text_config.num_hidden_layers = layers
        config.text_config.layer_types = ["full_attention"] * layers
        return Qwen2_5_VLForConditionalGeneration(config)

    torch.manual_seed(0)
    target, draft = tiny(4), tiny(1)
    draft.load_state_dict(target.state_dict(), strict=False)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(folder / name)
        AutoTokenizer.from_pretrained(source).save_pretrained(folder / name)
        AutoImageProcessor.from_pretrained(source).save_pretrained(folder / name)
    profile = folder / "my-vlm.yaml"
    profile.write_text(WALK_PROFILE)
    return profile


def build(row: str, folder: Path, target_layers: int, draft_layers: int) -> list[str]:
    """The row's models under ``folder`` (built once, kept with --models); the CLI
    arguments that point the profile at them."""
    if row == WALK:
        profile = folder / "my-vlm.yaml"
        if not profile.exists():
            walk_pair(folder)
        return ["-p", str(profile)]
    import families
    from eagle3_heads import eagle3_head

    from vlmspec_cli.profile import load_profile

    maker = getattr(families, PROFILES[row])
    target = folder / "target"
    if not (target / "config.json").exists():
        maker(target, seed=1, layers=target_layers)
    sets = [f"target.model={target}"]
    if load_profile(row).method == "eagle3":
        head = folder / "eagle3-head"
        if not (head / "config.json").exists():
            eagle3_head(head, target, seed=2)
        sets.append(f"eagle3.model={head}")
    else:
        draft = folder / "draft"
        if not (draft / "config.json").exists():
            maker(draft, seed=2, layers=draft_layers)
        sets.append(f"draft.model={draft}")
    return ["-p", row] + [a for s in sets for a in ("--set", s)]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def first_speedups(row: dict, inputs: int) -> list[float]:
    """Each pass's first request's speedup (the process's first)."""
    per = row.get("per_input_speedup") or []
    return per[::inputs] if inputs else []


def over_control(row: dict, control: dict) -> dict | None:
    """The row's speedup over its A/A control's, pass i with pass i, and its 95% interval
    (benchlib.relative_ci): what the row reads beyond what target-only reads against
    itself beside the same busy processes."""
    walls, base = row.get("per_pass_wall_s"), control.get("per_pass_wall_s")
    if not walls or not base or not control.get("speedup"):
        return None
    ci = relative_ci([tuple(w) for w in walls], [tuple(w) for w in base])
    return {"ratio": round(row["speedup"] / control["speedup"], 4),
            "ci95": [round(x, 4) for x in ci[1:]] if ci else None}


def table(rows: list[dict]) -> str:
    out = ["| profile | busy | speedup | ÷ control | first request | min input | identical | drafted / plain / probes | load before -> after |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        auto = r.get("auto") or {}
        per = r.get("per_input_speedup") or []
        out.append(
            f"| {r['row']} | {r['competitors']} | {r.get('speedup')} | "
            f"{(r.get('over_control') or {}).get('ratio', '')} | "
            f"{', '.join(f'{x:.2f}' for x in r['first_request_speedup'])} | "
            f"{min(per) if per else None} | {r.get('identical')}/{r['inputs']} | "
            f"{auto.get('rounds_drafted')} / {auto.get('rounds_plain')} / {auto.get('probes')} | "
            f"{r['loadavg_before'][0]:.1f} -> {r['loadavg_after'][0]:.1f} |")
    return "\n".join(out)


def write(args, info: dict, rows: list[dict]) -> None:
    if args.json_out:
        out = {"machine": info, "command": shlex.join(["python"] + sys.argv), "note": args.note,
               "images": args.images, "target_layers": args.target_layers,
               "draft_layers": args.draft_layers, "cold": args.cold, "rows": rows}
        Path(args.json_out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=",".join([*PROFILES, WALK]),
                    help="shipped profiles (and 'walk'), comma-separated")
    ap.add_argument("--loads", default="0,2", help="busy processes beside each row, comma-separated")
    ap.add_argument("--repeat", type=int, default=2, help="passes (fresh processes) of each row")
    ap.add_argument("--images", default=IMAGES, help="comma-separated image files")
    ap.add_argument("--target-layers", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--models", help="folder to build the models in and keep (default: a "
                                     "temporary one)")
    ap.add_argument("--competitor-s", type=float, default=300.0,
                    help="a busy process stops by itself after this many seconds")
    ap.add_argument("--cold", action="store_true",
                    help="bench/load.py's --cold: no --compare (whose untimed warm-up decode "
                         "learns what drafting costs before any input is timed); the method "
                         "and target-only each in a fresh process, every request timed as a "
                         "user's run times it, the process's first included")
    ap.add_argument("--control", action="store_true",
                    help="beside each row, its A/A control taking turns with it pass by pass "
                         "(the same command with --set method=none: target-only against "
                         "itself), and the row's speedup over the control's")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="more --set KEY=VALUE for every row (e.g. drafting.length=fixed)")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    rows_wanted = args.rows.split(",")
    unknown = [r for r in rows_wanted if r not in PROFILES and r != WALK]
    if unknown:
        ap.error(f"unknown row(s): {', '.join(unknown)}")
    loads = [int(x) for x in args.loads.split(",")]
    images = [str(ROOT / p) for p in args.images.split(",")]
    info = machine()
    info["uptime_at_start"] = uptime()
    print(f"# {info['date']}, {info['cpu']} ({info['cpus']} CPUs), commit {info['commit']}; "
          f"{info['uptime_at_start']}", flush=True)
    run_args = SimpleNamespace(repeat=args.repeat, competitor_s=args.competitor_s, cold=args.cold)
    py = [sys.executable, "-m", "vlmspec_cli"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="vlmspec-useless-") as tmp:
        base = Path(args.models or tmp)
        for name in rows_wanted:
            point = build(name, base / name, args.target_layers, args.draft_layers)
            cmd = py + ["caption", *images, *point, "--compare", "--json", "-q",
                        *[a for s in args.sets for a in ("--set", s)]]
            for load in loads:
                cmds = [cmd] + ([cmd + ["--set", "method=none"]] if args.control else [])
                done = run_rows(cmds, load, run_args)
                for tag, c, row in zip(("", " (control)"), cmds, done):
                    row.update({"row": name + tag, "command": shlex.join(["vlmspec"] + c[3:]),
                                "uptime_after": uptime()})
                    row["first_request_speedup"] = first_speedups(row, len(images))
                    rows.append(row)
                if args.control:
                    done[0]["over_control"] = over_control(done[0], done[1])
                for row in done:
                    print(f"[{row['row']}, {load} busy] {row['command']}\n    {row['uptime_after']}; "
                          f"rc {row['rc']}: speedup {row.get('speedup')}, over control "
                          f"{row.get('over_control')}, first {row['first_request_speedup']}, "
                          f"per input {row.get('per_input_speedup')}, identical "
                          f"{row.get('identical')}/{row['inputs']}, auto {row.get('auto')}"
                          + (f"\n    {row['stderr_tail']}" if row.get("stderr_tail") else ""),
                          flush=True)
                write(args, info, rows)   # after every row: a run cut short keeps its rows
    info["uptime_at_end"] = uptime()
    print()
    print(table(rows))
    write(args, info, rows)


if __name__ == "__main__":
    main()
