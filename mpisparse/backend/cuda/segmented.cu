// Segmented kernels of the CuPy backend (mpisparse/backend/cupy_segments.py):
// many segments (layers) of one flat vector in one launch each.
//
// The host cuts every segment into *tiles* of at most a few thousand
// elements; one block handles one tile, so a launch covers every segment
// whatever their number and sizes (tile_lo/tile_hi: flat bounds, tile_seg:
// the segment's position in the call).  The exact top-k of every segment:
//
// * seg_sumsq_*          one block per tile: the tile's sum of squares in
//                        double (fixed-order tree reduction: deterministic)
// * seg_tile_sums        one thread per segment: its tiles' sums added in tile
//                        order (the host's former order: the same float64 bits),
//                        so one number per segment is read back
// * seg_sample_mag_*     magnitude keys at hashed random positions (with
//                        replacement) of every segment, into the segment's
//                        own region of the sample (samp_off)
// * seg_kth_*            one block per segment: the need[s]-th largest key of
//                        the segment's region (kth_in_block): first the
//                        sample's r-th (the segment's threshold), then the
//                        candidates' k-th
// * seg_select_region_*  one block per tile: entries whose magnitude key is
//                        >= the segment's threshold are appended (warp-
//                        aggregated) to the segment's own candidate region
// * seg_take_*           one block per segment: its k largest candidates'
//                        indices, written at the segment's output offset
//
// Loops over a tile or a region have a trip count uniform across the block,
// so the warp intrinsics always see full, converged warps (blockDim % 32 == 0).

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
__device__ __forceinline__ void seg_sample_mag(const T* __restrict__ x, const i64* __restrict__ seg_lo,
                                               const i64* __restrict__ seg_size, const i64* __restrict__ samp_off,
                                               int nseg, i64 m, u64 seed, typename MagKey<T>::type* __restrict__ out) {
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < m; j += (i64)gridDim.x * blockDim.x) {
        int a = 0, b = nseg;  // samp_off[a] <= j < samp_off[b]
        while (b - a > 1) {
            const int mid = (a + b) >> 1;
            if (samp_off[mid] <= j) a = mid; else b = mid;
        }
        const u64 pos = mps_hash64(seed ^ mps_hash64((u64)j)) % (u64)seg_size[a];
        out[j] = MagKey<T>::of(x[seg_lo[a] + (i64)pos]);
    }
}

// Block s: the need[s]-th largest of the n keys at keys + off[s] (n = n_fixed[s],
// or min(counts[s], cap[s]) when counts is given).  kth[s] = that key,
// found[2s] = keys strictly above it, found[2s+1] = 1; when need[s] is 0 or
// above n: kth[s] = 0 (a threshold every entry passes), found[2s+1] = 0.
// Launch with KTH_THREADS threads, one block per segment.
template <typename K, int BITS>
__device__ __forceinline__ void seg_kth(const K* __restrict__ keys, const i64* __restrict__ off,
                                        const i64* __restrict__ n_fixed, const u64* __restrict__ counts,
                                        const i64* __restrict__ cap, const i64* __restrict__ need,
                                        K* __restrict__ kth, u64* __restrict__ found) {
    const int s = blockIdx.x;
    u64 n = counts != 0 ? counts[s] : (u64)n_fixed[s];
    if (counts != 0 && n > (u64)cap[s]) n = (u64)cap[s];
    const u64 nd = need[s] > 0 ? (u64)need[s] : 0ull;
    if (nd < 1ull || nd > n) {
        if (threadIdx.x == 0) {
            kth[s] = (K)0;
            found[2 * s] = 0ull;
            found[2 * s + 1] = 0ull;
        }
        return;
    }
    u64 above = 0ull;
    const K v = kth_in_block<K, BITS>(keys + off[s], n, nd, &above);
    if (threadIdx.x == 0) {
        kth[s] = v;
        found[2 * s] = above;
        found[2 * s + 1] = 1ull;
    }
}

// One block per tile: key >= the segment's threshold -> appended to the
// segment's region [coff[s], coff[s] + cap[s]) (counts[s] counts every hit,
// also those past cap[s], which are not written).
template <typename T, typename I>
__device__ __forceinline__ void seg_select_region(const T* __restrict__ x, const i64* __restrict__ tile_lo,
                                                  const i64* __restrict__ tile_hi, const i64* __restrict__ tile_seg,
                                                  const typename MagKey<T>::type* __restrict__ seg_t,
                                                  const i64* __restrict__ coff, const i64* __restrict__ cap,
                                                  I* __restrict__ idx, typename MagKey<T>::type* __restrict__ keys,
                                                  u64* __restrict__ counts) {
    typedef typename MagKey<T>::type K;
    const i64 lo = tile_lo[blockIdx.x], hi = tile_hi[blockIdx.x];
    const i64 s = tile_seg[blockIdx.x];
    const K t = seg_t[s];
    const i64 base_out = coff[s];
    const u64 c = (u64)cap[s];
    for (i64 base = lo; base < hi; base += blockDim.x) {
        const i64 i = base + threadIdx.x;
        const K key = i < hi ? MagKey<T>::of(x[i]) : (K)0;
        const bool hit = i < hi && key >= t;
        const u64 p = warp_append(hit, &counts[s]);
        if (hit && p < c) {
            idx[base_out + (i64)p] = (I)i;
            keys[base_out + (i64)p] = key;
        }
    }
}

