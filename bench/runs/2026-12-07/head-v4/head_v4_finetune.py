# head-v4 (issue 60, item 7): train the llava-deep hidden head from collected data
# (head_v4_collect.py), warm-started from a head (default: the shipped one), each batch
# drawn from the sources by weight. Same loss and stages as zoo/hidden_train.py.
#   python head_v4_finetune.py --data ref.pt:0.5,broad.pt:0.5 --out DIR [--init HEAD|new]
import argparse
import glob
import json
import random
import time
from pathlib import Path

import torch

from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead
from vlmspec_cli.runtime.models.loading import ZOO_ROOT, load_model
from vlmspec_cli.zoo.hidden_train import frozen_io, head_loss, new_head, pad_batch
from vlmspec_cli.zoo.train import optimize, warmup_cosine

ap = argparse.ArgumentParser()
ap.add_argument("--data", required=True, help="FILE:WEIGHT,...")
ap.add_argument("--init", default=str(ZOO_ROOT / "tinyworld" / "llava-deep-hidden"))
ap.add_argument("--out", required=True)
ap.add_argument("--stage1", type=int, default=200)
ap.add_argument("--stage2", type=int, default=300)
ap.add_argument("--feedback", type=int, default=3)
ap.add_argument("--lr", type=float, default=5e-4)
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--threads", type=int, default=1)
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
lm = load_model(ModelSpec(model="zoo:tinyworld/llava-target-deep", device="cpu", dtype="float32"),
                "target")
sources = []
for item in args.data.split(","):
    path, w = item.rsplit(":", 1)
    # a glob: every chunk collected so far
    files = sorted(glob.glob(path))
    data = [ex for f in files for ex in torch.load(f, weights_only=False)]
    sources.append((data, float(w), f"{path} ({len(files)} files, {len(data)} examples)"))
head = (new_head(lm, -1, max_steps=args.feedback + 1, seed=args.seed) if args.init == "new"
        else HiddenDraftHead.from_pretrained(args.init))
embed, lm_head = frozen_io(lm)
rng = random.Random(args.seed)
total = args.stage1 + args.stage2


def batch_loss(step):
    # each example of a batch from a source drawn by weight
    picks = rng.choices(sources, weights=[w for _, w, _ in sources], k=args.batch)
    batch = pad_batch([rng.choice(data) for data, _, _ in picks])
    stage = 1 if step < args.stage1 else 2
    loss = head_loss(head, embed, lm_head, batch, 0 if stage == 1 else args.feedback)
    return loss, lambda: f"stage {stage} loss {loss.item():.4f}"


t0 = time.time()
head.train()
optimize([p for p in head.parameters() if p.requires_grad], total, batch_loss, "head",
         lr=args.lr, weight_decay=0.0, schedule=warmup_cosine(args.warmup, total), log_every=50)
head.eval()
report = {"init": args.init, "data": [f"{p}: {w}" for _, w, p in sources], "stage1_steps": args.stage1,
          "stage2_steps": args.stage2, "feedback_steps": args.feedback, "lr": args.lr,
          "batch": args.batch, "train_s": round(time.time() - t0, 1),
          "params": sum(p.numel() for p in head.parameters())}
head.save_pretrained(args.out)
(Path(args.out) / "BUILD_REPORT.json").write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
