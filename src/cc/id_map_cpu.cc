// The embedding tables' id -> row map (see id_map_cpu.h).
#include "id_map_cpu.h"

#include <omp.h>

#include <algorithm>
#include <mutex>

#include "kernels.h"

namespace edl {
namespace cpu {

namespace {
constexpr int64_t kProbeAhead = 8;         // ids ahead whose home slot a lookup prefetches
constexpr int64_t kParallelMin = 1 << 15;  // smaller batches: one thread
}  // namespace

IdMap::IdMap(int64_t capacity) {
  const int64_t want = std::max<int64_t>(capacity, 8) * 2;  // load factor <= 1/2
  while ((int64_t{1} << bits_) < want && bits_ < 62) ++bits_;
  slots_.assign(static_cast<size_t>(int64_t{1} << bits_), Slot{0, -1});
}

void IdMap::lookup(const int64_t* ids, int64_t n, int64_t* rows) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  follow_load();
  const Slot* slots = slots_.data();
  const uint64_t mask = (uint64_t{1} << bits_) - 1;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    if (i + kProbeAhead < n) __builtin_prefetch(slots + home(ids[i + kProbeAhead]), 0, 1);
    const int64_t id = ids[i];
    int64_t row = -1;
    for (uint64_t j = home(id);; j = (j + 1) & mask) {
      const Slot& s = slots[j];
      if (s.row < 0) break;
      if (s.key == id) {
        row = s.row;
        break;
      }
    }
    rows[i] = row;
  }
}

void IdMap::put(int64_t id, int64_t row) {
  const uint64_t mask = (uint64_t{1} << bits_) - 1;
  for (uint64_t j = home(id);; j = (j + 1) & mask) {
    Slot& s = slots_[j];
    if (s.row < 0) {
      s = Slot{id, row};
      ++size_;
      return;
    }
    if (s.key == id) {
      s.row = row;
      return;
    }
  }
}

void IdMap::grow(int64_t needed) {
  int bits = bits_;
  while ((int64_t{1} << bits) < 2 * needed && bits < 62) ++bits;
  if (bits == bits_) return;
  std::vector<Slot> old(static_cast<size_t>(int64_t{1} << bits), Slot{0, -1});
  old.swap(slots_);
  bits_ = bits;
  size_ = 0;
  for (const Slot& s : old) {
    if (s.row >= 0) put(s.key, s.row);
  }
}

void IdMap::insert(const int64_t* ids, const int64_t* rows, int64_t n) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  grow(size_ + n);  // at most n new ids
  for (int64_t i = 0; i < n; ++i) {
    if (i + kProbeAhead < n) __builtin_prefetch(slots_.data() + home(ids[i + kProbeAhead]), 1, 1);
    put(ids[i], rows[i]);
  }
}

}  // namespace cpu
}  // namespace edl
