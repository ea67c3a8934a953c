"""``python -m indexer``: the ``indexer`` command line (``indexer.cli``)."""

from .cli import main

if __name__ == "__main__":  # (a tool that imports the module, to document it, runs nothing)
    main(prog_name="indexer")
