// int8 x int8 -> int32 matrix products on Intel AMX, with the weights packed once (at load) in
// the layout AMX reads, as an XLA FFI custom call (nn/int8_amx.py builds and registers it).
//
//   x: int8 (M, K) row-major; w: int8 (N / 16, K / 4, 16, 4), w[b, q, j, i] = W[4q + i, 16b + j];
//   out: int32 (M, N) = x @ W, exact. K a multiple of 64, N of 32, any M.
//
// XLA:CPU's own int8 dots re-pack the weight operand on every call (bench/NOTES.md, "What is
// left of #28's decode targets"); here that is done once.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "native_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct TileConfig {  // AMX palette 1, as ldtilecfg reads it
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0-1: C of rows 0-15 for two 16-column blocks; 2-3: C of rows 16-31; 4, 5: A for the
// two row groups (rows x 64 bytes of K); 6, 7: B for the two column blocks (16 x 64 bytes).
void configure(int rows0, int rows1) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(std::max(rows[t], 1));
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Columns [32 * p0, 32 * p1) of out, every row.
void column_pairs(const int8_t* x, const int8_t* w, int32_t* out, int64_t M, int64_t K,
                  int64_t N, int64_t p0, int64_t p1) {
  const int64_t block = K / 4 * 64;  // bytes of one 16-column block of w
  for (int64_t m = 0; m < M; m += 32) {
    const int rows0 = static_cast<int>(std::min<int64_t>(16, M - m));
    const int rows1 = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(16, M - m - 16)));
    configure(rows0, rows1);
    for (int64_t p = p0; p < p1; ++p) {
      const int8_t* b0 = w + 2 * p * block;
      const int8_t* b1 = b0 + block;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < K; k += 64) {
        _tile_loadd(4, x + m * K + k, K);
        _tile_loadd(6, b0 + k / 4 * 64, 64);
        _tile_loadd(7, b1 + k / 4 * 64, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        if (rows1) {
          _tile_loadd(5, x + (m + 16) * K + k, K);
          _tile_dpbssd(2, 5, 6);
          _tile_dpbssd(3, 5, 7);
        }
      }
      int32_t* o = out + m * N + 32 * p;
      _tile_stored(0, o, N * 4);
      _tile_stored(1, o + 16, N * 4);
      if (rows1) {
        _tile_stored(2, o + 16 * N, N * 4);
        _tile_stored(3, o + 16 * N + 16, N * 4);
      }
    }
  }
  _tile_release();
}

}  // namespace

// 0 when this process may use AMX tiles (Linux asks each process to request them once).
extern "C" int int8_amx_request_permission() {
  return static_cast<int>(syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                  18 /* XFEATURE_XTILEDATA */));
}

static ffi::Error Int8AmxProduct(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x,
                                 ffi::Buffer<ffi::S8> w, ffi::ResultBuffer<ffi::S32> out) {
  const auto xd = x.dimensions();
  const auto od = out->dimensions();
  if (xd.size() != 2 || od.size() != 2 || od[0] != xd[0])
    return ffi::Error::InvalidArgument("int8_amx_product: x (M, K) and out (M, N)");
  const int64_t M = xd[0], K = xd[1], N = od[1];
  if (K % 64 || N % 32 || static_cast<int64_t>(w.element_count()) != K * N)
    return ffi::Error::InvalidArgument(
        "int8_amx_product: K must be a multiple of 64, N of 32, and w hold K * N values");
  const int8_t* xs = x.typed_data();
  const int8_t* ws = w.typed_data();
  int32_t* os = out->typed_data();
  flax_transformer::run_on_pool(pool, N / 32, [=](int64_t p0, int64_t p1) {
    column_pairs(xs, ws, os, M, K, N, p0, p1);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(int8_amx_product, Int8AmxProduct,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
