// The fused attention core: O from Q, K, V, P_l, P_w and an additive bias,
// forward and gradient, as TensorFlow CPU ops (float and double).
//
// Layouts (reference.py is the definition; G groups, heads per group):
//   q [B, G, Hk, N, Dk]   k [B, G, Hk, M, Dk]   v [B, G, Hv, M, Dv]
//   p_l [G, Hk, H]        p_w [G, H, Hv]        bias [Bb, Hb, N, M]
//   o [B, G, Hv, N, Dv]   lse [B, G, H, N] (log-sum-exp of each row of L)
//
// The paper's section 4 over one block of bq queries of one (b, g):
//   J[h]  = Q[h] K[h]^T                 per head, into a block buffer
//                                       [bq, Hk, M] (a query's heads together)
//   then query by query ([heads, M] rows, tens of KB, in L1/L2):
//   L     = P_l^T J (+ bias)            a product of depth Hk
//   W     = softmax over m of L         exponentials vectorised; lse kept
//   U     = P_w^T W                     into a block buffer [bq, Hv, M]
//   O[h]  = U[h] V[h]                   per head
// so the n x m x heads tensors exist one block at a time and the forward
// keeps only lse (O(n x h)) for the gradient, which recomputes J, L, W, U
// block by block:
//   dV += U^T dO, dU = dO V^T, dP_w += W dU^T, dW = P_w dU,
//   dL = W (dW - sum_m W dW), dbias += dL, dP_l += J dL^T, dJ = P_l dL,
//   dQ = dJ K, dK += dJ^T Q.
// A block computes only the columns [0, end) its bias leaves unmasked in
// some row (BlockColumns): under a causal mask about half of every product.
// Multi-head (no P_l, no P_w) runs through the same code with every head a
// group of its own (the memory layout is the same), so its blocks hold one
// head and its K, V stay in cache from block to block.  The products are
// register-tiled kernels on Eigen's packets (16 floats with AVX-512) that
// read every operand where it lies (K^T and V^T are laid out once per call),
// rather than a general GEMM, which would pack its operands for every
// block's short products.
//
// Parallelism: the op's CPU worker pool runs one task per (b, g, block) in
// the forward, which writes disjoint rows, the longest blocks first, and per
// (b, g, chunk of blocks) in the gradient, a chunk per thread at most, its
// blocks dealt in zigzag so that the chunks are as long under a causal mask.  A gradient task owns its dQ rows and its dbias rows (it
// loops over the batch or the groups itself when the bias is broadcast over
// them) and private partial sums of dK, dV (per chunk, zeroed by the tasks
// that write them and added afterwards) and dP_l, dP_w (per task), so there
// are no races and the result does not depend on timing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;
typedef int64_t int64;

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MapM = Eigen::Map<Mat<T>>;
template <typename T>
using CMapM = Eigen::Map<const Mat<T>>;
template <typename T>
using MapA = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

// ------------------------------------------------------ small GEMM kernels
//
// C[r, :] (+)= sum_k A(r, k) B[k, :] on row-major operands with row strides,
// A(r, k) = a[r * lda + k], or a[k * lda + r] when TransA.  Every product of
// the core has this form with its operands as they lie (K and V are given
// transposed where needed, once per call), so unlike a general GEMM nothing
// is packed per block: the blocks' products are short (bq rows, or a depth
// of bq or of the heads), where packing would cost as much as the multiplies.
// Register tiles of RT rows x CT packets (Eigen's packets: 16 floats or 8
// doubles with AVX-512), column panels outermost so a panel of B stays in L1
// across the row tiles; columns short of a packet run as scalars.

template <typename T>
using Packet = typename Eigen::internal::packet_traits<T>::type;

template <typename T>
constexpr int PacketSize() {
  return Eigen::internal::unpacket_traits<Packet<T>>::size;
}

template <typename T, bool TransA>
inline T AElem(const T* a, int64 lda, int64 r, int64 k) {
  return TransA ? a[k * lda + r] : a[r * lda + k];
}

template <typename T, int RT, int CT, bool TransA, bool Acc>
inline void Tile(int64 depth, const T* a, int64 lda, const T* b, int64 ldb,
                 T* c, int64 ldc) {
  using Eigen::internal::pmadd;
  using Eigen::internal::pset1;
  using Eigen::internal::ploadu;
  using Eigen::internal::pstoreu;
  typedef Packet<T> P;
  constexpr int PS = PacketSize<T>();
  P acc[RT][CT];
  for (int i = 0; i < RT; ++i)
    for (int j = 0; j < CT; ++j)
      acc[i][j] = Acc ? ploadu<P>(c + i * ldc + j * PS) : pset1<P>(T(0));
  for (int64 k = 0; k < depth; ++k) {
    P bk[CT];
    for (int j = 0; j < CT; ++j) bk[j] = ploadu<P>(b + k * ldb + j * PS);
    for (int i = 0; i < RT; ++i) {
      const P ai = pset1<P>(AElem<T, TransA>(a, lda, i, k));
      for (int j = 0; j < CT; ++j) acc[i][j] = pmadd(ai, bk[j], acc[i][j]);
    }
  }
  for (int i = 0; i < RT; ++i)
    for (int j = 0; j < CT; ++j) pstoreu(c + i * ldc + j * PS, acc[i][j]);
}

// The last `cols` (< one packet) columns of RT rows, as scalars.
template <typename T, int RT, bool TransA, bool Acc>
inline void TailTile(int64 depth, int64 cols, const T* a, int64 lda,
                     const T* b, int64 ldb, T* c, int64 ldc) {
  for (int i = 0; i < RT; ++i) {
    for (int64 j = 0; j < cols; ++j) {
      T sum = Acc ? c[i * ldc + j] : T(0);
      for (int64 k = 0; k < depth; ++k)
        sum += AElem<T, TransA>(a, lda, i, k) * b[k * ldb + j];
      c[i * ldc + j] = sum;
    }
  }
}

// RT rows at r of one column panel: CT packets, or (CT == 0) `cols` < one
// packet of scalars.
template <typename T, int RT, int CT, bool TransA, bool Acc>
inline void PanelRows(int64 r, int64 cols, int64 depth, const T* a,
                      int64 lda, const T* b, int64 ldb, T* c, int64 ldc) {
  const T* ar = a + (TransA ? r : r * lda);
  if (CT > 0) {
    Tile<T, RT, (CT > 0 ? CT : 1), TransA, Acc>(depth, ar, lda, b, ldb,
                                                 c + r * ldc, ldc);
  } else {
    TailTile<T, RT, TransA, Acc>(depth, cols, ar, lda, b, ldb, c + r * ldc,
                                 ldc);
  }
}

// Vector registers (32 with AVX-512, 16 with AVX2): tiles keep RT x CT
// accumulators, CT packets of B and A's broadcast in registers.
constexpr int kRegisters = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS;

