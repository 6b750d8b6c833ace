// The deterministic KV pattern: a value for every element of the KV cache,
// and pool addresses written out from the layout definitions (never from the
// planner). Prefill workers write it, decode workers check every byte against
// it, and the byte-exact tests use it as their independent oracle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pdkv/kv_spec.h"
#include "pdkv/sharding.h"

namespace pdkv::worker {

inline uint8_t mix_byte(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;  // splitmix64
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

// One seed per head vector of (layer, K/V, global head, token) and room...
inline uint64_t vector_seed(uint32_t layer, uint32_t kv, uint32_t head, uint64_t token,
                            uint64_t room) {
  uint64_t x = (uint64_t{layer} << 48) ^ (uint64_t{kv} << 44) ^ (uint64_t{head} << 32) ^
               (token << 4) ^ (room * 0x100000001b3ULL);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// ...and a cheap mix per byte of the vector, so that filling and checking
// gigabytes costs a multiply per byte, while every byte still depends on
// every coordinate.
inline uint8_t vector_byte(uint64_t seed, uint64_t byte) {
  const uint64_t x = (seed + byte) * 0x9e3779b97f4a7c15ULL;
  return static_cast<uint8_t>((x ^ (x >> 29)) >> 56);
}

// The value of byte `byte` of (layer, K/V, global head, token) for a room.
inline uint8_t element_byte(uint32_t layer, uint32_t kv, uint32_t head, uint64_t token,
                            uint64_t byte, uint64_t room = 0) {
  return vector_byte(vector_seed(layer, kv, head, token, room), byte);
}

// What an untouched destination byte holds, distinguishable from element_byte.
inline uint8_t untouched_byte(uint32_t rank, uint32_t buffer, uint64_t offset) {
  return static_cast<uint8_t>(
      mix_byte((uint64_t{rank + 1000} << 48) ^ (uint64_t{buffer} << 40) ^ offset ^ 0xabcdefULL) ^
      0x5a);
}

// Byte offset of (page, slot, local head) in a buffer, by layout.
inline uint64_t oracle_offset(const KvSpec& s, uint32_t heads_local, uint64_t page, uint32_t slot,
                              uint32_t head) {
  const uint64_t hb = uint64_t{s.head_dim} * s.dtype_bytes;
  const uint64_t page_base = page * s.page_size * heads_local * hb;
  if (s.mla || s.layout == Layout::kNhd) {
    return page_base + (uint64_t{slot} * heads_local + head) * hb;
  }
  return page_base + (uint64_t{head} * s.page_size + slot) * hb;
}

// Calls visit(buffer, offset, expected byte) for every byte that a request's
// pages hold on a rank owning `heads` and `layers`.
template <typename F>
void for_each_element(const KvSpec& s, UnitRange heads, UnitRange layers,
                      const std::vector<uint64_t>& pages, uint64_t room, F&& visit) {
  const uint32_t kvs = s.buffers_per_layer();
  for (uint32_t l = 0; l < layers.count; ++l)
    for (uint32_t kv = 0; kv < kvs; ++kv)
      for (uint64_t i = 0; i < pages.size(); ++i)
        for (uint32_t slot = 0; slot < s.page_size; ++slot)
          for (uint32_t h = 0; h < heads.count; ++h) {
            const uint64_t base = oracle_offset(s, heads.count, pages[i], slot, h);
            const uint64_t seed =
                vector_seed(layers.first + l, kv, heads.first + h, i * s.page_size + slot, room);
            for (uint64_t b = 0; b < s.head_bytes(); ++b) {
              visit(l * kvs + kv, base + b, vector_byte(seed, b));
            }
          }
}

}  // namespace pdkv::worker
