#!/bin/bash
# As run (by hand, the session after stop 66): its JSON files were written to /tmp/s67/ab and
# copied into this folder; summary.txt is `python agg.py .` over them.
# A/B: base (328ad7c worktree) vs new (working tree), alternating, eagle3 rows
PY=/work/main/.venv/bin/python
for i in 1 2 3 4 5 6; do
  for v in base new; do
    d=/work/wt/base; [ $v = new ] && d=/work/main
    for L in 0 2; do
      (cd $d && $PY bench/useless_drafts.py --loads $L --repeat 1 --models /tmp/useless-models \
        --rows qwen3-vl-8b-eagle3,qwen25-vl-7b-eagle3 --json /tmp/s67/ab/$v-L$L-$i.json > /tmp/s67/ab/$v-L$L-$i.txt 2>&1)
    done
  done
done
