// The embedding tables' id -> row map (see id_map_cpu.h).
#include "id_map_cpu.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <new>

#include "kernels.h"

namespace edl {
namespace cpu {

namespace {
constexpr int64_t kProbeAhead = 8;         // ids ahead whose home slot a lookup prefetches
constexpr int64_t kParallelMin = 1 << 15;  // smaller batches: one thread
constexpr size_t kMinSlots = 16;
constexpr size_t kHugePage = size_t{2} << 20;

// Slots that hold `ids` ids at the largest load factor.
size_t slots_for(int64_t ids) {
  return static_cast<size_t>((ids * IdMap::kLoadDen + IdMap::kLoadNum - 1) / IdMap::kLoadNum);
}
}  // namespace

IdMap::Slot* IdMap::allocate(size_t n) {
  void* p = mmap(nullptr, n * sizeof(Slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  // Probes land anywhere in the array: 2 MB pages spare most of their TLB misses.
  if (n * sizeof(Slot) >= kHugePage) madvise(p, n * sizeof(Slot), MADV_HUGEPAGE);
#endif
  return static_cast<Slot*>(p);
}

void IdMap::release(Slot* slots, size_t n) {
  if (slots != nullptr) munmap(slots, n * sizeof(Slot));
}

IdMap::IdMap(int64_t capacity) {
  n_slots_ = std::max(kMinSlots, slots_for(std::max<int64_t>(capacity, 0)));
  slots_ = allocate(n_slots_);
}

IdMap::~IdMap() { release(slots_, n_slots_); }

int64_t IdMap::find(int64_t id) const {
  for (uint64_t j = home(id);; j = next(j)) {
    const Slot& s = slots_[j];
    if (s.row1 == 0) return -1;
    if (s.key == id) return static_cast<int64_t>(s.row1 - 1);
  }
}

void IdMap::lookup(const int64_t* ids, int64_t n, int64_t* rows) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  follow_load();
  const Slot* slots = slots_;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    if (i + kProbeAhead < n) __builtin_prefetch(slots + home(ids[i + kProbeAhead]), 0, 1);
    rows[i] = find(ids[i]);
  }
}

void IdMap::resolve(const int64_t* direct, int64_t n_direct, const int64_t* ids, int64_t n, int64_t next_row,
                    int64_t* rows, std::vector<int64_t>* new_ids) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  follow_load();
  const Slot* slots = slots_;
  // Unsigned, a negative id compares as huge: it goes to the map, never indexes `direct`.
  const uint64_t below = n_direct > 0 ? static_cast<uint64_t>(n_direct) : 0;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    if (i + kProbeAhead < n) {
      const uint64_t ahead = static_cast<uint64_t>(ids[i + kProbeAhead]);
      if (ahead < below)
        __builtin_prefetch(direct + ahead, 0, 1);
      else
        __builtin_prefetch(slots + home(static_cast<int64_t>(ahead)), 0, 1);
    }
    const int64_t id = ids[i];
    rows[i] = static_cast<uint64_t>(id) < below ? direct[id] : find(id);
  }
  std::vector<int64_t> absent;  // positions in ids
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] < 0) absent.push_back(i);
  if (absent.empty()) return;
  // Distinct absent ids in order of first appearance, each numbered once: a small open-addressing
  // set (load <= 1/2), linear in the absent ids, where sorting them would not be.
  size_t cap = 16;
  while (cap < 2 * absent.size()) cap *= 2;
  const int shift = 64 - __builtin_ctzll(cap);
  std::vector<int64_t> keys(cap);
  std::vector<int64_t> rank1(cap, 0);  // rank + 1; 0: empty
  for (const int64_t i : absent) {
    const int64_t id = ids[i];
    uint64_t j = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift;
    while (rank1[j] != 0 && keys[j] != id) j = (j + 1) & (cap - 1);
    if (rank1[j] == 0) {
      keys[j] = id;
      new_ids->push_back(id);
      rank1[j] = static_cast<int64_t>(new_ids->size());
    }
    rows[i] = next_row + rank1[j] - 1;
  }
}

void IdMap::put(int64_t id, uint64_t row1) {
  for (uint64_t j = home(id);; j = next(j)) {
    Slot& s = slots_[j];
    if (s.row1 == 0) {
      s = Slot{id, row1};
      ++size_;
      return;
    }
    if (s.key == id) {
      s.row1 = row1;
      return;
    }
  }
}

void IdMap::grow(int64_t needed) {
  if (slots_for(needed) <= n_slots_) return;
  size_t n = n_slots_;
  while (n < slots_for(needed)) n += n / 2;
  Slot* old = slots_;
  const size_t old_n = n_slots_;
  slots_ = allocate(n);
  n_slots_ = n;
  size_ = 0;
  constexpr size_t kAhead = 16;  // old slots ahead whose new home is prefetched
  for (size_t i = 0; i < old_n; ++i) {
    if (i + kAhead < old_n && old[i + kAhead].row1 != 0)
      __builtin_prefetch(slots_ + home(old[i + kAhead].key), 1, 1);
    if (old[i].row1 != 0) put(old[i].key, old[i].row1);
  }
  release(old, old_n);
}

void IdMap::insert(const int64_t* ids, const int64_t* rows, int64_t n) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  grow(size_ + n);  // at most n new ids
  for (int64_t i = 0; i < n; ++i) {
    if (i + kProbeAhead < n) __builtin_prefetch(slots_ + home(ids[i + kProbeAhead]), 1, 1);
    put(ids[i], static_cast<uint64_t>(rows[i]) + 1);
  }
}

int64_t IdMap::items(int64_t* ids, int64_t* rows, int64_t max_n) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t k = 0;
  for (size_t j = 0; j < n_slots_ && k < max_n; ++j) {
    if (slots_[j].row1 == 0) continue;
    ids[k] = slots_[j].key;
    rows[k] = static_cast<int64_t>(slots_[j].row1 - 1);
    ++k;
  }
  return k;
}

}  // namespace cpu
}  // namespace edl
