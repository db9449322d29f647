"""One module per `selfplay` sub-command (see selfplay/cli.py)."""
