#include <cstdint>
#include <cstring>
#include <vector>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

// cache (B*K, ...) float bytes, parents int32 (B, K); out aliases cache: rows follow parents.
static ffi::Error Reorder(ffi::AnyBuffer cache, ffi::Buffer<ffi::S32> parents,
                         ffi::Result<ffi::AnyBuffer> out) {
  auto pd = parents.dimensions();
  const int64_t B = pd[0], K = pd[1];
  const int64_t bytes = cache.size_bytes();
  const int64_t row = bytes / (B * K);
  char* dst = static_cast<char*>(out->untyped_data());
  const char* src = static_cast<const char*>(cache.untyped_data());
  if (dst != src) std::memcpy(dst, src, bytes);  // not aliased: plain copy first
  std::vector<char> tmp(K * row);
  const int32_t* p = parents.typed_data();
  for (int64_t b = 0; b < B; ++b) {
    char* base = dst + b * K * row;
    bool moved = false;
    for (int64_t k = 0; k < K; ++k) {
      if (p[b * K + k] != k) {
        std::memcpy(tmp.data() + k * row, base + p[b * K + k] * row, row);
        moved = true;
      }
    }
    if (!moved) continue;
    for (int64_t k = 0; k < K; ++k)
      if (p[b * K + k] != k) std::memcpy(base + k * row, tmp.data() + k * row, row);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(beam_reorder, Reorder,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::Buffer<ffi::S32>>().Ret<ffi::AnyBuffer>());
