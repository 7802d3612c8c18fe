"""Where the tinyworld EAGLE-3 head's proposals go wrong on MMSpec questions (issue 60): per
reply of examples/mmspec/mmspec.jsonl (every turn of every conversation, each later
question also asked alone, over its image), the demo captions, and chats that end in a
caption after a question:

- ``teacher``: the head's first proposal read off the whole sequence in one pass (the
  target's own transformers forward over prompt + greedy answer, its three layers, the
  head over every pair at once; no drafter, no engine): how often its argmax is the
  target's next token (tests/test_eagle3_rounds.py proves the drafter proposes exactly this);
- ``eagle3`` / ``hidden``: the engine at γ = 1, fixed (no auto length): tokens kept of those
  proposed, the first free token of a reply (q = p) included;
- ``oov``: answer tokens outside the EAGLE-3 head's draft vocabulary (q = 0 there: the head
  can never propose them).

    python bench/eagle3_questions.py > bench/runs/2026-12-07/eagle3-questions.txt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from PIL import Image

from vlmspec_cli import api
from vlmspec_cli.runtime.adapters.base import pick_layers
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import draft_vocab_logits

ROOT = Path(__file__).resolve().parent.parent
FIXED = ["drafting.length=fixed", "drafting.gamma=1"]


@torch.inference_mode()
def teacher_hits(drafter, msgs, toks) -> tuple[int, int, int]:
    """(answer tokens the head's one-pass argmax predicts, tokens predicted, prompt length)."""
    lm, head = drafter.target, drafter.head
    ad = lm.adapter
    inp = ad.encode(lm, ad.prompt_text(lm, msgs), [im for m in msgs for im in m.images] or None)
    ids = inp["input_ids"][0]
    full = torch.cat([ids, torch.tensor(toks[:-1], dtype=ids.dtype)])
    inp = dict(inp, input_ids=full[None])
    inp.pop("attention_mask", None)
    g = pick_layers(lm.model(**inp, output_hidden_states=True).hidden_states, drafter.hidden_layer)[0]
    n = len(full)
    seq = torch.cat([full, torch.tensor(toks[-1:], dtype=ids.dtype)])
    h = head(drafter.embed(seq[1:n + 1][None]), head.project(g)[None],
             torch.arange(n)[None].expand(3, -1), head.new_cache())[0]
    pred = draft_vocab_logits(head.logits(h).float(), head.target_ids, drafter.vocab).argmax(-1)
    hits = [int(pred[len(ids) + j - 2]) == toks[j] for j in range(1, len(toks))]
    return sum(hits), len(hits), len(ids)


class Table:
    def __init__(self, profile: str | None) -> None:
        self.e3 = api.load(profile, method="eagle3", overrides=FIXED).session
        self.hid = api.load(profile, method="hidden", overrides=FIXED).session
        self.drafter = self.e3.engine.drafter
        self.t2d = self.drafter.head.t2d.cpu()
        self.groups: dict[str, list[int]] = {}

    def row(self, name: str, group: str, msgs) -> list[int]:
        r = self.e3.engine.generate(Request(list(msgs), max_new_tokens=64))
        toks = r.state.tokens
        a, n, L = teacher_hits(self.drafter, msgs, toks)
        rh = self.hid.engine.generate(Request(list(msgs), max_new_tokens=64))
        assert rh.state.tokens == toks, name
        s, sh = r.state.stats, rh.state.stats
        oov = sum(1 for t in toks if not self.t2d[t])
        v = [a, n, s.num_accepted_tokens, s.num_draft_tokens, sh.num_accepted_tokens,
             sh.num_draft_tokens, oov, len(toks)]
        self.groups[group] = [x + y for x, y in zip(self.groups.get(group, [0] * 8), v)]
        print(f"{name[:58]:58s} L={L:4d} teacher {a:2d}/{n:2d}  eagle3 γ=1 {v[2]:2d}/{v[3]:2d}  "
              f"hidden γ=1 {v[4]:2d}/{v[5]:2d}  oov {oov}/{len(toks)}", flush=True)
        return toks

    def summary(self) -> None:
        print(f"\n{'group':38s} teacher-forced  eagle3 γ=1   hidden γ=1  outside draft vocab")
        for k, (a, n, ea, en, ha, hn, oov, nt) in self.groups.items():
            print(f"{k:38s} {a / max(n, 1):6.2f} ({n:3d})  {ea / max(en, 1):6.2f} ({en:3d})  "
                  f"{ha / max(hn, 1):6.2f} ({hn:3d})  {oov / nt:5.0%} of {nt}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=None, help="default: tinyworld-caption")
    ap.add_argument("--mmspec", default=str(ROOT / "examples" / "mmspec" / "mmspec.jsonl"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    t = Table(args.profile)
    tok = t.e3.target.tokenizer
    folder = Path(args.mmspec).parent / "images"
    for line in open(args.mmspec, encoding="utf-8"):
        x = json.loads(line)
        im = Image.open(folder / x["image"]).convert("RGB")
        msgs: list[Message] = []
        for i, q in enumerate(x["turns"]):
            msgs.append(Message("user", q, (im,) if i == 0 else ()))
            toks = t.row(f"{x['id']} t{i + 1} {q}", x["topic"] + (" (turn 1)" if i == 0 else " (turn 2+)"), msgs)
            msgs.append(Message("assistant", tok.decode(toks, skip_special_tokens=True)))
            if i > 0:
                t.row(f"{x['id']} single {q}", "later questions asked alone", [Message("user", q, (im,))])
    for i in range(1, 7):
        im = Image.open(ROOT / "examples" / "images" / f"scene{i}.png").convert("RGB")
        t.row(f"scene{i} describe", "demo captions", [Message("user", "describe the image.", (im,))])
        if i <= 3:
            m = [Message("user", "which colour does the circle have?", (im,))]
            r = t.e3.engine.generate(Request(list(m), max_new_tokens=64))
            m += [Message("assistant", tok.decode(r.state.tokens, skip_special_tokens=True)),
                  Message("user", "describe the image.")]
            t.row(f"scene{i} chat: question, then describe", "chat ending in a caption", m)
    t.summary()


if __name__ == "__main__":
    main()
