// Selection kernels of the CuPy backend (mpisparse/backend/cupy_select.py).
//
// * select_ge_*      threshold select with compaction, one fused pass:
//                    compare |x| >= t, count, write indices (and values)
// * select_key_ge_*  the same on magnitude keys (key(|x|) >= key(t)), writing
//                    indices and keys: the candidate pass of the sampled top-k
// * *_vec_*          the same two passes with 16-byte loads (x 16-byte aligned)
// * block_kth_*      the need-th largest of a key array, one block (radix
//                    digits in shared memory): the sampled top-k's threshold
//                    and its exact k-th candidate, without a host round trip
// * take_top_*       the k largest candidates' indices given that k-th key
// * sample_keys_*    magnitude keys at hashed random positions (with replacement)
// * radix_hist_*     12-bit digit histogram of the magnitude keys (of x, or of
//                    a candidate key array)
// * radix_find_bin   the bin holding the need-th largest key (one block)
// * radix_split_*    one pass: keys whose digit is above the bin are winners
//                    (indices appended to the output), keys in the bin are the
//                    next level's candidates
//
// Output order follows the atomic counters (not sorted).  Element-wise loops
// are grid-stride loops whose trip count is uniform across a block, so the
// warp intrinsics always see full, converged warps (blockDim % 32 == 0).

#include "common.cuh"

#define RADIX_BITS 12
#define RADIX_BINS 4096
#define ILP 4
#define VILP 2

// ----------------------------------------------------------------- threshold select
template <typename T, typename I>
__device__ __forceinline__ void select_ge(const T* __restrict__ x, i64 n, T t, const T* __restrict__ t_ptr,
                                          I* __restrict__ idx, T* __restrict__ vals,
                                          u64* __restrict__ counter, u64 capacity) {
    if (t_ptr != 0) t = *t_ptr;
    const i64 stride = (i64)gridDim.x * blockDim.x * ILP;
    for (i64 base = (i64)blockIdx.x * blockDim.x * ILP; base < n; base += stride) {
        T v[ILP];
        bool hit[ILP];
#pragma unroll
        for (int j = 0; j < ILP; ++j) {  // ILP independent coalesced loads in flight
            const i64 i = base + (i64)j * blockDim.x + threadIdx.x;
            v[j] = i < n ? x[i] : (T)0;
            hit[j] = i < n && mps_abs(v[j]) >= t;  // NaN never passes
        }
#pragma unroll
        for (int j = 0; j < ILP; ++j) {
            const u64 p = warp_append(hit[j], counter);
            if (hit[j] && p < capacity) {
                idx[p] = (I)(base + (i64)j * blockDim.x + threadIdx.x);
                if (vals != 0) vals[p] = v[j];
            }
        }
    }
}

// ------------------------------------------------------------ key select (candidates)
template <typename T, typename I>
__device__ __forceinline__ void select_key_ge(const T* __restrict__ x, i64 n,
                                              const typename MagKey<T>::type* __restrict__ t_key,
                                              I* __restrict__ idx, typename MagKey<T>::type* __restrict__ keys,
                                              u64* __restrict__ counter, u64 capacity) {
    typedef typename MagKey<T>::type K;
    const K t = *t_key;
    const i64 stride = (i64)gridDim.x * blockDim.x * ILP;
    for (i64 base = (i64)blockIdx.x * blockDim.x * ILP; base < n; base += stride) {
        K key[ILP];
        bool hit[ILP];
#pragma unroll
        for (int j = 0; j < ILP; ++j) {
            const i64 i = base + (i64)j * blockDim.x + threadIdx.x;
            key[j] = i < n ? MagKey<T>::of(x[i]) : (K)0;
            hit[j] = i < n && key[j] >= t;
        }
#pragma unroll
        for (int j = 0; j < ILP; ++j) {
            const u64 p = warp_append(hit[j], counter);
            if (hit[j] && p < capacity) {
                idx[p] = (I)(base + (i64)j * blockDim.x + threadIdx.x);
                keys[p] = key[j];
            }
        }
    }
}

