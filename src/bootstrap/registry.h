// The bootstrap service's state: which ranks of which engine (prefill or decode) have
// registered, and whether their registrations agree. Pure logic, no gRPC, so
// that every rule is unit-tested directly.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "pdkv.pb.h"
#include "pdkv/security.h"
#include "pdkv/status.h"

namespace pdkv::bootstrap {

class Registry {
 public:
  explicit Registry(const Limits& limits = {}) : limits_(limits) {}

  struct Registered {
    bool replaced = false;              // an entry of this rank was there (and is replaced)
    uint64_t replaced_incarnation = 0;  // its incarnation
  };
  // Errors: a rank outside its declared sizes; a spec, backend or size that
  // disagrees with the ranks already registered for the engine (naming both
  // values); a layer range unlike the other ranks of its pipeline stage;
  // with `renewal`, another incarnation of the rank holding its entry
  // (failed_precondition: a newer process replaced this one); an engine of
  // more than Limits::ranks_per_engine ranks, or one engine (and dp rank)
  // more than Limits::engines (resource_exhausted).
  Result<Registered> register_rank(const proto::RankInfo& rank, bool renewal = false);
  // Every rank of (engine, dp_rank) ordered by (pp_rank, tp_rank), or
  // unavailable while some are missing, or not_found for an unknown engine.
  Result<std::vector<proto::RankInfo>> topology(const std::string& engine_id,
                                                uint32_t dp_rank) const;

 private:
  using GroupKey = std::tuple<std::string, uint32_t>;  // (engine, dp_rank)
  using RankKey = std::tuple<uint32_t, uint32_t>;      // (pp_rank, tp_rank)

  const Limits limits_;
  mutable std::mutex mu_;
  std::map<GroupKey, std::map<RankKey, proto::RankInfo>> groups_;
};

// Ok when a and b can belong to one engine: same sizes, spec and backend.
Status check_same_engine(const proto::RankInfo& a, const proto::RankInfo& b);

}  // namespace pdkv::bootstrap
