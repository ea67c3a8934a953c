// bench_probes.cu: kernels that load the GPU in one known way each, for the benchmark and
// its scripts (indexer/bench.py, scripts/sustained_rate.py). Neither computes anything.

// Keeps every SM busy for `cycles`, spinning on its cycle counter; no memory traffic.
// bench.time_graph enqueues it before the start event of each timed CUDA-graph replay, so
// that the start event, the graph and the stop event are all queued before the GPU reaches
// them: the interval between the events is device time only (not the host's graph
// submission), on a GPU whose clocks are those of a loaded one. sustained_rate.py runs it
// back to back for the board's power with its SMs clocked and idle.
// grid: a few CTAs per SM; block: any size.
__global__ void busy_kernel(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

// Reads n16 16-byte words of src once (streaming loads, four in flight a thread) and
// nothing else: the HBM read bandwidth and the board's power while it streams
// (sustained_rate.py). Each thread folds what it read into one word and stores it only if
// it equals `never`, so that the loads are not removed; sink is one word.
// grid: any (a few CTAs per SM); block: any size.
__global__ void read_stream_kernel(const uint4* __restrict__ src, long long n16, unsigned never,
                                   unsigned* __restrict__ sink) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0u;
    auto fold = [&](const uint4 v) { acc ^= v.x ^ v.y ^ v.z ^ v.w; };
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride);
        const uint4 c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
        fold(a);
        fold(b);
        fold(c);
        fold(d);
    }
    for (; i < n16; i += stride) fold(__ldcs(src + i));
    if (acc == never) *sink = acc;
}
