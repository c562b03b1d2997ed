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

#define R2_BITS 11
#define R2_BINS 2048
#define R2_ILP 4
#define R2_VILP 2
#define R2_MAX_THREADS 1024

// device state slots (u64)
#define S_NEED 0    // the remaining need (after pass 0's decision)
#define S_PREFIX 1  // the key bits chosen so far
#define S_FINAL 2   // the final pass + 1 (0: not decided yet)
#define S_SRC 3     // 1: this pass reads the previous pass's candidates, 0: x
#define S_SRC_N 4   // how many it reads there
#define S_WRITE 5   // 1: this pass writes its candidates (the bucket fits the buffer)
#define S_CAND 6    // candidates written by this pass
#define S_OUT 7     // winners written so far
#define S_TIES 8    // ties taken by the final pass
#define S_BLOCKS 9  // blocks of this pass finished

// 16-byte vectors of x for the passes that read it: four floats or two doubles per load
template <typename T> struct R2Vec;
template <> struct R2Vec<float> {
    typedef float4 type;
    static const int W = 4;
    __device__ __forceinline__ static void get(const float4& v, float* o) {
        o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
    }
};
template <> struct R2Vec<double> {
    typedef double2 type;
    static const int W = 2;
    __device__ __forceinline__ static void get(const double2& v, double* o) {
        o[0] = v.x; o[1] = v.y;
    }
};

// What one pass does with a few keys of every thread (every thread of the block calls run(), with the same NE):
// classify against the prefix, count the bucket's keys in the block's histogram, append winners, candidates
// or ties (warp-aggregated; a warp with nothing to append skips the appends).
template <typename T, typename I>
struct R2Step {
    typedef typename MagKey<T>::type K;
    K pfx, dmask;
    int sp, wp, sc;
    bool last_pass, write;
    u64 need, k, cap;
    u64* st;
    u32* shist;
    I* out;
    I* dst_idx;
    K* dst_key;

    // 0 dropped, 1 winner (above the bucket of the previous digit), 2 in that bucket
    __device__ __forceinline__ int classify(K key) const {
        if (sp < 0) return 2;  // pass 0: every key is in play
        const K hi = key >> sp, phi = pfx >> sp;
        const int up = sp + wp;  // bits above the previous digit: 31 or 63 at most
        if (hi == phi) return 2;
        return hi > phi && (key >> up) == (pfx >> up) ? 1 : 0;
    }

