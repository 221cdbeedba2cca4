// The id -> row map of a parameter server's embedding table (elasticdl/ps/id_index.py): an
// open-addressing hash table (linear probing, Fibonacci hashing) of 16-byte slots, so a probe
// costs one cache line. It holds up to 4/5 of its slots and grows by 3/2, so its size need not
// be a power of two (an id's home slot is the high half of hash x capacity): between 20 and
// 30 bytes per id, where a load factor <= 1/2 and doubling cost 32 to 64. The slots are a fresh
// anonymous mapping whose zero pages read as empty (a slot stores row + 1), so nothing is
// written to create the map, and a grown-out array goes back to the kernel at once.
// A push or pull resolves a batch of ~100k ids: lookups prefetch the home slot of an id several
// positions ahead (the table of a large embedding does not fit in cache) and run on OpenMP
// threads for large batches. Lookups may run concurrently with each other; inserts (which may
// grow and move the table) take the map exclusively.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <vector>

namespace edl {
namespace cpu {

class IdMap {
 public:
  // The most ids per slot before the map grows, as a fraction.
  static constexpr int64_t kLoadNum = 4, kLoadDen = 5;

  explicit IdMap(int64_t capacity = 1024);
  ~IdMap();
  IdMap(const IdMap&) = delete;
  IdMap& operator=(const IdMap&) = delete;

  int64_t size() const { return size_; }
  int64_t capacity() const { return static_cast<int64_t>(n_slots_); }  // slots
  size_t bytes() const { return n_slots_ * sizeof(Slot); }
  // rows[i] = the row of ids[i], or -1 where the id is absent.
  void lookup(const int64_t* ids, int64_t n, int64_t* rows) const;
  // rows[i] = the row of ids[i], where an id below n_direct reads direct[id] (-1: absent) and
  // the others the map. An absent id gets next_row + its rank among the distinct absent ids in
  // order of first appearance, and those ids are appended to *new_ids (empty on entry) in that
  // order: the rows an append of *new_ids would give them. Nothing is inserted, so a caller
  // that refuses new ids has changed nothing.
  void resolve(const int64_t* direct, int64_t n_direct, const int64_t* ids, int64_t n, int64_t next_row,
               int64_t* rows, std::vector<int64_t>* new_ids) const;
  // Maps ids[i] -> rows[i] (rows >= 0); an id already present gets the new row.
  void insert(const int64_t* ids, const int64_t* rows, int64_t n);
  // Writes the (id, row) pairs, in slot order, into ids[] and rows[], at most max_n of them;
  // returns how many.
  int64_t items(int64_t* ids, int64_t* rows, int64_t max_n) const;

 private:
  struct Slot {
    int64_t key;
    uint64_t row1;  // row + 1; 0: empty (any int64 is a valid id, so emptiness lives here)
  };
  static Slot* allocate(size_t n);
  static void release(Slot* slots, size_t n);
  int64_t find(int64_t id) const;  // the row of id, -1 if absent; the caller holds mu_
  void put(int64_t id, uint64_t row1);
  void grow(int64_t needed);
  uint64_t home(int64_t id) const {
    const uint64_t h = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n_slots_) >> 64);
  }
  uint64_t next(uint64_t j) const { return j + 1 == n_slots_ ? 0 : j + 1; }

  Slot* slots_ = nullptr;
  size_t n_slots_ = 0;
  int64_t size_ = 0;
  mutable std::shared_mutex mu_;
};

}  // namespace cpu
}  // namespace edl
