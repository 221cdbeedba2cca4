// Python bindings of the kernels (module `elasticdl_native`). Arrays travel as raw
// addresses (uintptr_t) plus sizes: the Python layer (elasticdl/ops) owns all checks of
// dtype/shape/layout and reads addresses from NumPy (`__array_interface__`) or GPU arrays
// (`__cuda_array_interface__`), so one binding serves host and device memory without copies.
// The GIL is released while kernels run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "dedup_cpu.h"
#include "id_map_cpu.h"
#include "init_cpu.h"
#include "kernels.h"
#include "range_rank_cpu.h"

namespace py = pybind11;

namespace edl::wire {
void bind(py::module_& m);  // push_wire_py.cc
}
using edl::OptParams;
using edl::OptSlots;

namespace {

constexpr int kAbiVersion = 7;  // 2: IdMap; 3: IdMap.items, IdMap.nbytes; 4: cpu_sparse_update_unique;
                                // 5: push_encode, push_decode, scan_ids,
                                // cpu_aggregate_increasing; 6: cpu_uniform01, cpu_uniform_scaled;
                                // 7: IdMap.resolve

template <typename T>
T* P(uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

OptParams make_params(int kind, float lr, float mu, bool nesterov, float b1, float b2, float eps, bool ams) {
  OptParams p;
  p.kind = kind;
  p.lr = lr;
  p.mu = mu;
  p.nesterov = nesterov;
  p.beta1 = b1;
  p.beta2 = b2;
  p.eps = eps;
  p.amsgrad = ams;
  return p;
}

OptSlots make_slots(uintptr_t s0, uintptr_t s1, uintptr_t s2) {
  return OptSlots{P<float>(s0), P<float>(s1), P<float>(s2)};
}

std::vector<const float*> ptr_list(const std::vector<uintptr_t>& v) {
  std::vector<const float*> out;
  out.reserve(v.size());
  for (auto a : v) out.push_back(P<const float>(a));
  return out;
}

// Registers the pointer-level kernels of one backend namespace under a prefix.
#define EDL_BIND_COMMON(m, prefix, NS)                                                                     \
  m.def(prefix "lookup",                                                                                   \
        [](uintptr_t table, int dtype, int64_t rows, int64_t dim, uintptr_t ids, int64_t n, uintptr_t out) { \
          py::gil_scoped_release nogil;                                                                    \
          return NS::lookup(P<const void>(table), dtype, rows, dim, P<const int64_t>(ids), n, P<void>(out)); \
        });                                                                                                \
  m.def(prefix "lookup_pooled",                                                                            \
        [](uintptr_t table, int dtype, int64_t rows, int64_t dim, uintptr_t ids, int64_t n, uintptr_t offs, \
           int64_t bags, uintptr_t weights, int combiner, uintptr_t out) {                                  \
          py::gil_scoped_release nogil;                                                                    \
          return NS::lookup_pooled(P<const void>(table), dtype, rows, dim, P<const int64_t>(ids), n,       \
                                   P<const int64_t>(offs), bags, P<const float>(weights), combiner,        \
                                   P<float>(out));                                                         \
        });                                                                                                \
  m.def(prefix "dense_accumulate",                                                                         \
        [](uintptr_t out, const std::vector<uintptr_t>& grads, int64_t n, float scale) {                   \
          auto g = ptr_list(grads);                                                                        \
          py::gil_scoped_release nogil;                                                                    \
          NS::dense_accumulate(P<float>(out), g.data(), static_cast<int>(g.size()), n, scale);             \
        });                                                                                                \
  m.def(prefix "dense_update",                                                                             \
        [](int kind, float lr, float mu, bool nesterov, float b1, float b2, float eps, bool ams,           \
           uintptr_t param, uintptr_t grad, uintptr_t s0, uintptr_t s1, uintptr_t s2, int64_t n) {         \
          const OptParams p = make_params(kind, lr, mu, nesterov, b1, b2, eps, ams);                       \
          py::gil_scoped_release nogil;                                                                    \
          NS::dense_update(p, P<float>(param), P<const float>(grad), make_slots(s0, s1, s2), n);           \
        });                                                                                                \
  m.def(prefix "sparse_update",                                                                            \
        [](int kind, float lr, float mu, bool nesterov, float b1, float b2, float eps, bool ams,           \
           uintptr_t table, int64_t rows, int64_t dim, uintptr_t ids, int64_t n, uintptr_t grads,          \
           uintptr_t s0, uintptr_t s1, uintptr_t s2) {                                                     \
          const OptParams p = make_params(kind, lr, mu, nesterov, b1, b2, eps, ams);                       \
          py::gil_scoped_release nogil;                                                                    \
          return NS::sparse_update(p, P<float>(table), rows, dim, P<const int64_t>(ids), n,                \
                                   P<const float>(grads), make_slots(s0, s1, s2));                         \
        });

// Result blocks of cpu_aggregate and pooled_bytes, reused once NumPy frees the arrays that
// viewed them. A fresh result pays a page fault per page (the kernel zeroes every page) before
// a byte is written; a PS that aggregates or looks up every step and drops the previous
// result then writes into pages that are already mapped. At most kPoolBlocks blocks /
// kPoolBytes are kept.
constexpr size_t kPoolBlocks = 4;
constexpr size_t kPoolBytes = size_t{1} << 30;
constexpr size_t kHuge = size_t{2} << 20;

struct Block {
  void* p;
  size_t cap;
};
std::mutex g_out_mu;
std::vector<Block> g_out_pool;

Block* get_block(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  {
    std::lock_guard<std::mutex> lock(g_out_mu);
    // Smallest pooled block that fits and wastes at most half of itself.
    int best = -1;
    for (size_t k = 0; k < g_out_pool.size(); ++k) {
      const size_t c = g_out_pool[k].cap;
      if (c >= bytes && c / 2 <= bytes && (best < 0 || c < g_out_pool[best].cap)) best = static_cast<int>(k);
    }
    if (best >= 0) {
      Block* b = new Block(g_out_pool[best]);
      g_out_pool.erase(g_out_pool.begin() + best);
      return b;
    }
  }
  // Large blocks: 2 MB aligned and sized, transparent huge pages asked for (fewer faults
  // and TLB misses); small ones: 64-byte aligned (rows are written with streaming stores).
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t cap = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, cap);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (align == kHuge) madvise(p, cap, MADV_HUGEPAGE);
#endif
  return new Block{p, cap};
}

void put_block(void* blk) {
  Block* b = static_cast<Block*>(blk);
  {
    std::lock_guard<std::mutex> lock(g_out_mu);
    size_t held = b->cap;
    for (const Block& x : g_out_pool) held += x.cap;
    if (g_out_pool.size() < kPoolBlocks && held <= kPoolBytes) {
      g_out_pool.push_back(*b);
      delete b;
      return;
    }
  }
  std::free(b->p);
  delete b;
}

// A new C-contiguous array over a pooled block; the block returns to the pool when the last
// array viewing it is freed.
template <typename T>
py::array_t<T> pooled_array(std::vector<py::ssize_t> shape) {
  size_t bytes = sizeof(T);
  for (py::ssize_t d : shape) bytes *= static_cast<size_t>(d);
  Block* blk = get_block(bytes);
  py::capsule owner(blk, [](void* b) { put_block(b); });
  return py::array_t<T>(std::move(shape), static_cast<T*>(blk->p), owner);
}

}  // namespace

