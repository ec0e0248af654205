// int8 x int8 -> int32 matrix product with weights packed once, AMX (tdpbssd), as an XLA FFI
// custom call. x: int8 (M, K); w: int8 packed (N/16, K/4, 16, 4); out: int32 (M, N).
// K a multiple of 64, N of 32.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// tiles: 0,1 C (rows x 16 int32) for n blocks 0,1; 2,3 C for the second 16 rows; 4,5 A (rows x 64
// bytes); 6,7 B (16 x 64 bytes).
static void configure(int rows0, int rows1) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = rows[t] ? rows[t] : 1;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

static void tile_range(const int8_t* x, const int8_t* w, int32_t* out, int64_t M, int64_t K,
                       int64_t N, int64_t p0, int64_t p1) {
  const int64_t kq = K / 4;
  for (int64_t m = 0; m < M; m += 32) {
    const int rows0 = (int)std::min<int64_t>(16, M - m);
    const int rows1 = (int)std::max<int64_t>(0, std::min<int64_t>(16, M - m - 16));
    configure(rows0, rows1);
    for (int64_t p = p0; p < p1; ++p) {  // pairs of 16-column blocks
      const int8_t* b0 = w + (2 * p) * kq * 64;
      const int8_t* b1 = w + (2 * p + 1) * kq * 64;
      _tile_zero(0);
      _tile_zero(1);
      if (rows1) {
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t k = 0; k < K; k += 64) {
        _tile_loadd(4, x + m * K + k, K);
        _tile_loadd(6, b0 + (k / 4) * 64, 64);
        _tile_loadd(7, b1 + (k / 4) * 64, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        if (rows1) {
          _tile_loadd(5, x + (m + 16) * K + k, K);
          _tile_dpbssd(2, 5, 6);
          _tile_dpbssd(3, 5, 7);
        }
      }
      int32_t* o = out + m * N + p * 32;
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

static bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /*ARCH_REQ_XCOMP_PERM*/, 18) == 0;
  return ok;
}

static ffi::Error Int8GemmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x,
                               ffi::Buffer<ffi::S8> w, ffi::ResultBuffer<ffi::S32> out) {
  auto xd = x.dimensions();
  auto od = out->dimensions();
  const int64_t M = xd[0], K = xd[1], N = od[1];
  if (K % 64 || N % 32 || od[0] != M || (int64_t)w.element_count() != K * N)
    return ffi::Error::InvalidArgument("int8_gemm_amx: K a multiple of 64, N of 32, w K*N");
  if (!amx_permitted()) return ffi::Error::Internal("int8_gemm_amx: AMX not permitted");
  const int64_t pairs = N / 32;
  int64_t threads = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), pairs));
  const int8_t* xp = x.typed_data();
  const int8_t* wp = w.typed_data();
  int32_t* op = out->typed_data();
  const int64_t per = (pairs + threads - 1) / threads;
  std::atomic<int64_t> left(threads - 1);
  std::mutex mu;
  std::condition_variable cv;
  for (int64_t i = 1; i < threads; ++i) {
    int64_t p0 = i * per, p1 = std::min(pairs, p0 + per);
    pool.Schedule([=, &left, &mu, &cv] {
      if (p0 < p1) tile_range(xp, wp, op, M, K, N, p0, p1);
      if (left.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_one();
      }
    });
  }
  tile_range(xp, wp, op, M, K, N, 0, std::min(pairs, per));
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return left.load() == 0; });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Int8GemmAmx, Int8GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
