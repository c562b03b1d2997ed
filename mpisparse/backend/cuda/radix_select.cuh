// The radix select's pieces shared by `radix2` (radix.cu: one vector) and the segmented top-k
// (segmented.cu: every segment of a flat vector in one launch); inlined by cupy_launch.kernel_source.
//
// * the device state slots of one selection (u64; RS_SLOTS reserved, 10 used);
// * RadixStep: what one pass does with a few keys of every thread;
// * radix_pick: after a pass, the block merges its histogram, and the last block of the selection to
//   finish picks the bucket holding the need-th largest remaining key and records the next pass's state.

#ifndef MPISPARSE_RADIX_SELECT_CUH
#define MPISPARSE_RADIX_SELECT_CUH

#define RS_SLOTS 16
#define RS_NEED 0    // the remaining need (after pass 0's decision)
#define RS_PREFIX 1  // the key bits chosen so far
#define RS_FINAL 2   // the final pass + 1 (0: not decided yet)
#define RS_SRC 3     // 1: this pass reads the previous pass's candidates, 0: x
#define RS_SRC_N 4   // how many it reads there
#define RS_WRITE 5   // 1: this pass writes its candidates (the bucket fits the buffer)
#define RS_CAND 6    // candidates written by this pass
#define RS_OUT 7     // winners written so far
#define RS_TIES 8    // ties (bucket keys) taken by the final pass
#define RS_BLOCKS 9  // blocks of this pass finished

// What one pass does with a few keys of every thread (every thread of the block calls run(), with the same NE):
// classify against the prefix, count the bucket's keys in the block's histogram, append winners, candidates
// or ties (warp-aggregated; a warp with nothing to append skips the appends).
template <typename T, typename I>
struct RadixStep {
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
            const u64 p = warp_append(win, &st[RS_OUT]);
            if (win) out[p] = (I)id[j];
            const bool in_bucket = cls[j] == 2;
            if (last_pass) {  // ties at the k-th magnitude (or, after an early stop, the whole bucket)
                const u64 q = warp_append(in_bucket, &st[RS_TIES]);
                if (in_bucket && q < need) out[k - need + q] = (I)id[j];
            } else if (write) {
                const u64 q = warp_append(in_bucket, &st[RS_CAND]);
                if (in_bucket && q < cap) {
                    dst_idx[q] = (I)id[j];
                    dst_key[q] = key[j];
                }
            }
        }
    }

    // NE scalar loads per thread in flight from `base` (stride blockDim.x) below `end`: keys of x, or the
    // previous pass's candidates (index and key), then run() on them
    template <int NE>
    __device__ __forceinline__ void load_run(const T* __restrict__ x, const I* __restrict__ src_idx,
                                             const K* __restrict__ src_key, bool from_cand, i64 base,
                                             i64 end) const {
        K key[NE];
        i64 id[NE];
        bool in[NE];
#pragma unroll
        for (int j = 0; j < NE; ++j) {  // independent coalesced loads in flight
            const i64 i = base + (i64)j * blockDim.x + threadIdx.x;
            in[j] = i < end;
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
        run<NE>(key, id, in);
    }
};

// After a pass (not the final one): merge this block's histogram `shist` (nb bins) into the selection's
// `hist`; the last of the selection's `blocks` blocks to finish scans it from the top, picks the bucket
// holding the need-th largest remaining key, zeroes `hist` and writes the next pass's state into `st`.
// `part` (blockDim.x entries), s_bin, s_above, s_count and s_last are the caller's shared memory.
template <typename K>
__device__ __forceinline__ void radix_pick(const u32* shist, int nb, u64* hist, u64* st, u64 blocks, u64 need,
                                           K pfx, int sc, int pass, u64 cap, u64* part, u64& s_bin,
                                           u64& s_above, u64& s_count, int& s_last) {
    const int t = threadIdx.x;
    __syncthreads();
    for (int b = t; b < nb; b += blockDim.x)
        if (shist[b] != 0u) atomicAdd(&hist[b], (u64)shist[b]);
    __threadfence();
    __syncthreads();
    if (t == 0) s_last = atomicAdd(&st[RS_BLOCKS], 1ull) == blocks - 1ull;
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
        volatile u64* vs = st;  // other blocks' atomics: not a cached copy
        const u64 rest = need - s_above, c = s_count;
        vs[RS_PREFIX] = (u64)(pfx | ((K)s_bin << sc));
        vs[RS_SRC] = pass == 0 ? 0ull : vs[RS_WRITE];  // the next pass reads what this one wrote, if it wrote
        vs[RS_SRC_N] = vs[RS_CAND];
        vs[RS_CAND] = 0ull;
        vs[RS_WRITE] = c <= cap ? 1ull : 0ull;
        vs[RS_NEED] = rest;
        if (c == rest || sc == 0) vs[RS_FINAL] = (u64)pass + 2ull;  // the next pass writes the rest
        vs[RS_BLOCKS] = 0ull;
        __threadfence();
    }
}

#endif  // MPISPARSE_RADIX_SELECT_CUH
