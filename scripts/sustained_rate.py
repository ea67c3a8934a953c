"""The floor's tensor rate under sustained load, what a benchmark case draws, and the
power floor: the least time a case can take at the board's power cap (GPU only).

    python scripts/sustained_rate.py [CASES] [SECONDS]    # e.g. prefill-chunk,decode-1M 4
    python scripts/sustained_rate.py --burst              # the same probes in short bursts

bench.py's ceiling is ten 8,192^3 fp16 GEMMs (~15 ms), short enough to run at boost clock.
A case that runs for seconds sits at the board's power cap instead. This script runs, for
SECONDS each, back to back: fp16 GEMMs, a pure HBM read stream, SMs spinning with no work
(kernels/bench_probes.cu), and whole calls of each of CASES (a comma list, on a
Workspace); it samples the SM clock and board power with nvidia-smi every 100 ms and
prints the steady part's medians with the sustained GEMM rate, the read bandwidth and the
time a call (docs/performance.md, v31: 630 TFLOP/s at 1,440 MHz and 691 W sustained,
against ~750 in the short probe).

The power floor (v37). At the cap, time follows energy. Count the energy above the
spinning SMs' power P0 (the board with every SM clocked and idle: static power, clocks,
fans' share): a flop on the tensor cores costs (P_gemm - P0) / R_gemm, the sustained GEMM's
rate R_gemm at its power P_gemm, and a byte read from HBM (P_read - P0) / B_read. A case of
F flops that must read B bytes then needs at least

    F / R_gemm * (P_gemm - P0) / (P_cap - P0)  +  B / B_read * (P_read - P0) / (P_cap - P0)

seconds at the cap P_cap, however its kernels are written: the GEMM's own time at the cap
(its first term, exactly F / R_gemm when the GEMM runs at the cap) plus the share of the
cap the key reads take. It counts neither the FP4 decode, the epilogue nor the select, so
it is below what any implementation can reach. The larger P0 is, the smaller the second
term: P0 measured with the SMs at full clock (more than at the cap's lower clock) keeps the
bound on the safe side. The model's one assumption, that the tensor cores' and the reads'
energies add, is checked by running both at once on the same SMs (an MMA probe and the read
stream, on two streams, grids that fit an SM together): if they share the cap as energy,
the shares of their alone-rates that they keep sum to ~1.0; without interplay, to ~2.0.
Measured 1.14 (v37): together they run 14% faster than their energies added, so the lines
also give the floor divided by that sum ("with the overlap"), never below its GEMM term
alone. For the single-query decode cases the lines add the time of their tiles'
core work alone (the FP4 decode, the MMAs and the epilogue without memory: a probe that
runs under the cap, so a limit on time, not on power).

--burst (v63): the same MMA probe and read stream timed as the benchmark times its rows,
in bursts after an idle second: 2, 8 and 40 launches of each alone and of both at once
on two streams (the shares of their alone-rates kept, summed as above), then 300 launches
of the MMA probe back to back, each timed, to show when the board starts to slow. On the
H200 the shares summed 1.88-1.90 in bursts of up to ~28 ms (1.11 sustained) and the probe
held its rate for ~50 ms: the power floor bounds sustained use, not the benchmark's rows.
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import indexer  # noqa: E402
from indexer import bench  # noqa: E402


def sample(cp, tag, fn, seconds):
    """Run fn back to back for `seconds`, sampling clock and power; returns (seconds a
    call, median SM clock in MHz, median board power in W)."""
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
    return elapsed / calls, clock[len(clock) // 2], power[len(power) // 2]


def power_cap_watts() -> float:
    """The board's enforced power limit (nvidia-smi)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=enforced.power.limit", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


