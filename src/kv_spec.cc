#include "pdkv/kv_spec.h"

#include <fmt/format.h>

namespace pdkv {

const char* layout_name(Layout layout) { return layout == Layout::kNhd ? "nhd" : "hnd"; }

Result<Layout> parse_layout(std::string_view text) {
  if (text == "nhd") return Layout::kNhd;
  if (text == "hnd") return Layout::kHnd;
  return Status::invalid_argument(fmt::format("layout '{}' is neither 'nhd' nor 'hnd'", text));
}

Status KvSpec::validate() const {
  auto zero = [](const char* field) {
    return Status::invalid_argument(fmt::format("KvSpec.{} is 0; it must be at least 1", field));
  };
  if (total_heads == 0) return zero("total_heads");
  if (head_dim == 0) return zero("head_dim");
  if (page_size == 0) return zero("page_size");
  if (num_layers == 0) return zero("num_layers");
  if (num_pages == 0) return zero("num_pages");
  if (dtype_bytes != 1 && dtype_bytes != 2 && dtype_bytes != 4 && dtype_bytes != 8) {
    return Status::invalid_argument(
        fmt::format("KvSpec.dtype_bytes is {}; it must be 1, 2, 4 or 8", dtype_bytes));
  }
  if (mla && total_heads != 1) {
    return Status::invalid_argument(fmt::format(
        "KvSpec.total_heads is {} with mla; MLA has one latent vector per token, so it must be 1",
        total_heads));
  }
  // Offsets are 64-bit, but a pool beyond 2^48 bytes is a unit mistake, not a GPU.
  const unsigned __int128 pool_bytes =
      static_cast<unsigned __int128>(num_pages) * page_bytes(total_heads);
  if (pool_bytes > (uint64_t{1} << 48)) {
    return Status::invalid_argument(
        fmt::format("KvSpec.num_pages {} x {} bytes per page exceeds 2^48 bytes per buffer",
                    num_pages, page_bytes(total_heads)));
  }
  return Status::ok();
}

std::string KvSpec::to_string() const {
  return fmt::format(
      "KvSpec{{heads={}, head_dim={}, dtype_bytes={}, page_size={}, layers={}, pages={}, "
      "layout={}, mla={}}}",
      total_heads, head_dim, dtype_bytes, page_size, num_layers, num_pages, layout_name(layout),
      mla);
}

Status check_compatible(const KvSpec& src, const KvSpec& dst) {
  auto differ = [](const char* field, auto a, auto b) {
    return Status::invalid_argument(
        fmt::format("KvSpec.{} differs: prefill has {}, decode has {}", field, a, b));
  };
  if (src.total_heads != dst.total_heads)
    return differ("total_heads", src.total_heads, dst.total_heads);
  if (src.head_dim != dst.head_dim) return differ("head_dim", src.head_dim, dst.head_dim);
  if (src.dtype_bytes != dst.dtype_bytes)
    return differ("dtype_bytes", src.dtype_bytes, dst.dtype_bytes);
  if (src.page_size != dst.page_size) return differ("page_size", src.page_size, dst.page_size);
  if (src.num_layers != dst.num_layers) return differ("num_layers", src.num_layers, dst.num_layers);
  if (src.mla != dst.mla) return differ("mla", src.mla, dst.mla);
  return Status::ok();
}

}  // namespace pdkv