// Rows of the tall tiles of a panel of CT packets: 24 accumulators with 32
// registers (12 x 2 ran 1.1-1.3x 8 x 2 on the test machine where the depth
// is long: O, dQ), else 8 rows.
template <int CT>
constexpr int TileRows() {
  return kRegisters >= 32 ? (CT >= 3 ? 8 : 12) : 8;
}

// One column panel over all rows, in tiles of TileRows rows (then 8, 4, 2,
// 1).
template <typename T, int CT, bool TransA, bool Acc>
inline void Panel(int64 rows, int64 cols, int64 depth, const T* a, int64 lda,
                  const T* b, int64 ldb, T* c, int64 ldc) {
  constexpr int kRows = TileRows<CT>();
  // 12 + 4 rows go as 8 + 8 (e.g. blocks of 16 queries)
  const int64 tall = kRows > 8 && rows % kRows == 4 && rows > kRows
                         ? rows - kRows - 4
                         : rows;
  int64 r = 0;
  for (; r + kRows <= tall; r += kRows)
    PanelRows<T, kRows, CT, TransA, Acc>(r, cols, depth, a, lda, b, ldb, c,
                                         ldc);
  for (int i = 0; i < (kRows > 8 ? 2 : 0) && r + 8 <= rows; ++i) {
    PanelRows<T, 8, CT, TransA, Acc>(r, cols, depth, a, lda, b, ldb, c, ldc);
    r += 8;
  }
  if (r + 4 <= rows) {
    PanelRows<T, 4, CT, TransA, Acc>(r, cols, depth, a, lda, b, ldb, c, ldc);
    r += 4;
  }
  if (r + 2 <= rows) {
    PanelRows<T, 2, CT, TransA, Acc>(r, cols, depth, a, lda, b, ldb, c, ldc);
    r += 2;
  }
  if (r < rows)
    PanelRows<T, 1, CT, TransA, Acc>(r, cols, depth, a, lda, b, ldb, c, ldc);
}

// C (+)= A B as above: C [rows, cols], A(r, k), B [depth, cols].  With
// b_panel > 0, B is stored panel by panel (PanelMajor): the 2 PS columns
// from j are at b + (j / 2 PS) b_panel, rows ldb = 2 PS apart.
template <typename T, bool TransA, bool Acc = false>
void Gemm(int64 rows, int64 cols, int64 depth, const T* a, int64 lda,
          const T* b, int64 ldb, T* c, int64 ldc, int64 b_panel = 0) {
  constexpr int PS = PacketSize<T>();
  auto column = [&](int64 j) {
    return b_panel ? b + j / (2 * PS) * b_panel + j % (2 * PS) : b + j;
  };
  int64 j = 0;
  for (; j + 2 * PS <= cols; j += 2 * PS)
    Panel<T, 2, TransA, Acc>(rows, 0, depth, a, lda, column(j), ldb, c + j,
                             ldc);
  if (j + PS <= cols) {
    Panel<T, 1, TransA, Acc>(rows, 0, depth, a, lda, column(j), ldb, c + j,
                             ldc);
    j += PS;
  }
  if (j < cols)
    Panel<T, 0, TransA, Acc>(rows, cols - j, depth, a, lda, column(j), ldb,
                             c + j, ldc);
}

// C = A B for the heads' mixes (L = P_l^T J, U = P_w^T W, dW = P_w dU,
// dJ = P_l dL: rows and depth the heads, B a [heads, M] row): with 32
// registers, panels of 3 packets, whose 8 x 3 tiles ran 1.2-1.4x the
// 8 x 2 ones on the test machine (AVX-512, one FMA port), then Gemm's
// panels for the last columns.
template <typename T, bool TransA>
void MixGemm(int64 rows, int64 cols, int64 depth, const T* a, int64 lda,
             const T* b, int64 ldb, T* c, int64 ldc) {
  constexpr int PS = PacketSize<T>();
  int64 j = 0;
  // (3 packets x 8 rows need 32 registers)
  for (; kRegisters >= 32 && j + 3 * PS <= cols; j += 3 * PS)
    Panel<T, 3, TransA, false>(rows, 0, depth, a, lda, b + j, ldb, c + j,
                               ldc);
  if (j < cols)
    Gemm<T, TransA>(rows, cols - j, depth, a, lda, b + j, ldb, c + j, ldc);
}

// Columns of one panel of a panel-major matrix (K^T, V^T): 2 packets.
template <typename T>
constexpr int64 PanelWidth() {
  return 2 * PacketSize<T>();
}

// END_GEMM (benchmarks extract the kernels above up to here)

// Elements of one block buffer ([bq, heads, M]) the automatic block size
// aims at (then rounded to 8 queries, within [8, 64]), in the forward (two
// block buffers) and in the gradient (three).  Taller blocks read K and V
// (every head's, from L3) fewer times; shorter ones keep the buffers nearer
// and skip more of a causal mask's columns.  At 24 heads and m = n = 512
// under a causal mask, 32 queries were fastest in the forward, and 16 as
// fast as 32 or faster in the gradient, on the test machine (block_queries
// 8, 16, 24, 32, 64; the machine shared, so within a few percent).
constexpr int64 kBlockElements = 32 * 24 * 512;
constexpr int64 kGradBlockElements = 16 * 24 * 512;

struct Flags {
  bool has_p_l = false, has_p_w = false, has_bias = false, bias_grad = false;
  int block_queries = 0;
};

// Sizes, after folding multi-head's heads into groups.
struct Dims {
  int64 B, G, Hk, H, Hv, N, M, Dk, Dv, Bb, Hb;
  int64 bq, blocks;  // queries per block, blocks per (b, g)
};

Status Bad(const std::string& msg) {
  return tensorflow::errors::InvalidArgument("fused attention core: ", msg);
}

std::string ShapeStr(const Tensor& t) { return t.shape().DebugString(); }

// O's shape [B, G, Hv, N, Dv] and lse's [B, G, H, N] (inputs as given).
void OutputShapes(OpKernelContext* ctx, const Flags& f, TensorShape* o,
                  TensorShape* lse) {
  const Tensor& q = ctx->input(0);
  const Tensor& v = ctx->input(2);
  const int64 heads = f.has_p_w ? ctx->input(4).dim_size(1)
                      : f.has_p_l ? ctx->input(3).dim_size(2)
                                  : q.dim_size(2);
  *o = TensorShape({q.dim_size(0), q.dim_size(1), v.dim_size(2),
                    q.dim_size(3), v.dim_size(4)});
  *lse = TensorShape({q.dim_size(0), q.dim_size(1), heads, q.dim_size(3)});
}

void GetFlags(OpKernelConstruction* c, Flags* f) {
  OP_REQUIRES_OK(c, c->GetAttr("has_p_l", &f->has_p_l));
  OP_REQUIRES_OK(c, c->GetAttr("has_p_w", &f->has_p_w));
  OP_REQUIRES_OK(c, c->GetAttr("has_bias", &f->has_bias));
  OP_REQUIRES_OK(c, c->GetAttr("bias_grad", &f->bias_grad));
  OP_REQUIRES_OK(c, c->GetAttr("block_queries", &f->block_queries));
  OP_REQUIRES(c, f->block_queries >= 0,
              Bad("block_queries must be >= 0 (0: automatic)"));
  OP_REQUIRES(c, !f->bias_grad || f->has_bias,
              Bad("bias_grad needs has_bias"));
}