    template <int NE>
    __device__ __forceinline__ void run(const K* key, const i64* id, const bool* in) const {
        int cls[NE];
        bool any = false;
#pragma unroll
        for (int j = 0; j < NE; ++j) {
            cls[j] = in[j] ? classify(key[j]) : 0;
            if (!last_pass && cls[j] == 2) atomicAdd(&shist[(u32)((key[j] >> sc) & dmask)], 1u);
            any = any || cls[j] == 1 || (cls[j] == 2 && (last_pass || write));
        }
        if (__ballot_sync(MPS_FULL_MASK, any) == 0u) return;  // uniform across the warp
#pragma unroll
        for (int j = 0; j < NE; ++j) {
            const bool win = cls[j] == 1;
            const u64 p = warp_append(win, &st[S_OUT]);
            if (win) out[p] = (I)id[j];
            const bool in_bucket = cls[j] == 2;
            if (last_pass) {  // ties at the k-th magnitude (or, after an early stop, the whole bucket)
                const u64 q = warp_append(in_bucket, &st[S_TIES]);
                if (in_bucket && q < need) out[k - need + q] = (I)id[j];
            } else if (write) {
                const u64 q = warp_append(in_bucket, &st[S_CAND]);
                if (in_bucket && q < cap) {
                    dst_idx[q] = (I)id[j];
                    dst_key[q] = key[j];
                }
            }
        }
    }
};

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
    const u64 fin = st[S_FINAL];
    if (fin != 0ull && (u64)pass + 1ull > fin) return;  // finished early: nothing left to do
    const bool last_pass = fin != 0ull && (u64)pass + 1ull == fin;
    const u64 need = pass == 0 ? k : st[S_NEED];
    const K pfx = (K)st[S_PREFIX];
    const bool from_cand = st[S_SRC] != 0ull;
    const bool write = !last_pass && st[S_WRITE] != 0ull;
    const i64 m = from_cand ? (i64)st[S_SRC_N] : n;
    const int nb = last_pass ? 0 : 1 << wc;
    const K dmask = (K)(nb - 1);
    for (int b = t; b < nb; b += blockDim.x) shist[b] = 0u;
    __syncthreads();

    R2Step<T, I> step;
    step.pfx = pfx; step.dmask = dmask; step.sp = sp; step.wp = wp; step.sc = sc;
    step.last_pass = last_pass; step.write = write; step.need = need; step.k = k; step.cap = cap;
    step.st = st; step.shist = shist; step.out = out; step.dst_idx = dst_idx; step.dst_key = dst_key;
    if (from_cand || ((u64)x & 15ull) != 0ull) {  // the candidates, or an x off the 16-byte grid
        const i64 stride = (i64)gridDim.x * blockDim.x * R2_ILP;
        for (i64 base = (i64)blockIdx.x * blockDim.x * R2_ILP; base < m; base += stride) {
            K key[R2_ILP];
            i64 id[R2_ILP];
            bool in[R2_ILP];
#pragma unroll
            for (int j = 0; j < R2_ILP; ++j) {  // independent coalesced loads in flight
                const i64 i = base + (i64)j * blockDim.x + t;
                in[j] = i < m;
                key[j] = (K)0;
                id[j] = i;
                if (in[j]) {
                    if (from_cand) {
                        key[j] = src_key[i];
                        id[j] = (i64)src_idx[i];
                    } else {
                        key[j] = MagKey<T>::of(x[i]);
                    }
                }
            }
            step.template run<R2_ILP>(key, id, in);
        }
    } else {  // x itself: R2_VILP 16-byte loads per thread in flight; block 0 takes the last n % W
        typedef typename R2Vec<T>::type V;
        const int W = R2Vec<T>::W;
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
                    R2Vec<T>::get(xv[i], v);
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
    __syncthreads();
    for (int b = t; b < nb; b += blockDim.x)
        if (shist[b] != 0u) atomicAdd(&hist[b], (u64)shist[b]);
    __threadfence();
    __syncthreads();
    if (t == 0) s_last = atomicAdd(&st[S_BLOCKS], 1ull) == (u64)gridDim.x - 1ull;
    __syncthreads();
    if (!s_last) return;
    __threadfence();

    // thread t owns `per` bins from the top: nb-1-t*per, ...; a block scan gives the counts above them
    const volatile u64* vh = hist;
    const int per = (nb + (int)blockDim.x - 1) / (int)blockDim.x;
    u64 mine = 0ull;
    for (int j = 0; j < per; ++j) {
        const int b = nb - 1 - (t * per + j);
        if (b >= 0) mine += vh[b];
    }
    part[t] = mine;
    __syncthreads();
    for (int off = 1; off < (int)blockDim.x; off <<= 1) {  // inclusive scan, Hillis-Steele
        const u64 v = t >= off ? part[t - off] : 0ull;
        __syncthreads();
        part[t] += v;
        __syncthreads();
    }
    u64 run = part[t] - mine;
    for (int j = 0; j < per; ++j) {
        const int b = nb - 1 - (t * per + j);
        if (b < 0) break;
        const u64 h = vh[b];
        if (run < need && need <= run + h) {  // exactly one bin of one thread holds the need-th largest
            s_bin = (u64)b;
            s_above = run;
            s_count = h;
        }
        run += h;
    }
    __syncthreads();
    for (int j = 0; j < per; ++j) {  // the next histogram pass starts from zero
        const int b = nb - 1 - (t * per + j);
        if (b >= 0) hist[b] = 0ull;
    }
    if (t == 0) {
        const u64 rest = need - s_above, c = s_count;
        st[S_PREFIX] = (u64)(pfx | ((K)s_bin << sc));
        st[S_SRC] = pass == 0 ? 0ull : st[S_WRITE];  // the next pass reads what this one wrote, if it wrote
        st[S_SRC_N] = ((volatile u64*)st)[S_CAND];  // other blocks' atomics: not a cached copy
        st[S_CAND] = 0ull;
        st[S_WRITE] = c <= cap ? 1ull : 0ull;
        st[S_NEED] = rest;
        if (c == rest || sc == 0) st[S_FINAL] = (u64)pass + 2ull;  // the next pass writes the rest
        st[S_BLOCKS] = 0ull;
        __threadfence();
    }
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
