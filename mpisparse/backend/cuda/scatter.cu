// Scatter/gather helpers of the sparse exchanges (mpisparse/backend/cupy_scatter.py).
//
// * scatter_add_distinct_*  out[idx[i]] += vals[i] for indices distinct within
//                           the launch (one rank's block of an Allgatherv): no
//                           atomics, and the same float sums as NumPy's
//                           block-by-block fancy-index add
// * scatter_add_atomic_*    the same with atomicAdd (duplicates allowed; the
//                           order of the float additions is not fixed)
// * gather_clear_*          vals[i] = acc[idx[i]]; acc[idx[i]] = 0 (error
//                           feedback: take what is sent out of the memory;
//                           distinct indices)

#include "common.cuh"

template <typename T, typename I>
__device__ __forceinline__ void scatter_add_distinct(T* __restrict__ out, const I* __restrict__ idx,
                                                     const T* __restrict__ vals, i64 m) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (i64)gridDim.x * blockDim.x)
        out[idx[i]] += vals[i];
}

template <typename T, typename I>
__device__ __forceinline__ void scatter_add_atomic(T* __restrict__ out, const I* __restrict__ idx,
                                                   const T* __restrict__ vals, i64 m) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (i64)gridDim.x * blockDim.x)
        atomicAdd(out + idx[i], vals[i]);
}

template <typename T, typename I>
__device__ __forceinline__ void gather_clear(T* __restrict__ acc, const I* __restrict__ idx,
                                             T* __restrict__ vals, i64 m) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (i64)gridDim.x * blockDim.x) {
        const I j = idx[i];
        vals[i] = acc[j];
        acc[j] = (T)0;
    }
}

#define MPS_SCATTER(TN, T, IN, I)                                                                         \
    extern "C" __global__ void scatter_add_distinct_##TN##_##IN(T* out, const I* idx, const T* vals,     \
                                                                 i64 m) {                                 \
        scatter_add_distinct<T, I>(out, idx, vals, m);                                                    \
    }                                                                                                     \
    extern "C" __global__ void scatter_add_atomic_##TN##_##IN(T* out, const I* idx, const T* vals,       \
                                                               i64 m) {                                   \
        scatter_add_atomic<T, I>(out, idx, vals, m);                                                      \
    }                                                                                                     \
    extern "C" __global__ void gather_clear_##TN##_##IN(T* acc, const I* idx, T* vals, i64 m) {         \
        gather_clear<T, I>(acc, idx, vals, m);                                                            \
    }

MPS_SCATTER(f32, float, i32, int)
MPS_SCATTER(f32, float, i64, long long)
MPS_SCATTER(f64, double, i32, int)
MPS_SCATTER(f64, double, i64, long long)
