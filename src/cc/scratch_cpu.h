// Scratch memory of the CPU index structures (Dedup, RangeRank): grow-only buffers, kept in a
// process-wide pool between calls so that steady-state calls allocate nothing and touch pages
// that are already mapped, while concurrent calls still get separate scratch.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace edl {
namespace cpu {

// Grow-only uninitialised buffer (new T[] of a trivial T does not touch the pages).
template <typename T>
struct Buf {
  std::unique_ptr<T[]> p;
  size_t cap = 0;
  T* get(size_t k) {
    if (k > cap) {
      p.reset(new T[k]);
      cap = k;
    }
    return p.get();
  }
  size_t bytes() const { return cap * sizeof(T); }
};

// A pool of scratch objects S (default-constructible, with `size_t bytes() const`). One pool
// per S, shared by all threads; a one-off huge batch does not pin its memory.
template <typename S>
class ScratchPool {
 public:
  static constexpr size_t kKeepBytes = size_t{1} << 30;
  static constexpr size_t kMaxPooled = 4;

  static S* acquire() {
    ScratchPool& p = instance();
    {
      std::lock_guard<std::mutex> lock(p.mu_);
      if (!p.free_.empty()) {
        S* s = p.free_.back();
        p.free_.pop_back();
        return s;
      }
    }
    return new S();
  }

  static void release(S* s) {
    if (s->bytes() <= kKeepBytes) {
      ScratchPool& p = instance();
      std::lock_guard<std::mutex> lock(p.mu_);
      if (p.free_.size() < kMaxPooled) {
        p.free_.push_back(s);
        return;
      }
    }
    delete s;
  }

 private:
  static ScratchPool& instance() {
    static ScratchPool* pool = new ScratchPool();  // never destroyed: used until exit
    return *pool;
  }
  std::mutex mu_;
  std::vector<S*> free_;
};

}  // namespace cpu
}  // namespace edl
