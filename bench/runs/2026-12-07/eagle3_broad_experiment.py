"""An experiment, not a shipped head: the same EAGLE-3 training code (zoo/eagle3_export.train_eagle3)
on the target's own answers to broad conversations (zoo/hidden_broad.broad_data: every MMSpec
topic, multi-turn) instead of captions for one prompt. Does the architecture accept on questions?

    python bench/runs/2026-12-07/eagle3_broad_experiment.py 200 400 512 OUT_DIR
(conversations, training steps, draft vocabulary, where the head goes; the run's log:
eagle3-broad-experiment-train.txt)"""
import sys, time, json, torch
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.models.loading import load_model
from vlmspec_cli.zoo.hidden_broad import broad_data
from vlmspec_cli.zoo.eagle3_export import train_eagle3, write_head_dir
from pathlib import Path
n, steps, vocab, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
torch.set_num_threads(1)
lm = load_model(ModelSpec(model="zoo:tinyworld/llava-target-deep", device="cpu", dtype="float32"), "target")
t0 = time.time()
reqs, answers = broad_data(lm, n, 424242, log=lambda *a: None)
print("answered", len(reqs), "pairs in", round(time.time() - t0, 1), "s", flush=True)
head, report = train_eagle3(lm, reqs, answers, steps=steps, ttt=3, draft_vocab=vocab, seed=0,
                            log=lambda *a: print(*a, flush=True))
report = {"target": "zoo:tinyworld/llava-target-deep", "data": f"broad_data(n={n}, seed=424242)", **report}
write_head_dir(head, report, out)
print(json.dumps(report, indent=1))
