#include "program_constants.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace etlab {
namespace {

// Field ids of exir/_serialize/program.fbs (ET12): a field's id is its position in the table.
constexpr unsigned kProgramConstantBuffer = 2;
constexpr unsigned kProgramSegments = 4;
constexpr unsigned kProgramConstantSegment = 5;
constexpr unsigned kBufferStorage = 0;
constexpr unsigned kDataSegmentOffset = 0;
constexpr unsigned kDataSegmentSize = 1;
constexpr unsigned kSubsegmentSegmentIndex = 0;
constexpr unsigned kSubsegmentOffsets = 1;

constexpr size_t kHeadBytes = 64;             // as much of the head as ExecuTorch reads for the headers
constexpr uint32_t kExtendedHeaderMinimum = 24;  // magic, length, program size, segment base offset

// Reads little-endian values with pread from [0, limit) of a file; never past it, never more than asked.
class Region {
 public:
  Region(int fd, uint64_t limit) : fd_(fd), limit_(limit) {}

  uint64_t limit() const { return limit_; }

  bool bytes(uint64_t offset, uint8_t* out, size_t count) const {
    if (offset > limit_ || count > limit_ - offset) return false;
    if (limit_ > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) return false;  // a 32-bit off_t
    size_t done = 0;
    while (done < count) {
      const ssize_t got = pread(fd_, out + done, count - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;  // an error, or the file shrank under us
      done += static_cast<size_t>(got);
    }
    return true;
  }

  template <typename T>
  bool value(uint64_t offset, T& out) const {
    uint8_t raw[sizeof(T)];
    if (!bytes(offset, raw, sizeof(T))) return false;
    uint64_t assembled = 0;
    for (size_t i = 0; i < sizeof(T); ++i) assembled |= static_cast<uint64_t>(raw[i]) << (8 * i);
    out = static_cast<T>(assembled);
    return true;
  }

  // The position of field `id` of the table at `table`, 0 when the table does not have it.
  bool field(uint64_t table, unsigned id, uint64_t& at) const {
    uint32_t back = 0;
    if (!value(table, back)) return false;
    const int64_t vtable = static_cast<int64_t>(table) - static_cast<int64_t>(static_cast<int32_t>(back));
    uint16_t vtable_size = 0;
    uint16_t table_size = 0;
    if (vtable < 0 || !value(static_cast<uint64_t>(vtable), vtable_size) ||
        !value(static_cast<uint64_t>(vtable) + 2, table_size) || vtable_size < 4 || vtable_size % 2 != 0) {
      return false;
    }
    const uint64_t slot = 4 + 2 * static_cast<uint64_t>(id);
    if (slot + 2 > vtable_size) {
      at = 0;  // written by an older schema: the field is absent
      return true;
    }
    uint16_t offset = 0;
    if (!value(static_cast<uint64_t>(vtable) + slot, offset) || (offset != 0 && offset >= table_size)) return false;
    at = offset == 0 ? 0 : table + offset;
    return true;
  }

  // Follows the uoffset stored at `at` (a table or vector reference).
  bool follow(uint64_t at, uint64_t& target) const {
    uint32_t relative = 0;
    if (!value(at, relative)) return false;
    target = at + relative;
    return target < limit_;
  }

  // A vector's length, checked to fit in the region with elements of `width` bytes; `first` is element 0.
  bool vector(uint64_t at, uint64_t width, uint64_t& length, uint64_t& first) const {
    uint64_t start = 0;
    uint32_t count = 0;
    if (!follow(at, start) || !value(start, count)) return false;
    first = start + 4;
    if (first > limit_ || static_cast<uint64_t>(count) * width > limit_ - first) return false;
    length = count;
    return true;
  }

  // The table at element `index` of a vector of tables.
  bool table_at(uint64_t first, uint64_t index, uint64_t& table) const { return follow(first + 4 * index, table); }

 private:
  int fd_;
  uint64_t limit_;
};

bool add(uint64_t& total, uint64_t more) {
  if (more > std::numeric_limits<uint64_t>::max() - total) return false;
  total += more;
  return true;
}

// Sum of the constant_buffer storage lengths.
bool inline_constants(const Region& program, uint64_t root, uint64_t& total) {
  uint64_t at = 0;
  if (!program.field(root, kProgramConstantBuffer, at)) return false;
  if (at == 0) return true;
  uint64_t count = 0;
  uint64_t first = 0;
  if (!program.vector(at, 4, count, first)) return false;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t buffer = 0;
    uint64_t storage = 0;
    if (!program.table_at(first, i, buffer) || !program.field(buffer, kBufferStorage, storage)) return false;
    if (storage == 0) continue;
    uint64_t length = 0;
    uint64_t data = 0;
    if (!program.vector(storage, 1, length, data) || !add(total, length)) return false;
  }
  return true;
}

// The size of the segment constant_segment names, when it lists offsets; 0 otherwise.
bool segment_constants(const Region& program, uint64_t root, uint64_t segment_base, uint64_t file_size,
                       uint64_t& total) {
  uint64_t at = 0;
  uint64_t subsegment = 0;
  if (!program.field(root, kProgramConstantSegment, at)) return false;
  if (at == 0) return true;
  uint64_t offsets_at = 0;
  if (!program.follow(at, subsegment) || !program.field(subsegment, kSubsegmentOffsets, offsets_at)) return false;
  uint64_t offsets = 0;
  uint64_t ignored = 0;
  if (offsets_at == 0) return true;
  if (!program.vector(offsets_at, 8, offsets, ignored)) return false;
  if (offsets == 0) return true;
  uint64_t index_at = 0;
  uint32_t index = 0;
  if (!program.field(subsegment, kSubsegmentSegmentIndex, index_at)) return false;
  if (index_at != 0 && !program.value(index_at, index)) return false;
  uint64_t segments_at = 0;
  uint64_t count = 0;
  uint64_t first = 0;
  if (!program.field(root, kProgramSegments, segments_at)) return false;
  if (segments_at == 0) return true;  // memory.py counts nothing for an index past the segments
  if (!program.vector(segments_at, 4, count, first)) return false;
  if (index >= count) return true;
  uint64_t segment = 0;
  uint64_t offset_at = 0;
  uint64_t size_at = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  if (!program.table_at(first, index, segment) || !program.field(segment, kDataSegmentOffset, offset_at) ||
      !program.field(segment, kDataSegmentSize, size_at)) {
    return false;
  }
  if ((offset_at != 0 && !program.value(offset_at, offset)) || (size_at != 0 && !program.value(size_at, size))) {
    return false;
  }
  // The segment must lie in the file: a size the file does not hold is not constant data.
  if (segment_base > file_size || offset > file_size - segment_base || size > file_size - segment_base - offset) {
    return false;
  }
  return add(total, size);
}

std::optional<uint64_t> read_constants(int fd) {
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_size < 8) return std::nullopt;
  const auto file_size = static_cast<uint64_t>(info.st_size);
  uint8_t head[kHeadBytes] = {};
  const size_t head_size = file_size < kHeadBytes ? static_cast<size_t>(file_size) : kHeadBytes;
  const Region file(fd, file_size);
  if (!file.bytes(0, head, head_size) || std::memcmp(head + 4, "ET12", 4) != 0) return std::nullopt;

  // The extended header (after the root offset and identifier) says where the flatbuffer ends; without one the
  // whole file is the flatbuffer.
  uint64_t program_size = file_size;
  uint64_t segment_base = 0;
  if (head_size >= 32 && std::memcmp(head + 8, "eh00", 4) == 0) {
    uint32_t length = 0;
    if (!file.value(12, length) || length < kExtendedHeaderMinimum || !file.value(16, program_size) ||
        !file.value(24, segment_base) || program_size > file_size || program_size < 8) {
      return std::nullopt;
    }
  }
  const Region program(fd, program_size);
  uint64_t root = 0;
  uint64_t total = 0;
  if (!program.follow(0, root) || !inline_constants(program, root, total) ||
      !segment_constants(program, root, segment_base, file_size, total)) {
    return std::nullopt;
  }
  return total;
}

}  // namespace

std::optional<uint64_t> program_constants_bytes(const std::string& path) noexcept {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<uint64_t> total = read_constants(fd);
  close(fd);
  return total;
}

}  // namespace etlab