// Checks the inputs against the layouts above and fills `d` (its block size
// for the gradient op if `grad`).
Status ReadDims(OpKernelContext* ctx, const Flags& f, bool grad, Dims* d) {
  const Tensor& q = ctx->input(0);
  const Tensor& k = ctx->input(1);
  const Tensor& v = ctx->input(2);
  const Tensor& p_l = ctx->input(3);
  const Tensor& p_w = ctx->input(4);
  const Tensor& bias = ctx->input(5);
  if (q.dims() != 5)
    return Bad("q must be [B, G, Hk, N, Dk], got " + ShapeStr(q));
  if (k.dims() != 5)
    return Bad("k must be [B, G, Hk, M, Dk], got " + ShapeStr(k));
  if (v.dims() != 5)
    return Bad("v must be [B, G, Hv, M, Dv], got " + ShapeStr(v));
  d->B = q.dim_size(0), d->G = q.dim_size(1), d->Hk = q.dim_size(2);
  d->N = q.dim_size(3), d->Dk = q.dim_size(4);
  d->M = k.dim_size(3), d->Hv = v.dim_size(2), d->Dv = v.dim_size(4);
  if (k.dim_size(0) != d->B || k.dim_size(1) != d->G ||
      k.dim_size(2) != d->Hk || k.dim_size(4) != d->Dk)
    return Bad("k " + ShapeStr(k) + " does not match q " + ShapeStr(q) +
               " in B, G, Hk or Dk");
  if (v.dim_size(0) != d->B || v.dim_size(1) != d->G || v.dim_size(3) != d->M)
    return Bad("v " + ShapeStr(v) + " does not match k " + ShapeStr(k) +
               " in B, G or M");
  d->H = d->Hk;
  if (f.has_p_l) {
    if (p_l.dims() != 3 || p_l.dim_size(0) != d->G || p_l.dim_size(1) != d->Hk)
      return Bad("p_l must be [G, Hk, H] = [" + std::to_string(d->G) + ", " +
                 std::to_string(d->Hk) + ", H], got " + ShapeStr(p_l));
    d->H = p_l.dim_size(2);
  }
  if (f.has_p_w) {
    if (p_w.dims() != 3 || p_w.dim_size(0) != d->G || p_w.dim_size(1) != d->H ||
        p_w.dim_size(2) != d->Hv)
      return Bad("p_w must be [G, H, Hv] = [" + std::to_string(d->G) + ", " +
                 std::to_string(d->H) + ", " + std::to_string(d->Hv) +
                 "], got " + ShapeStr(p_w));
  } else if (d->Hv != d->H) {
    return Bad("without p_w, v's heads (" + std::to_string(d->Hv) +
               ") must equal the logits' heads H (" + std::to_string(d->H) +
               ")");
  }
  d->Bb = d->Hb = 1;
  if (f.has_bias) {
    if (bias.dims() != 4 || bias.dim_size(2) != d->N ||
        bias.dim_size(3) != d->M ||
        (bias.dim_size(0) != 1 && bias.dim_size(0) != d->B) ||
        (bias.dim_size(1) != 1 && bias.dim_size(1) != d->G * d->H))
      return Bad("bias must be [1 or B, 1 or G*H, N, M] = [1 or " +
                 std::to_string(d->B) + ", 1 or " +
                 std::to_string(d->G * d->H) + ", " + std::to_string(d->N) +
                 ", " + std::to_string(d->M) + "], got " + ShapeStr(bias));
    d->Bb = bias.dim_size(0), d->Hb = bias.dim_size(1);
  }
  if (!f.has_p_l && !f.has_p_w) {  // multi-head: each head a group
    d->G *= d->H;
    d->Hk = d->H = d->Hv = 1;
  }
  const int64 heads = std::max(d->Hk, std::max(d->H, d->Hv));
  int64 bq = f.block_queries;
  if (bq == 0) {
    bq = (grad ? kGradBlockElements : kBlockElements) /
         std::max<int64>(1, heads * d->M);
    // and at least 8 blocks: a causal mask's blocks then skip more columns
    bq = std::min(bq, d->N / 8);
    bq = std::max<int64>(8, std::min<int64>(64, bq / 8 * 8));
  }
  d->bq = std::max<int64>(1, std::min(bq, d->N));
  d->blocks = d->N == 0 ? 0 : (d->N + d->bq - 1) / d->bq;
  return Status();
}

template <typename T>
struct Ptrs {
  const T *q, *k, *v, *p_l, *p_w, *bias;
  // K, V transposed, panel-major: [B, G, Hk, mp / W, Dk, W] (W =
  // PanelWidth, mp = M rounded up to W), [B, G, Hv, mp / W, Dv, W]
  const T *kt, *vt;
  int64 mp;
  const Dims* d;
  const T* Q(int64 b, int64 g, int64 h, int64 n) const {
    return q + (((b * d->G + g) * d->Hk + h) * d->N + n) * d->Dk;
  }
  const T* K(int64 b, int64 g, int64 h) const {
    return k + ((b * d->G + g) * d->Hk + h) * d->M * d->Dk;
  }
  const T* KT(int64 b, int64 g, int64 h) const {
    return kt + ((b * d->G + g) * d->Hk + h) * mp * d->Dk;
  }
  const T* V(int64 b, int64 g, int64 h) const {
    return v + ((b * d->G + g) * d->Hv + h) * d->M * d->Dv;
  }
  const T* VT(int64 b, int64 g, int64 h) const {
    return vt + ((b * d->G + g) * d->Hv + h) * mp * d->Dv;
  }
  // The bias row offset of (b, g, h, n) in [Bb, Hb, N, M].
  int64 BiasRow(int64 b, int64 g, int64 h, int64 n) const {
    const int64 bb = d->Bb == 1 ? 0 : b;
    const int64 hb = d->Hb == 1 ? 0 : g * d->H + h;
    return ((bb * d->Hb + hb) * d->N + n) * d->M;
  }
};

// Per-thread block buffers (kept between calls: no page faults per block),
// aligned to 64 bytes: rows of the buffers are whole cache lines apart, so
// a packet never straddles two lines (with malloc's 16-byte alignment the
// talking-heads forward and gradient ran about 1.1x slower on the test
// machine: benchmarks/fused_ab.py, docs/costs.md).
template <typename T>
T* Scratch(int64 elements) {
  constexpr int64 kAlign = 64 / sizeof(T);
  thread_local std::vector<T> buffer;
  if (static_cast<int64>(buffer.size()) < elements + kAlign)
    buffer.resize(elements + kAlign);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (64 - address % 64) % 64 / sizeof(T);
}

