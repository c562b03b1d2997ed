// Per-row top-k mask (DCT-MP, Gupta et al., Alg. 2 l.3-9): one block per row.
//
// Radix select on the magnitude keys of the row, 8 bits per pass from the
// top (4 passes for float32, 8 for float64), with a shared 256-bin histogram:
// after the passes `prefix` is the k-th largest key of the row and `need` the
// number of entries equal to it that still belong to the top k.  A last pass
// writes the mask: keys above the k-th are set, and of the keys equal to it
// the first `need` in index order (an ordered block-wide count), so every row
// gets exactly k entries even on ties.  Requires blockDim.x % 32 == 0, <= 1024.

#include "common.cuh"

template <typename T>
__device__ __forceinline__ void rowwise_topk(const T* __restrict__ X, i64 cols, i64 k,
                                             unsigned char* __restrict__ mask) {
    typedef typename MagKey<T>::type K;
    const T* x = X + (i64)blockIdx.x * cols;
    unsigned char* m = mask + (i64)blockIdx.x * cols;
    __shared__ u32 hist[256];
    __shared__ K s_prefix;
    __shared__ i64 s_need;
    __shared__ u32 warp_count[32];

    K prefix = (K)0, pmask = (K)0;
    i64 need = k;
    for (int hi = MagKey<T>::bits; hi > 0; hi -= 8) {
        const int width = hi >= 8 ? 8 : hi;
        const int shift = hi - width;
        const u32 dmask = (1u << width) - 1u;
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u;
        __syncthreads();
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
            const K key = MagKey<T>::of(x[j]);
            if ((key & pmask) == prefix) atomicAdd(&hist[(u32)(key >> shift) & dmask], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            i64 above = 0;
            int b = (int)dmask;
            for (; b > 0; --b) {  // bin 0 takes what is left
                if (above + (i64)hist[b] >= need) break;
                above += (i64)hist[b];
            }
            s_prefix = prefix | ((K)b << shift);
            s_need = need - above;
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        pmask |= (K)dmask << shift;
        __syncthreads();  // hist and the shared results are rewritten next pass
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    i64 taken = 0;  // ties selected in earlier chunks (uniform across the block)
    for (i64 base = 0; base < cols; base += blockDim.x) {
        const i64 j = base + threadIdx.x;
        const bool in = j < cols;
        const K key = in ? MagKey<T>::of(x[j]) : (K)0;
        const bool tie = in && key == prefix;
        const u32 ballot = __ballot_sync(MPS_FULL_MASK, tie);
        if (lane == 0) warp_count[warp] = (u32)__popc(ballot);
        __syncthreads();
        i64 before = 0, total = 0;
        for (int w = 0; w < nwarps; ++w) {
            if (w < warp) before += warp_count[w];
            total += warp_count[w];
        }
        const i64 rank = before + __popc(ballot & ((1u << lane) - 1u));
        if (in) m[j] = (unsigned char)((key > prefix) || (tie && taken + rank < need));
        taken += total;
        __syncthreads();  // warp_count is rewritten by the next chunk
    }
}

extern "C" __global__ void rowwise_topk_f32(const float* X, i64 cols, i64 k, unsigned char* mask) {
    rowwise_topk<float>(X, cols, k, mask);
}
extern "C" __global__ void rowwise_topk_f64(const double* X, i64 cols, i64 k, unsigned char* mask) {
    rowwise_topk<double>(X, cols, k, mask);
}