// ------------------------------------------------- the two passes with 16-byte loads
// One template for both: KEYS false = select_ge (|x| >= t, indices and values),
// KEYS true = select_key_ge (key >= *t_key, indices and keys).  x must be
// 16-byte aligned; the last n % W elements are handled by block 0.  A warp
// whose VILP * W elements per lane hold no hit skips the appends (one ballot).
template <typename T, typename I, bool KEYS>
__device__ __forceinline__ void select_vec(const T* __restrict__ x, i64 n, T t, const T* __restrict__ t_ptr,
                                           const typename MagKey<T>::type* __restrict__ t_key,
                                           I* __restrict__ idx, T* __restrict__ vals,
                                           typename MagKey<T>::type* __restrict__ keys,
                                           u64* __restrict__ counter, u64 capacity) {
    typedef typename Vec16<T>::type V;
    typedef typename MagKey<T>::type K;
    const int W = Vec16<T>::W;
    K tk = (K)0;
    if (KEYS) tk = *t_key;
    else if (t_ptr != 0) t = *t_ptr;
    const V* __restrict__ xv = reinterpret_cast<const V*>(x);
    const i64 nv = n / W;
    const i64 stride = (i64)gridDim.x * blockDim.x * VILP;
    for (i64 base = (i64)blockIdx.x * blockDim.x * VILP; base < nv; base += stride) {
        T v[VILP][W];
#pragma unroll
        for (int j = 0; j < VILP; ++j) {
            const i64 i = base + (i64)j * blockDim.x + threadIdx.x;
            if (i < nv) {
                Vec16<T>::get(xv[i], v[j]);
            } else {
#pragma unroll
                for (int e = 0; e < W; ++e) v[j][e] = (T)0;
            }
        }
        bool hit[VILP][W];
        bool any = false;
#pragma unroll
        for (int j = 0; j < VILP; ++j) {
            const bool in = base + (i64)j * blockDim.x + threadIdx.x < nv;
#pragma unroll
            for (int e = 0; e < W; ++e) {
                hit[j][e] = in && (KEYS ? MagKey<T>::of(v[j][e]) >= tk : mps_abs(v[j][e]) >= t);
                any = any || hit[j][e];
            }
        }
        if (__ballot_sync(MPS_FULL_MASK, any) == 0u) continue;  // uniform across the warp
#pragma unroll
        for (int j = 0; j < VILP; ++j) {
            const i64 i = base + (i64)j * blockDim.x + threadIdx.x;
#pragma unroll
            for (int e = 0; e < W; ++e) {
                const u64 p = warp_append(hit[j][e], counter);
                if (hit[j][e] && p < capacity) {
                    idx[p] = (I)(i * W + e);
                    if (KEYS) keys[p] = MagKey<T>::of(v[j][e]);
                    else if (vals != 0) vals[p] = v[j][e];
                }
            }
        }
    }
    if (blockIdx.x == 0) {  // the tail: fewer than W elements, one per thread of block 0
        const i64 i = nv * W + threadIdx.x;
        const bool in = i < n;
        const T val = in ? x[i] : (T)0;
        const bool hit = in && (KEYS ? MagKey<T>::of(val) >= tk : mps_abs(val) >= t);
        const u64 p = warp_append(hit, counter);
        if (hit && p < capacity) {
            idx[p] = (I)i;
            if (KEYS) keys[p] = MagKey<T>::of(val);
            else if (vals != 0) vals[p] = val;
        }
    }
}

// ------------------------------------------------ exact k-th largest key, one block
// The need-th largest of the first n keys (n = min(*n_ptr, cap) when n_ptr is
// given, else n_fixed): kth_in_block (common.cuh).  Writes found[0] = that
// key, found[1] = the number of keys strictly above it, found[2] = 1, and
// kth_out[0] = the key (typed, for a pass that reads it); when need is 0 or
// above n, only found[2] = 0.  Launch with KTH_THREADS threads.
template <typename K, int BITS>
__device__ __forceinline__ void block_kth(const K* __restrict__ keys, i64 n_fixed, const u64* __restrict__ n_ptr,
                                          u64 cap, u64 need, u64* __restrict__ found, K* __restrict__ kth_out) {
    u64 n = n_ptr != 0 ? *n_ptr : (u64)n_fixed;
    if (n_ptr != 0 && n > cap) n = cap;
    if (need < 1ull || need > n) {
        if (threadIdx.x == 0) found[2] = 0ull;
        return;
    }
    u64 above = 0ull;
    const K kth = kth_in_block<K, BITS>(keys, n, need, &above);
    if (threadIdx.x == 0) {
        found[0] = (u64)kth;
        found[1] = above;
        found[2] = 1ull;
        if (kth_out != 0) kth_out[0] = kth;
    }
}

