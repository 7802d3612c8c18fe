from vlmspec_cli.cli import main

main()
