# head-v4 (issue 60, item 7): collect the training data of a hidden head for llava-deep once
# and keep it (torch.save of hidden_train.Example lists), so several fine-tunes can share it.
#   ref N SEED OUT:   zoo/hidden.py's llava_data (the shipped head's data: world captions/QA)
#   broad N SEED OUT: zoo/hidden_broad.py's conversations answered by the target (v3's mix),
#                     in chunks of 150 (seeds SEED, SEED+1, ...: OUT-0.pt, OUT-1.pt, ...) so
#                     that a slow machine still leaves usable chunks
import sys
import time

import torch

from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.models.loading import load_model
from vlmspec_cli.zoo.hidden import llava_data
from vlmspec_cli.zoo.hidden_broad import broad_data
from vlmspec_cli.zoo.hidden_train import collect

kind, n, seed, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
torch.manual_seed(0)
lm = load_model(ModelSpec(model="zoo:tinyworld/llava-target-deep", device="cpu", dtype="float32"),
                "target")
t0 = time.time()
if kind == "ref":
    reqs, answers = llava_data(n, seed)
    data = collect(lm, reqs, answers, -1)
    torch.save(data, out)
    print(f"ref: {len(data)} examples, {time.time() - t0:.0f}s -> {out}", flush=True)
else:
    for k in range(0, (n + 149) // 150):
        reqs, answers = broad_data(lm, min(150, n - 150 * k), seed + k, max_new_tokens=64)
        data = collect(lm, reqs, answers, -1)
        torch.save(data, f"{out}-{k}.pt")
        print(f"broad chunk {k}: {len(data)} examples, {time.time() - t0:.0f}s -> {out}-{k}.pt",
              flush=True)
