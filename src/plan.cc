#include "pdkv/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace pdkv {
namespace {

// Byte offset of (token, head) inside one page of a buffer whose rank owns
// `heads` heads. MLA pools have one "head", for which both layouts coincide.
uint64_t offset_in_page(Layout layout, uint32_t page_size, uint32_t heads, uint64_t head_bytes,
                        uint32_t token, uint32_t head) {
  if (layout == Layout::kNhd) return (uint64_t{token} * heads + head) * head_bytes;
  return (uint64_t{head} * page_size + token) * head_bytes;
}

Status check_axis_route(const char* axis, const Segment& seg, const UnitRange& src_owned,
                        const UnitRange& dst_owned, uint32_t total) {
  if (seg.count == 0) return Status::invalid_argument(fmt::format("route moves 0 {}", axis));
  if (src_owned.end() > total || dst_owned.end() > total) {
    return Status::invalid_argument(
        fmt::format("ranks own {} [{}, {}) and [{}, {}) but the model has {}", axis,
                    src_owned.first, src_owned.end(), dst_owned.first, dst_owned.end(), total));
  }
  if (uint64_t{seg.src_offset} + seg.count > src_owned.count) {
    return Status::out_of_range(fmt::format("route reads source {} [{}, {}) but the rank owns {}",
                                            axis, seg.src_offset, seg.src_offset + seg.count,
                                            src_owned.count));
  }
  if (uint64_t{seg.dst_offset} + seg.count > dst_owned.count) {
    return Status::out_of_range(
        fmt::format("route writes destination {} [{}, {}) but the rank owns {}", axis,
                    seg.dst_offset, seg.dst_offset + seg.count, dst_owned.count));
  }
  // The check that makes a drifted head computation loud: both ends of a
  // segment must name the same global units.
  if (src_owned.first + seg.src_offset != dst_owned.first + seg.dst_offset) {
    return Status::invalid_argument(
        fmt::format("route sends global {} {} into the slot of global {} {}", axis,
                    src_owned.first + seg.src_offset, axis, dst_owned.first + seg.dst_offset));
  }
  return Status::ok();
}

Status check_pages(const char* side, std::span<const uint64_t> pages, uint64_t pool_pages) {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] >= pool_pages) {
      return Status::out_of_range(
          fmt::format("{} page list entry {} is page {}, but the pool has "
                      "{} pages",
                      side, i, pages[i], pool_pages));
    }
  }
  return Status::ok();
}

// Pages are already known to be < pool_pages; one bit per pool page is far
// cheaper than sorting a 32k-page list, and small next to the pool itself.
Status check_no_duplicates(std::span<const uint64_t> pages, uint64_t pool_pages) {
  std::vector<bool> seen(pool_pages);
  for (uint64_t page : pages) {
    if (seen[page]) {
      return Status::invalid_argument(fmt::format(
          "destination page {} is listed twice: two tokens would land in one page", page));
    }
    seen[page] = true;
  }
  return Status::ok();
}

}  // namespace

PlanView TransferPlan::view() const {
  PlanView v;
  if (!template_) return v;
  v.pieces = template_->pieces.data();
  v.piece_count = template_->pieces.size();
  v.runs = runs_.data();
  v.run_count = runs_.size();
  v.pages = pages_;
  v.src_page_bytes = template_->src_page_bytes;
  v.dst_page_bytes = template_->dst_page_bytes;
  v.template_bytes = template_->bytes;
  v.src_layer = src_layer_;
  v.dst_layer = dst_layer_;
  v.layers = layers_;
  v.buffers_per_layer = buffers_per_layer_;
  return v;
}

std::vector<Fragment> TransferPlan::fragments() const {
  std::vector<Fragment> out;
  out.reserve(fragment_count());
  for_each([&out](const Fragment& f) { out.push_back(f); });
  return out;
}

size_t Planner::TemplateKeyHash::operator()(const TemplateKey& k) const {
  size_t h = 0;
  auto mix = [&h](uint64_t v) {
    h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  };
  mix(static_cast<uint64_t>(k.src_layout) << 8 | static_cast<uint64_t>(k.dst_layout) << 4 | k.mla);
  mix(k.page_size);
  mix(k.head_bytes);
  mix(uint64_t{k.src_heads} << 32 | k.dst_heads);
  mix(uint64_t{k.src_head} << 32 | k.dst_head);
  mix(k.count);
  return h;
}

