#include "tensor_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "atomic_file.h"

namespace etlab {
namespace {

constexpr char kMagic[8] = {'E', 'T', 'L', 'T', 'E', 'N', 'S', '1'};
constexpr size_t kMaxDims = 64;

// Little-endian helpers that do not depend on the host byte order.
template <typename T>
T load_le(const uint8_t* bytes) {
  using U = std::make_unsigned_t<T>;
  U value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<U>(static_cast<U>(bytes[i]) << (8 * i));
  return static_cast<T>(value);
}

template <typename T>
void store_le(std::string& out, T value) {
  using U = std::make_unsigned_t<T>;
  const auto bits = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

class Reader {
 public:
  Reader(const std::string& path, const std::vector<uint8_t>& bytes) : path_(path), bytes_(bytes) {}

  template <typename T>
  T take() {
    need(sizeof(T));
    const T value = load_le<T>(bytes_.data() + offset_);
    offset_ += sizeof(T);
    return value;
  }

  const uint8_t* take_bytes(uint64_t count, const std::string& what) {
    if (count > bytes_.size() - offset_) throw TensorFileError("tensor file " + path_ + ": " + what + " truncated");
    const uint8_t* start = bytes_.data() + offset_;
    offset_ += static_cast<size_t>(count);
    return start;
  }

 private:
  void need(size_t count) const {
    if (count > bytes_.size() - offset_) {
      throw TensorFileError("tensor file " + path_ + ": truncated at byte " + std::to_string(offset_));
    }
  }

  const std::string& path_;
  const std::vector<uint8_t>& bytes_;
  size_t offset_ = 0;
};

}  // namespace

int64_t NamedTensor::numel() const {
  int64_t count = 1;
  for (const int64_t dim : dims) count *= dim;
  return count;
}

size_t dtype_element_size(uint8_t code) {
  switch (code) {
    case 0:  // uint8
    case 1:  // int8
    case 11:  // bool
      return 1;
    case 2:  // int16
    case 5:  // float16
      return 2;
    case 3:  // int32
    case 6:  // float32
      return 4;
    case 4:  // int64
    case 7:  // float64
      return 8;
    default:
      return 0;
  }
}

std::string dtype_name(uint8_t code) {
  switch (code) {
    case 0: return "uint8";
    case 1: return "int8";
    case 2: return "int16";
    case 3: return "int32";
    case 4: return "int64";
    case 5: return "float16";
    case 6: return "float32";
    case 7: return "float64";
    case 11: return "bool";
    default: return "dtype code " + std::to_string(code);
  }
}

std::string format_dims(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << ']';
  return out.str();
}

std::vector<NamedTensor> read_tensor_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TensorFileError("cannot read tensor file " + path + ": " + std::strerror(errno));
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw TensorFileError("cannot read tensor file " + path);
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    throw TensorFileError("tensor file " + path + ": not an ETLT file (bad magic)");
  }
  Reader reader(path, bytes);
  reader.take_bytes(sizeof(kMagic), "magic");
  const auto count = reader.take<uint32_t>();
  std::vector<NamedTensor> tensors;
  for (uint32_t index = 0; index < count; ++index) {
    NamedTensor tensor;
    const auto name_len = reader.take<uint16_t>();
    const uint8_t* name = reader.take_bytes(name_len, "tensor " + std::to_string(index) + " name");
    tensor.name.assign(reinterpret_cast<const char*>(name), name_len);
    tensor.dtype = reader.take<uint8_t>();
    if (dtype_element_size(tensor.dtype) == 0) {
      throw TensorFileError("tensor file " + path + ": tensor " + std::to_string(index) + " has unknown dtype code " +
                            std::to_string(tensor.dtype));
    }
    const auto ndim = reader.take<uint8_t>();
    if (ndim > kMaxDims) {
      throw TensorFileError("tensor file " + path + ": tensor '" + tensor.name + "' has too many dims");
    }
    for (uint8_t d = 0; d < ndim; ++d) {
      const auto dim = reader.take<int64_t>();
      if (dim < 0 || dim > std::numeric_limits<int32_t>::max()) {
        throw TensorFileError("tensor file " + path + ": tensor '" + tensor.name + "' has invalid dim " +
                              std::to_string(dim));
      }
      tensor.dims.push_back(dim);
    }
    const auto nbytes = reader.take<uint64_t>();
    const uint8_t* data = reader.take_bytes(nbytes, "tensor '" + tensor.name + "'");
    const size_t element = dtype_element_size(tensor.dtype);
    int64_t numel = 1;
    bool overflow = false;
    for (const int64_t dim : tensor.dims) overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
    if (overflow || nbytes % element != 0 || numel != static_cast<int64_t>(nbytes / element)) {
      throw TensorFileError("tensor file " + path + ": tensor '" + tensor.name + "' has " + std::to_string(nbytes) +
                            " bytes for shape " + format_dims(tensor.dims));
    }
    tensor.data.assign(data, data + nbytes);
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

void write_tensor_file(const std::string& path, const std::vector<NamedTensor>& tensors) {
  std::string out(kMagic, sizeof(kMagic));
  store_le<uint32_t>(out, static_cast<uint32_t>(tensors.size()));
  for (const NamedTensor& tensor : tensors) {
    store_le<uint16_t>(out, static_cast<uint16_t>(tensor.name.size()));
    out += tensor.name;
    store_le<uint8_t>(out, tensor.dtype);
    store_le<uint8_t>(out, static_cast<uint8_t>(tensor.dims.size()));
    for (const int64_t dim : tensor.dims) store_le<int64_t>(out, dim);
    store_le<uint64_t>(out, tensor.data.size());
    out.append(reinterpret_cast<const char*>(tensor.data.data()), tensor.data.size());
  }
  write_file_atomically(path, out);
}

}  // namespace etlab