// A bias at or below this masks its column (masks add -1e9): its weight
// exp(L - max) is exactly 0 in float and double while the logits of a row
// lie within 1e5 of each other.
constexpr double kMasked = -1e6;

// The columns [0, end) a block of queries [n0, n0 + nb) of (b, g) attends
// to: past `end` the bias masks every row of the block (the causal mask's
// upper triangle, padding at the end), so its weights, and every product
// and gradient term over those columns, are exactly 0 and the block skips
// them.  end is rounded up to a panel (2 packets); it is M without a bias
// or when some row of the block masks every column (its softmax is then
// uniform over all M).
template <typename T>
int64 BlockColumns(const Ptrs<T>& p, const Flags& f, int64 b, int64 g,
                   int64 n0, int64 nb) {
  const Dims& d = *p.d;
  if (!f.has_bias) return d.M;
  const T masked = static_cast<T>(kMasked);
  const int64 heads = d.Hb == 1 ? 1 : d.H;
  int64 end = 0;
  for (int64 r = nb - 1; r >= 0; --r) {
    for (int64 h = 0; h < heads; ++h) {
      const T* row = p.bias + p.BiasRow(b, g, h, n0 + r);
      int64 first = 0;
      while (first < d.M && row[first] <= masked) ++first;
      if (first == d.M) return d.M;
      int64 last = d.M - 1;
      while (last >= end && last > first && row[last] <= masked) --last;
      end = std::max(end, last + 1);
    }
  }
  constexpr int64 W = PanelWidth<T>();
  return std::min(d.M, (end + W - 1) / W * W);
}

// The row stride of a block's [.., M] buffers: M rounded up to whole cache
// lines, plus one line when that is a multiple of 1 KB (rows then fall in
// different L1 sets).  Per block: a causal mask's early blocks, with few
// columns, keep their buffers that much smaller.
inline int64 RowStride(int64 M) {
  const int64 s = (M + 15) / 16 * 16;
  return s % 256 == 0 ? s + 16 : s;
}

// The J GEMMs of queries [n0, n0 + nb) of (b, g) over columns [0, M):
// J[r, h, :] = Q[h, r] K[h]^T into a block buffer [nb, Hk, S] (row r's
// heads together, for the mixes).
template <typename T>
void BlockJ(const Ptrs<T>& p, int64 b, int64 g, int64 n0, int64 nb, int64 M,
            int64 S, T* j) {
  const Dims& d = *p.d;
  for (int64 h = 0; h < d.Hk; ++h) {
    Gemm<T, false>(nb, M, d.Dk, p.Q(b, g, h, n0), d.Dk, p.KT(b, g, h),
                   PanelWidth<T>(), j + h * S, d.Hk * S,
                   d.Dk * PanelWidth<T>());
  }
}

// L of query n over columns [0, M) without the bias: P_l^T J_n ([H, M])
// into `l` (or J_n itself without P_l).  Returns its address.  The callers
// add the bias head by head in their softmax pass, while the row is in L1.
template <typename T>
T* RowLogits(const Ptrs<T>& p, const Flags& f, int64 g, int64 M, int64 S,
             T* j_row, T* l) {
  const Dims& d = *p.d;
  if (!f.has_p_l) return j_row;
  MixGemm<T, true>(d.H, M, d.Hk, p.p_l + g * d.Hk * d.H, d.H, j_row, S, l,
                   S);
  return l;
}

// The bias row of (b, g, h, n), or nullptr without a bias.
template <typename T>
const T* BiasOf(const Ptrs<T>& p, const Flags& f, int64 b, int64 g, int64 h,
                int64 n) {
  return f.has_bias ? p.bias + p.BiasRow(b, g, h, n) : nullptr;
}

// x += bias (if any) over n elements; returns their maximum.
template <typename T>
T AddBiasMax(T* x, const T* bias, int64 n) {
  MapA<T> row(x, n);
  if (bias) {
    row += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(bias, n);
  }
  return row.maxCoeff();
}

// acc[r, s, :] += sum over packets k of A[r, k] B[s, k] (lanes summed later);
// the last K % PacketSize columns go to tail[r, s].  A [R, K], B [S, K].
template <typename T, int RT, int ST>
inline void DotTile(int64 depth, const T* a, int64 lda, const T* b,
                    int64 ldb, T* acc, int64 S, T* tail) {
  using Eigen::internal::pmadd;
  using Eigen::internal::ploadu;
  using Eigen::internal::pstoreu;
  typedef Packet<T> P;
  constexpr int PS = PacketSize<T>();
  P sum[RT][ST];
  for (int i = 0; i < RT; ++i)
    for (int j = 0; j < ST; ++j) sum[i][j] = ploadu<P>(acc + (i * S + j) * PS);
  int64 k = 0;
  for (; k + PS <= depth; k += PS) {
    P bv[ST];
    for (int j = 0; j < ST; ++j) bv[j] = ploadu<P>(b + j * ldb + k);
    for (int i = 0; i < RT; ++i) {
      const P av = ploadu<P>(a + i * lda + k);
      for (int j = 0; j < ST; ++j) sum[i][j] = pmadd(av, bv[j], sum[i][j]);
    }
  }
  for (int i = 0; i < RT; ++i)
    for (int j = 0; j < ST; ++j) pstoreu(acc + (i * S + j) * PS, sum[i][j]);
  // (apart: indexing `sum` in a loop of run-time length would keep it in
  // memory throughout)
  for (int64 kk = k; kk < depth; ++kk)
    for (int i = 0; i < RT; ++i)
      for (int j = 0; j < ST; ++j)
        tail[i * S + j] += a[i * lda + kk] * b[j * ldb + kk];
}

template <typename T>
void DotAcc(int64 R, int64 S, int64 depth, const T* a, int64 lda, const T* b,
            int64 ldb, T* acc, T* tail) {
  constexpr int PS = PacketSize<T>();
  // 4 x 6 tiles where 32 registers hold their 24 sums (fewer loads per
  // multiply-add than 4 x 4)
  constexpr int64 kWide = kRegisters >= 32 ? 6 : 4;
  for (int64 r = 0; r < R; r += (r + 4 <= R ? 4 : 1)) {
    const bool r4 = r + 4 <= R;
    for (int64 s = 0; s < S;) {
      const int64 width = s + kWide <= S ? kWide : s + 4 <= S ? 4 : 1;
      T* at = acc + (r * S + s) * PS;
      T* tt = tail + r * S + s;
      const T* ar = a + r * lda;
      const T* bs = b + s * ldb;
      if (width == kWide && kWide > 4) {
        if (r4) {
          DotTile<T, 4, kWide>(depth, ar, lda, bs, ldb, at, S, tt);
        } else {
          DotTile<T, 1, kWide>(depth, ar, lda, bs, ldb, at, S, tt);
        }
      } else if (width == 4) {
        if (r4) {
          DotTile<T, 4, 4>(depth, ar, lda, bs, ldb, at, S, tt);
        } else {
          DotTile<T, 1, 4>(depth, ar, lda, bs, ldb, at, S, tt);
        }
      } else if (r4) {
        DotTile<T, 4, 1>(depth, ar, lda, bs, ldb, at, S, tt);
      } else {
        DotTile<T, 1, 1>(depth, ar, lda, bs, ldb, at, S, tt);
      }
      s += width;
    }
  }
}

