"""Does a case run at the GPU's power cap, and what floor does the cap set? Each bench case's
call (fast, float32 query), captured in a CUDA graph per input set and replayed back to
back for a while, with nvidia-smi sampling the SM clock, power and the clock's event
reasons (0x4: the software power cap) every 50 ms. Prints per case and kernel the
sustained ms a call (back to back, as an engine's layers come) beside bench.time_graph's
isolated replay (each behind a busy kernel, as bench.py times), the median clock and
power under load, and the energy a call.

With ``--floor``, the bench's two ceilings are run the same way first (the 1 GiB copy and
the 8192^3 fp16 GEMM, back to back), and idle power is read: each case's energy floor is
then its bytes at the copy's energy a byte plus its flops at the GEMM's energy a flop (each
above idle), plus idle power over the time, spent at the cap. Where the two terms must share
one power budget, the classical floor max(bytes/bw, flops/rate) assumes both run at full
speed at once; the energy floor says how far the cap lets them.

    PYTHONPATH=. python exp/case_clocks.py [case ...] [--kernels auto,ws,...] [--seconds S] [--floor]

``--kernels``: the scoring kernels to force (bench.py's fast-<kernel> paths; "auto" the
default choice); a kernel that does not take a case's shape is skipped.
"""
import datetime
import statistics
import subprocess
import sys
import time

import cupy as cp

from indexer import bench, cuda_ops
from indexer.workspace import Workspace

FIELDS = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"
SETTLE = 0.2  # seconds a window skips (main: 1.5 with --floor, whose power figures need it)


