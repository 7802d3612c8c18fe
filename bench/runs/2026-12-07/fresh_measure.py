"""Both heads on the build's fresh sets (zoo/hidden.py's measure: γ 5 chains, T = 0)."""
import json, sys, torch
torch.set_num_threads(1)
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.models.loading import load_model
from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead
from vlmspec_cli.zoo.hidden import llava_data, broad_data
from vlmspec_cli.zoo.hidden_train import measure
from vlmspec_cli.zoo.hidden_user import HeadWriteError
lm = load_model(ModelSpec(model="zoo:tinyworld/llava-target-deep", device="cpu", dtype="float32"), "target")
fresh, _ = llava_data(24, 99991)
broad, _ = broad_data(lm, 24, 99991)
for name, path in (("old", sys.argv[1]), ("new", sys.argv[2])):
    head = HiddenDraftHead.from_pretrained(path)
    print(name, path, json.dumps({"fresh": measure(lm, head, fresh), "fresh_broad": measure(lm, head, broad)}), flush=True)
