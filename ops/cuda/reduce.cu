// CUDA reductions. Over everything: cub::DeviceReduce with a combine that is
// commutative and associative (so CUB's order does not change the result):
// sums accumulate in double (float) or wrap in int64 (integers); max, min
// and argmax keep the first NaN and the lowest index on ties, as the CPU
// does. Over the last axis of many rows: one warp per output element, its
// threads reading neighbouring elements and combining with warp shuffles
// (the combine is commutative and associative, so the tree's order gives
// the same max, min and argmax, and sums within rounding of a double). Over
// any other axis, and over few long rows: a block per group of up to 32
// neighbouring output elements, its threads reading along the inner dim
// (coalesced) and splitting the axis, combined by a tree in shared memory;
// with few such groups, the axis is also cut into stretches of a block
// each, whose partials a second kernel combines in a fixed order
// (columns_kernel, split_finish_kernel).
#include "common.cuh"

#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <limits>
#include <string>

namespace lazydag::ops::cuda {

namespace {

template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, std::int64_t>;

template <class T>
struct Item {
  Acc<T> sum;
  T best;
  std::int64_t index;  // of `best`; -1: empty
};

template <class T>
__host__ __device__ bool is_nan(T v) {
  return v != v;
}

template <class T>
struct Combine {
  ReduceOp op;
  __host__ __device__ Item<T> operator()(const Item<T>& a, const Item<T>& b) const {
    Item<T> r;
    if constexpr (std::is_integral_v<Acc<T>>) {
      r.sum = static_cast<Acc<T>>(static_cast<std::uint64_t>(a.sum) + static_cast<std::uint64_t>(b.sum));
    } else {
      r.sum = a.sum + b.sum;
    }
    if (a.index < 0 || b.index < 0) {
      const Item<T>& x = a.index < 0 ? b : a;
      r.best = x.best;
      r.index = x.index;
      return r;
    }
    const bool an = is_nan(a.best);
    const bool bn = is_nan(b.best);
    bool take_a;
    if (an || bn) {
      take_a = an && bn ? a.index < b.index : an;
    } else if (a.best == b.best) {
      take_a = a.index < b.index;
    } else {
      take_a = op == ReduceOp::kMin ? a.best < b.best : a.best > b.best;
    }
    r.best = take_a ? a.best : b.best;
    r.index = take_a ? a.index : b.index;
    return r;
  }
};

template <class T>
struct Load {
  const T* x;
  __host__ __device__ Item<T> operator()(std::int64_t i) const {
    return Item<T>{static_cast<Acc<T>>(x[i]), x[i], i};
  }
};

template <class T, class O>
__device__ O result(ReduceOp op, const Item<T>& it, std::int64_t len) {
  switch (op) {
    case ReduceOp::kSum: return static_cast<O>(it.sum);
    case ReduceOp::kMean:
      return static_cast<O>(len == 0 ? std::numeric_limits<double>::quiet_NaN()
                                     : static_cast<double>(it.sum) / static_cast<double>(len));
    case ReduceOp::kMax:
    case ReduceOp::kMin: return static_cast<O>(it.best);
    case ReduceOp::kArgmax: return static_cast<O>(it.index);
  }
  return O{};
}

template <class T, class O>
__global__ void finish_kernel(ReduceOp op, const Item<T>* in, O* out, std::int64_t len) {
  out[0] = result<T, O>(op, *in, len);
}

// Over an axis that is not the last (and over the last, for few long
// rows): output lane (o, i) reduces x[o*len*inner + l*inner + i] over l. A
// block of bx * by threads (bx * by = kColumnThreads) takes bx neighbouring
// lanes of one o and one stretch of the axis: threadIdx.x picks the lane, so
// a warp's loads are coalesced along the inner dim (with inner = 1, bx = 1
// and the block's threads read neighbouring elements of the row), and the by
// threads of a lane split the stretch (l = first + threadIdx.y, + by, ...);
// they then combine in shared memory by a tree of fixed shape. bx is the
// inner size rounded up to a power of two, at most 32: few lanes get more
// threads along the axis. With splits > 1 the axis is cut into `splits`
// stretches of equal length, one block each, whose partials go to
// `partial` ([lane][split]); split_finish_kernel then combines each lane's
// partials in split order. The stretches depend on the shape alone, so the
// result is the same on every run and every GPU (deterministic).
constexpr int kColumnThreads = 256;

template <class T, class O>
__global__ void columns_kernel(ReduceOp op, const T* x, O* y, Item<T>* partial, std::int64_t outer,
                               std::int64_t len, std::int64_t inner, std::int64_t splits) {
  extern __shared__ __align__(16) unsigned char column_shared[];
  Item<T>* part = reinterpret_cast<Item<T>*>(column_shared);  // [by][bx]
  const Combine<T> combine{op};
  const int bx = static_cast<int>(blockDim.x);
  const int by = static_cast<int>(blockDim.y);
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const std::int64_t tiles = (inner + bx - 1) / bx;  // lane groups per o
  const std::int64_t stretch = (len + splits - 1) / splits;
  for (std::int64_t b = blockIdx.x; b < outer * tiles * splits; b += gridDim.x) {
    const std::int64_t group = b / splits;
    const std::int64_t split = b - group * splits;
    const std::int64_t o = group / tiles;
    const std::int64_t i = (group - o * tiles) * bx + tx;
    const std::int64_t first = split * stretch;
    const std::int64_t last = first + stretch < len ? first + stretch : len;
    Item<T> acc{Acc<T>(0), T{}, -1};
    if (i < inner) {
      const T* p = x + o * len * inner + i;
      for (std::int64_t l = first + ty; l < last; l += by) {
        acc = combine(acc, Item<T>{static_cast<Acc<T>>(p[l * inner]), p[l * inner], l});
      }
    }
    part[ty * bx + tx] = acc;
    __syncthreads();
    for (int half = by / 2; half > 0; half /= 2) {
      if (ty < half) part[ty * bx + tx] = combine(part[ty * bx + tx], part[(ty + half) * bx + tx]);
      __syncthreads();
    }
    if (ty == 0 && i < inner) {
      if (splits == 1) {
        y[o * inner + i] = result<T, O>(op, part[tx], len);
      } else {
        partial[(o * inner + i) * splits + split] = part[tx];
      }
    }
    __syncthreads();  // part is reused by the block's next lane group
  }
}

// One thread per output lane: its partials, combined in split order.
template <class T, class O>
__global__ void split_finish_kernel(ReduceOp op, const Item<T>* partial, O* y, std::int64_t lanes,
                                    std::int64_t splits, std::int64_t len) {
  const Combine<T> combine{op};
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t lane = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; lane < lanes;
       lane += stride) {
    const Item<T>* p = partial + lane * splits;
    Item<T> acc = p[0];
    for (std::int64_t k = 1; k < splits; ++k) acc = combine(acc, p[k]);
    y[lane] = result<T, O>(op, acc, len);
  }
}

// One warp per row: row r reduces x[r*len .. r*len + len) (len > 0).
// Every thread of a warp has the same row, so the shuffles see all 32.
template <class T, class O>
__global__ void rows_kernel(ReduceOp op, const T* x, O* y, std::int64_t rows, std::int64_t len) {
  const Combine<T> combine{op};
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t first = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::int64_t warps = static_cast<std::int64_t>(blockDim.x) * gridDim.x / 32;
  for (std::int64_t r = first; r < rows; r += warps) {
    const T* p = x + r * len;
    Item<T> acc{Acc<T>(0), T{}, -1};
    for (std::int64_t l = lane; l < len; l += 32) acc = combine(acc, Item<T>{static_cast<Acc<T>>(p[l]), p[l], l});
    for (int offset = 16; offset > 0; offset /= 2) {
      Item<T> other;
      other.sum = __shfl_down_sync(0xffffffffu, acc.sum, offset);
      other.best = __shfl_down_sync(0xffffffffu, acc.best, offset);
      other.index = __shfl_down_sync(0xffffffffu, acc.index, offset);
      acc = combine(acc, other);  // lane 0 ends with the whole row's
    }
    if (lane == 0) y[r] = result<T, O>(op, acc, len);
  }
}

// Rows at least this many go to a warp each (enough warps to fill a GPU);
// rows shorter than this too (a block per row would idle).
constexpr std::int64_t kManyRows = 4096;
constexpr std::int64_t kShortRow = 8192;
// Blocks the split columns kernel aims at (several per SM of any current
// GPU), and the elements each thread of a block reduces at least in its
// stretch, so that a stretch amortises its share of the partials.
constexpr std::int64_t kSplitBlocks = 1024;
constexpr std::int64_t kPerThread = 32;

// How many stretches the axis is cut into, from the shape alone: 1 when the
// lane groups fill the GPU already or the axis is short.
std::int64_t split_count(std::int64_t groups, std::int64_t len, int by) {
  if (groups >= kSplitBlocks / 2 || len == 0) return 1;
  const std::int64_t by_blocks = (kSplitBlocks + groups - 1) / groups;
  const std::int64_t by_length = len / (static_cast<std::int64_t>(by) * kPerThread);
  return std::max<std::int64_t>(1, std::min(by_blocks, by_length));
}

}  // namespace