// Asks for n elements at x to be brought to L2 (the next query's rows of
// the block buffers, while this query's run).
template <typename T>
inline void Prefetch(const T* x, int64 n) {
  const char* c = reinterpret_cast<const char*>(x);
  for (int64 i = 0; i < n * static_cast<int64>(sizeof(T)); i += 64)
    __builtin_prefetch(c + i, 0, 2);
}

// exp of a packet: Eigen's, and for AVX-512 floats a shorter one (the
// Cephes polynomial on [-ln 2 / 2, ln 2 / 2], scaled by 2^k with one
// instruction; within 2e-7 relative, and 0 below e^-104, which the masks'
// -1e9 reach).
template <typename P>
inline P Exp(const P& x) {
  return Eigen::internal::pexp(x);
}

#ifdef __AVX512F__
template <>
inline __m512 Exp(const __m512& x_in) {
  const __m512 x = _mm512_max_ps(x_in, _mm512_set1_ps(-104.f));
  const __m512 k = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(
      k, _mm512_set1_ps(-2.12194440e-4f),
      _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x));
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r),
                      _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, k);
}
#endif

// y = exp(x (+ bias) - shift) over n elements (y may be x; bias nullptr:
// none); returns their sum.
template <typename T, bool HasBias>
T ExpSumOf(const T* x, const T* bias, T* y, int64 n, T shift) {
  using namespace Eigen::internal;  // NOLINT (packet primitives)
  typedef Packet<T> P;
  constexpr int PS = PacketSize<T>();
  const P s = pset1<P>(shift);
  P acc = pset1<P>(T(0));
  int64 i = 0;
  for (; i + PS <= n; i += PS) {
    P xi = ploadu<P>(x + i);
    if (HasBias) xi = padd(xi, ploadu<P>(bias + i));
    const P e = Exp(psub(xi, s));
    pstoreu(y + i, e);
    acc = padd(acc, e);
  }
  T sum = predux(acc);
  for (; i < n; ++i) {
    y[i] = std::exp((HasBias ? x[i] + bias[i] : x[i]) - shift);
    sum += y[i];
  }
  return sum;
}

template <typename T>
T ExpSum(const T* x, const T* bias, T* y, int64 n, T shift) {
  return bias ? ExpSumOf<T, true>(x, bias, y, n, shift)
              : ExpSumOf<T, false>(x, nullptr, y, n, shift);
}

// ---------------------------------------------------------------- forward

// Block buffers: J [bq, Hk, M] and U [bq, Hv, M] (whole block: the GEMMs
// with K and V read them by head), row temporaries L [H, M] and P_w / sum
// [H, Hv], and 1 / sum of each (h, r) [H, bq].  Query by query, the row's
// L, W, U ([heads, M], tens of KB) stay in L1/L2.
template <typename T>
void ForwardBlock(const Ptrs<T>& p, const Flags& f, int64 b, int64 g,
                  int64 n0, T* o, T* lse) {
  const Dims& d = *p.d;
  const int64 nb = std::min(d.bq, d.N - n0);
  const int64 M = BlockColumns(p, f, b, g, n0, nb), S = RowStride(M);
  T* j = Scratch<T>(d.bq * S * (d.Hk + d.Hv) + d.H * S + d.H * d.Hv +
                    d.H * d.bq);
  T* u = j + d.bq * S * d.Hk;
  T* l_tmp = u + d.bq * S * d.Hv;
  T* p_w = l_tmp + d.H * S;
  T* inv = p_w + d.H * d.Hv;
  BlockJ(p, b, g, n0, nb, M, S, j);
  for (int64 r = 0; r < nb; ++r) {
    T* j_row = j + r * d.Hk * S;
    T* u_row = u + r * d.Hv * S;
    if (r + 1 < nb) {  // the next query's J, the columns in use only
      for (int64 h = 0; h < d.Hk; ++h) Prefetch(j_row + (d.Hk + h) * S, M);
    }
    // Without P_w, W is U: L goes straight to U's row.
    T* l = RowLogits(p, f, g, M, S, j_row, f.has_p_w ? l_tmp : u_row);
    if (!f.has_p_w && l != u_row) {
      std::memcpy(u_row, l, sizeof(T) * d.H * S);
      l = u_row;
    }
    // W = exp(L - max) / sum: the exponentials in place, the 1 / sum folded
    // into P_w (or into O's rows without P_w).
    for (int64 h = 0; h < d.H; ++h) {
      T* row = l + h * S;
      const T top = AddBiasMax(row, BiasOf(p, f, b, g, h, n0 + r), M);
      const T sum = ExpSum(row, static_cast<const T*>(nullptr), row, M, top);
      inv[h * d.bq + r] = T(1) / sum;
      lse[((b * d.G + g) * d.H + h) * d.N + n0 + r] = top + std::log(sum);
    }
    if (f.has_p_w) {
      const T* pw = p.p_w + g * d.H * d.Hv;
      for (int64 h = 0; h < d.H; ++h)
        for (int64 v = 0; v < d.Hv; ++v)
          p_w[h * d.Hv + v] = pw[h * d.Hv + v] * inv[h * d.bq + r];
      MixGemm<T, true>(d.Hv, M, d.H, p_w, d.Hv, l, S, u_row, S);
    }
  }
  for (int64 h = 0; h < d.Hv; ++h) {  // O[h] = U[h] V[h]
    T* o_h = o + (((b * d.G + g) * d.Hv + h) * d.N + n0) * d.Dv;
    Gemm<T, false>(nb, d.Dv, M, u + h * S, d.Hv * S, p.V(b, g, h), d.Dv,
                   o_h, d.Dv);
    if (!f.has_p_w) {
      for (int64 r = 0; r < nb; ++r)
        MapA<T>(o_h + r * d.Dv, d.Dv) *= inv[h * d.bq + r];
    }
  }
}

// ---------------------------------------------------------------- gradient

// Where one gradient task accumulates: dQ (its rows), dbias (its rows), its
// chunk's dK and dV partials, its own dP_l, dP_w partials (packet lanes
// [G, Hk, H, PS] and scalar tails [G, Hk, H]).
template <typename T>
struct GradOut {
  T *dq, *dk, *dv, *dbias;
  T *dp_l_lanes, *dp_l_tail, *dp_w_lanes, *dp_w_tail;
  const T *lse, *dout;
};

