// Segmented kernels of the CuPy backend (mpisparse/backend/cupy_kernels.py):
// many segments (layers) of one flat vector in one launch each.
//
// The host cuts every segment into *tiles* of at most a few thousand
// elements; one block handles one tile, so a launch covers every segment
// whatever their number and sizes (tile_lo/tile_hi: flat bounds, tile_seg:
// the segment's position in the call).
//
// * seg_sumsq_*          one block per tile: the tile's sum of squares in
//                        double (fixed-order tree reduction: deterministic)
// * seg_sample_keys_*    hashed random positions (with replacement) in every
//                        segment; writes (segment << 32) | 31-bit key, the
//                        combined sort key of the per-segment thresholds
// * seg_select_key_ge_*  one block per tile: entries whose magnitude key is
//                        >= the tile's segment threshold are appended
//                        (warp-aggregated) with their index, key and segment;
//                        per-segment hit counts are added once per block
//
// Loops over a tile have a trip count uniform across the block, so the warp
// intrinsics always see full, converged warps (blockDim % 32 == 0).

#include "common.cuh"

#define SEG_MAX_BLOCK 1024

template <typename T>
__device__ __forceinline__ void seg_sumsq(const T* __restrict__ x, const i64* __restrict__ tile_lo,
                                          const i64* __restrict__ tile_hi, double* __restrict__ partial) {
    __shared__ double sh[SEG_MAX_BLOCK];
    const i64 lo = tile_lo[blockIdx.x], hi = tile_hi[blockIdx.x];
    double acc = 0.0;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double v = (double)x[i];
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

template <typename T>
__device__ __forceinline__ void seg_sample_keys(const T* __restrict__ x, const i64* __restrict__ seg_lo,
                                                const i64* __restrict__ seg_size, const i64* __restrict__ samp_off,
                                                int nseg, i64 m, u64 seed, u64* __restrict__ out) {
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < m; j += (i64)gridDim.x * blockDim.x) {
        int a = 0, b = nseg;  // samp_off[a] <= j < samp_off[b]
        while (b - a > 1) {
            const int mid = (a + b) >> 1;
            if (samp_off[mid] <= j) a = mid; else b = mid;
        }
        const u64 pos = mps_hash64(seed ^ mps_hash64((u64)j)) % (u64)seg_size[a];
        const u64 key = (u64)MagKey<T>::of(x[seg_lo[a] + (i64)pos]);
        out[j] = ((u64)a << 32) | (MagKey<T>::bits == 31 ? key : (key >> 32));
    }
}

template <typename T, typename I>
__device__ __forceinline__ void seg_select_key_ge(const T* __restrict__ x, const i64* __restrict__ tile_lo,
                                                  const i64* __restrict__ tile_hi, const i64* __restrict__ tile_seg,
                                                  const typename MagKey<T>::type* __restrict__ seg_t,
                                                  I* __restrict__ idx, typename MagKey<T>::type* __restrict__ keys,
                                                  i64* __restrict__ segs, u64* __restrict__ counts,
                                                  int nseg, u64 capacity) {
    typedef typename MagKey<T>::type K;
    __shared__ u64 block_hits;
    const i64 lo = tile_lo[blockIdx.x], hi = tile_hi[blockIdx.x];
    const i64 s = tile_seg[blockIdx.x];
    const K t = seg_t[s];
    u64* counter = counts + nseg;  // counts[nseg]: all hits; counts[s]: segment s's
    if (threadIdx.x == 0) block_hits = 0ull;
    __syncthreads();
    for (i64 base = lo; base < hi; base += blockDim.x) {
        const i64 i = base + threadIdx.x;
        const K key = i < hi ? MagKey<T>::of(x[i]) : (K)0;
        const bool hit = i < hi && key >= t;
        const u64 p = warp_append(hit, counter);
        if (hit && p < capacity) {
            idx[p] = (I)i;
            keys[p] = key;
            segs[p] = s;
        }
        const u32 ballot = __ballot_sync(MPS_FULL_MASK, hit);
        if ((threadIdx.x & 31) == 0 && ballot != 0u) atomicAdd(&block_hits, (u64)__popc(ballot));
    }
    __syncthreads();
    if (threadIdx.x == 0 && block_hits != 0ull) atomicAdd(&counts[s], block_hits);
}

// ---------------------------------------------------------------- extern "C" entry points
#define MPS_SEG_T(T, TN)                                                                                     \
    extern "C" __global__ void seg_sumsq_##TN(const T* x, const i64* tile_lo, const i64* tile_hi,           \
                                              double* partial) {                                            \
        seg_sumsq<T>(x, tile_lo, tile_hi, partial);                                                         \
    }                                                                                                        \
    extern "C" __global__ void seg_sample_keys_##TN(const T* x, const i64* seg_lo, const i64* seg_size,     \
                                                    const i64* samp_off, int nseg, i64 m, u64 seed,         \
                                                    u64* out) {                                             \
        seg_sample_keys<T>(x, seg_lo, seg_size, samp_off, nseg, m, seed, out);                              \
    }
#define MPS_SEG_TI(T, TN, I, IN)                                                                             \
    extern "C" __global__ void seg_select_key_ge_##TN##_##IN(                                               \
        const T* x, const i64* tile_lo, const i64* tile_hi, const i64* tile_seg,                            \
        const MagKey<T>::type* seg_t, I* idx, MagKey<T>::type* keys, i64* segs, u64* counts, int nseg,      \
        u64 capacity) {                                                                                      \
        seg_select_key_ge<T, I>(x, tile_lo, tile_hi, tile_seg, seg_t, idx, keys, segs, counts, nseg,        \
                                capacity);                                                                   \
    }

MPS_SEG_T(float, f32)
MPS_SEG_T(double, f64)
MPS_SEG_TI(float, f32, int, i32)
MPS_SEG_TI(float, f32, long long, i64)
MPS_SEG_TI(double, f64, int, i32)
MPS_SEG_TI(double, f64, long long, i64)