void reduce(void* stream, ReduceOp op, const TensorView& a, bool all, int axis, const TensorView& out) {
  cudaStream_t s = detail::as_stream(stream);
  std::int64_t outer = 1;
  std::int64_t len = 1;
  std::int64_t inner = 1;
  for (int d = 0; d < static_cast<int>(a.shape.size()); ++d) {
    const std::int64_t n = a.shape[static_cast<std::size_t>(d)];
    if (all || d == axis) {
      len *= n;
    } else if (d < axis) {
      outer *= n;
    } else {
      inner *= n;
    }
  }
  if (all) outer = inner = 1;
  dispatch(a.dtype, [&]<class T>() {
    dispatch(out.dtype, [&]<class O>() {
      if constexpr (std::is_same_v<T, bool> || std::is_same_v<O, bool>) {
        throw InvalidArgument("reduction on bool");  // refused at record time
      } else {
        const T* x = static_cast<const T*>(a.data) + a.offset;
        O* y = static_cast<O*>(out.data) + out.offset;
        if (outer * inner == 0) return;
        // Few long rows go to the columns kernel (inner = 1), whose
        // blocks split the rows; many rows, a warp each.
        if (inner == 1 && outer > 1 && len > 0 && (outer >= kManyRows || len < kShortRow)) {
          detail::clear_last_error();
          rows_kernel<T, O><<<detail::blocks_for(outer * 32), 256, 0, s>>>(op, x, y, outer, len);
          detail::check_launch("reduce kernel (rows)");
          return;
        }
        if (outer * inner > 1 || len == 0) {
          int bx = 1;
          while (bx < 32 && bx < inner) bx *= 2;
          const int by = kColumnThreads / bx;
          const dim3 block(static_cast<unsigned>(bx), static_cast<unsigned>(by));
          const std::int64_t groups = outer * ((inner + bx - 1) / bx);
          const std::int64_t splits = split_count(groups, len, by);
          const std::int64_t blocks = groups * splits;
          const int grid = static_cast<int>(std::min<std::int64_t>(blocks, 65535 * 16));
          const std::size_t shared = kColumnThreads * sizeof(Item<T>);
          if (splits == 1) {
            detail::clear_last_error();
            columns_kernel<T, O><<<grid, block, shared, s>>>(op, x, y, nullptr, outer, len, inner, 1);
            detail::check_launch("reduce kernel (columns)");
            return;
          }
          const std::int64_t lanes = outer * inner;
          Item<T>* partial = nullptr;
          LAZYDAG_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                             static_cast<std::size_t>(lanes * splits) * sizeof(Item<T>), s),
                             "reduce scratch (partials)");
          detail::clear_last_error();
          columns_kernel<T, O><<<grid, block, shared, s>>>(op, x, y, partial, outer, len, inner, splits);
          cudaError_t e = cudaGetLastError();
          if (e == cudaSuccess) {
            split_finish_kernel<T, O><<<detail::blocks_for(lanes), 256, 0, s>>>(op, partial, y, lanes, splits, len);
            e = cudaGetLastError();
          }
          (void)cudaFreeAsync(partial, s);
          if (e != cudaSuccess) ::lazydag::cuda::throw_cuda_error(e, "reduce kernel (split columns)", "reduce");
          return;
        }
        auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::int64_t>(0), Load<T>{x});
        const Item<T> init{Acc<T>(0), T{}, -1};
        Item<T>* total = nullptr;
        std::size_t temp_bytes = 0;
        LAZYDAG_CUDA_CHECK(cub::DeviceReduce::Reduce(nullptr, temp_bytes, in, total, len, Combine<T>{op}, init, s),
                           "reduce (temp size)");
        const std::size_t header = ((sizeof(Item<T>) + 255) / 256) * 256;
        // One stream-ordered block: the result header, then CUB's scratch.
        char* scratch = nullptr;
        LAZYDAG_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), header + temp_bytes, s), "reduce scratch");
        total = reinterpret_cast<Item<T>*>(scratch);
        cudaError_t e = cub::DeviceReduce::Reduce(scratch + header, temp_bytes, in, total, len, Combine<T>{op}, init, s);
        if (e == cudaSuccess) {
          detail::clear_last_error();
          finish_kernel<T, O><<<1, 1, 0, s>>>(op, total, y, len);
          e = cudaGetLastError();
        }
        (void)cudaFreeAsync(scratch, s);
        if (e != cudaSuccess) ::lazydag::cuda::throw_cuda_error(e, "cub::DeviceReduce::Reduce or its finish kernel", "reduce");
      }
    });
  });
}

}  // namespace lazydag::ops::cuda
