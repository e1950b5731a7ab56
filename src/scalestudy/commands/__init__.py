"""The command lines of the stages: each module parses its arguments and calls its stage's
functions (``python -m scalestudy.commands.<name>``; ``scalestudy <subcommand>`` for the
ones the CLI names). No stage module parses arguments."""