class Sampler:
    """nvidia-smi's samples every 50 ms, read back by wall-clock window."""

    def __init__(self):
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits",
                                      "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.samples = []

    def stop(self):
        self.proc.terminate()
        lines = self.proc.communicate()[0].splitlines()
        for line in lines:
            parts = [p.strip() for p in line.split(",")]
            try:
                stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((stamp, float(parts[1]), float(parts[2]), parts[3]))
            except (ValueError, IndexError):
                continue
        if not self.samples:
            print("nvidia-smi gave no samples:", lines[:3])

    def window(self, t0, t1):
        """(samples, median MHz, min MHz, max MHz, median W, reasons) between t0 and t1, or None."""
        got = [s for s in self.samples if t0 <= s[0] <= t1]
        if not got:
            return None
        clk = sorted(s[1] for s in got)
        return (len(got), clk[len(clk) // 2], clk[0], clk[-1], statistics.median(s[2] for s in got),
                " ".join(sorted({s[3] for s in got})))


def back_to_back(launch, stream, seconds, per_batch):
    """(window start, end, ms a launch) of ``launch(i)`` enqueued on ``stream`` back to back
    for ``seconds`` (batches of ``per_batch``, the host synchronising between batches); the
    window skips the first ``SETTLE`` seconds: nvidia-smi's power.draw is a running average
    (~1 s on an H100), and the clock settles to the cap."""
    n, t0 = 0, time.time()
    start = cp.cuda.Event()
    start.record(stream)
    while time.time() - t0 < seconds:
        for i in range(per_batch):
            launch(i)
        n += per_batch
        stream.synchronize()
    stop = cp.cuda.Event()
    stop.record(stream)
    stop.synchronize()
    return t0 + SETTLE, time.time(), cp.cuda.get_elapsed_time(start, stop) / n


def one(case, sets, kernel, seconds):
    """(window start, end, isolated ms, sustained ms) of ``kernel`` on ``case``, or None."""
    ws = Workspace()

    def fn(x):
        return bench.call_case(cuda_ops, x, case.top_k, precision="fast", validate=False, workspace=ws,
                               _fast_kernel=kernel)

    try:
        fn(sets[0])
    except ValueError as exc:
        print(f"  ({kernel} does not run {case.name}: {exc})")
        return None
    isolated = bench.time_graph(cp, fn, sets, repeats=20, echo=print)
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = []
    with stream:
        for x in sets:
            fn(x)
            stream.synchronize()
            stream.begin_capture()
            fn(x)
            graphs.append(stream.end_capture())
    t0, t1, ms = back_to_back(lambda i: graphs[i % len(graphs)].launch(stream), stream, seconds,
                              max(1, int(100 / max(isolated, 1e-3))))
    return t0, t1, isolated, ms


def ceilings(sampler, seconds):
    """{name: (bytes or flops a second, window start, end)} for idle (first, the GPU at rest),
    the copy and the GEMM, each run back to back for ``seconds``."""
    stream = cp.cuda.Stream(non_blocking=True)
    t0 = time.time()
    time.sleep(seconds)
    out = {"idle": (0.0, t0 + SETTLE, time.time())}
    n = 1 << 30
    a = cp.random.default_rng(1).integers(0, 255, size=n, dtype=cp.uint8)
    b = cp.empty_like(a)
    with stream:
        t0, t1, ms = back_to_back(lambda i: cp.copyto(b, a), stream, seconds, 50)
    out["copy"] = (2 * n / (ms * 1e-3), t0, t1)
    a = b = None
    x, y = bench.gemm_operands(cp)
    with stream:
        t0, t1, ms = back_to_back(lambda i: cp.matmul(x, y), stream, seconds, 50)
    out["gemm"] = (2 * x.shape[0] ** 3 / (ms * 1e-3), t0, t1)
    x = y = None
    bench.free_device_memory(cp)
    return out


def power_limit():
    """The board's power limit in W (nvidia-smi's power.limit)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=power.limit", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


def main():
    args = sys.argv[1:]
    kernels, seconds, floor = ["auto"], 1.5, "--floor" in args
    args = [a for a in args if a != "--floor"]
    if "--kernels" in args:
        i = args.index("--kernels")
        kernels = args[i + 1].split(",")
        del args[i:i + 2]
    if "--seconds" in args:
        i = args.index("--seconds")
        seconds = float(args[i + 1])
        del args[i:i + 2]
    if floor:
        global SETTLE
        SETTLE = 1.5
        seconds = max(seconds, 4.0)
    by_name = {c.name: c for c in bench.CASES}
    names = args or [c.name for c in bench.CASES]
    print("#", bench.device_name(cp))
    sampler = Sampler()
    time.sleep(0.3)
    ceil = ceilings(sampler, seconds) if floor else None
    windows = []
    for ci, name in enumerate(names):
        case = by_name[name]
        sets, counts = bench.input_sets(case, cp, ci)
        for kernel in kernels:
            measured = one(case, sets, kernel, seconds)
            if measured is not None:
                windows.append((name, kernel, counts, *measured))
        del sets
        bench.free_device_memory(cp)
    sampler.stop()
    if ceil:
        stats = {k: sampler.window(t0, t1) for k, (_, t0, t1) in ceil.items()}
        print(f"power limit {power_limit():.0f} W")
        for k, (rate, _, _) in ceil.items():
            st = stats[k]
            print(f"{k:6s} rate {rate:.4g}/s  " + (f"MHz {st[1]:.0f} ({st[2]:.0f}-{st[3]:.0f})  W {st[4]:.0f}  {st[5]}"
                                                   if st else "(no samples)"))
    print(f"{'case':15s} {'kernel':6s} {'isolated ms':>11s} {'sustained':>9s} {'n':>3s} {'MHz med (min-max)':>18s}"
          f" {'W':>4s} {'mJ':>6s}  reasons" + ("   floor ms: classical  energy" if ceil else ""))
    for name, kernel, counts, t0, t1, isolated, sustained in windows:
        st = sampler.window(t0, t1)
        if st is None:
            print(f"{name:15s} {kernel:6s} {isolated:11.4f} {sustained:9.4f}  (no samples)")
            continue
        line = (f"{name:15s} {kernel:6s} {isolated:11.4f} {sustained:9.4f} {st[0]:3d} {st[1]:6.0f} ({st[2]:.0f}-"
                f"{st[3]:.0f}) {st[4]:4.0f} {st[4] * sustained:6.1f}  {st[5]}")
        if ceil and all(stats.values()):
            idle = stats["idle"][4]
            cap = power_limit()
            bw, rate = ceil["copy"][0], ceil["gemm"][0]
            # the copy's bandwidth counts bytes read and written; a case's bytes are read once
            e_byte = (stats["copy"][4] - idle) / bw
            e_flop = (stats["gemm"][4] - idle) / rate
            dynamic = counts["bytes"] * e_byte + counts["flops"] * e_flop  # joules above idle
            classical = max(counts["bytes"] / bw, counts["flops"] / rate)
            energy = dynamic / (cap - idle)  # the bytes' and flops' energy spent at the cap
            line += f"   {classical * 1e3:.4f}  {energy * 1e3:.4f}"
        print(line)


if __name__ == "__main__":
    main()
