// The id -> row map of a parameter server's embedding table (elasticdl/ps/id_index.py): an
// open-addressing hash table (linear probing, Fibonacci hashing, load factor <= 1/2) of
// 16-byte slots, so a probe costs one cache line. A push or pull resolves a batch of
// ~100k ids: lookups prefetch the home slot of an id several positions ahead (the table of a
// large embedding does not fit in cache) and run on OpenMP threads for large batches.
// Lookups may run concurrently with each other; inserts (which may grow and move the table)
// take the map exclusively.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <vector>

namespace edl {
namespace cpu {

class IdMap {
 public:
  explicit IdMap(int64_t capacity = 1024);
  int64_t size() const { return size_; }
  int64_t capacity() const { return int64_t{1} << bits_; }
  // rows[i] = the row of ids[i], or -1 where the id is absent.
  void lookup(const int64_t* ids, int64_t n, int64_t* rows) const;
  // Maps ids[i] -> rows[i] (rows >= 0); an id already present gets the new row.
  void insert(const int64_t* ids, const int64_t* rows, int64_t n);

 private:
  struct Slot {
    int64_t key;
    int64_t row;  // < 0: empty (any int64 is a valid id, so emptiness lives here)
  };
  void put(int64_t id, int64_t row);
  void grow(int64_t needed);
  uint64_t home(int64_t id) const { return (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> (64 - bits_); }

  std::vector<Slot> slots_;
  int bits_ = 4;
  int64_t size_ = 0;
  mutable std::shared_mutex mu_;
};

}  // namespace cpu
}  // namespace edl
