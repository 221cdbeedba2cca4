// Hash deduplication of id batches (see dedup_cpu.h).
#include "dedup_cpu.h"

#include "kernels.h"
#include "scratch_cpu.h"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <utility>
#include <vector>

namespace edl {
namespace cpu {

namespace {

// Ids per partition: its table (2x that many 16-byte entries) then stays in L2.
constexpr int64_t kIdsPerPart = 2048;
// How many positions ahead the insert loop prefetches the hash slot.
constexpr int64_t kProbeAhead = 8;
// Step 1 splits the ids into at most kMaxChunks chunks of at least kIdsPerChunk.
constexpr int kMaxChunks = 16;
constexpr int64_t kIdsPerChunk = 16384;
// sort_unique: below this many unique ids one thread sorts them all; above, the ids are
// range-bucketed by their top kBucketBits bits (of id - min) and buckets sorted in parallel.
constexpr int64_t kParallelSortMin = 32768;
// Smaller batches are hashed, ranked and summed on one thread: below it a team's fork and
// join, and on a busy host a second thread waiting for its time slice, cost more than the
// work it takes over (where it was measured: benchmarks/ops/RESULTS.md).
constexpr int64_t kParallelMin = int64_t{1} << 15;
constexpr int kBucketBits = 7;
// sort_unique uses a bitmap over [min, max] when it has at most this many 64-bit words per
// unique id (ids spread over at most 256x their count).
constexpr int64_t kBitmapWordsPerId = 4;

struct Entry {
  int64_t key;
  int64_t slot;  // < 0: empty (any int64 is a valid key, so emptiness lives here)
};

// Fibonacci hashing: the top bits of id * 2^64/phi spread sequential and strided ids evenly.
// The partition comes from the top bits of a second multiplicative hash, so within one
// partition the table position (top bits of the first) is still uniform.
inline uint64_t hash_id(int64_t id) { return static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull; }
inline int part_of(int64_t id, int part_bits) {
  return part_bits == 0 ? 0 : static_cast<int>((static_cast<uint64_t>(id) * 0xD6E8FEB86659FD93ull) >> (64 - part_bits));
}

inline int ceil_log2(uint64_t x) {
  int b = 0;
  while ((uint64_t{1} << b) < x) ++b;
  return b;
}

}  // namespace

struct DedupScratch {
  Buf<Entry> table;
  Buf<int64_t> hist, slot_of, pos, first_pos, slot_id, count, aux, sort_k, sort_v, sort_k2, sort_v2;
  Buf<float> floats;
  Buf<uint64_t> bitmap;
  Buf<uint8_t> part;
  Buf<int64_t> prefix;
  size_t bytes() const {
    return table.bytes() + hist.bytes() + slot_of.bytes() + pos.bytes() + first_pos.bytes() + slot_id.bytes() + count.bytes() + aux.bytes() +
           sort_k.bytes() + sort_v.bytes() + sort_k2.bytes() + sort_v2.bytes() + floats.bytes() + bitmap.bytes() + part.bytes() + prefix.bytes();
  }
};

Dedup::Dedup(const int64_t* ids, int64_t n) : s_(ScratchPool<DedupScratch>::acquire()), n_(n) {
  const size_t m = static_cast<size_t>(std::max<int64_t>(n, 1));
  slot_of_ = s_->slot_of.get(m);
  pos_ = s_->pos.get(m);
  first_pos_ = s_->first_pos.get(m);
  slot_id_ = s_->slot_id.get(m);
  slot_aux_ = s_->aux.get(m);
  count_ = s_->count.get(m);
  part_of_pos_ = s_->part.get(m);
  follow_load();
  // The loops below test a local: reading the member inside OpenMP's outlined loops made the
  // one-thread path of small batches slower.
  const bool parallel = n >= kParallelMin && omp_get_max_threads() > 1;
  parallel_ = parallel;
  int part_bits = 0;
  while (part_bits < 8 && (int64_t{kIdsPerPart} << part_bits) < n) ++part_bits;
  const int P = 1 << part_bits;
  parts_ = P;

  // 1. Stable counting sort of positions by partition. Large batches: C contiguous chunks of
  // ids counted and scattered in parallel, each chunk into its own sub-range of every
  // partition (chunk c's positions before chunk c+1's, so partitions stay in order).
  int64_t* begin = part_begin_;
  const int C = static_cast<int>(std::min<int64_t>(kMaxChunks, std::max<int64_t>(1, n / kIdsPerChunk)));
  int64_t* hist = s_->hist.get(static_cast<size_t>(C) * P);
  std::fill(hist, hist + static_cast<size_t>(C) * P, 0);
  const int64_t per_chunk = (n + C - 1) / C;
#pragma omp parallel for schedule(static, 1) if (parallel && C > 1)
  for (int c = 0; c < C; ++c) {
    int64_t* h = hist + static_cast<size_t>(c) * P;
    for (int64_t i = c * per_chunk, e = std::min(n, i + per_chunk); i < e; ++i) {
      const int q = part_of(ids[i], part_bits);
      part_of_pos_[i] = static_cast<uint8_t>(q);
      ++h[q];
    }
  }
  int64_t seg_begin[kMaxParts + 1];
  int seg_bits[kMaxParts];
  seg_begin[0] = 0;
  int64_t at = 0;
  for (int p = 0; p < P; ++p) {
    begin[p] = at;
    for (int c = 0; c < C; ++c) {
      const int64_t k = hist[static_cast<size_t>(c) * P + p];
      hist[static_cast<size_t>(c) * P + p] = at;  // becomes chunk c's fill pointer in p
      at += k;
    }
    seg_bits[p] = std::max(4, ceil_log2(static_cast<uint64_t>(2 * (at - begin[p]))));
    seg_begin[p + 1] = seg_begin[p] + (int64_t{1} << seg_bits[p]);
  }
  begin[P] = at;
#pragma omp parallel for schedule(static, 1) if (parallel && C > 1)
  for (int c = 0; c < C; ++c) {
    int64_t* fill = hist + static_cast<size_t>(c) * P;
    for (int64_t i = c * per_chunk, e = std::min(n, i + per_chunk); i < e; ++i) pos_[fill[part_of_pos_[i]]++] = i;
  }
  Entry* const table = s_->table.get(static_cast<size_t>(seg_begin[P]));
  int64_t lo_id[kMaxParts], hi_id[kMaxParts];

  // 2. Per partition, one pass over its positions in order: find or insert each id.
#pragma omp parallel for schedule(dynamic, 1) if (parallel && P > 1)
  for (int p = 0; p < P; ++p) {
    Entry* seg = table + seg_begin[p];
    const int bits = seg_bits[p];
    const uint64_t mask = (uint64_t{1} << bits) - 1;
    for (uint64_t k = 0; k <= mask; ++k) seg[k].slot = -1;
    const int64_t kb = begin[p], ke = begin[p + 1];
    int64_t next = kb, lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t k = kb; k < ke; ++k) {
      if (k + kProbeAhead < ke) __builtin_prefetch(seg + (hash_id(ids[pos_[k + kProbeAhead]]) >> (64 - bits)), 1, 3);
      const int64_t i = pos_[k];
      const int64_t id = ids[i];
      uint64_t j = hash_id(id) >> (64 - bits);
      for (;;) {
        Entry& e = seg[j];
        if (e.slot < 0) {
          e.key = id;
          e.slot = next;
          slot_id_[next] = id;
          first_pos_[next] = i;
          count_[next] = 1;
          slot_of_[i] = next++;
          lo = std::min(lo, id);
          hi = std::max(hi, id);
          break;
        }
        if (e.key == id) {
          slot_of_[i] = e.slot;
          ++count_[e.slot];
          break;
        }
        j = (j + 1) & mask;
      }
    }
    part_unique_[p] = next - kb;
    lo_id[p] = lo;
    hi_id[p] = hi;
  }
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int p = 0; p < P; ++p) {
    num_unique_ += part_unique_[p];
    if (part_unique_[p] > 0) {
      lo = std::min(lo, lo_id[p]);
      hi = std::max(hi, hi_id[p]);
    }
  }
  min_id_ = num_unique_ ? lo : 0;
  max_id_ = num_unique_ ? hi : 0;
}

