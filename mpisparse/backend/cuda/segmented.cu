// Segmented kernels of the CuPy backend (mpisparse/backend/cupy_segments.py):
// many segments (layers) of one flat vector, every segment in the same launch.
//
// The host cuts every segment into *tiles* of at most SEG_TILE elements (the
// `tile` argument); one block handles one tile, so a launch covers every
// segment whatever their number and sizes (tile_lo/tile_hi: flat bounds,
// tile_seg: the segment's position in the call).  A segment's tiles finish
// in any order; the *last* block of a segment to finish (an atomic count of
// the segment's finished tiles, after a __threadfence) completes the
// segment's work, so no decision needs the host.
//
// * seg_norms_*   one launch: each block's tile sum of squares in double (a
//                 fixed-order tree: deterministic); the last block of a
//                 segment adds the segment's tile sums in tile order, writes
//                 the segment's sum of squares and resets its counter (so the
//                 next call starts from zero without a memset).  Empty
//                 segments have no tile: their sum stays the 0 the caller
//                 initialised.
// * segk_pass_*   the exact top-k_s of every segment s: a radix select over
//                 the magnitude keys (common.cuh) with every segment's
//                 histogram, prefix and need in device state, launched once
//                 per digit and once more for the output, all with the same
//                 grid of tiles (float: digits of 11, 11, 9 bits, four
//                 launches; double: 5 x 11 and 8, seven).  Pass 0 histograms
//                 digit 0 of each segment; pass q filters by the bucket of
//                 digit q-1 chosen for the segment (keys above it are
//                 winners, appended at the segment's output offset; keys in
//                 it are histogrammed on digit q and, when the bucket fits the
//                 segment's candidate region, written there for pass q+1 to
//                 read instead of x); the last block of a segment scans its
//                 merged histogram from the top and picks the bucket holding
//                 the need-th largest remaining key.  When that bucket holds
//                 exactly the remaining need (or its digit was the last) the
//                 next pass is the segment's final one: it writes the winners
//                 and, of the bucket's keys (ties at the k-th magnitude when no
//                 digit is left), the first `need` to arrive; later passes
//                 return at once for that segment.  Exactly k_s distinct
//                 indices per segment, nothing read back: the winners fill
//                 out[off_s : off_s + k_s - need_s], the bucket the rest.
//                 The caller zeroes `hist` and `st` before pass 0 (one memset).
//
// Loops over a tile or a candidate range have a trip count uniform across
// the block, so the warp intrinsics always see full, converged warps
// (blockDim % 32 == 0, at most SK_MAX_THREADS).

#include "common.cuh"
#include "radix_select.cuh"

#define SK_BITS 11
#define SK_BINS 2048
#define SK_ILP 4
#define SK_MAX_THREADS 1024

