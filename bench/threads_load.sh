#!/usr/bin/env bash
# The caption demo under the thread plan before and after auto counts followed the free
# cores (issue 34 item 1), side by side in the same minute: idle, and beside 1 or 2
# CPU-bound competitor processes started here (each stopped after its pair, or by
# `timeout 90` at the latest). Then --batch-size 8 over 24 images, idle and beside 2.
#
#   mkdir -p /tmp/old && git archive 9760171 | tar -x -C /tmp/old   # the tree before
#   bench/threads_load.sh /tmp/old > bench/runs/$(date -u +%F)/threads-load-cpu.txt
#
# Run from the repository root with its venv active. Each run prints its command, the
# load average before it, the plan line, each image's prefill seconds (from --json), the
# summary's speedup, tokens/s and batch size lines, and the wall time of the whole command.
set -u
OLD=$(cd "$1" && pwd)
NEW=$(pwd)
IMGS=$(mktemp -d)
trap 'rm -rf "$IMGS"' EXIT
PYTHONPATH=$NEW python - "$IMGS" <<'EOF'
import random, sys
from vlmspec_cli.zoo import world
rng = random.Random(3434)
for i in range(24):
    world.render(world.sample_scene(rng)).save(f"{sys.argv[1]}/scene{i:02d}.png")
EOF

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
echo "old: $(git -C "$NEW" rev-parse --short 9760171) (before); new: $(git -C "$NEW" rev-parse --short HEAD) (this tree)"
echo

summarise() {   # the --json stream on stdin: plan line, prefill per image, summary lines
    python -c '
import json, sys
pre = []
for line in sys.stdin:
    if line.startswith("{"):
        pre.append(json.loads(line)["stats"]["prefill_s"])
    elif "CPU threads" in line:
        print("  " + line.strip().split("; compiled")[0])
    elif "speedup" in line or "tokens/s" in line or "batch size" in line:
        print("  " + " ".join(line.replace("\u2502", " ").split()))
print("  prefill_s per image: " + " ".join(f"{p:.3f}" for p in pre))
'
}

run() {   # run LABEL TREE COMPETITORS ARGS...
    local label=$1 tree=$2 k=$3; shift 3
    echo "\$ [$label, $k competitor(s), load $(cut -d' ' -f1-3 /proc/loadavg)] vlmspec caption $*"
    local t0=$(date +%s.%N)
    PYTHONPATH=$tree vlmspec caption "$@" --json 2>&1 | summarise
    echo "  wall: $(python -c "print(f'{$(date +%s.%N) - $t0:.1f} s')")"
}

pair() {   # pair COMPETITORS FIRST SECOND ARGS...: both runs beside the same competitors
    local k=$1 first=$2 second=$3; shift 3
    local pids=()
    for _ in $(seq "$k"); do timeout 90 python -c "while True: pass" & pids+=($!); done
    sleep 1
    for which in "$first" "$second"; do
        if [ "$which" = old ]; then run old "$OLD" "$k" "$@"; else run new "$NEW" "$k" "$@"; fi
    done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    echo
}

for k in 0 2 1 0 2; do
    pair "$k" old new examples/images/ --compare
    pair "$k" new old examples/images/ --compare
done
for k in 0 2; do
    pair "$k" old new "$IMGS" --batch-size 8
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