Dedup::~Dedup() { ScratchPool<DedupScratch>::release(s_); }

float* Dedup::float_buffer(int64_t floats) { return s_->floats.get(static_cast<size_t>(std::max<int64_t>(floats, 1))); }

namespace {
// LSD radix sort of distinct keys key[0..m) (with their values) over their low `bits` bits,
// 8 bits a pass through kt/vt; the result ends in key/val.
void radix_sort(uint64_t* key, int64_t* val, uint64_t* kt, int64_t* vt, int64_t m, int bits, int radix) {
  const int buckets = 1 << radix;
  std::vector<int64_t> cnt(buckets);
  uint64_t *k0 = key, *k1 = kt;
  int64_t *v0 = val, *v1 = vt;
  for (int shift = 0; shift < bits; shift += radix) {
    std::fill(cnt.begin(), cnt.end(), 0);
    for (int64_t i = 0; i < m; ++i) ++cnt[(k0[i] >> shift) & (buckets - 1)];
    int64_t sum = 0;
    for (auto& c : cnt) {
      const int64_t c0 = c;
      c = sum;
      sum += c0;
    }
    for (int64_t i = 0; i < m; ++i) {
      const int64_t d = cnt[(k0[i] >> shift) & (buckets - 1)]++;
      k1[d] = k0[i];
      v1[d] = v0[i];
    }
    std::swap(k0, k1);
    std::swap(v0, v1);
  }
  if (k0 != key) {
    std::copy(k0, k0 + m, key);
    std::copy(v0, v0 + m, val);
  }
}

void small_sort(uint64_t* key, int64_t* val, int64_t m) {
  std::vector<std::pair<uint64_t, int64_t>> v(m);
  for (int64_t i = 0; i < m; ++i) v[i] = {key[i], val[i]};
  std::sort(v.begin(), v.end());  // keys are distinct
  for (int64_t i = 0; i < m; ++i) {
    key[i] = v[i].first;
    val[i] = v[i].second;
  }
}
}  // namespace

