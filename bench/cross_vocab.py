"""What drafting through text costs: a draft of another tokenizer (drafters/retokenized.py)
against the same draft with the target's tokenizer, both reading the prompt's text
(input T), on the default caption pair, side by side with target-only decoding.

The draft of another tokenizer is the default draft (llava-deep-draft) as a text-only
Llama with every token id reversed (tests/test_cross_vocab.py ``reversed_draft``): the same
model and text, other ids, so any difference from the same-tokenizer row is the cost of
re-tokenising (decode, encode twice per round, re-syncing the draft's cache). The default
configuration (input M) is there for reference. Configurations take turns over ``--repeats``
passes; wall times are medians; every row's tokens are compared with target-only.

    python bench/cross_vocab.py [--scenes 12] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

from benchlib import machine_info, print_table  # noqa: E402  (bench/benchlib.py)
from test_cross_vocab import reversed_draft  # noqa: E402  (the builder the tests use)
from vlmspec_cli.profile import load_profile  # noqa: E402
from vlmspec_cli.runtime.models.loading import ZOO_ROOT  # noqa: E402
from vlmspec_cli.runtime.request import Message, Request  # noqa: E402
from vlmspec_cli.session import build_session  # noqa: E402
from vlmspec_cli.zoo import world  # noqa: E402


def configs(reversed_dir: Path) -> dict[str, list[str]]:
    return {
        "target-only": ["method=none"],
        "chain T, same tokenizer": ["drafting.inputs=[text]"],
        "chain T, another tokenizer (through text)": ["drafting.inputs=[text]",
                                                       f"draft.model={reversed_dir}"],
        "chain M (the default)": [],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--scenes", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    folder = Path(tempfile.mkdtemp()) / "reversed"
    reversed_draft(folder, ZOO_ROOT / "tinyworld" / "llava-deep-draft")
    sessions = {name: build_session(load_profile("tinyworld-caption", sets))
                for name, sets in configs(folder).items()}
    prompt = sessions["target-only"].profile.generation
    rng = random.Random(args.seed)
    requests = [Request([Message("user", prompt.prompt, (world.render(world.sample_scene(rng)),))],
                        max_new_tokens=prompt.max_new_tokens) for _ in range(args.scenes)]
    walls = {name: [] for name in sessions}
    tokens, accept = {}, {}
    for _ in range(args.repeats):
        for name, session in sessions.items():
            t0 = time.perf_counter()
            results = [session.engine.generate(r) for r in requests]
            walls[name].append(time.perf_counter() - t0)
            tokens[name] = [r.tokens for r in results]
            acc = sum(r.state.stats.num_accepted_tokens for r in results)
            rounds = sum(r.state.stats.num_drafts for r in results)
            accept[name] = 1 + acc / max(rounds, 1)
    base = statistics.median(walls["target-only"])
    rows, out = [], []
    for name in sessions:
        wall = statistics.median(walls[name])
        same = sum(a == b for a, b in zip(tokens[name], tokens["target-only"]))
        new = sum(map(len, tokens[name]))
        out.append({"config": name, "wall_s": round(wall, 3), "speedup": round(base / wall, 3),
                    "new_tokens": new, "tokens_per_s": round(new / wall, 1),
                    "mean_acceptance_length": round(accept[name], 3), "identical": same,
                    "requests": len(requests)})
        rows.append([name, f"{wall:.2f}", f"{new / wall:.0f}", f"{base / wall:.2f}x", f"{accept[name]:.2f}",
                     f"{same}/{len(requests)}"])
    print_table(f"cross-vocabulary drafting, {args.scenes} scenes, median of {args.repeats}",
                ["config", "wall s", "tok/s", "speedup", "mean accept len", "identical"], rows, True)
    report = {"machine": machine_info(torch.device("cpu")), "args": vars(args) | {"json": str(args.json)},
              "rows": out}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
