// bulk_copy.cuh: Hopper's bulk asynchronous copies (the TMA engine, no tensor map) and the
// shared-memory barriers that track them.
//
// One thread issues a copy of a contiguous run of bytes (a multiple of 16, both addresses
// 16-byte aligned) from global to shared memory; the copy reports its bytes to an mbarrier,
// whose phase completes once every expected arrival has come and every expected byte has
// landed. Compiled for every target; the instructions exist on sm_90 and later only, and
// the launcher picks the kernels that use them on Hopper only.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// Shared memory by its window address (smem_u32's): for loops that keep a slot's address in
// a register and advance it, where a pointer's address was made again from the window's base
// each time (an S2R and a few instructions a use under register pressure). Volatile, so
// that a load stays after the barrier wait that publishes what it reads.
__device__ __forceinline__ int ld_shared_s32(u32 addr) {
    int v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ float4 ld_shared_f4(u32 addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ u32 atomic_add_shared(u32 addr, u32 v) {
    u32 old;
    asm volatile("atom.shared.add.u32 %0, [%1], %2;\n" : "=r"(old) : "r"(addr), "r"(v) : "memory");
    return old;
}

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(u64* bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// make barrier initialisation visible to the async proxy (then a __syncthreads)
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) { mbar_arrive(smem_u32(bar)); }
// arrive, announcing `bytes` more bytes to land in this phase (the barrier at window address bar)
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// global -> shared, `bytes` (multiple of 16) reported to `bar`
__device__ __forceinline__ void bulk_copy_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// the same, its lines marked first to leave L2 (keys read once a call: they should not push
// out the scores the select reads next)
__device__ __forceinline__ void bulk_copy_g2s_evict_first(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(l2_evict_first()) : "memory");
}
// true in one lane of the converged warp that calls it (elect.sync over all 32 lanes)
__device__ __forceinline__ bool elect_one() {
    u32 one;
    asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(one));
    return one != 0;
}
// the same by pointers into shared memory
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, u32 bytes) { mbar_arrive_expect_tx(smem_u32(bar), bytes); }
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) { mbar_wait(smem_u32(bar), parity); }
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, u32 bytes, u64* bar) {
    bulk_copy_g2s(smem_u32(dst), src, bytes, smem_u32(bar));
}
// ask L2 for `bytes` (multiple of 16) of global memory at src, so that later loads wait on
// L2 rather than HBM (a hint: nothing waits for it)
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, u32 bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
// the same for one line (an L2 prefetch of the line holding p)
__device__ __forceinline__ void prefetch_line_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
// order this thread's earlier shared-memory accesses before later async-proxy ones
// (shared memory written with ordinary stores, then read by wgmma or overwritten by a bulk copy)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#else
__device__ __forceinline__ void mbar_init(u64*, u32) { __trap(); }
__device__ __forceinline__ void mbar_init_fence() {}
__device__ __forceinline__ void mbar_arrive(u64*) { __trap(); }
__device__ __forceinline__ void mbar_arrive(u32) { __trap(); }
__device__ __forceinline__ void mbar_arrive_expect_tx(u64*, u32) { __trap(); }
__device__ __forceinline__ void mbar_wait(u64*, u32) { __trap(); }
__device__ __forceinline__ void bulk_copy_g2s(void*, const void*, u32, u64*) { __trap(); }
__device__ __forceinline__ void mbar_arrive_expect_tx(u32, u32) { __trap(); }
__device__ __forceinline__ void mbar_wait(u32, u32) { __trap(); }
__device__ __forceinline__ void bulk_copy_g2s(u32, const void*, u32, u32) { __trap(); }
__device__ __forceinline__ void bulk_copy_g2s_evict_first(u32, const void*, u32, u32) { __trap(); }
__device__ __forceinline__ bool elect_one() { return (threadIdx.x & 31) == 0; }
__device__ __forceinline__ void bulk_prefetch_l2(const void*, u32) {}
__device__ __forceinline__ void prefetch_line_l2(const void*) {}
__device__ __forceinline__ void fence_proxy_async() {}
#endif
