"""The floor's tensor rate under sustained load, and what a benchmark case draws (GPU only).

    python scripts/sustained_rate.py [CASES] [SECONDS]    # e.g. prefill-chunk,decode-1M 4

bench.py's ceiling is ten 8,192^3 fp16 GEMMs (~15 ms), short enough to run at boost clock.
A case that runs for seconds sits at the board's power cap instead. This script runs, for
SECONDS each, back-to-back GEMMs and back-to-back whole calls of each of CASES (a comma
list, on a Workspace),
samples the SM clock and board power with nvidia-smi every 100 ms, and prints the steady
part's medians with the sustained GEMM rate and the time a call (docs/performance.md, v31:
630 TFLOP/s at 1,440 MHz and 691 W sustained, against ~750 in the short probe).
"""
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import indexer  # noqa: E402
from indexer import bench  # noqa: E402


def sample(cp, tag, fn, seconds):
    """Run fn back to back for `seconds`, sampling clock and power; returns seconds a call."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    t0, calls = time.time(), 0
    while time.time() - t0 < seconds:
        fn()
        calls += 1
    cp.cuda.Device().synchronize()
    elapsed = time.time() - t0
    smi.terminate()
    lines = [ln for ln in smi.communicate()[0].splitlines() if ln.strip()]
    steady = [tuple(float(v) for v in ln.split(",")) for ln in lines[len(lines) // 3:]]  # past the ramp
    clock = sorted(v[0] for v in steady)
    power = sorted(v[1] for v in steady)
    print(f"{tag}: {calls} calls in {elapsed:.2f} s; SM clock median {clock[len(clock) // 2]:.0f} MHz "
          f"(min {clock[0]:.0f}), power median {power[len(power) // 2]:.0f} W", flush=True)
    return elapsed / calls


def main(case_names: str = "prefill-chunk", seconds: float = 4.0) -> None:
    cp = bench.require_gpu()
    from indexer import cuda_ops  # noqa: PLC0415  (imports CuPy)

    x, y = bench.gemm_operands(cp)
    m = x.shape[0]
    per = sample(cp, f"fp16 GEMM {m}^3", lambda: cp.matmul(x, y), seconds)
    print(f"  {2 * m**3 / per / 1e12:.0f} TFLOP/s sustained (host-timed)")
    ws = indexer.Workspace()
    for case in bench.select_cases(case_names):
        sets, _ = bench.input_sets(case, cp, 0)

        def call():
            bench.call_case(cuda_ops, sets[0], case.top_k, validate=False, workspace=ws)

        call()
        cp.cuda.Device().synchronize()
        per = sample(cp, f"{case.name} whole calls", call, seconds)
        print(f"  {per * 1e3:.3f} ms a call (host-timed)")


if __name__ == "__main__":
    main(*(sys.argv[1:2]), *(float(a) for a in sys.argv[2:3]))
