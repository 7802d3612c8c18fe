"""Grow a twig on a built target other than the one ``build.py`` grows it on:
``python -m vlmspec_cli.zoo.deep_twig`` writes ``llava-deep-twig``, the twig of the 32-layer
caption target (``zoo/deepen.py``), with ``zoo/twig.py``'s recipe; ``--ablation`` also
trains K in ``--other-ks`` and T in ``--ts`` and reports their TokAR in BUILD_REPORT.json.
(A module of its own: ``build`` imports ``twig``, so ``twig`` cannot import ``build``'s
dataset.)"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import LlavaProcessor

from vlmspec_cli.zoo.build import make_dataset
from vlmspec_cli.zoo.train import arg_parser, parse_args
from vlmspec_cli.zoo.twig import TWIG_T, build_twig


def main(argv=None) -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--target", default="llava-target-deep", help="the built target")
    ap.add_argument("--name", default="llava-deep-twig", help="the twig's name")
    ap.add_argument("--k", type=int, default=2, help="target layers shared with the twig")
    ap.add_argument("--t", type=int, default=TWIG_T, help="twig layers")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--examples", type=int, default=8000)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--ablation", action="store_true",
                    help="also train K in --other-ks and T in --ts (init next) and report TokAR")
    ap.add_argument("--other-ks", type=lambda v: [int(x) for x in v.split(",")], default=[4, 8])
    ap.add_argument("--ts", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 3])
    ap.add_argument("--variants", type=Path, metavar="DIR",
                    help="with --ablation: save every variant there (for bench/twig.py)")
    args = parse_args(ap, argv)
    processor = LlavaProcessor.from_pretrained(args.out / args.target)
    data = make_dataset(processor, args.examples, args.seed + 1)
    report_path = args.out / "BUILD_REPORT.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    build_twig(args.out, processor, data, report, args.steps, args.seed, args.batch_tokens,
               args.ablation, target_name=args.target, name=args.name, k=args.k, t=args.t,
               other_ks=args.other_ks, ts=args.ts, inits=("next",), variants_dir=args.variants)
    report_path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
