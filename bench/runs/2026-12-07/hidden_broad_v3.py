# zoo.hidden --data broad with more captions and clean renders than hidden_broad's v2 defaults
import vlmspec_cli.zoo.hidden_broad as b
b.TOPICS.update({"caption": 0.45, "multi-turn": 0.13, "general vqa": 0.09, "odd": 0.06})
b.CLEAN = 0.7
from vlmspec_cli.zoo.hidden import main
main(["--target", "llava-deep", "--data", "broad", "--examples", "3000", "--stage1", "800", "--stage2", "400", "--threads", "1", "--out", "/tmp/bheads/broad-head-v3"])
