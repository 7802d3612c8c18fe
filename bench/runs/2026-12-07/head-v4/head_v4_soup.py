# head-v4: a head whose weights are (1 - A) * OLD + A * NEW, tensor by tensor (both heads
# share the architecture; NEW fine-tuned from OLD, so they sit in one basin)
#   python head_v4_soup.py OLD NEW A OUT
import json
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

old, new, a, out = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
w0, w1 = load_file(old / "model.safetensors"), load_file(new / "model.safetensors")
assert w0.keys() == w1.keys()
out.mkdir(parents=True, exist_ok=True)
save_file({k: ((1 - a) * w0[k] + a * w1[k]).contiguous() for k in w0}, out / "model.safetensors",
          metadata={"format": "pt"})
shutil.copy(new / "config.json", out / "config.json")
report = json.loads((new / "BUILD_REPORT.json").read_text())
report["soup"] = {"old": str(old), "new": str(new), "new_weight": a}
(out / "BUILD_REPORT.json").write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report["soup"]))
