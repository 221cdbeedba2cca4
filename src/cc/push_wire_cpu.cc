#include "push_wire_cpu.h"

#include <cstring>

namespace edl::wire {
namespace {

// Field numbers of protos/elasticdl (push_wire_test.py checks every one through protobuf).
constexpr uint64_t kGradients = 1;             // PushGradientsRequest.gradients
constexpr uint64_t kDense = 3, kTables = 4;    // Model.dense_parameters, Model.embedding_tables
constexpr uint64_t kValues = 1, kIndices = 2;  // IndexedSlices
constexpr uint64_t kKey = 1, kValue = 2;       // every map entry
constexpr uint64_t kDtype = 1, kShape = 2, kContent = 3;  // Tensor
constexpr int kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5;

// ------------------------------------------------------------------ writing
int64_t varint_size(uint64_t v) {
  int64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

char* put_varint(char* out, uint64_t v) {
  while (v >= 0x80) {
    *out++ = static_cast<char>(v & 0x7F | 0x80);
    v >>= 7;
  }
  *out++ = static_cast<char>(v);
  return out;
}

int64_t field_size(uint64_t number, int64_t body) {  // tag, length and body of a LEN field
  return varint_size(number << 3 | kLen) + varint_size(static_cast<uint64_t>(body)) + body;
}

char* put_head(char* out, uint64_t number, int64_t body) {
  out = put_varint(out, number << 3 | kLen);
  return put_varint(out, static_cast<uint64_t>(body));
}

int64_t shape_body(const TensorOut& t) {
  int64_t n = 0;
  for (int64_t d : t.dims) n += varint_size(static_cast<uint64_t>(d));
  return n;
}

// As tensor_utils.ndarray_to_tensor_pieces lays a numeric Tensor out: the dtype, the packed
// shape when there is one, the content when it is not empty.
int64_t tensor_body(const TensorOut& t) {
  int64_t n = 1 + varint_size(static_cast<uint64_t>(t.dtype));
  if (!t.dims.empty()) n += field_size(kShape, shape_body(t));
  if (t.nbytes) n += field_size(kContent, t.nbytes);
  return n;
}

char* put_tensor(char* out, const TensorOut& t) {
  out = put_varint(out, kDtype << 3 | kVarint);
  out = put_varint(out, static_cast<uint64_t>(t.dtype));
  if (!t.dims.empty()) {
    out = put_head(out, kShape, shape_body(t));
    for (int64_t d : t.dims) out = put_varint(out, static_cast<uint64_t>(d));
  }
  if (t.nbytes) {
    out = put_head(out, kContent, t.nbytes);
    std::memcpy(out, t.data, static_cast<size_t>(t.nbytes));
    out += t.nbytes;
  }
  return out;
}

int64_t key_field(const EntryOut& e) { return field_size(kKey, static_cast<int64_t>(e.name.size())); }

char* put_key(char* out, const EntryOut& e) {
  out = put_head(out, kKey, static_cast<int64_t>(e.name.size()));
  std::memcpy(out, e.name.data(), e.name.size());
  return out + e.name.size();
}

int64_t slices_body(const EntryOut& e) {
  return field_size(kValues, tensor_body(e.values)) + field_size(kIndices, tensor_body(e.indices));
}

int64_t dense_entry_body(const EntryOut& e) { return key_field(e) + field_size(kValue, tensor_body(e.values)); }
int64_t table_entry_body(const EntryOut& e) { return key_field(e) + field_size(kValue, slices_body(e)); }

int64_t gradients_body(const std::vector<EntryOut>& dense, const std::vector<EntryOut>& tables) {
  int64_t n = 0;
  for (const auto& e : dense) n += field_size(kDense, dense_entry_body(e));
  for (const auto& e : tables) n += field_size(kTables, table_entry_body(e));
  return n;
}

}  // namespace

int64_t push_size(int64_t head_size, const std::vector<EntryOut>& dense, const std::vector<EntryOut>& tables) {
  if (dense.empty() && tables.empty()) return head_size;
  return head_size + field_size(kGradients, gradients_body(dense, tables));
}

void write_push(const char* head, int64_t head_size, const std::vector<EntryOut>& dense,
                const std::vector<EntryOut>& tables, char* out) {
  std::memcpy(out, head, static_cast<size_t>(head_size));
  out += head_size;
  if (dense.empty() && tables.empty()) return;
  out = put_head(out, kGradients, gradients_body(dense, tables));
  for (const auto& e : dense) {
    out = put_head(out, kDense, dense_entry_body(e));
    out = put_key(out, e);
    out = put_head(out, kValue, tensor_body(e.values));
    out = put_tensor(out, e.values);
  }
  for (const auto& e : tables) {
    out = put_head(out, kTables, table_entry_body(e));
    out = put_key(out, e);
    out = put_head(out, kValue, slices_body(e));
    out = put_head(out, kValues, tensor_body(e.values));
    out = put_tensor(out, e.values);
    out = put_head(out, kIndices, tensor_body(e.indices));
    out = put_tensor(out, e.indices);
  }
}

// ------------------------------------------------------------------ reading
namespace {

// A varint of data[*pos, end); false past `end` or over 64 bits.
bool get_varint(const uint8_t* data, int64_t end, int64_t* pos, uint64_t* value) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= end) return false;
    const uint8_t byte = data[(*pos)++];
    if (shift == 63 && byte > 1) return false;
    v |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if (!(byte & 0x80)) {
      *value = v;
      return true;
    }
  }
  return false;
}

