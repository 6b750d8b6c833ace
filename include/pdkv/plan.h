// The transfer planner: from one rank pair's route and two page lists to the
// byte fragments a transport moves.
//
// A plan is never a flat list built per request. Within one page of one
// (layer, K/V) buffer, which bytes go where depends only on the two pool
// formats and the head segment; that "page template" is built once, coalesced,
// and cached. Per request only the page lists change: consecutive pages merge
// into runs when a page moves whole on both sides. A fragment is then pure
// index arithmetic over (layer/K/V, run, template piece), which is what lets
// backends post fragments, and the staging gather/scatter (host memcpy here,
// GPU kernels in src/gpu/ through pdkv/plan_view.h) walk the same plan
// without materialising it.
//
// Buffer numbering: a rank's pool is one buffer per (local layer, K/V); buffer
// index = local_layer * buffers_per_layer + kv, kv 0 = K, 1 = V (MLA: one).
//
// Thread-safety: TransferPlan is immutable. Planner may be shared by threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "pdkv/kv_spec.h"
#include "pdkv/plan_view.h"
#include "pdkv/sharding.h"
#include "pdkv/status.h"

namespace pdkv {

// What one rank holds: the pool format and the units it owns of each axis
// (from AxisSharding::owned). MLA ranks own heads {0, 1}.
struct RankShard {
  KvSpec spec;
  UnitRange heads;
  UnitRange layers;
};

// One rank pair's share of a request: a segment of the head transfer map and
// one of the layer transfer map (offsets local to each rank).
struct Route {
  Segment heads;
  Segment layers;
};

// The coalesced fragments inside one page of one buffer, offsets relative to
// the page start. Shared by every request with the same formats and segment.
struct PageTemplate {
  using Piece = TemplatePiece;
  std::vector<Piece> pieces;
  uint64_t src_page_bytes = 0;
  uint64_t dst_page_bytes = 0;
  uint64_t bytes = 0;         // sum of piece lengths
  uint64_t head_vectors = 0;  // pieces before coalescing: tokens x heads
  bool whole_page = false;    // one piece that is a whole page on both sides
};

class TransferPlan {
 public:
  TransferPlan() = default;

  uint64_t fragment_count() const { return layer_buffers() * runs_.size() * pieces(); }
  // What a planner without coalescing would send: one fragment per head vector.
  uint64_t uncoalesced_fragment_count() const {
    return template_ ? layer_buffers() * pages_ * template_->head_vectors : 0;
  }
  uint64_t bytes() const { return template_ ? layer_buffers() * pages_ * template_->bytes : 0; }

  // Fragment i in [0, fragment_count()): pure arithmetic, no allocation.
  Fragment fragment(uint64_t i) const { return fragment_at(view(), i); }
  // The plan as the shared arithmetic (and the GPU kernels) see it; points
  // into this plan.
  PlanView view() const;
  // Visits fragment(0), fragment(1), ... in order; nested loops instead of
  // the divisions fragment(i) needs, since backends walk millions of these.
  template <typename F>
  void for_each(F&& visit) const;
  std::vector<Fragment> fragments() const;

  const std::shared_ptr<const PageTemplate>& page_template() const { return template_; }
  const std::vector<PageRun>& runs() const { return runs_; }
  // Buffers the plan touches must exist up to these indices, and each must
  // hold at least this many bytes.
  uint32_t src_buffers_needed() const { return (src_layer_ + layers_) * buffers_per_layer_; }
  uint32_t dst_buffers_needed() const { return (dst_layer_ + layers_) * buffers_per_layer_; }
  uint64_t src_extent() const { return src_extent_; }
  uint64_t dst_extent() const { return dst_extent_; }

 private:
  friend class Planner;
  uint64_t layer_buffers() const { return uint64_t{layers_} * buffers_per_layer_; }
  uint64_t pieces() const { return template_ ? template_->pieces.size() : 0; }