PYBIND11_MODULE(elasticdl_native, m) {
  m.doc() = "ElasticDL PS kernels (C++/OpenMP, optional CUDA); use them through elasticdl.ops";
  m.attr("ABI_VERSION") = kAbiVersion;
  m.attr("CUDA_SUM_CHUNK") = edl::kCudaSumChunk;
  m.def("num_threads", &edl::cpu::num_threads);
  m.def("team_threads", &edl::cpu::team_threads);

  EDL_BIND_COMMON(m, "cpu_", edl::cpu)
  edl::wire::bind(m);
  // sparse_update for ids the caller guarantees unique (kernels.h); CPU only.
  m.def("cpu_sparse_update_unique",
        [](int kind, float lr, float mu, bool nesterov, float b1, float b2, float eps, bool ams, uintptr_t table,
           int64_t rows, int64_t dim, uintptr_t ids, int64_t n, uintptr_t grads, uintptr_t s0, uintptr_t s1,
           uintptr_t s2) {
          const OptParams p = make_params(kind, lr, mu, nesterov, b1, b2, eps, ams);
          py::gil_scoped_release nogil;
          return edl::cpu::sparse_update_unique(p, P<float>(table), rows, dim, P<const int64_t>(ids), n,
                                                P<const float>(grads), make_slots(s0, s1, s2));
        });

  // CPU aggregation: rank the ids first (GIL released) -- by bitmaps when they lie in a narrow
  // range, else by hashing -- then allocate the outputs once the unique count is known, then
  // sum into them.
  m.def("cpu_aggregate", [](uintptr_t ids, int64_t n, uintptr_t grads, int64_t dim) {
    std::unique_ptr<edl::cpu::RangeRank> ranks;
    std::unique_ptr<edl::cpu::Dedup> d;
    {
      py::gil_scoped_release nogil;
      ranks = edl::cpu::RangeRank::build(P<const int64_t>(ids), n);
      if (!ranks) d = std::make_unique<edl::cpu::Dedup>(P<const int64_t>(ids), n);
    }
    const int64_t u = ranks ? ranks->num_unique() : d->num_unique();
    py::array_t<int64_t> out_ids(u);
    // Rows start on a 64-byte boundary, so the kernel can write whole lines with streaming stores.
    py::array_t<float> out = pooled_array<float>({u, dim});
    float* og = out.mutable_data();
    int64_t* oi = out_ids.mutable_data();
    {
      py::gil_scoped_release nogil;
      if (ranks) {
        edl::cpu::aggregate_rows(*ranks, P<const float>(grads), dim, oi, og);
      } else {
        edl::cpu::aggregate_rows(*d, P<const float>(grads), dim, oi, og);
      }
      ranks.reset();  // hand the scratch back to the pools
      d.reset();
    }
    return py::make_tuple(out_ids, out);
  });
  // cpu_aggregate's answer for ids that strictly increase (each id once, already in order):
  // the ids and the rows (plus 0, as the sum writes a -0.0 row) without ranking them; None
  // when the ids do not, found by a pass that stops at the first id not above the one before.
  m.def("cpu_aggregate_increasing", [](uintptr_t ids, int64_t n, uintptr_t grads, int64_t dim) -> py::object {
    const int64_t* in = P<const int64_t>(ids);
    bool increasing = true;
    {
      py::gil_scoped_release nogil;
      for (int64_t i = 1; i < n && increasing; ++i) increasing = in[i] > in[i - 1];
    }
    if (!increasing) return py::none();
    py::array_t<int64_t> out_ids(n);
    py::array_t<float> out = pooled_array<float>({n, dim});
    int64_t* oi = out_ids.mutable_data();
    float* og = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      std::copy(in, in + n, oi);
      const float* g = P<const float>(grads);
      for (int64_t i = 0; i < n * dim; ++i) og[i] = 0.0f + g[i];
    }
    return py::make_tuple(out_ids, out);
  });
  // Which ranking cpu_aggregate uses for these ids ("range" or "hash"); for tests.
  m.def("cpu_aggregate_method", [](uintptr_t ids, int64_t n) {
    return edl::cpu::RangeRank::build(P<const int64_t>(ids), n) ? "range" : "hash";
  });

  // A 1-D uint8 array of `nbytes` in a pooled block (64-byte aligned; 2 MB pages when large),
  // handed back to the pool when the last array viewing it is freed: results that are made
  // and dropped every step (lookups) then skip the page faults of fresh memory.
  m.def("pooled_bytes", [](int64_t nbytes) {
    if (nbytes < 0) throw py::value_error("pooled_bytes: nbytes must be >= 0");
    return pooled_array<uint8_t>({nbytes});
  });

  // The embedding tables' id -> row map (elasticdl/ps/id_index.py).
  using IdArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

  // Initial values of new embedding rows (init_cpu.h; elasticdl/ops/counter_rng.py): a new
  // float32 (len(ids), dim) array each.
  m.def(
      "cpu_uniform01",
      [](uint64_t seed, IdArray ids, int64_t dim, uint64_t stream) {
        if (dim < 0) throw py::value_error("cpu_uniform01: dim must be >= 0");
        const int64_t n = ids.size();
        py::array_t<float> out({n, dim});
        const int64_t* in = ids.data();
        float* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          edl::cpu::uniform01(seed, in, n, dim, stream, o);
        }
        return out;
      },
      "Counter-based uniforms in [0, 1) of (seed, id, column, stream).");
  m.def(
      "cpu_uniform_scaled",
      [](uint64_t seed, IdArray ids, int64_t dim, double limit, bool limit_in_double) {
        if (dim < 0) throw py::value_error("cpu_uniform_scaled: dim must be >= 0");
        const int64_t n = ids.size();
        py::array_t<float> out({n, dim});
        const int64_t* in = ids.data();
        float* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          edl::cpu::uniform_scaled(seed, in, n, dim, limit, limit_in_double, o);
        }
        return out;
      },
      "(2u - 1) * limit of stream 0's uniforms, the product in float32 or (limit_in_double) double.");
  py::class_<edl::cpu::IdMap>(m, "IdMap")
      .def(py::init<int64_t>(), py::arg("capacity") = 1024)
      .def("__len__", &edl::cpu::IdMap::size)
      .def_property_readonly("capacity", &edl::cpu::IdMap::capacity)
      .def_property_readonly("nbytes", &edl::cpu::IdMap::bytes)
      .def("items",
           [](const edl::cpu::IdMap& map) {
             // The size only grows: ids inserted meanwhile may be left out, never overrun.
             const int64_t n = map.size();
             IdArray ids(n), rows(n);
             int64_t* i = ids.mutable_data();
             int64_t* r = rows.mutable_data();
             {
               py::gil_scoped_release nogil;
               map.items(i, r, n);
             }
             return py::make_tuple(ids, rows);
           })
      .def("lookup",
           [](const edl::cpu::IdMap& map, IdArray ids) {
             const int64_t n = ids.size();
             IdArray rows(n);
             const int64_t* in = ids.data();
             int64_t* out = rows.mutable_data();
             {
               py::gil_scoped_release nogil;
               map.lookup(in, n, out);
             }
             return rows;
           })
      .def(
          "resolve",
          [](const edl::cpu::IdMap& map, py::object direct, IdArray ids, int64_t next_row) {
            // `direct`: the table's direct index (int64, -1 where absent) or None. Cast without a
            // copy when it is already a contiguous int64 array, as the table keeps it.
            IdArray index = direct.is_none() ? IdArray(0) : direct.cast<IdArray>();
            const int64_t n = ids.size();
            IdArray rows(n);
            std::vector<int64_t> new_ids;
            const int64_t* d = index.data();
            const int64_t* in = ids.data();
            int64_t* out = rows.mutable_data();
            {
              py::gil_scoped_release nogil;
              map.resolve(d, index.size(), in, n, next_row, out, &new_ids);
            }
            return py::make_tuple(rows, IdArray(static_cast<py::ssize_t>(new_ids.size()), new_ids.data()));
          },
          py::arg("direct"), py::arg("ids"), py::arg("next_row"),
          "(rows, new_ids): each id's row from the direct index (ids below its length) or the map; absent "
          "ids get next_row + their rank among the distinct absent ids by first appearance, new_ids in that "
          "order. Inserts nothing.")
      .def("insert", [](edl::cpu::IdMap& map, IdArray ids, IdArray rows) {
        if (ids.size() != rows.size()) throw py::value_error("IdMap.insert: ids and rows differ in length");
        const int64_t* r = rows.data();
        if (std::any_of(r, r + rows.size(), [](int64_t x) { return x < 0; }))
          throw py::value_error("IdMap.insert: rows must be >= 0");
        const int64_t* i = ids.data();
        py::gil_scoped_release nogil;
        map.insert(i, r, ids.size());
      });

#ifdef EDL_WITH_CUDA
  m.def("has_cuda", [] { return true; });
  m.def("cuda_device_count", &edl::cuda::device_count);
  m.def("cuda_archs", &edl::cuda::compiled_archs,
        "compute capabilities x 10 the CUDA kernels were compiled for, e.g. [800, 900]");
  m.def("cuda_runtime_version", &edl::cuda::runtime_version);
  EDL_BIND_COMMON(m, "cuda_", edl::cuda)
  m.def("cuda_aggregate",
        [](uintptr_t ids, int64_t n, uintptr_t grads, int64_t dim, uintptr_t out_ids, uintptr_t out) {
          py::gil_scoped_release nogil;
          return edl::cuda::aggregate(P<const int64_t>(ids), n, P<const float>(grads), dim,
                                      P<int64_t>(out_ids), P<float>(out));
        });
#else
  m.def("has_cuda", [] { return false; });
  m.def("cuda_device_count", [] { return 0; });
  m.def("cuda_archs", [] { return std::vector<int>{}; });
  m.def("cuda_runtime_version", [] { return 0; });
#endif
}