// Block buffers: J then dJ [bq, Hk, M], dU [bq, Hv, M], U [bq, Hv, M]; row
// temporaries L/W [H, M] and dW/dL [H, M].
template <typename T>
void BackwardBlock(const Ptrs<T>& p, const Flags& f, const GradOut<T>& out,
                   int64 b, int64 g, int64 n0) {
  const Dims& d = *p.d;
  constexpr int PS = PacketSize<T>();
  const int64 nb = std::min(d.bq, d.N - n0);
  const int64 M = BlockColumns(p, f, b, g, n0, nb), S = RowStride(M);
  T* j = Scratch<T>(d.bq * S * (d.Hk + 2 * d.Hv) + 2 * d.H * S);
  T* du = j + d.bq * S * d.Hk;
  T* u = du + d.bq * S * d.Hv;
  T* l_tmp = u + d.bq * S * d.Hv;
  T* dw_tmp = l_tmp + d.H * S;
  BlockJ(p, b, g, n0, nb, M, S, j);
  for (int64 h = 0; h < d.Hv; ++h) {  // dU[h] = dO[h] V[h]^T
    const T* dout = out.dout + (((b * d.G + g) * d.Hv + h) * d.N + n0) * d.Dv;
    Gemm<T, false>(nb, M, d.Dv, dout, d.Dv, p.VT(b, g, h), PanelWidth<T>(),
                   du + h * S, d.Hv * S, d.Dv * PanelWidth<T>());
  }
  const T* p_l = p.p_l + g * d.Hk * d.H;
  const T* p_w = p.p_w + g * d.H * d.Hv;
  for (int64 r = 0; r < nb; ++r) {
    const int64 n = n0 + r;
    T* j_row = j + r * d.Hk * S;
    T* du_row = du + r * d.Hv * S;
    T* u_row = u + r * d.Hv * S;
    if (r + 1 < nb) {
      for (int64 h = 0; h < d.Hk; ++h) Prefetch(j_row + (d.Hk + h) * S, M);
      for (int64 h = 0; h < d.Hv; ++h) Prefetch(du_row + (d.Hv + h) * S, M);
    }
    T* w = RowLogits(p, f, g, M, S, j_row, l_tmp);
    // W = exp(L + bias - lse); without P_w, W is U: written to U's row.
    T* w_out = f.has_p_w ? w : u_row;
    for (int64 h = 0; h < d.H; ++h) {
      const T stat = out.lse[((b * d.G + g) * d.H + h) * d.N + n];
      ExpSum(w + h * S, BiasOf(p, f, b, g, h, n), w_out + h * S, M, stat);
    }
    w = w_out;
    T* dw = du_row;
    if (f.has_p_w) {
      MixGemm<T, true>(d.Hv, M, d.H, p_w, d.Hv, w, S, u_row, S);  // U
      DotAcc(d.H, d.Hv, M, w, S, du_row, S,
             out.dp_w_lanes + g * d.H * d.Hv * PS,
             out.dp_w_tail + g * d.H * d.Hv);  // dP_w += W dU^T
      MixGemm<T, false>(d.H, M, d.Hv, p_w, d.Hv, du_row, S, dw_tmp, S);
      dw = dw_tmp;  // dW = P_w dU
    }
    // dL = W (dW - sum_m W dW): into dW's place, or (no P_l: dJ = dL) J's.
    T* dl = f.has_p_l ? dw : j_row;
    for (int64 h = 0; h < d.H; ++h) {
      MapA<T> wr(w + h * S, M), dr(dw + h * S, M);
      const T dot = (wr * dr).sum();
      MapA<T>(dl + h * S, M) = wr * (dr - dot);
      if (f.bias_grad) {
        MapA<T>(out.dbias + p.BiasRow(b, g, h, n), M) += MapA<T>(dl + h * S, M);
      }
    }
    if (f.has_p_l) {
      DotAcc(d.Hk, d.H, M, j_row, S, dl, S,
             out.dp_l_lanes + g * d.Hk * d.H * PS,
             out.dp_l_tail + g * d.Hk * d.H);  // dP_l += J dL^T
      MixGemm<T, false>(d.Hk, M, d.H, p_l, d.H, dl, S, j_row, S);  // dJ
    }
  }
  for (int64 h = 0; h < d.Hv; ++h) {  // dV[h] += U[h]^T dO[h]
    const int64 head = (b * d.G + g) * d.Hv + h;
    Gemm<T, true, true>(M, d.Dv, nb, u + h * S, d.Hv * S,
                        out.dout + (head * d.N + n0) * d.Dv, d.Dv,
                        out.dv + head * d.M * d.Dv, d.Dv);
  }
  for (int64 h = 0; h < d.Hk; ++h) {
    const int64 head = (b * d.G + g) * d.Hk + h;
    // dQ[h] = dJ[h] K[h]
    Gemm<T, false>(nb, d.Dk, M, j + h * S, d.Hk * S, p.K(b, g, h), d.Dk,
                   out.dq + (head * d.N + n0) * d.Dk, d.Dk);
    // dK[h] += dJ[h]^T Q[h]
    Gemm<T, true, true>(M, d.Dk, nb, j + h * S, d.Hk * S, p.Q(b, g, h, n0),
                        d.Dk, out.dk + head * d.M * d.Dk, d.Dk);
  }
}

// ---------------------------------------------------------------- kernels

// The gradient's chunk of block `blk` of `chunks`: zigzag (0 1 2 .. c-1
// c-1 .. 1 0 0 1 ..), so every chunk gets as many early (short, under a
// causal mask) blocks as late (long) ones.
inline int64 ChunkOf(int64 blk, int64 chunks) {
  const int64 pos = blk % (2 * chunks);
  return pos < chunks ? pos : 2 * chunks - 1 - pos;
}

template <typename T>
Ptrs<T> InputPtrs(OpKernelContext* ctx, const Dims& d) {
  Ptrs<T> p;
  p.q = ctx->input(0).flat<T>().data();
  p.k = ctx->input(1).flat<T>().data();
  p.v = ctx->input(2).flat<T>().data();
  p.p_l = ctx->input(3).flat<T>().data();
  p.p_w = ctx->input(4).flat<T>().data();
  p.bias = ctx->input(5).flat<T>().data();
  p.kt = p.vt = nullptr;
  p.mp = (d.M + PanelWidth<T>() - 1) / PanelWidth<T>() * PanelWidth<T>();
  p.d = &d;
  return p;
}

void RunTasks(OpKernelContext* ctx, int64 tasks,
              const std::function<void(int64)>& fn);

// x [heads, rows, cols] -> panel-major x^T [heads, mp / W, cols, W] in a
// temporary (K^T, V^T; W = PanelWidth, rows padded with zeros to mp).
template <typename T>
Status Transposed(OpKernelContext* ctx, const T* x, int64 heads, int64 rows,
                  int64 cols, int64 mp, Tensor* tmp, const T** out) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DataTypeToEnum<T>::value,
                                        TensorShape({heads * mp * cols}),
                                        tmp));
  T* y = tmp->flat<T>().data();
  constexpr int64 W = PanelWidth<T>();
  RunTasks(ctx, heads, [&](int64 h) {
    const T* xh = x + h * rows * cols;
    T* yh = y + h * mp * cols;
    for (int64 p = 0; p < mp / W; ++p)
      for (int64 c = 0; c < cols; ++c)
        for (int64 w = 0; w < W; ++w) {
          const int64 r = p * W + w;
          yh[(p * cols + c) * W + w] = r < rows ? xh[r * cols + c] : T(0);
        }
  });
  *out = y;
  return Status();
}

