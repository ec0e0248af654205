// int8 x int8 -> int32 matrix products with AVX2 on weights packed once (at load), as an XLA
// FFI custom call (kernels/int8_amx.py registers it): the int8 kernel of CPUs without AMX.
//
//   x: int8 (M, K) row-major; w: int8 (N / 16, K / 4, 16, 4), w[b, q, j, i] = W[4q + i, 16b + j]
//   (int8_amx.pack's layout); out: int32 (M, N) = x @ W, exact. K a multiple of 4 (the packer
//   asks 64), N of 32, any M. Every value of x and W in [-127, 127] (nn.int8 quantises to that
//   range): then the pair sums of vpmaddubsw (|x| times W with x's sign, at most
//   2 * 127 * 127 = 32258) never saturate and the result is exact.
//
// XLA:CPU's int8 dot re-packs the weight operand inside every call (bench/NOTES.md); here the
// weights are read in the packed layout as they are, 32 columns at a time.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "native_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The 4 int8 values x[0..3] broadcast to every 32-bit lane.
inline __m256i broadcast4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

// acc += the 8 columns' dot products of 4 k-values: |x| * (w with x's sign), exact in range.
inline __m256i dot4(__m256i acc, __m256i x_abs, __m256i x, __m256i w, __m256i ones) {
  const __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w, x));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
}

// Rows [0, R) of x times the two 16-column blocks b0, b1 (32 columns of out from `o`).
template <int R>
void rows_by_block_pair(const int8_t* x, const int8_t* b0, const int8_t* b1, int32_t* o,
                        int64_t K, int64_t N) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm256_setzero_si256();
  for (int64_t q = 0; q < K / 4; ++q) {
    const __m256i* p0 = reinterpret_cast<const __m256i*>(b0 + q * 64);
    const __m256i* p1 = reinterpret_cast<const __m256i*>(b1 + q * 64);
    const __m256i w[4] = {_mm256_loadu_si256(p0), _mm256_loadu_si256(p0 + 1),
                          _mm256_loadu_si256(p1), _mm256_loadu_si256(p1 + 1)};
    _mm_prefetch(reinterpret_cast<const char*>(b0 + (q + 8) * 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b1 + (q + 8) * 64), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const __m256i xv = broadcast4(x + r * K + 4 * q);
      const __m256i x_abs = _mm256_abs_epi8(xv);
      for (int v = 0; v < 4; ++v) acc[r][v] = dot4(acc[r][v], x_abs, xv, w[v], ones);
    }
  }
  // acc[r][v] lanes are columns 8v .. 8v + 7 of the 32 (blocks of 16: v 0-1 b0, 2-3 b1).
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + r * N + 8 * v), acc[r][v]);
}

// Columns [32 * p0, 32 * p1) of out, every row, two rows at a time.
void column_pairs(const int8_t* x, const int8_t* w, int32_t* out, int64_t M, int64_t K,
                  int64_t N, int64_t p0, int64_t p1) {
  const int64_t block = K * 16;  // bytes of one 16-column block of w
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* b0 = w + 2 * p * block;
    const int8_t* b1 = b0 + block;
    int32_t* o = out + 32 * p;
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) rows_by_block_pair<2>(x + m * K, b0, b1, o + m * N, K, N);
    if (m < M) rows_by_block_pair<1>(x + m * K, b0, b1, o + m * N, K, N);
  }
}

}  // namespace

static ffi::Error Int8Avx2Product(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x,
                                  ffi::Buffer<ffi::S8> w, ffi::ResultBuffer<ffi::S32> out) {
  const auto xd = x.dimensions();
  const auto od = out->dimensions();
  if (xd.size() != 2 || od.size() != 2 || od[0] != xd[0])
    return ffi::Error::InvalidArgument("int8_avx2_product: x (M, K) and out (M, N)");
  const int64_t M = xd[0], K = xd[1], N = od[1];
  if (K % 4 || N % 32 || static_cast<int64_t>(w.element_count()) != K * N)
    return ffi::Error::InvalidArgument(
        "int8_avx2_product: K must be a multiple of 4, N of 32, and w hold K * N values");
  const int8_t* xs = x.typed_data();
  const int8_t* ws = w.typed_data();
  int32_t* os = out->typed_data();
  flax_transformer::run_on_pool(pool, N / 32, [=](int64_t p0, int64_t p1) {
    column_pairs(xs, ws, os, M, K, N, p0, p1);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(int8_avx2_product, Int8Avx2Product,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
