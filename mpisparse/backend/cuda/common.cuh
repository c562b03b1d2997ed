// Shared device helpers of the mpisparse CUDA kernels (included by every .cu).
//
// No system headers: the sources are compiled at run time by NVRTC (CuPy's
// RawModule) and ahead of time by nvcc in the tests; both accept this file.

#ifndef MPISPARSE_COMMON_CUH
#define MPISPARSE_COMMON_CUH

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define MPS_FULL_MASK 0xffffffffu

// Magnitude keys: the bit pattern of |v| read as an unsigned integer orders
// like |v| for every non-NaN v (and puts NaN above +inf).
template <typename T> struct MagKey;
template <> struct MagKey<float> {
    typedef u32 type;
    static const int bits = 31;  // the sign bit is cleared
    __device__ __forceinline__ static u32 of(float v) { return __float_as_uint(v) & 0x7fffffffu; }
};
template <> struct MagKey<double> {
    typedef u64 type;
    static const int bits = 63;
    __device__ __forceinline__ static u64 of(double v) {
        return (u64)__double_as_longlong(v) & 0x7fffffffffffffffull;
    }
};

__device__ __forceinline__ float mps_abs(float v) { return fabsf(v); }
__device__ __forceinline__ double mps_abs(double v) { return fabs(v); }

// Warp-aggregated append: every lane of the (full, converged) warp calls it;
// lanes with `hit` get consecutive slots of *counter, in lane order, for one
// atomicAdd per warp.  Returns the lane's slot (meaningless where !hit).
__device__ __forceinline__ u64 warp_append(bool hit, u64* counter) {
    const u32 ballot = __ballot_sync(MPS_FULL_MASK, hit);
    if (ballot == 0u) return 0ull;
    const int lane = threadIdx.x & 31;
    const int leader = __ffs(ballot) - 1;
    u64 base = 0ull;
    if (lane == leader) base = atomicAdd(counter, (u64)__popc(ballot));
    base = __shfl_sync(MPS_FULL_MASK, base, leader);
    return base + (u64)__popc(ballot & ((1u << lane) - 1u));
}

// splitmix64: a counter-based hash, for reproducible random sample positions.
__device__ __forceinline__ u64 mps_hash64(u64 z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// ------------------------------------------------ exact k-th largest key, one block
#define KTH_BITS 11
#define KTH_BINS 2048
#define KTH_THREADS 1024

// The need-th largest of keys[0:n] (1 <= need <= n) and, in *above, the
// number of keys strictly above it, found by one block of KTH_THREADS
// threads (every thread must call it: it has barriers): radix digits of
// KTH_BITS from the top, each a shared-memory histogram of the keys that
// share the digits fixed so far, and a block scan for the bin that holds the
// need-th largest.  Only the low BITS bits of a key count (a float's sign
// bit above a magnitude key's 31 or 63 is ignored).
template <typename K, int BITS>
__device__ __forceinline__ K kth_in_block(const K* __restrict__ keys, u64 n, u64 need, u64* above) {
    __shared__ u32 hist[KTH_BINS];
    __shared__ u64 part[KTH_THREADS];
    __shared__ u64 s_bin, s_above;
    const int t = threadIdx.x;
    K prefix = (K)0, mask = (K)0;
    u64 above_total = 0ull;
    for (int hi = BITS; hi > 0;) {
        const int w = hi >= KTH_BITS ? KTH_BITS : hi;
        const int shift = hi - w;
        const int nb = 1 << w;
        for (int b = t; b < KTH_BINS; b += blockDim.x) hist[b] = 0u;
        __syncthreads();
        for (u64 i = (u64)t; i < n; i += blockDim.x) {
            const K key = keys[i];
            if ((key & mask) == prefix) atomicAdd(&hist[(u32)(key >> shift) & (u32)(nb - 1)], 1u);
        }
        __syncthreads();
        // thread t owns bins nb-1-2t and nb-2-2t (scanned from the top)
        const int b0 = nb - 1 - 2 * t, b1 = b0 - 1;
        const u64 c0 = b0 >= 0 ? (u64)hist[b0] : 0ull, c1 = b1 >= 0 ? (u64)hist[b1] : 0ull;
        part[t] = c0 + c1;
        __syncthreads();
        for (int off = 1; off < KTH_THREADS; off <<= 1) {  // inclusive scan, Hillis-Steele
            const u64 v = t >= off ? part[t - off] : 0ull;
            __syncthreads();
            part[t] += v;
            __syncthreads();
        }
        const u64 excl = part[t] - (c0 + c1);
        if (excl < need && need <= part[t]) {
            if (excl + c0 >= need) {
                s_bin = (u64)b0;
                s_above = excl;
            } else {
                s_bin = (u64)b1;
                s_above = excl + c0;
            }
        }
        __syncthreads();
        prefix |= (K)s_bin << shift;
        mask |= (K)(nb - 1) << shift;
        need -= s_above;
        above_total += s_above;
        __syncthreads();  // every thread has read s_bin / s_above before the next digit rewrites them
        hi = shift;
    }
    *above = above_total;
    return prefix;
}

// 16-byte vectors of x (where it is 16-byte aligned): four floats or two doubles per load
template <typename T> struct Vec16;
template <> struct Vec16<float> {
    typedef float4 type;
    static const int W = 4;
    __device__ __forceinline__ static void get(const float4& v, float* o) {
        o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
    }
};
template <> struct Vec16<double> {
    typedef double2 type;
    static const int W = 2;
    __device__ __forceinline__ static void get(const double2& v, double* o) {
        o[0] = v.x; o[1] = v.y;
    }
};

#endif  // MPISPARSE_COMMON_CUH
