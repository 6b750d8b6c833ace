// pdkv_control_bench: the control path alone. One-page requests between
// in-process engines over the test-only loopback transport (a memcpy), so
// that what is measured is the protocol: lookups, metadata, reports, the
// engine's own scheduling. Never a test: timings are for people.
//
//   pdkv_control_bench [--rooms N] [--window W] [--pairs 1x1,2x4,8x8] [--signed] [--json]
//
// --signed: the cluster has a secret, so every bootstrap and control call is
// signed and checked (HMAC-SHA256, docs/security.md); run with and without it
// to see what authentication costs.
//
// For each TP pair: N rooms, W in flight at a time; a room's latency runs
// from the moment its first call is made (the receivers' send_metadata and
// the senders' init + send of the one page) until every rank, decode and
// prefill, polls Success (a prefill rank's waits for its report's answer).
// Prints rooms per second and p50/p99 latency.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "support/cluster.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace pdkv;

struct Pair {
  uint32_t prefill_tp, decode_tp;
};

struct PairResult {
  Pair pair;
  uint64_t rooms = 0, failed = 0;
  double seconds = 0, p50_ms = 0, p99_ms = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

struct OpenRoom {
  std::vector<std::unique_ptr<Sender>> senders;
  std::vector<std::unique_ptr<Receiver>> receivers;
  Clock::time_point start;
  uint64_t page = 0;
};

PairResult run_pair(Pair pair, uint64_t rooms, uint32_t window, bool signed_calls) {
  testing::ClusterSpec spec = testing::shape(8, pair.prefill_tp, pair.decode_tp);
  spec.kv.num_pages = window;
  if (signed_calls) spec.security.secret = "control-bench-cluster-secret";
  auto cluster = testing::Cluster::start(spec);
  PairResult r{pair};
  if (!cluster) {
    r.failed = rooms;
    return r;
  }
  std::map<RoomId, OpenRoom> open;
  std::vector<uint64_t> free_pages;
  for (uint64_t p = 0; p < window; ++p) free_pages.push_back(p);
  std::vector<double> latencies;
  RoomId next = 1;
  uint64_t done = 0;
  const auto begin = Clock::now();
  while (done < rooms) {
    while (next <= rooms && !free_pages.empty()) {
      OpenRoom room;
      room.page = free_pages.back();
      free_pages.pop_back();
      room.start = Clock::now();
      const std::vector<uint64_t> pages{room.page};
      for (auto& e : cluster->decode) {
        auto rx = e->receiver(next, spec.prefill_id);
        if (!rx.is_ok() || !(*rx)->init().is_ok() || !(*rx)->send_metadata(pages).is_ok()) {
          std::fprintf(stderr, "room %llu: decode side refused\n", (unsigned long long)next);
          std::exit(1);
        }
        room.receivers.push_back(std::move(rx).value());
      }
      for (auto& e : cluster->prefill) {
        auto tx = e->sender(next, spec.decode_id);
        if (!tx.is_ok() || !(*tx)->init(1).is_ok() || !(*tx)->send(pages, true).is_ok()) {
          std::fprintf(stderr, "room %llu: prefill side refused\n", (unsigned long long)next);
          std::exit(1);
        }
        room.senders.push_back(std::move(tx).value());
      }
      open.emplace(next++, std::move(room));
    }
    for (auto it = open.begin(); it != open.end();) {
      bool ended = true, ok = true;
      for (auto& rx : it->second.receivers) {
        const PollState s = rx->poll();
        ended &= s == PollState::kSuccess || s == PollState::kFailed;
        ok &= s == PollState::kSuccess;
      }
      for (auto& tx : it->second.senders) {
        const PollState s = tx->poll();
        ended &= s == PollState::kSuccess || s == PollState::kFailed;
      }
      if (!ended) {
        ++it;
        continue;
      }
      latencies.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - it->second.start).count());
      r.failed += ok ? 0 : 1;
      free_pages.push_back(it->second.page);
      it = open.erase(it);
      ++done;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  r.rooms = rooms;
  r.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  r.p50_ms = percentile(latencies, 0.5);
  r.p99_ms = percentile(latencies, 0.99);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t rooms = 2000;
  uint32_t window = 64;
  std::vector<Pair> pairs = {{1, 1}, {2, 4}, {8, 8}};
  bool json = false, signed_calls = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rooms") {
      rooms = std::stoull(value());
    } else if (a == "--window") {
      window = static_cast<uint32_t>(std::stoul(value()));
    } else if (a == "--pairs") {
      pairs.clear();
      std::string list = value();
      size_t at = 0;
      while (at < list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        unsigned p = 0, d = 0;
        if (std::sscanf(list.substr(at, comma - at).c_str(), "%ux%u", &p, &d) != 2 || p == 0 ||
            d == 0) {
          std::fprintf(stderr, "--pairs: '%s' is not PxD\n", list.substr(at, comma - at).c_str());
          return 2;
        }
        pairs.push_back({p, d});
        at = comma + 1;
      }
    } else if (a == "--signed") {
      signed_calls = true;
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (rooms == 0 || window == 0) {
    std::fprintf(stderr, "--rooms and --window must be at least 1\n");
    return 2;
  }
  std::string out = "[";
  for (const Pair& p : pairs) {
    const PairResult r = run_pair(p, rooms, window, signed_calls);
    if (json) {
      out += fmt::format(
          "{}{{\"prefill_tp\":{},\"decode_tp\":{},\"signed\":{},\"rooms\":{},\"failed\":{},"
          "\"rooms_per_s\":{:.1f},\"p50_ms\":{:.3f},\"p99_ms\":{:.3f}}}",
          out.size() > 1 ? "," : "", p.prefill_tp, p.decode_tp, signed_calls, r.rooms, r.failed,
          r.rooms / std::max(r.seconds, 1e-9), r.p50_ms, r.p99_ms);
    } else {
      std::printf(
          "TP %u -> %u%s: %llu rooms (%llu failed), %.0f rooms/s, p50 %.3f ms, p99 %.3f ms\n",
          p.prefill_tp, p.decode_tp, signed_calls ? " signed" : "", (unsigned long long)r.rooms,
          (unsigned long long)r.failed, r.rooms / std::max(r.seconds, 1e-9), r.p50_ms, r.p99_ms);
      std::fflush(stdout);
    }
  }
  if (json) std::printf("%s]\n", out.c_str());
  return 0;
}