struct Field {
  uint64_t number = 0;
  int wire = 0;
  int64_t field_start = 0, start = 0, end = 0;  // tag, value, value end
};

// The fields of data[pos, end) one by one, as push_wire._fields reads them.
class Fields {
 public:
  Fields(const uint8_t* data, int64_t start, int64_t end) : data_(data), pos_(start), end_(end) {}

  // True with the next field in `f`; false at the end (`ok()` true) or on bytes the fast path
  // does not read (`ok()` false).
  bool next(Field* f) {
    if (pos_ >= end_) return false;
    f->field_start = pos_;
    uint64_t key, value;
    if (!get_varint(data_, end_, &pos_, &key)) return fail();
    f->number = key >> 3;
    f->wire = static_cast<int>(key & 7);
    f->start = pos_;
    switch (f->wire) {
      case kVarint:
        if (!get_varint(data_, end_, &pos_, &value)) return fail();
        break;
      case kLen:
        if (!get_varint(data_, end_, &pos_, &value) || value > static_cast<uint64_t>(end_ - pos_)) return fail();
        f->start = pos_;
        pos_ += static_cast<int64_t>(value);
        break;
      case kFixed64:
        if (end_ - pos_ < 8) return fail();
        pos_ += 8;
        break;
      case kFixed32:
        if (end_ - pos_ < 4) return fail();
        pos_ += 4;
        break;
      default:
        return fail();
    }
    f->end = pos_;
    return true;
  }

  bool ok() const { return ok_; }

 private:
  bool fail() {
    ok_ = false;
    return false;
  }
  const uint8_t* data_;
  int64_t pos_, end_;
  bool ok_ = true;
};

// The spans of the two LEN fields `a` and `b` of data[start, end), each at most once and no
// other field (push_wire._once); a missing one keeps {0, 0} and sets its flag false.
bool once(const uint8_t* data, int64_t start, int64_t end, uint64_t a, uint64_t b, int64_t span_a[2],
          int64_t span_b[2], bool* has_a, bool* has_b) {
  *has_a = *has_b = false;
  Fields fields(data, start, end);
  Field f;
  while (fields.next(&f)) {
    if (f.wire != kLen) return false;
    if (f.number == a && !*has_a) {
      *has_a = true;
      span_a[0] = f.start;
      span_a[1] = f.end;
    } else if (f.number == b && !*has_b) {
      *has_b = true;
      span_b[0] = f.start;
      span_b[1] = f.end;
    } else {
      return false;
    }
  }
  return fields.ok();
}

// A Tensor read field by field in any order, as protobuf merges one: the last dtype and content
// win, shapes (packed or not) add up. False for a string Tensor or a negative dimension, which
// Python reads (or refuses) itself.
bool read_tensor(const uint8_t* data, int64_t start, int64_t end, int64_t string_dtype, TensorSpan* t) {
  uint64_t dtype = 0;
  t->dims.clear();
  t->start = t->end = 0;
  Fields fields(data, start, end);
  Field f;
  while (fields.next(&f)) {
    if (f.wire == kVarint && (f.number == kDtype || f.number == kShape)) {
      int64_t pos = f.start;
      uint64_t v;
      get_varint(data, f.end, &pos, &v);
      if (f.number == kDtype) {
        dtype = v;
      } else {
        if (v >> 63) return false;
        t->dims.push_back(static_cast<int64_t>(v));
      }
    } else if (f.wire == kLen && f.number == kShape) {
      int64_t pos = f.start;
      while (pos < f.end) {
        uint64_t v;
        if (!get_varint(data, f.end, &pos, &v) || v >> 63) return false;
        t->dims.push_back(static_cast<int64_t>(v));
      }
    } else if (f.wire == kLen && f.number == kContent) {
      t->start = f.start;
      t->end = f.end;
    }
  }
  if (!fields.ok() || dtype > 0x7FFFFFFF || static_cast<int64_t>(dtype) == string_dtype) return false;
  t->dtype = static_cast<int64_t>(dtype);
  return true;
}

