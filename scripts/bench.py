#!/usr/bin/env python3
"""Side-by-side benchmark of the indexer against its floor and its peers, in one run.

    python scripts/bench.py                          # decode cases, every path
    python scripts/bench.py --cases decode-128K,mtp-2 --paths exact,torch-composed
    python scripts/bench.py --json out.json
    python scripts/bench.py --cases decode-8x131072-k512,mtp3-16x65536   # shapes of your own

A thin wrapper: the benchmark is ``indexer.bench`` (also ``indexer bench``, with a
progress bar); this script runs it from a source checkout without installing.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
