// The one sharding helper: who owns which units of an axis, and who writes
// what to whom when the two sides shard the axis differently.
//
// Every axis pdkv splits goes through this file: KV heads over tensor
// parallelism, recurrent-state channels over TP, layers over pipeline stages.
// No backend and no other module computes head or layer offsets of its own;
// that duplication is how other stacks came to send the wrong heads under GQA
// replication (docs/head-slicing.md).
//
// Rules (DESIGN §3). An axis of N units over T ranks:
//   T <= N: N % T == 0, rank r owns [r*N/T, (r+1)*N/T).
//   T >  N: T % N == 0, rank r owns the single unit r / (T/N); T/N consecutive
//           ranks replicate each unit.
//   Layers may instead be explicit, consecutive per-stage ranges (uneven PP).
// Anything else is refused with an error that names the numbers.
//
// Thread-safety: AxisSharding is immutable after construction; share freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pdkv/status.h"

namespace pdkv {

// A run of consecutive units [first, first + count).
struct UnitRange {
  uint32_t first = 0;
  uint32_t count = 0;
  uint32_t end() const { return first + count; }
  bool contains(uint32_t unit) const { return unit >= first && unit < end(); }
  bool operator==(const UnitRange&) const = default;
};

// Words used in error messages, so that a refusal reads "8 KV heads over
// prefill TP 3" rather than "8 units over 3 ranks".
struct AxisNames {
  std::string units = "units";  // e.g. "KV heads", "layers", "state channels"
  std::string ranks = "ranks";  // e.g. "prefill TP", "decode PP"
};

class AxisSharding {
 public:
  // N units split evenly (or replicated) over T ranks, as the rules above.
  static Result<AxisSharding> even(uint32_t units, uint32_t ranks, AxisNames names = {});
  // One range per rank; the ranges must be non-empty, consecutive and cover [0, units).
  static Result<AxisSharding> from_ranges(uint32_t units, std::vector<UnitRange> ranges,
                                          AxisNames names = {});

  uint32_t units() const { return units_; }
  uint32_t ranks() const { return static_cast<uint32_t>(ranges_.size()); }
  const AxisNames& names() const { return names_; }

  // The units `rank` owns; out_of_range when rank >= ranks().
  Result<UnitRange> owned(uint32_t rank) const;
  // The consecutive ranks that own `unit` (count > 1 only under replication).
  // `unit` must be < units().
  UnitRange owners(uint32_t unit) const;

 private:
  AxisSharding(uint32_t units, std::vector<UnitRange> ranges, AxisNames names)
      : units_(units), ranges_(std::move(ranges)), names_(std::move(names)) {}

  uint32_t units_;
  std::vector<UnitRange> ranges_;  // indexed by rank
  AxisNames names_;
};

// `count` units that source rank `src_rank` sends to destination rank
// `dst_rank`. Offsets are local to each rank (index into what it owns).
struct Segment {
  uint32_t src_rank = 0;
  uint32_t dst_rank = 0;
  uint32_t src_offset = 0;
  uint32_t dst_offset = 0;
  uint32_t count = 0;
  bool operator==(const Segment&) const = default;
};

// The transfer map from `src` to `dst` sharding of the same axis: every unit
// owned by every destination rank is written exactly once, by a source rank
// that owns it. Where several source ranks replicate a unit, destination d is
// written by replica (d mod replicas) of that unit's owners. Contiguous runs
// of units between one rank pair are merged into one segment. Sorted by
// (src_rank, dst_rank, dst_offset).
Result<std::vector<Segment>> transfer_map(const AxisSharding& src, const AxisSharding& dst);

// The segments of `map` that a given rank takes part in, in map order.
std::vector<Segment> segments_from(const std::vector<Segment>& map, uint32_t src_rank);
std::vector<Segment> segments_to(const std::vector<Segment>& map, uint32_t dst_rank);

}  // namespace pdkv