// A map entry's key span and value span (push_wire._entry).
bool read_entry(const uint8_t* data, int64_t start, int64_t end, EntrySpan* e, int64_t value[2]) {
  int64_t key[2] = {0, 0};
  bool has_key, has_value;
  if (!once(data, start, end, kKey, kValue, key, value, &has_key, &has_value) || !has_value) return false;
  e->name_start = key[0];
  e->name_end = key[1];
  return true;
}

bool read_table(const uint8_t* data, int64_t start, int64_t end, int64_t string_dtype, EntrySpan* e) {
  int64_t value[2], values[2], indices[2];
  bool has_values, has_indices;
  return read_entry(data, start, end, e, value) &&
         once(data, value[0], value[1], kValues, kIndices, values, indices, &has_values, &has_indices) &&
         has_values && has_indices && read_tensor(data, values[0], values[1], string_dtype, &e->values) &&
         read_tensor(data, indices[0], indices[1], string_dtype, &e->indices);
}

void append(std::string* out, const uint8_t* data, int64_t start, int64_t end) {
  out->append(reinterpret_cast<const char*>(data) + start, static_cast<size_t>(end - start));
}

}  // namespace

bool read_push(const uint8_t* data, int64_t size, int64_t string_dtype, DecodedLayout* out) {
  std::string model;  // the gradients' other fields (occurrences merge: concatenated)
  bool seen_gradients = false;
  Fields fields(data, 0, size);
  Field f;
  while (fields.next(&f)) {
    if (f.number != kGradients || f.wire != kLen) {
      append(&out->request, data, f.field_start, f.end);
      continue;
    }
    seen_gradients = true;
    Fields inner(data, f.start, f.end);
    Field g;
    while (inner.next(&g)) {
      if (g.number == kTables && g.wire == kLen) {
        EntrySpan e;
        if (!read_table(data, g.start, g.end, string_dtype, &e)) return false;
        out->tables.push_back(std::move(e));
      } else if (g.number == kDense && g.wire == kLen) {
        EntrySpan e;
        int64_t value[2];
        if (!read_entry(data, g.start, g.end, &e, value) ||
            !read_tensor(data, value[0], value[1], string_dtype, &e.values))
          return false;
        out->dense.push_back(std::move(e));
      } else {
        append(&model, data, g.field_start, g.end);
      }
    }
    if (!inner.ok()) return false;
  }
  if (!fields.ok()) return false;
  if (seen_gradients) {  // present (maybe empty), as protobuf would leave it
    char head[16];
    char* end = put_head(head, kGradients, static_cast<int64_t>(model.size()));
    out->request.append(head, end);
    out->request += model;
  }
  return true;
}

namespace {

// The first i with owner(ids[i]) != ps_id, or -1.
template <typename Owner>
int64_t first_foreign(const int64_t* ids, int64_t n, uint64_t ps_id, Owner owner) {
  for (int64_t i = 0; i < n; ++i)
    if (owner(static_cast<uint64_t>(ids[i])) != ps_id) return i;
  return -1;
}

}  // namespace

IdScan scan_ids(const int64_t* ids, int64_t n, int64_t num_ps, int64_t ps_id) {
  IdScan s;
  if (n == 0) return s;
  int64_t lo = ids[0], hi = ids[0];
  bool increasing = true;
  for (int64_t i = 1; i < n; ++i) {
    lo = ids[i] < lo ? ids[i] : lo;
    hi = ids[i] > hi ? ids[i] : hi;
    increasing &= ids[i] > ids[i - 1];
  }
  s.min = lo;
  s.increasing = increasing;
  if (num_ps > 1 && lo >= 0) {
    // A division per id costs more than the rest of the pass: a mask for a power of two, for
    // ids below 2^32 two multiplications (Lemire, Kaser, Kurz: "Faster remainder by direct
    // computation", 2019), a division only for larger ids.
    const uint64_t d = static_cast<uint64_t>(num_ps), want = static_cast<uint64_t>(ps_id);
    if ((d & (d - 1)) == 0) {
      s.first_foreign = first_foreign(ids, n, want, [d](uint64_t v) { return v & (d - 1); });
    } else if (static_cast<uint64_t>(hi) <= UINT32_MAX && d <= UINT32_MAX) {
      const uint64_t m = UINT64_MAX / d + 1;
      s.first_foreign = first_foreign(ids, n, want, [m, d](uint64_t v) {
        return static_cast<uint64_t>((static_cast<unsigned __int128>(m * v) * d) >> 64);
      });
    } else {
      s.first_foreign = first_foreign(ids, n, want, [d](uint64_t v) { return v % d; });
    }
  }
  return s;
}

}  // namespace edl::wire
