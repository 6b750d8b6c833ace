// KvSpec: the shape of a model's KV cache and of one rank's page pool.
//
// A KvSpec describes the model (total KV heads, layers, head_dim, dtype) and
// the pool format a rank chose (page size, pages in the pool, layout). What a
// rank *owns* of the heads and layers is not here: that is the sharding's
// business (pdkv/sharding.h), so that both sides of a transfer can share one
// spec and disagree only on TP/PP.
//
// Memory layout of one (layer, K or V) buffer of a rank that owns
// `heads_local` heads:
//   nhd (token-major, SGLang's default): [page][token][head][dim]
//   hnd (head-major):                    [page][head][token][dim]
//   mla: one latent vector per token and no head axis ([page][token][dim]);
//        total_heads must be 1 and the buffer is never sliced. MLA has a
//        single buffer per layer instead of separate K and V.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "pdkv/status.h"

namespace pdkv {

enum class Layout : uint8_t { kNhd, kHnd };

const char* layout_name(Layout layout);  // "nhd" / "hnd"
Result<Layout> parse_layout(std::string_view text);

struct KvSpec {
  uint32_t total_heads = 0;  // KV heads of the whole model (not per rank); 1 for MLA
  uint32_t head_dim = 0;     // elements per head vector (MLA: latent width)
  uint32_t dtype_bytes = 0;  // bytes per element: 1, 2, 4 or 8
  uint32_t page_size = 0;    // tokens per page
  uint32_t num_layers = 0;   // layers of the whole model (not per pipeline stage)
  uint64_t num_pages = 0;    // pages in this rank's pool
  Layout layout = Layout::kNhd;
  bool mla = false;

  // Ok, or an invalid_argument naming the first bad field and its value.
  Status validate() const;

  // K and V are separate buffers per layer; MLA has one.
  uint32_t buffers_per_layer() const { return mla ? 1 : 2; }
  uint64_t head_bytes() const { return uint64_t{head_dim} * dtype_bytes; }
  // Bytes of one page of one (layer, K/V) buffer for a rank owning `heads_local` heads.
  uint64_t page_bytes(uint32_t heads_local) const {
    return uint64_t{page_size} * heads_local * head_bytes();
  }

  std::string to_string() const;
  bool operator==(const KvSpec&) const = default;
};

// Ok when two sides can exchange KV: every model and element property agrees.
// Layout and pool size may differ. The error names the field and both values.
Status check_compatible(const KvSpec& src, const KvSpec& dst);

}  // namespace pdkv
