// A push's wire bytes (elasticdl/common/push_wire.py) written and read in one call each, and the
// PS's one-pass scan of a request's ids. The Python module stays the reference: the bytes
// written here are the ones it writes, and the reader answers only where the Python fast path
// would (anything else returns "not read" and Python decides).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace edl::wire {

// A numeric Tensor to write: its DataType, dimensions and C-contiguous little-endian bytes.
struct TensorOut {
  int64_t dtype = 0;
  std::vector<int64_t> dims;
  const char* data = nullptr;
  int64_t nbytes = 0;
};

struct EntryOut {  // a map entry: name -> Tensor (dense), or name -> IndexedSlices (tables)
  std::string name;
  TensorOut values;
  TensorOut indices;  // tables only
};

// Bytes of `head` (the request without these gradients, serialized) followed by one
// `gradients` field holding the dense entries, then the table entries, in order.
int64_t push_size(int64_t head_size, const std::vector<EntryOut>& dense, const std::vector<EntryOut>& tables);
void write_push(const char* head, int64_t head_size, const std::vector<EntryOut>& dense,
                const std::vector<EntryOut>& tables, char* out);

// Where a decoded Tensor lies in the input.
struct TensorSpan {
  int64_t dtype = 0;
  std::vector<int64_t> dims;
  int64_t start = 0, end = 0;
};

struct EntrySpan {
  int64_t name_start = 0, name_end = 0;
  TensorSpan values;
  TensorSpan indices;  // tables only
};

struct DecodedLayout {
  std::string request;  // the request's other fields, the gradients' other fields appended
  std::vector<EntrySpan> tables;
  std::vector<EntrySpan> dense;
};

// False where the Python fast path would not read `data` (or might read it otherwise): an
// unexpected field or wire type, a field past its message's end, a string or negative-size
// Tensor, a varint over 64 bits.
bool read_push(const uint8_t* data, int64_t size, int64_t string_dtype, DecodedLayout* out);

// One pass over a request's ids: the smallest, the position of the first one another PS owns
// (id % num_ps != ps_id; -1 when none) and whether they strictly increase.
struct IdScan {
  int64_t min = 0;
  int64_t first_foreign = -1;
  bool increasing = true;
};
IdScan scan_ids(const int64_t* ids, int64_t n, int64_t num_ps, int64_t ps_id);

}  // namespace edl::wire