// The k largest of n = min(*n_ptr, cap) candidates, given their k-th largest
// key (found, from block_kth): keys above it all go, slots from counters[0];
// keys equal to it fill the slots from found[1] while they are below k
// (counters[1]).  Writes out[0:k] exactly; nothing when found[2] == 0.
template <typename K, typename I>
__device__ __forceinline__ void take_top(const K* __restrict__ keys, const I* __restrict__ idx,
                                         const u64* __restrict__ n_ptr, u64 cap, const u64* __restrict__ found,
                                         u64 k, I* __restrict__ out, u64* __restrict__ counters) {
    if (found[2] == 0ull) return;
    u64 n = *n_ptr;
    if (n > cap) n = cap;
    const K kth = (K)found[0];
    const u64 above = found[1];
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < n; base += (u64)gridDim.x * blockDim.x) {
        const u64 i = base + threadIdx.x;
        const K key = i < n ? keys[i] : (K)0;
        const bool gt = i < n && key > kth;
        const bool eq = i < n && key == kth;
        const u64 p = warp_append(gt, &counters[0]);
        if (gt) out[p] = idx[i];
        const u64 q = warp_append(eq, &counters[1]);
        if (eq && above + q < k) out[above + q] = idx[i];
    }
}

// -------------------------------------------------------------------- sampling
template <typename T>
__device__ __forceinline__ void sample_keys(const T* __restrict__ x, i64 n, u64 seed, i64 m,
                                            typename MagKey<T>::type* __restrict__ out) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (i64)gridDim.x * blockDim.x) {
        const u64 pos = mps_hash64(seed ^ mps_hash64((u64)i)) % (u64)n;
        out[i] = MagKey<T>::of(x[pos]);
    }
}

// ------------------------------------------------------------------ radix select
// Histogram of digit (key >> shift) & (RADIX_BINS - 1).  Keys come from x
// (FROM_X) or from a key array of *count_ptr elements (a candidate set whose
// bits above the digit are all equal).
template <typename T, bool FROM_X>
__device__ __forceinline__ void radix_hist(const T* __restrict__ x,
                                           const typename MagKey<T>::type* __restrict__ keys,
                                           i64 n, int shift, u64* __restrict__ hist) {
    __shared__ u32 sh[RADIX_BINS];
    for (int b = threadIdx.x; b < RADIX_BINS; b += blockDim.x) sh[b] = 0u;
    __syncthreads();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const typename MagKey<T>::type key = FROM_X ? MagKey<T>::of(x[i]) : keys[i];
        atomicAdd(&sh[(u32)(key >> shift) & (RADIX_BINS - 1)], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < RADIX_BINS; b += blockDim.x)
        if (sh[b] != 0u) atomicAdd(&hist[b], (u64)sh[b]);
}

// One pass: digit > bin -> winner (index appended to out at *n_out);
// digit == bin -> candidate (index and key appended at *n_cand).
template <typename T, typename I, bool FROM_X>
__device__ __forceinline__ void radix_split(const T* __restrict__ x,
                                            const typename MagKey<T>::type* __restrict__ keys_in,
                                            const I* __restrict__ idx_in, i64 n, int shift,
                                            const u64* __restrict__ found, I* __restrict__ out,
                                            u64* __restrict__ n_out, I* __restrict__ cand_idx,
                                            typename MagKey<T>::type* __restrict__ cand_key,
                                            u64* __restrict__ n_cand) {
    typedef typename MagKey<T>::type K;
    const u32 bin = (u32)found[0];
    for (i64 base = (i64)blockIdx.x * blockDim.x; base < n; base += (i64)gridDim.x * blockDim.x) {
        const i64 i = base + threadIdx.x;
        K key = (K)0;
        u32 d = 0u;
        if (i < n) {
            key = FROM_X ? MagKey<T>::of(x[i]) : keys_in[i];
            d = (u32)(key >> shift) & (RADIX_BINS - 1);
        }
        const bool win = i < n && d > bin;
        const bool cand = i < n && d == bin;
        const I my = FROM_X ? (I)i : (i < n ? idx_in[i] : (I)0);
        const u64 p = warp_append(win, n_out);
        if (win) out[p] = my;
        const u64 q = warp_append(cand, n_cand);
        if (cand) {
            cand_idx[q] = my;
            cand_key[q] = key;
        }
    }
}