// Runs fn(task) for task in [0, tasks) on the op's worker pool, one each.
void RunTasks(OpKernelContext* ctx, int64 tasks,
              const std::function<void(int64)>& fn) {
  if (tasks == 0) return;
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  tensorflow::thread::ThreadPool::SchedulingParams params(
      tensorflow::thread::ThreadPool::SchedulingStrategy::kFixedBlockSize,
      absl::nullopt, 1);
  pool->ParallelFor(tasks, params, [&fn](int64 start, int64 limit) {
    for (int64 t = start; t < limit; ++t) fn(t);
  });
}

int NumThreads(OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
}

// What the forward and gradient kernels share: the attributes, read once.
class FusedCoreKernel : public OpKernel {
 public:
  explicit FusedCoreKernel(OpKernelConstruction* c) : OpKernel(c) {
    GetFlags(c, &flags_);
  }

 protected:
  Flags flags_;
};

template <typename T>
class FusedAttentionCoreOp : public FusedCoreKernel {
 public:
  using FusedCoreKernel::FusedCoreKernel;

  void Compute(OpKernelContext* ctx) override {
    Dims d;
    OP_REQUIRES_OK(ctx, ReadDims(ctx, flags_, false, &d));
    TensorShape o_shape, lse_shape;
    OutputShapes(ctx, flags_, &o_shape, &lse_shape);
    Tensor *o, *lse;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, o_shape, &o));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, lse_shape, &lse));
    if (d.M == 0) {  // softmax over nothing: no weights, O = 0
      o->flat<T>().setZero();
      lse->flat<T>().setConstant(-std::numeric_limits<T>::infinity());
      return;
    }
    Ptrs<T> p = InputPtrs<T>(ctx, d);
    Tensor kt;
    OP_REQUIRES_OK(ctx, Transposed(ctx, p.k, d.B * d.G * d.Hk, d.M, d.Dk,
                                   p.mp, &kt, &p.kt));
    T* out = o->flat<T>().data();
    T* stats = lse->flat<T>().data();
    const Flags& f = flags_;
    RunTasks(ctx, d.B * d.G * d.blocks, [&](int64 t) {
      // the last blocks first: under a causal mask they are the longest
      const int64 block = d.blocks - 1 - t % d.blocks, bg = t / d.blocks;
      ForwardBlock(p, f, bg / d.G, bg % d.G, block * d.bq, out, stats);
    });
  }
};

template <typename T>
class FusedAttentionCoreGradOp : public FusedCoreKernel {
 public:
  using FusedCoreKernel::FusedCoreKernel;

  void Compute(OpKernelContext* ctx) override {
    Dims d;
    OP_REQUIRES_OK(ctx, ReadDims(ctx, flags_, true, &d));
    const Tensor& lse = ctx->input(6);
    const Tensor& dout = ctx->input(7);
    TensorShape o_shape, lse_shape;
    OutputShapes(ctx, flags_, &o_shape, &lse_shape);
    OP_REQUIRES(ctx, dout.shape() == o_shape,
                Bad("do must be O's shape " + o_shape.DebugString() +
                    ", got " + ShapeStr(dout)));
    OP_REQUIRES(ctx, lse.shape() == lse_shape,
                Bad("lse must be " + lse_shape.DebugString() + ", got " +
                    ShapeStr(lse)));
    Tensor* grads[6];
    for (int i = 0; i < 6; ++i) {
      TensorShape shape = ctx->input(i).shape();
      if (i == 5 && !flags_.bias_grad) shape = TensorShape({0});
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shape, &grads[i]));
    }
    // dK and dV: zeroed by the tasks that sum into them, in parallel
    for (int i = 3; i < 6; ++i) grads[i]->flat<T>().setZero();
    if (d.M == 0) {
      for (int i = 0; i < 3; ++i) grads[i]->flat<T>().setZero();
      return;
    }
    Run(ctx, d, grads, lse.flat<T>().data(), dout.flat<T>().data());
  }

 private:
  void Run(OpKernelContext* ctx, const Dims& d, Tensor** grads, const T* lse,
           const T* dout) {
    const Flags& f = flags_;
    // A task loops over the batch (or the groups) itself when the bias it
    // sums into is broadcast over them, so that it alone owns its rows.
    const bool all_b = f.bias_grad && d.Bb == 1;
    const bool all_g = f.bias_grad && d.Hb == 1;
    const int64 nb_out = all_b ? 1 : d.B, ng_out = all_g ? 1 : d.G;
    const int64 outer = nb_out * ng_out;
    // a chunk per thread (the zigzag balances them; more chunks would add
    // dK, dV partials to zero and sum)
    const int64 want = static_cast<int64>(NumThreads(ctx));
    const int64 chunks = std::max<int64>(
        1, std::min<int64>(d.blocks, (want + outer - 1) / outer));
    const int64 tasks = chunks * outer;
    const int64 k_size = d.B * d.G * d.Hk * d.M * d.Dk;
    const int64 v_size = d.B * d.G * d.Hv * d.M * d.Dv;
    constexpr int PS = PacketSize<T>();
    const int64 pl_size = f.has_p_l ? d.G * d.Hk * d.H : 0;
    const int64 pw_size = f.has_p_w ? d.G * d.H * d.Hv : 0;
    // [chunks - 1] dK, dV and [tasks] dP_l, dP_w partials (lanes and tails)
    const int64 dp_size = (pl_size + pw_size) * (PS + 1);
    Tensor partial;
    const int64 extra = chunks - 1;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
        tensorflow::DataTypeToEnum<T>::value,
        TensorShape({extra * (k_size + v_size) + tasks * dp_size}),
        &partial));
    T* part = partial.flat<T>().data();
    T* dk = grads[1]->flat<T>().data();
    T* dv = grads[2]->flat<T>().data();
    T* dp = part + extra * (k_size + v_size);
    std::fill_n(dp, tasks * dp_size, T(0));
    Ptrs<T> p = InputPtrs<T>(ctx, d);
    Tensor kt, vt;
    OP_REQUIRES_OK(ctx, Transposed(ctx, p.k, d.B * d.G * d.Hk, d.M, d.Dk,
                                   p.mp, &kt, &p.kt));
    OP_REQUIRES_OK(ctx, Transposed(ctx, p.v, d.B * d.G * d.Hv, d.M, d.Dv,
                                   p.mp, &vt, &p.vt));
    RunTasks(ctx, tasks, [&](int64 t) {
      const int64 c = t % chunks, o = t / chunks;
      const int64 bo = o / ng_out, go = o % ng_out;
      GradOut<T> out;
      out.dq = grads[0]->flat<T>().data();
      out.dk = c == 0 ? dk : part + (c - 1) * (k_size + v_size);
      out.dv = c == 0 ? dv : part + (c - 1) * (k_size + v_size) + k_size;
      out.dp_l_lanes = dp + t * dp_size;
      out.dp_l_tail = out.dp_l_lanes + pl_size * PS;
      out.dp_w_lanes = out.dp_l_tail + pl_size;
      out.dp_w_tail = out.dp_w_lanes + pw_size * PS;
      out.dbias = grads[5]->flat<T>().data();
      out.lse = lse;
      out.dout = dout;
      for (int64 b = all_b ? 0 : bo; b < (all_b ? d.B : bo + 1); ++b)
        for (int64 g = all_g ? 0 : go; g < (all_g ? d.G : go + 1); ++g) {
          // this task alone sums into its chunk's dK, dV of (b, g)
          const int64 bg = b * d.G + g;
          std::fill_n(out.dk + bg * d.Hk * d.M * d.Dk, d.Hk * d.M * d.Dk,
                      T(0));
          std::fill_n(out.dv + bg * d.Hv * d.M * d.Dv, d.Hv * d.M * d.Dv,
                      T(0));
          for (int64 blk = 0; blk < d.blocks; ++blk)
            if (ChunkOf(blk, chunks) == c)
              BackwardBlock(p, f, out, b, g, blk * d.bq);
        }
    });
    Reduce(ctx, dk, part, k_size, v_size, extra, 0);
    Reduce(ctx, dv, part, k_size, v_size, extra, k_size);
    T* dp_l = grads[3]->flat<T>().data();
    T* dp_w = grads[4]->flat<T>().data();
    for (int64 t = 0; t < tasks; ++t) {
      const T* src = dp + t * dp_size;
      SumLanes(src, src + pl_size * PS, pl_size, dp_l);
      src += pl_size * (PS + 1);
      SumLanes(src, src + pw_size * PS, pw_size, dp_w);
    }
  }

  // dst[i] += tail[i] + the PacketSize lanes of i.
  static void SumLanes(const T* lanes, const T* tail, int64 size, T* dst) {
    constexpr int PS = PacketSize<T>();
    for (int64 i = 0; i < size; ++i) {
      T sum = tail[i];
      for (int l = 0; l < PS; ++l) sum += lanes[i * PS + l];
      dst[i] += sum;
    }
  }

  // dst += the chunks' partial sums (stride k_size + v_size, from `offset`).
  static void Reduce(OpKernelContext* ctx, T* dst, const T* part, int64 k_size,
                     int64 v_size, int64 extra, int64 offset) {
    if (extra == 0) return;
    const int64 size = offset == 0 ? k_size : v_size;
    const int64 pieces = std::max<int64>(1, std::min<int64>(64, size / 4096));
    RunTasks(ctx, pieces, [&](int64 i) {
      const int64 lo = i * size / pieces, hi = (i + 1) * size / pieces;
      for (int64 c = 0; c < extra; ++c) {
        const T* src = part + c * (k_size + v_size) + offset;
        for (int64 x = lo; x < hi; ++x) dst[x] += src[x];
      }
    });
  }
};

