// The constant data size of a .pte, read from its Program flatbuffer. The SDK has no public API for it and the
// wheel ships no program_generated.h, so this is a small bounds-checked reader of exactly the fields needed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace etlab {

// Every constant_buffer's storage bytes plus the size of the segment constant_segment names (when it has
// offsets), as orchestrator/programs/memory.py counts them. nullopt for anything that is not a readable ET12
// program: the file is untrusted, every offset and length is checked, and only the flatbuffer part is read.
std::optional<uint64_t> program_constants_bytes(const std::string& path) noexcept;

}  // namespace etlab
