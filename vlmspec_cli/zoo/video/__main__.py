"""``python -m vlmspec_cli.zoo.video``: build the tinyworld video models (see build.py)."""

from vlmspec_cli.zoo.video.build import main

main()
