#!/usr/bin/env python3
"""README's performance table from a bench run's JSON (no GPU needed).

    python scripts/bench.py --cases all --paths fast,fast-score,torch-composed --json new.json   # on the GPU
    python scripts/bench_table.py new.json                      # the table's rows, as README writes them
    python scripts/bench_table.py new.json --exact-from old.json  # the exact column from an older run
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer.bench import markdown_table  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json_path", help="scripts/bench.py --json output")
    ap.add_argument("--exact-from", default=None, help="another run's JSON for the exact (graph) column")
    args = ap.parse_args(argv)
    results = json.loads(Path(args.json_path).read_text())
    older = json.loads(Path(args.exact_from).read_text()) if args.exact_from else None
    print(f"<!-- {results.get('device', '')} {results.get('date', '')}: copy {results['copy_bw'] / 1e12:.2f} TB/s, "
          f"fp16 tensor {results['tensor_rate'] / 1e12:.0f} TFLOP/s -->")
    print(markdown_table(results, older))
    return 0


if __name__ == "__main__":
    sys.exit(main())
