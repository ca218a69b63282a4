// ETLT tensor files, the same format as orchestrator/tensorfile.py (little-endian, no alignment):
//   magic "ETLTENS1", u32 count, then per tensor: u16 name_len, name, u8 dtype (ExecuTorch ScalarType code),
//   u8 ndim, i64 dims[ndim], u64 nbytes, data (C-contiguous).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace etlab {

struct NamedTensor {
  std::string name;
  uint8_t dtype = 0;  // ExecuTorch ScalarType code
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;

  int64_t numel() const;
};

class TensorFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bytes per element for a dtype code the format allows, 0 for any other code.
size_t dtype_element_size(uint8_t code);
// "float32", "int64", ...; "dtype code N" for a code the format does not allow.
std::string dtype_name(uint8_t code);
// "[1, 128]"
std::string format_dims(const std::vector<int64_t>& dims);

// Throws TensorFileError naming the file and what is wrong (missing, bad magic, truncated, unknown dtype).
std::vector<NamedTensor> read_tensor_file(const std::string& path);
// Writes to a temporary name in the same folder and renames it into place; throws IoError (atomic_file.h).
void write_tensor_file(const std::string& path, const std::vector<NamedTensor>& tensors);

}  // namespace etlab
