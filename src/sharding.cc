#include "pdkv/sharding.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace pdkv {

Result<AxisSharding> AxisSharding::even(uint32_t units, uint32_t ranks, AxisNames names) {
  if (units == 0) {
    return Status::invalid_argument(
        fmt::format("0 {} to split over {} {}: need at least 1", names.units, names.ranks, ranks));
  }
  if (ranks == 0) {
    return Status::invalid_argument(fmt::format("{} 0 cannot own {} {}: need at least 1 rank",
                                                names.ranks, units, names.units));
  }
  std::vector<UnitRange> ranges(ranks);
  if (ranks <= units) {
    if (units % ranks != 0) {
      return Status::invalid_argument(fmt::format(
          "{} {} cannot be split over {} {}: {} % {} = {} (the rank count must divide the {}, "
          "or be a multiple of them)",
          units, names.units, names.ranks, ranks, units, ranks, units % ranks, names.units));
    }
    const uint32_t per_rank = units / ranks;
    for (uint32_t r = 0; r < ranks; ++r) ranges[r] = {r * per_rank, per_rank};
  } else {
    if (ranks % units != 0) {
      return Status::invalid_argument(fmt::format(
          "{} {} cannot replicate {} {}: {} % {} = {} (a rank count above the {} must be a "
          "multiple of them)",
          names.ranks, ranks, units, names.units, ranks, units, ranks % units, names.units));
    }
    const uint32_t replicas = ranks / units;
    for (uint32_t r = 0; r < ranks; ++r) ranges[r] = {r / replicas, 1};
  }
  return AxisSharding(units, std::move(ranges), std::move(names));
}

Result<AxisSharding> AxisSharding::from_ranges(uint32_t units, std::vector<UnitRange> ranges,
                                               AxisNames names) {
  if (ranges.empty()) {
    return Status::invalid_argument(
        fmt::format("no {} ranges given for {} {}", names.ranks, units, names.units));
  }
  uint32_t next = 0;
  for (size_t r = 0; r < ranges.size(); ++r) {
    const UnitRange& range = ranges[r];
    if (range.count == 0) {
      return Status::invalid_argument(fmt::format("{} {} owns no {} (range [{}, {}))", names.ranks,
                                                  r, names.units, range.first, range.end()));
    }
    if (range.first != next) {
      if (r == 0) {
        return Status::invalid_argument(fmt::format("{} 0 starts at {} {}; it must start at 0",
                                                    names.ranks, names.units, range.first));
      }
      return Status::invalid_argument(
          fmt::format("{} {} starts at {} but {} {} ends at {}: ranges of {} must be consecutive",
                      names.ranks, r, range.first, names.ranks, r - 1, next, names.units));
    }
    next = range.end();
  }
  if (next != units) {
    return Status::invalid_argument(fmt::format("{} ranges cover {} {} but the axis has {}",
                                                names.ranks, next, names.units, units));
  }
  return AxisSharding(units, std::move(ranges), std::move(names));
}

Result<UnitRange> AxisSharding::owned(uint32_t rank) const {
  if (rank >= ranks()) {
    return Status::out_of_range(
        fmt::format("{} rank {} does not exist: there are {} ranks", names_.ranks, rank, ranks()));
  }
  return ranges_[rank];
}

UnitRange AxisSharding::owners(uint32_t unit) const {
  // Owners are consecutive ranks, so a binary search over the sorted ranges
  // finds the first; replication makes the run longer than one.
  auto first = std::partition_point(ranges_.begin(), ranges_.end(),
                                    [unit](const UnitRange& r) { return r.end() <= unit; });
  auto last = std::partition_point(first, ranges_.end(),
                                   [unit](const UnitRange& r) { return r.first <= unit; });
  return {static_cast<uint32_t>(first - ranges_.begin()), static_cast<uint32_t>(last - first)};
}

Result<std::vector<Segment>> transfer_map(const AxisSharding& src, const AxisSharding& dst) {
  if (src.units() != dst.units()) {
    return Status::invalid_argument(fmt::format("the source shards {} {} but the destination {}",
                                                src.units(), src.names().units, dst.units()));
  }
  std::vector<Segment> map;
  for (uint32_t d = 0; d < dst.ranks(); ++d) {
    const UnitRange mine = dst.owned(d).value();
    for (uint32_t unit = mine.first; unit < mine.end(); ++unit) {
      const UnitRange owners = src.owners(unit);
      const uint32_t writer = owners.first + d % owners.count;
      const uint32_t src_offset = unit - src.owned(writer).value().first;
      const uint32_t dst_offset = unit - mine.first;
      // Units of one destination are visited in order, so a run continues
      // only the segment appended last.
      if (!map.empty()) {
        Segment& last = map.back();
        if (last.src_rank == writer && last.dst_rank == d &&
            last.src_offset + last.count == src_offset &&
            last.dst_offset + last.count == dst_offset) {
          ++last.count;
          continue;
        }
      }
      map.push_back({writer, d, src_offset, dst_offset, 1});
    }
  }
  std::sort(map.begin(), map.end(), [](const Segment& a, const Segment& b) {
    return std::tie(a.src_rank, a.dst_rank, a.dst_offset) <
           std::tie(b.src_rank, b.dst_rank, b.dst_offset);
  });
  return map;
}

std::vector<Segment> segments_from(const std::vector<Segment>& map, uint32_t src_rank) {
  std::vector<Segment> out;
  std::copy_if(map.begin(), map.end(), std::back_inserter(out),
               [src_rank](const Segment& s) { return s.src_rank == src_rank; });
  return out;
}

std::vector<Segment> segments_to(const std::vector<Segment>& map, uint32_t dst_rank) {
  std::vector<Segment> out;
  std::copy_if(map.begin(), map.end(), std::back_inserter(out),
               [dst_rank](const Segment& s) { return s.dst_rank == dst_rank; });
  return out;
}

}  // namespace pdkv