// Block s: the k[s] largest of the segment's candidates, given their k-th key
// (kth, found from seg_kth): keys above it all go, keys equal to it fill the
// slots from found[2s] while they are below k[s]; written at out + out_off[s].
// Nothing when found[2s+1] == 0 (the host redoes that segment).
template <typename K, typename I>
__device__ __forceinline__ void seg_take(const K* __restrict__ keys, const I* __restrict__ idx,
                                         const i64* __restrict__ coff, const u64* __restrict__ counts,
                                         const i64* __restrict__ cap, const K* __restrict__ kth,
                                         const u64* __restrict__ found, const i64* __restrict__ k,
                                         const i64* __restrict__ out_off, I* __restrict__ out) {
    __shared__ u64 n_gt, n_eq;
    const int s = blockIdx.x;
    if (found[2 * s + 1] == 0ull) return;
    if (threadIdx.x == 0) {
        n_gt = 0ull;
        n_eq = 0ull;
    }
    __syncthreads();
    u64 n = counts[s];
    if (n > (u64)cap[s]) n = (u64)cap[s];
    const K t = kth[s];
    const u64 above = found[2 * s], ks = (u64)k[s];
    const K* __restrict__ kk = keys + coff[s];
    const I* __restrict__ ii = idx + coff[s];
    I* __restrict__ o = out + out_off[s];
    for (u64 base = 0ull; base < n; base += blockDim.x) {
        const u64 i = base + threadIdx.x;
        const K key = i < n ? kk[i] : (K)0;
        const bool gt = i < n && key > t;
        const bool eq = i < n && key == t;
        const u64 p = warp_append(gt, &n_gt);
        if (gt) o[p] = ii[i];
        const u64 q = warp_append(eq, &n_eq);
        if (eq && above + q < ks) o[above + q] = ii[i];
    }
}

// A thread per segment (grid-stride): the sum of its tiles' partial sums (tiles tile_off[s] .. tile_off[s+1]), in tile order.
extern "C" __global__ void seg_tile_sums(const double* __restrict__ partial, const i64* __restrict__ tile_off,
                                         i64 nseg, double* __restrict__ out) {
    for (i64 s = (i64)blockIdx.x * blockDim.x + threadIdx.x; s < nseg; s += (i64)gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (i64 t = tile_off[s]; t < tile_off[s + 1]; ++t) acc += partial[t];
        out[s] = acc;
    }
}

// ---------------------------------------------------------------- extern "C" entry points
#define MPS_SEG_T(T, TN)                                                                                     \
    extern "C" __global__ void seg_sumsq_##TN(const T* x, const i64* tile_lo, const i64* tile_hi,           \
                                              double* partial) {                                            \
        seg_sumsq<T>(x, tile_lo, tile_hi, partial);                                                         \
    }                                                                                                        \
    extern "C" __global__ void seg_sample_mag_##TN(const T* x, const i64* seg_lo, const i64* seg_size,      \
                                                   const i64* samp_off, int nseg, i64 m, u64 seed,          \
                                                   MagKey<T>::type* out) {                                  \
        seg_sample_mag<T>(x, seg_lo, seg_size, samp_off, nseg, m, seed, out);                               \
    }                                                                                                        \
    extern "C" __global__ void seg_kth_##TN(const MagKey<T>::type* keys, const i64* off, const i64* n_fixed, \
                                            const u64* counts, const i64* cap, const i64* need,             \
                                            MagKey<T>::type* kth, u64* found) {                             \
        seg_kth<MagKey<T>::type, MagKey<T>::bits>(keys, off, n_fixed, counts, cap, need, kth, found);       \
    }
#define MPS_SEG_TI(T, TN, I, IN)                                                                             \
    extern "C" __global__ void seg_select_region_##TN##_##IN(                                               \
        const T* x, const i64* tile_lo, const i64* tile_hi, const i64* tile_seg, const MagKey<T>::type* seg_t, \
        const i64* coff, const i64* cap, I* idx, MagKey<T>::type* keys, u64* counts) {                      \
        seg_select_region<T, I>(x, tile_lo, tile_hi, tile_seg, seg_t, coff, cap, idx, keys, counts);        \
    }                                                                                                        \
    extern "C" __global__ void seg_take_##TN##_##IN(const MagKey<T>::type* keys, const I* idx, const i64* coff, \
                                                    const u64* counts, const i64* cap,                      \
                                                    const MagKey<T>::type* kth, const u64* found,           \
                                                    const i64* k, const i64* out_off, I* out) {             \
        seg_take<MagKey<T>::type, I>(keys, idx, coff, counts, cap, kth, found, k, out_off, out);            \
    }

MPS_SEG_T(float, f32)
MPS_SEG_T(double, f64)
MPS_SEG_TI(float, f32, int, i32)
MPS_SEG_TI(float, f32, long long, i64)
MPS_SEG_TI(double, f64, int, i32)
MPS_SEG_TI(double, f64, long long, i64)