PageTemplate Planner::build_template(const TemplateKey& k) {
  PageTemplate t;
  t.src_page_bytes = uint64_t{k.page_size} * k.src_heads * k.head_bytes;
  t.dst_page_bytes = uint64_t{k.page_size} * k.dst_heads * k.head_bytes;
  t.head_vectors = uint64_t{k.page_size} * k.count;

  auto emit = [&](uint32_t token, uint32_t h) {
    const uint64_t src =
        offset_in_page(k.src_layout, k.page_size, k.src_heads, k.head_bytes, token, k.src_head + h);
    const uint64_t dst =
        offset_in_page(k.dst_layout, k.page_size, k.dst_heads, k.head_bytes, token, k.dst_head + h);
    if (!t.pieces.empty()) {
      auto& last = t.pieces.back();
      if (last.src_offset + last.length == src && last.dst_offset + last.length == dst) {
        last.length += k.head_bytes;
        return;
      }
    }
    t.pieces.push_back({src, dst, k.head_bytes, 0});
  };
  // Visit head vectors in source memory order, so that everything contiguous
  // on the source is offered to the coalescer in one sweep.
  if (k.src_layout == Layout::kNhd || k.mla) {
    for (uint32_t token = 0; token < k.page_size; ++token)
      for (uint32_t h = 0; h < k.count; ++h) emit(token, h);
  } else {
    for (uint32_t h = 0; h < k.count; ++h)
      for (uint32_t token = 0; token < k.page_size; ++token) emit(token, h);
  }
  for (auto& piece : t.pieces) {
    piece.staging_offset = t.bytes;
    t.bytes += piece.length;
  }
  t.whole_page = t.pieces.size() == 1 && t.pieces[0].src_offset == 0 &&
                 t.pieces[0].dst_offset == 0 && t.pieces[0].length == t.src_page_bytes &&
                 t.pieces[0].length == t.dst_page_bytes;
  return t;
}

Result<TransferPlan> Planner::plan(const RankShard& src, const RankShard& dst, const Route& route,
                                   std::span<const uint64_t> src_pages,
                                   std::span<const uint64_t> dst_pages) {
  PDKV_RETURN_IF_ERROR(src.spec.validate().with_context("prefill spec"));
  PDKV_RETURN_IF_ERROR(dst.spec.validate().with_context("decode spec"));
  PDKV_RETURN_IF_ERROR(check_compatible(src.spec, dst.spec));
  PDKV_RETURN_IF_ERROR(
      check_axis_route("heads", route.heads, src.heads, dst.heads, src.spec.total_heads));
  PDKV_RETURN_IF_ERROR(
      check_axis_route("layers", route.layers, src.layers, dst.layers, src.spec.num_layers));
  if (src_pages.size() != dst_pages.size()) {
    return Status::invalid_argument(
        fmt::format("page lists differ in length: prefill sends {} pages, decode offers {}",
                    src_pages.size(), dst_pages.size()));
  }
  PDKV_RETURN_IF_ERROR(check_pages("prefill", src_pages, src.spec.num_pages));
  PDKV_RETURN_IF_ERROR(check_pages("decode", dst_pages, dst.spec.num_pages));
  PDKV_RETURN_IF_ERROR(check_no_duplicates(dst_pages, dst.spec.num_pages));

  const TemplateKey key{src.spec.layout,    dst.spec.layout,        src.spec.mla,
                        src.spec.page_size, src.spec.head_bytes(),  src.heads.count,
                        dst.heads.count,    route.heads.src_offset, route.heads.dst_offset,
                        route.heads.count};
  TransferPlan plan;
  {
    std::lock_guard lock(mu_);
    auto& slot = cache_[key];
    if (!slot) slot = std::make_shared<const PageTemplate>(build_template(key));
    plan.template_ = slot;
  }
  const PageTemplate& t = *plan.template_;

  plan.pages_ = src_pages.size();
  plan.src_layer_ = route.layers.src_offset;
  plan.dst_layer_ = route.layers.dst_offset;
  plan.layers_ = route.layers.count;
  plan.buffers_per_layer_ = src.spec.buffers_per_layer();
  plan.runs_.reserve(src_pages.size());
  uint64_t src_max = 0, dst_max = 0;
  for (size_t i = 0; i < src_pages.size(); ++i) {
    src_max = std::max(src_max, src_pages[i] + 1);
    dst_max = std::max(dst_max, dst_pages[i] + 1);
    if (t.whole_page && !plan.runs_.empty()) {
      PageRun& last = plan.runs_.back();
      if (last.src_page + last.count == src_pages[i] &&
          last.dst_page + last.count == dst_pages[i]) {
        ++last.count;
        continue;
      }
    }
    plan.runs_.push_back({src_pages[i], dst_pages[i], 1, i});
  }
  plan.src_extent_ = src_max * t.src_page_bytes;
  plan.dst_extent_ = dst_max * t.dst_page_bytes;
  return plan;
}

size_t Planner::cached_templates() const {
  std::lock_guard lock(mu_);
  return cache_.size();
}

}  // namespace pdkv