// ---------------------------------------------------------------- layer norms
template <typename T>
__device__ __forceinline__ void seg_norms(const T* __restrict__ x, const i64* __restrict__ tile_lo,
                                          const i64* __restrict__ tile_hi, const i64* __restrict__ tile_seg,
                                          const i64* __restrict__ tile_off, double* __restrict__ partial,
                                          u64* __restrict__ done, double* __restrict__ sums) {
    __shared__ double sh[SK_MAX_THREADS];
    const int t = threadIdx.x;
    const int B = blockDim.x;
    const i64 lo = tile_lo[blockIdx.x], hi = tile_hi[blockIdx.x];
    double acc = 0.0;
    for (i64 i = lo + t; i < hi; i += 4 * (i64)B) {  // four independent loads in flight, added in index order
        const double v0 = (double)x[i];
        const double v1 = i + B < hi ? (double)x[i + B] : 0.0;
        const double v2 = i + 2 * B < hi ? (double)x[i + 2 * B] : 0.0;
        const double v3 = i + 3 * B < hi ? (double)x[i + 3 * B] : 0.0;
        acc += v0 * v0;
        acc += v1 * v1;
        acc += v2 * v2;
        acc += v3 * v3;
    }
    sh[t] = acc;
    __syncthreads();
    for (int s = B / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    if (t != 0) return;
    partial[blockIdx.x] = sh[0];
    __threadfence();  // the tile sum is visible before the count says so
    const i64 s = tile_seg[blockIdx.x];
    const i64 a = tile_off[s], e = tile_off[s + 1];
    if (atomicAdd(&done[s], 1ull) != (u64)(e - a - 1)) return;
    __threadfence();
    const volatile double* vp = partial;  // other blocks' writes: not a cached copy
    double sum = 0.0;
    for (i64 j = a; j < e; ++j) sum += vp[j];  // tile order: deterministic
    sums[s] = sum;
    done[s] = 0ull;  // the next call (a graph replay) starts from zero
}

// ---------------------------------------------------------------- segmented top-k
// One pass of the segmented radix select; block b handles tile b of segment s = tile_seg[b].
// Per segment: seg_lo (first element), seg_tiles (its tiles), seg_k (k_s; 0: the segment is skipped),
// out_off (its output offset), cand_off / cand_cap (its candidate region in each of the two candidate buffers).
template <typename T, typename I>
__device__ __forceinline__ void segk_pass(
    const T* __restrict__ x, const i64* __restrict__ tile_lo, const i64* __restrict__ tile_hi,
    const i64* __restrict__ tile_seg, const i64* __restrict__ seg_lo, const i64* __restrict__ seg_tiles,
    const i64* __restrict__ seg_k, const i64* __restrict__ out_off, const i64* __restrict__ cand_off,
    const i64* __restrict__ cand_cap, i64 tile, int pass, int sp, int wp, int sc, int wc,
    const I* __restrict__ src_idx, const typename MagKey<T>::type* __restrict__ src_key, I* __restrict__ dst_idx,
    typename MagKey<T>::type* __restrict__ dst_key, u64* __restrict__ hist_all, u64* __restrict__ st_all,
    I* __restrict__ out) {
    typedef typename MagKey<T>::type K;
    __shared__ u32 shist[SK_BINS];
    __shared__ u64 part[SK_MAX_THREADS];
    __shared__ u64 s_bin, s_above, s_count;
    __shared__ int s_last;
    const int t = threadIdx.x;
    const i64 s = tile_seg[blockIdx.x];
    const u64 k = (u64)seg_k[s];
    if (k == 0ull) return;  // nothing to select in this segment
    u64* st = st_all + s * RS_SLOTS;
    const u64 fin = st[RS_FINAL];
    if (fin != 0ull && (u64)pass + 1ull > fin) return;  // this segment finished early: nothing left to do
    const bool last_pass = fin != 0ull && (u64)pass + 1ull == fin;
    const u64 need = pass == 0 ? k : st[RS_NEED];
    const K pfx = (K)st[RS_PREFIX];
    const bool from_cand = st[RS_SRC] != 0ull;
    const bool write = !last_pass && st[RS_WRITE] != 0ull;
    const i64 coff = cand_off[s];
    const u64 cap = (u64)cand_cap[s];
    const int nb = last_pass ? 0 : 1 << wc;
    const K dmask = (K)(nb - 1);
    for (int b = t; b < nb; b += blockDim.x) shist[b] = 0u;
    __syncthreads();

    RadixStep<T, I> step;
    step.pfx = pfx; step.dmask = dmask; step.sp = sp; step.wp = wp; step.sc = sc;
    step.last_pass = last_pass; step.write = write; step.need = need; step.k = k; step.cap = cap;
    step.st = st; step.shist = shist; step.out = out + out_off[s];
    step.dst_idx = dst_idx + coff; step.dst_key = dst_key + coff;
    // what this block reads: its tile of x, or the same share of the segment's candidates
    i64 lo = tile_lo[blockIdx.x], hi = tile_hi[blockIdx.x];
    if (from_cand) {
        const i64 j = (lo - seg_lo[s]) / tile, m = (i64)st[RS_SRC_N];
        lo = j * tile;
        hi = lo + tile < m ? lo + tile : m;
    }
    const I* __restrict__ ci = src_idx + coff;
    const K* __restrict__ ck = src_key + coff;
    for (i64 base = lo; base < hi; base += (i64)blockDim.x * SK_ILP)
        step.template load_run<SK_ILP>(x, ci, ck, from_cand, base, hi);
    if (last_pass) return;

    // merge this block's histogram into the segment's; the segment's last block picks the bucket
    radix_pick<K>(shist, nb, hist_all + s * SK_BINS, st, (u64)seg_tiles[s], need, pfx, sc, pass, cap, part, s_bin,
                  s_above, s_count, s_last);
}

// ---------------------------------------------------------------- extern "C" entry points
#define MPS_SEG_T(T, TN)                                                                                     \
    extern "C" __global__ void seg_norms_##TN(const T* x, const i64* tile_lo, const i64* tile_hi,           \
                                              const i64* tile_seg, const i64* tile_off, double* partial,    \
                                              u64* done, double* sums) {                                    \
        seg_norms<T>(x, tile_lo, tile_hi, tile_seg, tile_off, partial, done, sums);                         \
    }
#define MPS_SEG_TI(T, TN, I, IN)                                                                             \
    extern "C" __global__ void segk_pass_##TN##_##IN(                                                       \
        const T* x, const i64* tile_lo, const i64* tile_hi, const i64* tile_seg, const i64* seg_lo,         \
        const i64* seg_tiles, const i64* seg_k, const i64* out_off, const i64* cand_off,                    \
        const i64* cand_cap, i64 tile, int pass, int sp, int wp, int sc, int wc, const I* src_idx,          \
        const MagKey<T>::type* src_key, I* dst_idx, MagKey<T>::type* dst_key, u64* hist, u64* st, I* out) { \
        segk_pass<T, I>(x, tile_lo, tile_hi, tile_seg, seg_lo, seg_tiles, seg_k, out_off, cand_off,         \
                        cand_cap, tile, pass, sp, wp, sc, wc, src_idx, src_key, dst_idx, dst_key, hist, st, \
                        out);                                                                                \
    }

MPS_SEG_T(float, f32)
MPS_SEG_T(double, f64)
MPS_SEG_TI(float, f32, int, i32)
MPS_SEG_TI(float, f32, long long, i64)
MPS_SEG_TI(double, f64, int, i32)
MPS_SEG_TI(double, f64, long long, i64)