def power_floor_seconds(flops, nbytes, gemm_rate, gemm_watts, read_bw, read_watts, idle_watts, cap_watts):
    """The power floor above: (seconds, its GEMM term, its read term)."""
    budget = cap_watts - idle_watts
    t_gemm = flops / gemm_rate * (gemm_watts - idle_watts) / budget
    t_read = nbytes / read_bw * (read_watts - idle_watts) / budget
    return t_gemm + t_read, t_gemm, t_read


def _probe_operands(cp, seed):
    """The probes' random fp16 A fragments and B tile (the tensor cores' power depends on
    the data: never zeros)."""
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal(8 * 4 * 128 * 2, dtype=cp.float32).astype(cp.float16).view(cp.uint32)
    b = rng.standard_normal(16 * 1024 // 2, dtype=cp.float32).astype(cp.float16)
    return a, b


def mma_probe(cp, sms):
    """A launch of wgmma_rate_kernel<128> (kernels/probe_wgmma.cu: the scoring kernels' MMA
    shape from registers and shared memory, no memory traffic) at two CTAs an SM, ~0.7 ms."""
    from indexer import _jit  # noqa: PLC0415

    kern = _jit.get_kernel("probe_wgmma.cu", "wgmma_rate_kernel<128>")
    a, b = _probe_operands(cp, 7)
    out = cp.empty(2 * sms * 128, dtype=cp.float32)
    return lambda: kern((2 * sms,), (128,), (a, b, cp.int32(1000), out), shared_mem=16 * 1024)


def core_probe(cp, sms, rounds=2000):
    """A launch of wgmma_overlap_kernel<3> (kernels/probe_wgmma.cu) at three CTAs an SM: the
    single-query scoring kernel's core work on `rounds` 128-entry tiles a CTA (the FP4
    decode, the MMAs, the ReLU and weights; no loads, stores or addresses). Returns (launch,
    tiles a launch)."""
    from indexer import _jit  # noqa: PLC0415

    kern = _jit.get_kernel("probe_wgmma.cu", "wgmma_overlap_kernel<3>")
    a, b = _probe_operands(cp, 11)
    grid = 3 * sms
    out = cp.empty(grid * 128, dtype=cp.float32)
    clk = cp.zeros(2 * grid, dtype=cp.int64)
    return (lambda: kern((grid,), (128,), (a, b, cp.int32(rounds), out, clk), shared_mem=16 * 1024)), grid * rounds


def read_stream(cp, sms, nbytes):
    """(launch, bytes a launch): launch(ctas_per_sm) reads a random buffer of ``nbytes``
    (not zeros) once with read_stream_kernel (kernels/bench_probes.cu). The buffer lives as
    long as ``launch``."""
    from indexer import _jit  # noqa: PLC0415

    src = cp.random.default_rng(4).integers(0, 2**31, size=nbytes // 4, dtype=cp.int32)
    sink = cp.zeros(1, cp.uint32)
    kern = _jit.get_kernel("bench_probes.cu", "read_stream_kernel")
    n16 = src.nbytes // 16

    def launch(ctas_per_sm):
        kern((ctas_per_sm * sms,), (256,), (src, cp.int64(n16), cp.uint32(0x9E3779B9), sink))

    return launch, src.nbytes


def concurrent_check(cp, first, second, t_first, t_second, seconds):
    """first() and second() back to back on two streams at once (grids that fit an SM
    together), about `seconds` of each by their sustained-alone times t_first and t_second:
    prints the board's power and what share of its alone-rate each kept."""
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    n_first, n_second = max(1, round(seconds / t_first)), max(1, round(seconds / t_second))
    marks = [cp.cuda.Event() for _ in range(4)]
    cp.cuda.Device().synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    marks[0].record(a)
    marks[1].record(b)
    for i in range(max(n_first, n_second)):
        if i < n_first:
            with a:
                first()
        if i < n_second:
            with b:
                second()
    marks[2].record(a)
    marks[3].record(b)
    cp.cuda.Device().synchronize()
    smi.terminate()
    lines = [ln for ln in smi.communicate()[0].splitlines() if ln.strip()]
    power = sorted(float(ln.split(",")[1]) for ln in lines[len(lines) // 3:])
    s_first = cp.cuda.get_elapsed_time(marks[0], marks[2]) * 1e-3
    s_second = cp.cuda.get_elapsed_time(marks[1], marks[3]) * 1e-3
    k_first, k_second, _ = shares_kept(n_first * t_first, n_second * t_second, s_first, s_second)
    print(f"  at once: power median {power[len(power) // 2]:.0f} W; the MMAs kept {k_first:.2f} of their alone-rate "
          f"({s_first:.2f} s), the reads {k_second:.2f} ({s_second:.2f} s): sum {k_first + k_second:.2f} "
          f"(1.0: the cap shared as energy; 2.0: no interplay)", flush=True)
    return k_first + k_second


def main(case_names: str = "prefill-chunk", seconds: float = 4.0) -> None:
    cp = bench.require_gpu()
    from indexer import _jit, cuda_ops  # noqa: PLC0415  (imports CuPy)

    cap = power_cap_watts()
    print(f"power cap {cap:.0f} W")
    x, y = bench.gemm_operands(cp)
    m = x.shape[0]
    z = cp.empty_like(x)
    gemm_call, _, gemm_watts = sample(cp, f"fp16 GEMM {m}^3", lambda: cp.matmul(x, y, out=z), seconds)
    gemm_rate = 2 * m**3 / gemm_call
    print(f"  {gemm_rate / 1e12:.0f} TFLOP/s sustained (host-timed)")
    sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]
    reads, read_bytes = read_stream(cp, sms, 4 << 30)  # 4 GiB a call

    def read():
        reads(8)

    read_call, _, read_watts = sample(cp, "HBM read stream (4 GiB a call)", read, seconds)
    read_bw = read_bytes / read_call
    print(f"  {read_bw / 1e12:.2f} TB/s read sustained (host-timed)")
    probe = mma_probe(cp, sms)
    t_probe, _, _ = sample(cp, "MMA probe (two CTAs an SM)", probe, seconds)

    def read_beside():  # three CTAs an SM: they fit beside the probe's two (registers)
        reads(3)

    t_beside, _, _ = sample(cp, "HBM read stream at three CTAs an SM", read_beside, seconds)
    overlap = concurrent_check(cp, probe, read_beside, t_probe, t_beside, seconds)
    core, core_tiles = core_probe(cp, sms)
    t_core, _, core_watts = sample(cp, "core probe (decode, MMAs, epilogue of one query's tiles; no memory)",
                                   core, seconds)
    tile_s = t_core / core_tiles
    x = y = z = reads = read = read_beside = None  # their buffers freed before the cases' inputs
    busy_k = _jit.get_kernel("bench_probes.cu", "busy_kernel")
    _, _, idle_watts = sample(cp, "SMs spinning, no work", lambda: busy_k((4 * sms,), (128,), (cp.int64(400_000),)),
                              seconds)
    ws = indexer.Workspace()
    for case in bench.select_cases(case_names):
        sets, counts = bench.input_sets(case, cp, 0)

        def call():
            bench.call_case(cuda_ops, sets[0], case.top_k, validate=False, workspace=ws)

        call()
        cp.cuda.Device().synchronize()
        per, _, _ = sample(cp, f"{case.name} whole calls", call, seconds)
        pf, pf_gemm, pf_read = power_floor_seconds(counts["flops"], counts["bytes"], gemm_rate, gemm_watts,
                                                   read_bw, read_watts, idle_watts, cap)
        # with the overlap measured above (a sum over 1.0 lets the two run that much faster
        # together than their energies added), never below the GEMM term alone
        low = max(pf_gemm, pf / max(overlap, 1.0))
        print(f"  {per * 1e3:.3f} ms a call (host-timed); power floor {pf * 1e3:.3f} ms "
              f"(GEMM at the cap {pf_gemm * 1e3:.3f} + reads {pf_read * 1e3:.3f}), {low * 1e3:.3f} with the overlap; "
              f"a call / those {per / pf:.2f} / {per / low:.2f}", flush=True)
        if case.queries_per_seq == 1 and case.kind != "prefill":  # one query a key: the core probe's tile
            t_core_case = counts["pairs"] / 128 * tile_s
            print(f"  its tiles' core work alone {t_core_case * 1e3:.3f} ms at the core probe's sustained rate "
                  f"({core_watts:.0f} W: a time, not a power, limit)", flush=True)
        sets = None
        bench.free_device_memory(cp)


def shares_kept(alone_first, alone_second, together_first, together_second):
    """The shares of their alone-rates two loads keep when run at once (times for the same
    work alone and together): (first's, second's, their sum). A sum near 2 means they run
    side by side without interplay, near 1 that they share one budget (the cap's energy)."""
    k_first, k_second = alone_first / together_first, alone_second / together_second
    return k_first, k_second, k_first + k_second


def burst_main(launch_counts=(2, 8, 40), rounds=3, onset_launches=300) -> None:
    """--burst: the MMA probe and the read stream in bursts after an idle second (see the
    module docstring)."""
    cp = bench.require_gpu()
    sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]
    probe = mma_probe(cp, sms)
    reads, _ = read_stream(cp, sms, 1 << 30)  # 1 GiB a call

    def read():  # three CTAs an SM: they fit beside the probe's two (registers)
        reads(3)

    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    for _ in range(3):  # compiled, loaded and warm
        with a:
            probe()
            read()
    cp.cuda.Device().synchronize()

    def timed(which, k):
        """ms of k launches of the probe ('m'), the reads ('r') or both on two streams ('mr'),
        after an idle second: (the probe's stream, the reads' stream)."""
        time.sleep(1.0)
        marks = [cp.cuda.Event() for _ in range(4)]
        marks[0].record(a)
        marks[1].record(b)
        for _ in range(k):
            if "m" in which:
                with a:
                    probe()
            if "r" in which:
                with b:
                    read()
        marks[2].record(a)
        marks[3].record(b)
        cp.cuda.Device().synchronize()
        return cp.cuda.get_elapsed_time(marks[0], marks[2]), cp.cuda.get_elapsed_time(marks[1], marks[3])

    for k in launch_counts:
        runs = [(timed("m", k)[0], timed("r", k)[1], *timed("mr", k)) for _ in range(rounds)]
        tm, tr, bm, br = (statistics.median(r[i] for r in runs) for i in range(4))
        km, kr, total = shares_kept(tm, tr, bm, br)
        print(f"{k:3d} launches each: MMA probe alone {tm:.3f} ms, reads alone {tr:.3f} ms; at once "
              f"{bm:.3f} / {br:.3f} ms: kept {km:.2f} + {kr:.2f} = {total:.2f}", flush=True)
    time.sleep(2.0)
    marks = [cp.cuda.Event() for _ in range(onset_launches + 1)]
    with a:
        marks[0].record(a)
        for i in range(onset_launches):
            probe()
            marks[i + 1].record(a)
    cp.cuda.Device().synchronize()
    elapsed = 0.0
    print(f"{onset_launches} launches of the MMA probe back to back after an idle 2 s (ms a launch):")
    for i in range(onset_launches):
        per = cp.cuda.get_elapsed_time(marks[i], marks[i + 1])
        elapsed += per
        if i + 1 in (1, 2, 5, 10, 20, 50, 80, 120, 160, 200, 250, 300):
            print(f"  #{i + 1} at {elapsed:6.1f} ms: {per:.3f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    try:
        if sys.argv[1:2] == ["--burst"]:
            burst_main()
        else:
            main(*(sys.argv[1:2]), *(float(a) for a in sys.argv[2:3]))
    except bench.GPUUnavailable as exc:
        print(exc)
        sys.exit(2)
