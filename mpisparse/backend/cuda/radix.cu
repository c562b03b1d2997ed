// Exact top-k by magnitude in about two reads of x: the `radix2` method of
// topk_abs (mpisparse/backend/cupy_radix.py).
//
// Radix select over the magnitude keys (common.cuh: the bits of |v|), digits
// of at most R2_BITS from the top (float: 11, 11, 9; double: 5 x 11, 8).  One
// kernel, launched once per digit and once more for the output, every launch
// with the same grid; all decisions live in a small device state (`st`), so a
// call needs no host round trip and its launches replay as one CUDA graph.
//
// * pass 0 histograms digit 0 of every key;
// * pass q (1 <= q < P) filters by digit q-1 (the bucket chosen at the end of
//   pass q-1): a key above the bucket is a winner (its index appended to the
//   output), a key in the bucket is a candidate: counted in the histogram of
//   digit q and, when the bucket's size (known from the last histogram) fits
//   the candidate buffer, written there (index and key) for pass q+1 to read
//   instead of x;
// * the last block of a histogram pass to finish (an atomic count of finished
//   blocks) scans the merged histogram from the top, picks the bucket that
//   holds the need-th largest remaining key, and records the new prefix,
//   need, and where the next pass reads.  When the bucket holds exactly the
//   remaining need (or its digit was the last), the next pass is the final one;
// * the final pass writes the winners above the bucket, and of the keys in
//   the bucket (ties, when no digit is left) the first `need` to arrive; the
//   passes after it return at once.
//
// A pass that reads x loads 16-byte vectors (R2_VILP per thread in flight)
// where x is 16-byte aligned, else R2_ILP scalar loads, as does a pass over
// the candidates.  Built for sm_90 with nvcc: 38-40 registers, no spills,
// 16 KB of shared memory a block.
//
// So x is read by pass 0 and pass 1; later passes read the (small) candidate
// buffers unless a bucket overflowed them (mostly-equal inputs), then x
// again.  The winners fill out[0 : k-need] in arrival order and the ties
// out[k-need : k]: exactly k distinct indices.  The caller zeroes `hist` and
// `st` before pass 0 (one memset); grid-stride loops have a trip count
// uniform across a block, so the warp intrinsics see full warps.

#include "common.cuh"
#include "radix_select.cuh"

#define R2_BITS 11
#define R2_BINS 2048
#define R2_ILP 4
#define R2_VILP 2
#define R2_MAX_THREADS 1024

template <typename T, typename I>
__device__ __forceinline__ void radix2_pass(const T* __restrict__ x, i64 n, u64 k, int pass, int sp, int wp,
                                            int sc, int wc, const I* __restrict__ src_idx,
                                            const typename MagKey<T>::type* __restrict__ src_key,
                                            I* __restrict__ dst_idx, typename MagKey<T>::type* __restrict__ dst_key,
                                            u64 cap, u64* __restrict__ hist, u64* __restrict__ st,
                                            I* __restrict__ out) {
    typedef typename MagKey<T>::type K;
    __shared__ u32 shist[R2_BINS];
    __shared__ u64 part[R2_MAX_THREADS];
    __shared__ u64 s_bin, s_above, s_count;
    __shared__ int s_last;
    const int t = threadIdx.x;
    const u64 fin = st[RS_FINAL];
    if (fin != 0ull && (u64)pass + 1ull > fin) return;  // finished early: nothing left to do
    const bool last_pass = fin != 0ull && (u64)pass + 1ull == fin;
    const u64 need = pass == 0 ? k : st[RS_NEED];
    const K pfx = (K)st[RS_PREFIX];
    const bool from_cand = st[RS_SRC] != 0ull;
    const bool write = !last_pass && st[RS_WRITE] != 0ull;
    const i64 m = from_cand ? (i64)st[RS_SRC_N] : n;
    const int nb = last_pass ? 0 : 1 << wc;
    const K dmask = (K)(nb - 1);
    for (int b = t; b < nb; b += blockDim.x) shist[b] = 0u;
    __syncthreads();

    RadixStep<T, I> step;
    step.pfx = pfx; step.dmask = dmask; step.sp = sp; step.wp = wp; step.sc = sc;
    step.last_pass = last_pass; step.write = write; step.need = need; step.k = k; step.cap = cap;
    step.st = st; step.shist = shist; step.out = out; step.dst_idx = dst_idx; step.dst_key = dst_key;
    if (from_cand || ((u64)x & 15ull) != 0ull) {  // the candidates, or an x off the 16-byte grid
        const i64 stride = (i64)gridDim.x * blockDim.x * R2_ILP;
        for (i64 base = (i64)blockIdx.x * blockDim.x * R2_ILP; base < m; base += stride)
            step.template load_run<R2_ILP>(x, src_idx, src_key, from_cand, base, m);
    } else {  // x itself: R2_VILP 16-byte loads per thread in flight; block 0 takes the last n % W
        typedef typename Vec16<T>::type V;
        const int W = Vec16<T>::W;
        const V* __restrict__ xv = reinterpret_cast<const V*>(x);
        const i64 nv = n / W;
        const i64 stride = (i64)gridDim.x * blockDim.x * R2_VILP;
        for (i64 base = (i64)blockIdx.x * blockDim.x * R2_VILP; base < nv; base += stride) {
            K key[R2_VILP * W];
            i64 id[R2_VILP * W];
            bool in[R2_VILP * W];
#pragma unroll
            for (int j = 0; j < R2_VILP; ++j) {
                const i64 i = base + (i64)j * blockDim.x + t;
                T v[W];
                if (i < nv) {
                    Vec16<T>::get(xv[i], v);
                } else {
#pragma unroll
                    for (int e = 0; e < W; ++e) v[e] = (T)0;
                }
#pragma unroll
                for (int e = 0; e < W; ++e) {
                    key[j * W + e] = MagKey<T>::of(v[e]);
                    id[j * W + e] = i * W + e;
                    in[j * W + e] = i < nv;
                }
            }
            step.template run<R2_VILP * W>(key, id, in);
        }
        if (blockIdx.x == 0) {
            const i64 i = nv * W + t;
            bool in[1] = {i < n};
            K key[1] = {in[0] ? MagKey<T>::of(x[i]) : (K)0};
            i64 id[1] = {i};
            step.template run<1>(key, id, in);
        }
    }
    if (last_pass) return;

    // merge this block's histogram; the last block to finish picks the bucket
    radix_pick<K>(shist, nb, hist, st, (u64)gridDim.x, need, pfx, sc, pass, cap, part, s_bin, s_above, s_count,
                  s_last);
}

// ---------------------------------------------------------------- extern "C" entry points
#define MPS_RADIX2(TN, T, IN, I)                                                                         \
    extern "C" __global__ void radix2_pass_##TN##_##IN(                                                  \
        const T* x, i64 n, u64 k, int pass, int sp, int wp, int sc, int wc, const I* src_idx,           \
        const MagKey<T>::type* src_key, I* dst_idx, MagKey<T>::type* dst_key, u64 cap, u64* hist,       \
        u64* st, I* out) {                                                                               \
        radix2_pass<T, I>(x, n, k, pass, sp, wp, sc, wc, src_idx, src_key, dst_idx, dst_key, cap, hist, \
                          st, out);                                                                      \
    }

MPS_RADIX2(f32, float, i32, int)
MPS_RADIX2(f32, float, i64, long long)
MPS_RADIX2(f64, double, i32, int)
MPS_RADIX2(f64, double, i64, long long)