void Dedup::sort_unique(int64_t* sorted_ids, int64_t* rank) {
  const int64_t u = num_unique_;
  if (u == 0) return;
  uint64_t* key = reinterpret_cast<uint64_t*>(s_->sort_k.get(u));
  int64_t* val = s_->sort_v.get(u);
  uint64_t* kt = reinterpret_cast<uint64_t*>(s_->sort_k2.get(u));
  int64_t* vt = s_->sort_v2.get(u);
  const uint64_t base = static_cast<uint64_t>(min_id_);  // keys biased: the span decides the passes
  const uint64_t span = static_cast<uint64_t>(max_id_) - base;
  const int bits = span == 0 ? 0 : 64 - __builtin_clzll(span);
  const int P = parts_;
  const uint64_t words = (span >> 6) + 1;
  if (words <= static_cast<uint64_t>(kBitmapWordsPerId * u + 64)) {
    // Dense enough id range (e.g. 95k unique ids out of 1M: 16k words = 128 KB, L2-resident):
    // no comparison or radix sort at all. A bitmap over [min, max] marks the ids; the set
    // bits read in order are the sorted ids, and an id's rank is the set bits before it
    // (popcount prefix per word plus the bits below it in its word).
    uint64_t* bm = s_->bitmap.get(words);
    int64_t* pre = s_->prefix.get(words);
    std::fill(bm, bm + words, 0);
    for (int p = 0; p < P; ++p) {
      for (int64_t g = part_begin_[p], e = g + part_unique_[p]; g < e; ++g) {
        const uint64_t kk = static_cast<uint64_t>(slot_id_[g]) - base;
        bm[kk >> 6] |= uint64_t{1} << (kk & 63);
      }
    }
    int64_t r = 0;
    for (uint64_t w = 0; w < words; ++w) {
      pre[w] = r;
      for (uint64_t x = bm[w]; x != 0; x &= x - 1) {
        sorted_ids[r++] = static_cast<int64_t>(base + (w << 6) + static_cast<uint64_t>(__builtin_ctzll(x)));
      }
    }
#pragma omp parallel for schedule(dynamic, 4) if (parallel_ && u >= kParallelSortMin)
    for (int p = 0; p < P; ++p) {
      for (int64_t g = part_begin_[p], e = g + part_unique_[p]; g < e; ++g) {
        const uint64_t kk = static_cast<uint64_t>(slot_id_[g]) - base;
        const uint64_t below = bm[kk >> 6] & ((uint64_t{1} << (kk & 63)) - 1);
        rank[g] = pre[kk >> 6] + __builtin_popcountll(below);
      }
    }
    return;
  }
  if (!parallel_ || u < kParallelSortMin || P == 1 || bits <= kBucketBits) {
    int64_t k = 0;
    for (int p = 0; p < P; ++p) {
      for (int64_t g = part_begin_[p], e = g + part_unique_[p]; g < e; ++g, ++k) {
        key[k] = static_cast<uint64_t>(slot_id_[g]) - base;
        val[k] = g;
      }
    }
    if (u < 512) {
      small_sort(key, val, u);
    } else {
      radix_sort(key, val, kt, vt, u, bits, 11);
    }
    for (int64_t r = 0; r < u; ++r) {
      sorted_ids[r] = static_cast<int64_t>(key[r] + base);
      rank[val[r]] = r;
    }
    return;
  }
  // Parallel: bucket b holds the keys whose top kBucketBits bits (of `bits`) are b, so the
  // buckets are already in order; each partition's unique ids are counted and scattered per
  // bucket (partition-major offsets inside a bucket), then every bucket is sorted alone.
  constexpr int B = 1 << kBucketBits;
  const int shift = bits - kBucketBits;
  int64_t* h = s_->hist.get(static_cast<size_t>(P) * B);
  std::fill(h, h + static_cast<size_t>(P) * B, 0);
#pragma omp parallel for schedule(dynamic, 4)
  for (int p = 0; p < P; ++p) {
    int64_t* hp = h + static_cast<size_t>(p) * B;
    for (int64_t g = part_begin_[p], e = g + part_unique_[p]; g < e; ++g)
      ++hp[(static_cast<uint64_t>(slot_id_[g]) - base) >> shift];
  }
  int64_t bucket_begin[B + 1];
  int64_t at = 0;
  for (int b = 0; b < B; ++b) {
    bucket_begin[b] = at;
    for (int p = 0; p < P; ++p) {
      const int64_t c = h[static_cast<size_t>(p) * B + b];
      h[static_cast<size_t>(p) * B + b] = at;
      at += c;
    }
  }
  bucket_begin[B] = at;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 4)
    for (int p = 0; p < P; ++p) {
      int64_t* hp = h + static_cast<size_t>(p) * B;
      for (int64_t g = part_begin_[p], e = g + part_unique_[p]; g < e; ++g) {
        const uint64_t kk = static_cast<uint64_t>(slot_id_[g]) - base;
        const int64_t d = hp[kk >> shift]++;
        key[d] = kk;
        val[d] = g;
      }
    }
    // implicit barrier: all keys are in their buckets
#pragma omp for schedule(dynamic, 1)
    for (int b = 0; b < B; ++b) {
      const int64_t lo = bucket_begin[b], m = bucket_begin[b + 1] - lo;
      if (m < 256) {
        small_sort(key + lo, val + lo, m);
      } else {
        radix_sort(key + lo, val + lo, kt + lo, vt + lo, m, shift, 8);
      }
      for (int64_t r = lo; r < lo + m; ++r) {
        sorted_ids[r] = static_cast<int64_t>(key[r] + base);
        rank[val[r]] = r;
      }
    }
  }
}

}  // namespace cpu
}  // namespace edl
