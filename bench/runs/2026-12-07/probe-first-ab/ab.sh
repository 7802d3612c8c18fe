#!/bin/bash
# A/B of "a probe due within a new request comes at its first chosen round" (73befb7)
# against the commit before it (77029a8), in one sitting on the 2-core machine, nothing
# else running: inprocess.py, 20 passes, base and new taking turns three times, for the
# useless EAGLE-3 head on Qwen3-VL and the useless chain draft on LLaVA-1.5.
#   git worktree add /work/wt/base 77029a8; git worktree add /work/wt/new 73befb7
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/work/main/.venv/bin/python}
uptime
for row in qwen3-vl-8b-eagle3 llava15-7b; do
  for i in 1 2 3; do
    for side in base new; do
      (cd /work/wt/$side && PYTHONPATH=/work/wt/$side $PY "$HERE/inprocess.py" $row 20 \
          "$HERE/$side-$row-$i.json")
    done
  done
done
uptime
