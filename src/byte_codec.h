// Little-endian encoding of the opaque descriptor blobs backends exchange
// through the bootstrap service. A reader never trusts its input: every read
// is bounds-checked and a short or malformed blob is an error, not a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace pdkv {

class ByteWriter {
 public:
  void u64(uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void bytes(std::string_view b) {
    u64(b.size());
    out_.append(b);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  bool u64(uint64_t& v) {
    if (in_.size() < sizeof v) return false;
    std::memcpy(&v, in_.data(), sizeof v);
    in_.remove_prefix(sizeof v);
    return true;
  }
  bool bytes(std::string_view& b) {
    uint64_t n = 0;
    if (!u64(n) || in_.size() < n) return false;
    b = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }
  // Bytes not read yet: a count of entries that cannot fit in them is a lie.
  size_t left() const { return in_.size(); }

 private:
  std::string_view in_;
};

}  // namespace pdkv
