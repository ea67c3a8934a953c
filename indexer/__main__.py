"""``python -m indexer``: the ``indexer`` command line (``indexer.cli``)."""

from .cli import main

main(prog_name="indexer")