  std::shared_ptr<const PageTemplate> template_;
  std::vector<PageRun> runs_;
  uint64_t pages_ = 0;
  uint32_t src_layer_ = 0;  // local layer offsets and count, from Route::layers
  uint32_t dst_layer_ = 0;
  uint32_t layers_ = 0;
  uint32_t buffers_per_layer_ = 0;
  uint64_t src_extent_ = 0;
  uint64_t dst_extent_ = 0;
};

template <typename F>
void TransferPlan::for_each(F&& visit) const {
  if (!template_) return;
  const PageTemplate& t = *template_;
  Fragment f;
  uint64_t staging = 0;
  for (uint32_t layer = 0; layer < layers_; ++layer) {
    for (uint32_t kv = 0; kv < buffers_per_layer_; ++kv) {
      f.src_buffer = (src_layer_ + layer) * buffers_per_layer_ + kv;
      f.dst_buffer = (dst_layer_ + layer) * buffers_per_layer_ + kv;
      for (const PageRun& run : runs_) {
        const uint64_t src_base = run.src_page * t.src_page_bytes;
        const uint64_t dst_base = run.dst_page * t.dst_page_bytes;
        for (const PageTemplate::Piece& piece : t.pieces) {
          f.src_offset = src_base + piece.src_offset;
          f.dst_offset = dst_base + piece.dst_offset;
          f.length = piece.length * run.count;
          f.staging_offset = staging;
          staging += f.length;
          visit(static_cast<const Fragment&>(f));
        }
      }
    }
  }
}

// Builds plans and caches their page templates by (layout pair, formats,
// head segment). Thread-safe.
class Planner {
 public:
  // Errors: incompatible specs, a route outside either rank's heads or layers
  // or naming different global heads/layers on the two sides, page lists of
  // different lengths, a page beyond either pool, a destination page listed twice.
  Result<TransferPlan> plan(const RankShard& src, const RankShard& dst, const Route& route,
                            std::span<const uint64_t> src_pages,
                            std::span<const uint64_t> dst_pages);

  size_t cached_templates() const;

 private:
  struct TemplateKey {
    Layout src_layout, dst_layout;
    bool mla;
    uint32_t page_size;
    uint64_t head_bytes;
    uint32_t src_heads, dst_heads;  // heads each rank owns
    uint32_t src_head, dst_head, count;
    bool operator==(const TemplateKey&) const = default;
  };
  struct TemplateKeyHash {
    size_t operator()(const TemplateKey& k) const;
  };
  static PageTemplate build_template(const TemplateKey& key);

  mutable std::mutex mu_;
  std::unordered_map<TemplateKey, std::shared_ptr<const PageTemplate>, TemplateKeyHash> cache_;
};

// Staging (DESIGN §3): the sender gathers a plan's source bytes into one
// contiguous buffer (fragment order, Fragment::staging_offset), the receiver
// scatters the same buffer back through the same plan. `*_buffers` are indexed
// by buffer index; each must cover the plan's extent and staging must hold
// plan.bytes(). An undersized argument is an error, never a stray write.
Status gather(const TransferPlan& plan, std::span<const std::span<const std::byte>> src_buffers,
              std::span<std::byte> staging);
Status scatter(const TransferPlan& plan, std::span<const std::byte> staging,
               std::span<const std::span<std::byte>> dst_buffers);

// The checks gather() and scatter() make, on lengths alone (the GPU kernels
// make them too): the lengths of the plan's source or destination buffers,
// by buffer index, and of the staging buffer.
enum class PlanSide : uint8_t { kSource, kDestination };
Status check_staging_bounds(const TransferPlan& plan, PlanSide side,
                            std::span<const uint64_t> buffer_lengths, uint64_t staging_bytes);

// Whether staging the plan costs less than writing its fragments one by one
// (Staging::kAuto). Staging saves the overhead of every write but one, and
// adds a gather of plan.bytes() at the source and a scatter at the
// destination. The ranks work side by side, so what it costs is the longer
// of the two: the destination's, which scatters the blocks of all
// `sources_scattered` sources of the room it stages (at least 1) while each
// source gathers its own. `write_overhead_bytes` is the transport's
// (TransportCapabilities), so the comparison is in copied bytes:
// (fragments - 1) x overhead > sources x bytes. Until 2026-12 it was
// 2 x bytes whatever the sources, and no figure of nixl's chose right at
// every pair: a decode rank fed by two or four sources scatters for them
// all (`off` won at 4 -> 1 and 2 -> 1), one fed by a single source does not
// (`on` won at 2 -> 4 and 1 -> 4; docs/benchmarks.md).
bool staging_pays(const TransferPlan& plan, uint64_t write_overhead_bytes,
                  uint32_t sources_scattered);

}  // namespace pdkv
