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

#endif  // MPISPARSE_COMMON_CUH