// Output shapes where the ranks are known (the kernel checks the sizes).
Status ForwardShape(InferenceContext* c) {
  ShapeHandle q = c->input(0), v = c->input(2);
  bool has_p_l, has_p_w;
  TF_RETURN_IF_ERROR(c->GetAttr("has_p_l", &has_p_l));
  TF_RETURN_IF_ERROR(c->GetAttr("has_p_w", &has_p_w));
  if (c->Rank(q) != 5 || c->Rank(v) != 5) {
    c->set_output(0, c->UnknownShape());
    c->set_output(1, c->UnknownShape());
    return Status();
  }
  DimensionHandle heads = c->Dim(q, 2);
  if (has_p_w) {
    heads = c->Rank(c->input(4)) == 3 ? c->Dim(c->input(4), 1)
                                      : c->UnknownDim();
  } else if (has_p_l) {
    heads = c->Rank(c->input(3)) == 3 ? c->Dim(c->input(3), 2)
                                      : c->UnknownDim();
  }
  c->set_output(0, c->MakeShape({c->Dim(q, 0), c->Dim(q, 1), c->Dim(v, 2),
                                 c->Dim(q, 3), c->Dim(v, 4)}));
  c->set_output(1, c->MakeShape({c->Dim(q, 0), c->Dim(q, 1), heads,
                                 c->Dim(q, 3)}));
  return Status();
}

Status GradShape(InferenceContext* c) {
  bool bias_grad;
  TF_RETURN_IF_ERROR(c->GetAttr("bias_grad", &bias_grad));
  for (int i = 0; i < 5; ++i) c->set_output(i, c->input(i));
  c->set_output(5, bias_grad ? c->input(5) : c->MakeShape({0}));
  return Status();
}

}  // namespace

#define FUSED_CORE_ATTRS                                         \
  Attr("T: {float, double}")                                     \
      .Attr("has_p_l: bool")                                     \
      .Attr("has_p_w: bool")                                     \
      .Attr("has_bias: bool")                                    \
      .Attr("bias_grad: bool = false")                           \
      .Attr("block_queries: int = 0")

REGISTER_OP("FusedAttentionCore")
    .Input("q: T")
    .Input("k: T")
    .Input("v: T")
    .Input("p_l: T")
    .Input("p_w: T")
    .Input("bias: T")
    .Output("o: T")
    .Output("lse: T")
    .FUSED_CORE_ATTRS
    .SetShapeFn(ForwardShape)
    .Doc("O [B,G,Hv,N,Dv] and each row's log-sum-exp [B,G,H,N].");

REGISTER_OP("FusedAttentionCoreGrad")
    .Input("q: T")
    .Input("k: T")
    .Input("v: T")
    .Input("p_l: T")
    .Input("p_w: T")
    .Input("bias: T")
    .Input("lse: T")
    .Input("do: T")
    .Output("dq: T")
    .Output("dk: T")
    .Output("dv: T")
    .Output("dp_l: T")
    .Output("dp_w: T")
    .Output("dbias: T")
    .FUSED_CORE_ATTRS
    .SetShapeFn(GradShape)
    .Doc("dQ, dK, dV, dP_l, dP_w, dbias of FusedAttentionCore.");

#define REGISTER_FUSED_CORE(T)                                              \
  REGISTER_KERNEL_BUILDER(                                                  \
      Name("FusedAttentionCore").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      FusedAttentionCoreOp<T>);                                             \
  REGISTER_KERNEL_BUILDER(Name("FusedAttentionCoreGrad")                    \
                              .Device(DEVICE_CPU)                           \
                              .TypeConstraint<T>("T"),                      \
                          FusedAttentionCoreGradOp<T>);

REGISTER_FUSED_CORE(float);
REGISTER_FUSED_CORE(double);
