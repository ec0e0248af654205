// float32 matrix products of a few rows on weights packed once (at load) into column panels,
// as an XLA FFI custom call (nn/f32_packed.py builds and registers it). Built twice: with
// AVX-512 (the default) and, with -DF32_PACKED_AVX2, with AVX2 + FMA for CPUs without AVX-512.
//
//   x: float32 (M, K) row-major; w: float32 (N / 16, K, 16), w[p, k, j] = W[k, 16p + j];
//   out: float32 (M, N) = x @ W. N a multiple of 32, any M and K.
//
// Decoding multiplies a few rows by every weight matrix on every step. XLA:CPU's dot re-packs
// the weight operand inside each call (for the (vocab, d_model) output table that is a whole
// transpose: bench/NOTES.md); here each 16-column panel is streamed once per call and each
// output is one chain of fused multiply-adds over k = 0..K-1 in order, so the result depends
// neither on the threads nor on the vector width (both builds give the same bits).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "native_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#if defined(F32_PACKED_AVX2)
using Vec = __m256;
constexpr int kLanes = 8;
constexpr int kMaxRows = 3;  // 3 rows x 4 vectors of accumulators + 4 of weights: 16 registers
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec broadcast(float a) { return _mm256_set1_ps(a); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec zero() { return _mm256_setzero_ps(); }
#else
using Vec = __m512;
constexpr int kLanes = 16;
constexpr int kMaxRows = 6;  // 6 rows x 2 vectors of accumulators
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec broadcast(float a) { return _mm512_set1_ps(a); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec zero() { return _mm512_setzero_ps(); }
#endif
constexpr int kPerPanel = 16 / kLanes;  // vectors per 16-column panel

namespace {

// Rows [m, m + R) times the two 16-column panels w0, w1 (columns n0 .. n0 + 31 of out).
template <int R>
void rows_by_panel_pair(const float* x, const float* w0, const float* w1, float* out,
                        int64_t K, int64_t N, int64_t n0) {
  constexpr int V = 2 * kPerPanel;  // vectors per row: the two panels' 32 columns
  Vec acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t k = 0; k < K; ++k) {
    Vec b[V];
    for (int v = 0; v < kPerPanel; ++v) {
      b[v] = load(w0 + k * 16 + v * kLanes);
      b[kPerPanel + v] = load(w1 + k * 16 + v * kLanes);
    }
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (k + 16) * 16), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + (k + 16) * 16), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const Vec a = broadcast(x[r * K + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = fma(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) store(out + r * N + n0 + v * kLanes, acc[r][v]);
}

// Columns [32 * p0, 32 * p1) of out, every row, kMaxRows rows at a time.
void column_pairs(const float* x, const float* w, float* out, int64_t M, int64_t K, int64_t N,
                  int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* w0 = w + 2 * p * K * 16;
    const float* w1 = w0 + K * 16;
    float* o = out + 32 * p;
    int64_t m = 0;
    for (; m + kMaxRows <= M; m += kMaxRows)
      rows_by_panel_pair<kMaxRows>(x + m * K, w0, w1, o + m * N, K, N, 0);
    if constexpr (kMaxRows > 4)
      for (; m + 4 <= M; m += 4) rows_by_panel_pair<4>(x + m * K, w0, w1, o + m * N, K, N, 0);
    for (; m + 2 <= M; m += 2) rows_by_panel_pair<2>(x + m * K, w0, w1, o + m * N, K, N, 0);
    for (; m < M; ++m) rows_by_panel_pair<1>(x + m * K, w0, w1, o + m * N, K, N, 0);
  }
}

}  // namespace

static ffi::Error F32PackedProduct(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                   ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions();
  const auto od = out->dimensions();
  if (xd.size() != 2 || od.size() != 2 || od[0] != xd[0])
    return ffi::Error::InvalidArgument("f32_packed_product: x (M, K) and out (M, N)");
  const int64_t M = xd[0], K = xd[1], N = od[1];
  if (N % 32 || static_cast<int64_t>(w.element_count()) != K * N)
    return ffi::Error::InvalidArgument(
        "f32_packed_product: N must be a multiple of 32 and w hold K * N values");
  const float* xs = x.typed_data();
  const float* ws = w.typed_data();
  float* os = out->typed_data();
  flax_transformer::run_on_pool(pool, N / 32, [=](int64_t p0, int64_t p1) {
    column_pairs(xs, ws, os, M, K, N, p0, p1);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(f32_packed_product, F32PackedProduct,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
