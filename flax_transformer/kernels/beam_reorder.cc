// Beam search's cache reorder, in place: every beam's keys (or values) follow its parent.
//
// cache (B*K, H, T, D), any element type, aliased with the result; parents (B, K) int32, each
// beam's parent within its row; filled () int32, the slots written so far (the cache index).
// Only what changes is written: a beam whose parent is itself is not touched, and of the
// others only the `filled` slots of each head (the slots past them are empty: masked, and
// overwritten before they are read). A parent that is itself overwritten is copied aside
// first. XLA's gather instead writes the whole cache anew, and the while loop copies it once
// more (decoding/beam_reorder.py; bench/NOTES.md, "The cache reorder in place").
#include <cstdint>
#include <cstring>
#include <vector>

#include "native_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error BeamReorder(ffi::ThreadPool pool, ffi::AnyBuffer cache,
                              ffi::Buffer<ffi::S32> parents, ffi::Buffer<ffi::S32> filled,
                              ffi::Result<ffi::AnyBuffer> out) {
  auto cd = cache.dimensions();
  auto pd = parents.dimensions();
  if (cd.size() != 4 || pd.size() != 2 || cd[0] != pd[0] * pd[1])
    return ffi::Error::InvalidArgument("beam_reorder: cache (B*K, H, T, D) and parents (B, K)");
  const int64_t B = pd[0], K = pd[1], H = cd[1], T = cd[2];
  const int64_t slot = cache.size_bytes() / (cd[0] * H * T);  // bytes of one slot (D elements)
  const int64_t head = T * slot, row = H * head;
  const int64_t n = std::min<int64_t>(T, std::max<int32_t>(0, *filled.typed_data()));
  const int32_t* p = parents.typed_data();
  for (int64_t i = 0; i < B * K; ++i)
    if (p[i] < 0 || p[i] >= K) return ffi::Error::InvalidArgument("beam_reorder: parent out of range");
  char* data = static_cast<char*>(out->untyped_data());
  const char* src = static_cast<const char*>(cache.untyped_data());
  if (data != src) std::memcpy(data, src, cache.size_bytes());  // not aliased: copy, then move
  if (n == 0) return ffi::Error::Success();
  const int64_t live = n * slot;  // bytes of one head's filled slots

  flax_transformer::run_on_pool(pool, B, [=](int64_t b0, int64_t b1) {
    std::vector<char> aside;
    for (int64_t b = b0; b < b1; ++b) {
      const int32_t* parent = p + b * K;
      char* base = data + b * K * row;
      // Parents that are themselves overwritten go aside first: aside_of[j] is their copy.
      std::vector<int64_t> aside_of(K, -1);
      int64_t copies = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t j = parent[k];
        if (j != k && parent[j] != j && aside_of[j] < 0) aside_of[j] = copies++;
      }
      aside.resize(copies * H * live);
      for (int64_t j = 0; j < K; ++j) {
        if (aside_of[j] < 0) continue;
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(aside.data() + (aside_of[j] * H + h) * live, base + j * row + h * head, live);
      }
      for (int64_t k = 0; k < K; ++k) {
        const int64_t j = parent[k];
        if (j == k) continue;
        for (int64_t h = 0; h < H; ++h) {
          const char* from = aside_of[j] >= 0 ? aside.data() + (aside_of[j] * H + h) * live
                                              : base + j * row + h * head;
          std::memcpy(base + k * row + h * head, from, live);
        }
      }
    }
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(beam_reorder, BeamReorder,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());