// ---------------------------------------------------------------- extern "C" entry points
#define MPS_SELECT(TN, T, IN, I)                                                                        \
    extern "C" __global__ void select_ge_##TN##_##IN(const T* x, i64 n, T t, const T* t_ptr, I* idx,    \
                                                      T* vals, u64* counter, u64 capacity) {            \
        select_ge<T, I>(x, n, t, t_ptr, idx, vals, counter, capacity);                                  \
    }                                                                                                   \
    extern "C" __global__ void select_key_ge_##TN##_##IN(const T* x, i64 n,                             \
                                                          const MagKey<T>::type* t_key, I* idx,          \
                                                          MagKey<T>::type* keys, u64* counter,          \
                                                          u64 capacity) {                               \
        select_key_ge<T, I>(x, n, t_key, idx, keys, counter, capacity);                                 \
    }                                                                                                   \
    extern "C" __global__ void radix_split_x_##TN##_##IN(const T* x, i64 n, int shift, const u64* found, \
                                                          I* out, u64* n_out, I* cand_idx,               \
                                                          MagKey<T>::type* cand_key, u64* n_cand) {      \
        radix_split<T, I, true>(x, 0, 0, n, shift, found, out, n_out, cand_idx, cand_key, n_cand);      \
    }                                                                                                   \
    extern "C" __global__ void radix_split_k_##TN##_##IN(const MagKey<T>::type* keys, const I* idx,     \
                                                          i64 n, int shift, const u64* found, I* out,    \
                                                          u64* n_out, I* cand_idx,                       \
                                                          MagKey<T>::type* cand_key, u64* n_cand) {      \
        radix_split<T, I, false>(0, keys, idx, n, shift, found, out, n_out, cand_idx, cand_key, n_cand); \
    }                                                                                                   \
    extern "C" __global__ void select_ge_vec_##TN##_##IN(const T* x, i64 n, T t, const T* t_ptr, I* idx, \
                                                          T* vals, u64* counter, u64 capacity) {        \
        select_vec<T, I, false>(x, n, t, t_ptr, 0, idx, vals, 0, counter, capacity);                    \
    }                                                                                                   \
    extern "C" __global__ void select_key_ge_vec_##TN##_##IN(const T* x, i64 n,                         \
                                                              const MagKey<T>::type* t_key, I* idx,      \
                                                              MagKey<T>::type* keys, u64* counter,      \
                                                              u64 capacity) {                           \
        select_vec<T, I, true>(x, n, (T)0, 0, t_key, idx, 0, keys, counter, capacity);                  \
    }                                                                                                   \
    extern "C" __global__ void take_top_##TN##_##IN(const MagKey<T>::type* keys, const I* idx,          \
                                                     const u64* n_ptr, u64 cap, const u64* found, u64 k, \
                                                     I* out, u64* counters) {                           \
        take_top<MagKey<T>::type, I>(keys, idx, n_ptr, cap, found, k, out, counters);                   \
    }

#define MPS_PER_TYPE(TN, T)                                                                              \
    extern "C" __global__ void sample_keys_##TN(const T* x, i64 n, u64 seed, i64 m,                     \
                                                MagKey<T>::type* out) {                                  \
        sample_keys<T>(x, n, seed, m, out);                                                              \
    }                                                                                                    \
    extern "C" __global__ void radix_hist_x_##TN(const T* x, i64 n, int shift, u64* hist) {             \
        radix_hist<T, true>(x, 0, n, shift, hist);                                                       \
    }                                                                                                    \
    extern "C" __global__ void radix_hist_k_##TN(const MagKey<T>::type* keys, i64 n, int shift,         \
                                                 u64* hist) {                                            \
        radix_hist<T, false>(0, keys, n, shift, hist);                                                   \
    }                                                                                                    \
    extern "C" __global__ void block_kth_##TN(const MagKey<T>::type* keys, i64 n_fixed, const u64* n_ptr, \
                                              u64 cap, u64 need, u64* found, MagKey<T>::type* kth_out) { \
        block_kth<MagKey<T>::type, MagKey<T>::bits>(keys, n_fixed, n_ptr, cap, need, found, kth_out);    \
    }

MPS_SELECT(f32, float, i32, int)
MPS_SELECT(f32, float, i64, long long)
MPS_SELECT(f64, double, i32, int)
MPS_SELECT(f64, double, i64, long long)
MPS_PER_TYPE(f32, float)
MPS_PER_TYPE(f64, double)

// The bin of the need-th largest key (1 <= need <= sum(hist)).  One block of
// 1024 threads; thread t owns bins 4095-4t .. 4092-4t (scanned from the top).
// found[0] = bin, found[1] = keys in bins above it, found[2] = keys in the bin.
extern "C" __global__ void radix_find_bin(const u64* __restrict__ hist, u64 need, u64* __restrict__ found) {
    __shared__ u64 part[1024];
    const int t = threadIdx.x;
    u64 c[4];
    u64 s = 0ull;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        c[j] = hist[RADIX_BINS - 1 - 4 * t - j];
        s += c[j];
    }
    part[t] = s;
    __syncthreads();
    for (int off = 1; off < 1024; off <<= 1) {  // inclusive scan, Hillis-Steele
        const u64 v = t >= off ? part[t - off] : 0ull;
        __syncthreads();
        part[t] += v;
        __syncthreads();
    }
    u64 above = part[t] - s;
    if (above < need && need <= part[t]) {
        for (int j = 0; j < 4; ++j) {
            if (above + c[j] >= need) {
                found[0] = (u64)(RADIX_BINS - 1 - 4 * t - j);
                found[1] = above;
                found[2] = c[j];
                break;
            }
            above += c[j];
        }
    }
}
