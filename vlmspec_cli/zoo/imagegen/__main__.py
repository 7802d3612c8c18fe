"""``python -m vlmspec_cli.zoo.imagegen``: build the tinyworld Janus models (see build.py)."""

from vlmspec_cli.zoo.imagegen.build import main

main()
