// Splitting one custom call's work over XLA's intra-op thread pool (nn/int8_amx.cc,
// nn/f32_packed.cc).
//
// The work is a range of `units` (column blocks) cut into chunks that the calling thread and the
// pool's threads claim from a counter. The caller never waits for a task that has not started
// (XLA may be running other thunks on every pool thread): it claims chunks itself until none
// are left, then waits only for chunks being computed. The state is on the heap, shared with
// the tasks, so a task that starts after the call returned finds nothing to claim and touches
// nothing else.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace flax_transformer {

struct PoolWork {
  std::function<void(int64_t, int64_t)> run;  // computes units [u0, u1)
  int64_t units = 0, chunk = 1;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> busy{0};
  std::mutex mu;
  std::condition_variable done;

  bool claim_one() {  // false when every chunk is claimed
    busy.fetch_add(1);
    const int64_t u0 = next.fetch_add(1) * chunk;
    const bool claimed = u0 < units;
    if (claimed) run(u0, std::min(units, u0 + chunk));
    if (busy.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu);
      done.notify_all();
    }
    return claimed;
  }
};

// run(u0, u1) over [0, units), about four chunks per thread, on the caller and the pool.
inline void run_on_pool(xla::ffi::ThreadPool& pool, int64_t units,
                        std::function<void(int64_t, int64_t)> run) {
  auto work = std::make_shared<PoolWork>();
  work->run = std::move(run);
  work->units = units;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  work->chunk = std::max<int64_t>(1, units / (4 * threads));
  for (int64_t i = 1; i < threads; ++i) pool.Schedule([work] { while (work->claim_one()) {} });
  while (work->claim_one()) {
  }
  std::unique_lock<std::mutex> lock(work->mu);
  work->done.wait(lock, [&] { return work->busy.load() == 0; });
}

}  // namespace flax_transformer
