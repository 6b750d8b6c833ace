// The fault campaign: every backend on its network path, ranks on two hosts
// (network namespaces), one fault per trial. Host A runs the bootstrap
// service and the prefill engine (TP 2); host B two decode engines of TP 2
// each, requests round-robin over them. Link 0 carries the control plane
// (--host), link 1 the data plane (backend option host), so that the data
// plane can be cut alone.
//
// Every trial checks what the table promises: the rooms a fault
// touches fail within seconds with a reason that names the rank, rooms it
// does not touch finish, rooms after a passing fault succeed again, no
// process crashes or hangs, and no room counts as succeeded unless its
// decode ranks verified every byte (and saw nothing land in a failed room's
// pages afterwards).
//
// PDKV_FAULT_TRIALS sets the trials per case (2 by default; 20 under the
// CTest label `slow`); PDKV_FAULT_REPORT names a file to which each trial's
// figures are appended as a JSON line (docs/reliability.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "fault/hosts.h"

namespace pdkv {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::Hosts;

enum class Fault { kKillPrefill, kKillDecode, kStopDecode, kLinkDown, kDataBlackhole, kBootstrap };

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kKillPrefill:
      return "kill_prefill_rank";
    case Fault::kKillDecode:
      return "kill_decode_rank";
    case Fault::kStopDecode:
      return "sigstop_decode_rank_3s";
    case Fault::kLinkDown:
      return "link_down_3s";
    case Fault::kDataBlackhole:
      return "data_plane_blackhole_3s";
    case Fault::kBootstrap:
      return "bootstrap_killed_restarted";
  }
  return "?";
}

struct Path {
  std::string name, backend;
  std::vector<std::string> flags;
  std::map<std::string, std::string> env;
};

struct Case {
  Path path;
  Fault fault;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.path.name << " " << fault_name(c.fault); }

std::vector<Path> network_paths() {
  std::vector<Path> paths;
#ifdef PDKV_WITH_NIXL
  paths.push_back({"nixl_ucx_tcp", "nixl", {}, {{"UCX_TLS", "tcp"}}});
#endif
  paths.push_back({"mooncake_tcp", "mooncake", {"--backend-opt", "same_host=off"}, {}});
#ifdef PDKV_WITH_MORI
  paths.push_back({"mori_tcp_rxm", "mori", {"--provider", "tcp;ofi_rxm"}, {}});
#endif
  return paths;
}

// Known defects (docs/reliability.md, item 6): nixl's link-down case
// aborted a prefill rank inside UCX 1.13.1 (uct_tcp_ep_move_ctx_cap's
// assertion, from uct_tcp_iface_progress, no pdkv frame) in 1 trial of a
// fresh-clone make test; its blackhole case lost a prefill rank inside
// uct_tcp_iface_progress in 2 of 6 trials after endpoints were given up
// late. Until their cause is known they run on demand only
// (--gtest_also_run_disabled_tests), not in make test.
bool known_defect(const Path& p, Fault f) {
  return p.backend == "nixl" && (f == Fault::kLinkDown || f == Fault::kDataBlackhole);
}

std::vector<Case> cases(bool defects) {
  std::vector<Case> out;
  for (const Path& p : network_paths()) {
    for (Fault f : {Fault::kKillPrefill, Fault::kKillDecode, Fault::kStopDecode, Fault::kLinkDown,
                    Fault::kDataBlackhole, Fault::kBootstrap}) {
      if (known_defect(p, f) == defects) out.push_back({p, f});
    }
  }
  return out;
}

int trials() {
  const char* env = std::getenv("PDKV_FAULT_TRIALS");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 2;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr uint32_t kEngines = 2, kTp = 2;
constexpr uint32_t kVictimRoomsLeft = 24;   // a killed rank's rooms still to come
constexpr uint64_t kRoomsBeforeFault = 20;  // every peer known, the pace steady
// The limits: named within 3 s, healed within 5 s. A sanitizer build
// (several times slower in every process) is given twice as long.
#ifdef PDKV_SANITIZED_BUILD
constexpr int64_t kSlowdown = 2;
#else
constexpr int64_t kSlowdown = 1;
#endif
constexpr int64_t kDetectLimitMs = 3000 * kSlowdown, kRecoverLimitMs = 5000 * kSlowdown;
// The bootstrap service's absence, and the most its restart may take (a
// sanitizer build's start-up under CI's load took over 3 s).
constexpr int64_t kAbsenceMs = 2000, kRestartMs = 3000 * kSlowdown;

// How many requests a trial's workers make, one each `interval_ms`.
struct Pace {
  uint32_t requests;
  int64_t interval_ms;
};

// 300 requests, one every 20 ms (150 per decode engine), outlast every fault
// but the bootstrap service's: its workers must outlive the absence, the
// restart and the lookup that waits for them to register again (a worker
// that has finished its requests has exited and registers nowhere; with 300
// requests a sanitizer build under load restarted the service as the
// workers ended). That run is paced slower rather than made of more rooms:
// it needs rooms only to show that they flow while the service is away.
Pace pace_of(Fault fault) {
  if (fault != Fault::kBootstrap) return {300, 20};
  constexpr int64_t kInterval = 100;
  constexpr int64_t kFaultLasts = kAbsenceMs + kRestartMs + kRecoverLimitMs;
  return {static_cast<uint32_t>(2 * kRoomsBeforeFault + kFaultLasts / kInterval), kInterval};
}

// What one trial measured.
struct Figures {
  uint64_t failures = 0;                // failed rooms, over every surviving rank
  std::optional<int64_t> detection_ms;  // fault -> first failure
  std::optional<int64_t> recovery_ms;   // fault over -> first success after it
  std::string first_failure;            // "rank: room R: reason"
  uint64_t late_failures = 0;           // failed more than 5 s after the fault ended
  uint64_t collateral = 0;              // failed rooms of decode-0 (untouched but for links)
  uint64_t late_landings = 0;  // SIGSTOP: rooms of the frozen rank that got bytes after failing
  std::optional<int64_t> reregistered_ms;  // bootstrap: its return -> every rank known again
};

// One trial: the processes, the fault, the summaries.
class Trial {
 public:
  Trial(const Path& path, Fault fault)
      : path_(path), fault_(fault), pace_(pace_of(fault)), hosts_(2) {}

  const std::string& why_not() const { return hosts_.why_not(); }

  void run() {
    ASSERT_TRUE(hosts_.ok());
    start_bootstrap(0);
    for (uint32_t r = 0; r < kTp; ++r) prefill_.push_back(&worker('a', "prefill", "prefill", r));
    decode_.resize(kEngines);
    for (uint32_t e = 0; e < kEngines; ++e) start_decode_engine(e);
    inject();
    collect();
  }

  void check(Figures& figures);

 private:
  std::string engine_id(uint32_t e) const { return "decode-" + std::to_string(e); }

  void start_bootstrap(uint16_t port) {
    address_ = hosts_.start_bootstrap(port, &bootstrap_);
    ASSERT_FALSE(address_.empty());
  }

  ChildProcess& worker(char host, const char* role, const std::string& engine, uint32_t rank) {
    std::vector<std::string> argv = {
        PDKV_BIN, role, "--engine-id", engine, "--tp-rank", std::to_string(rank), "--bootstrap",
        address_, "--host", Hosts::address(host, 0), "--backend-opt",
        "host=" + Hosts::address(host, 1), "--backend", path_.backend, "--prefill-tp",
        std::to_string(kTp), "--decode-tp", std::to_string(kTp), "--decode-engines",
        std::to_string(kEngines), "--kv-heads", "8", "--requests", std::to_string(pace_.requests),
        "--interval-ms", std::to_string(pace_.interval_ms), "--tokens", "64", "--page-size", "16",
        "--head-dim", "32", "--layers", "2", "--window", "4", "--keep-going", "--engine-timeout",
        "transfer=2000", "--engine-timeout", "connect=2000",
        // A room one side gave up while cut off is told to the other over a
        // fresh link once the fault ends (docs/reliability.md, item 3); a
        // notice that is lost still leaves the prefill side's data timeout,
        // and decode ranks wait longer, so that the rooms of the untouched
        // engine, queued behind such rooms, outlast it.
        "--engine-timeout", std::string(role) == "prefill" ? "data=8000" : "data=20000"};
    argv.insert(argv.end(), path_.flags.begin(), path_.flags.end());
    return hosts_.start(host, argv, path_.env);
  }

  void start_decode_engine(uint32_t e) {
    for (uint32_t r = 0; r < kTp; ++r)
      decode_[e].push_back(&worker('b', "decode", engine_id(e), r));
  }

  // Until `worker` (prefill rank 0 unless named) has finished `n` requests
  // (every worker prints a line each). One limit for the whole wait, start-up
  // included: on a loaded machine the first line may take seconds (every
  // process of the trial starting at once), and a stall later shows as rooms
  // failed before the fault.
  void await_progress(uint64_t n, ChildProcess* worker = nullptr) {
    if (worker == nullptr) worker = prefill_[0];
    const auto start = std::chrono::steady_clock::now(), end = start + 60s;
    std::string last = "(none)";
    while (std::chrono::steady_clock::now() < end) {
      const std::string line =
          worker->read_line(std::chrono::duration_cast<std::chrono::milliseconds>(
              end - std::chrono::steady_clock::now()));
      unsigned long long done = 0;
      if (std::sscanf(line.c_str(), "progress %llu", &done) == 1 && done >= n) return;
      if (line.empty()) break;
      last = line;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    FAIL() << "worker pid " << worker->pid() << " did not reach " << n << " requests in "
           << waited.count() << " ms; its last line: " << last;
  }

  void inject();
  void collect();

  const Path path_;
  const Fault fault_;
  const Pace pace_;
  Hosts hosts_;
  std::string address_;  // the bootstrap service
  ChildProcess* bootstrap_ = nullptr;
  std::vector<ChildProcess*> prefill_;
  std::vector<std::vector<ChildProcess*>> decode_;  // [engine][rank]
  ChildProcess* victim_ = nullptr;                  // killed: no summary expected
  int64_t fault_at_ = 0, over_at_ = 0;              // epoch ms
  bool registered_again_ = false;                   // kBootstrap: every engine, in time
  int64_t reregistered_ms_ = 0;                     // kBootstrap: its return -> all known
  std::string last_lookup_;                         // kBootstrap: what the lookup said
  // Every surviving worker's summary and exit status, with its name.
  struct Outcome {
    std::string name;
    bool decode;
    uint32_t engine, rank;
    nlohmann::json summary;
    int status;
  };
  std::vector<Outcome> outcomes_;
};

void Trial::inject() {
  switch (fault_) {
    case Fault::kKillPrefill:
    case Fault::kKillDecode:
      // Late in the run: the rooms after it fail one by one (each finds the
      // rank gone), so fewer of them keep the trial short. The victim's own
      // progress is watched, not another rank's: a rank that lags (a loaded
      // machine) could otherwise be counted while the victim had no rooms
      // left to fail, and then nobody would notice its death.
      victim_ = fault_ == Fault::kKillPrefill ? prefill_[1] : decode_[1][0];
      await_progress((fault_ == Fault::kKillPrefill ? pace_.requests : pace_.requests / kEngines) -
                         kVictimRoomsLeft,
                     victim_);
      fault_at_ = now_ms();
      victim_->kill_now();
      return;
    case Fault::kStopDecode:
      await_progress(kRoomsBeforeFault);
      fault_at_ = now_ms();
      decode_[1][0]->signal(SIGSTOP);
      std::this_thread::sleep_for(3s);  // the fault's duration, not a wait for anything
      decode_[1][0]->signal(SIGCONT);
      over_at_ = now_ms();
      return;
    case Fault::kLinkDown:
    case Fault::kDataBlackhole: {
      await_progress(kRoomsBeforeFault);
      const bool all = fault_ == Fault::kLinkDown;
      fault_at_ = now_ms();
      if (all) {
        ASSERT_TRUE(hosts_.link(0, false));
      }
      ASSERT_TRUE(hosts_.link(1, false));
      std::this_thread::sleep_for(3s);  // the fault's duration
      if (all) {
        ASSERT_TRUE(hosts_.link(0, true));
      }
      ASSERT_TRUE(hosts_.link(1, true));
      over_at_ = now_ms();
      return;
    }
    case Fault::kBootstrap: {
      await_progress(kRoomsBeforeFault);
      const std::string port = address_.substr(address_.rfind(':') + 1);
      fault_at_ = now_ms();
      bootstrap_->kill_now();
      // The service's absence, not a wait for anything.
      std::this_thread::sleep_for(std::chrono::milliseconds(kAbsenceMs));
      const int64_t restart_at = now_ms();
      start_bootstrap(static_cast<uint16_t>(std::stoi(port)));
      over_at_ = now_ms();
      // Said, not excused: past this the workers may end before the lookup.
      EXPECT_LE(over_at_ - restart_at, kRestartMs)
          << "the restarted service took that long to listen";
      // The new service knows nobody; every rank registers again by itself,
      // after which a lookup of any engine succeeds. One process asks for
      // every engine and waits (a process started per attempt took seconds
      // of the limit under a sanitizer's load). Asked from host B, as a
      // decode rank would ask.
      const auto r = testing::run_command(
          "ip netns exec " + hosts_.ns('b') + " " + PDKV_BIN + " topology --bootstrap " + address_ +
          " --engine prefill --engine decode-0 --engine decode-1 --wait --timeout " +
          std::to_string(kRecoverLimitMs / 1000.0));
      reregistered_ms_ = now_ms() - over_at_;
      size_t whole = 0;
      for (size_t at = 0, end; (end = r.out.find('\n', at)) != std::string::npos; at = end + 1) {
        const auto j = nlohmann::json::parse(r.out.substr(at, end - at), nullptr, false);
        if (!j.is_discarded() && j["ranks"].size() == kTp) ++whole;
      }
      registered_again_ = r.exit_code == 0 && whole == kEngines + 1;  // prefill and each decode
      last_lookup_ = "exit " + std::to_string(r.exit_code) + ": " + r.out + r.err;
      return;
    }
  }
}

void Trial::collect() {
  auto take = [&](ChildProcess* p, std::string name, bool decode, uint32_t engine, uint32_t rank) {
    if (p == victim_) return;
    Outcome o{std::move(name), decode, engine, rank, testing::summary_of(*p, 90s), -1};
    // A worker that reported exits at once; one that hangs is killed here.
    const auto status = p->wait_for(30s);
    EXPECT_TRUE(status.has_value()) << o.name << " did not exit; killed it";
    o.status = status.value_or(-1);
    outcomes_.push_back(std::move(o));
  };
  for (uint32_t r = 0; r < prefill_.size(); ++r) {
    take(prefill_[r], "prefill rank " + std::to_string(r), false, 0, r);
  }
  for (uint32_t e = 0; e < decode_.size(); ++e) {
    for (uint32_t r = 0; r < decode_[e].size(); ++r) {
      take(decode_[e][r], engine_id(e) + " rank " + std::to_string(r), true, e, r);
    }
  }
}

void Trial::check(Figures& figures) {
  std::vector<std::pair<int64_t, std::string>> failures;  // at_ms, "name: room R: reason"
  // Per room: how many decode ranks of its engine succeeded, and when the
  // last of them did (epoch ms). A room succeeded once all kTp have.
  std::map<uint64_t, std::pair<uint32_t, int64_t>> successes;
  for (const Outcome& o : outcomes_) {
    // No crash, no hang: every survivor reported and exited 0 (verified).
    ASSERT_FALSE(o.summary.is_discarded()) << o.name << " printed no summary";
    const bool frozen = fault_ == Fault::kStopDecode && o.decode && o.engine == 1 && o.rank == 0;
    if (frozen && !o.summary["verified"].get<bool>()) {
      // The one documented limit (transport.h, "kFailed means over"): what
      // the frozen rank's kernel had received it applies as it thaws, into
      // rooms it failed. It exits 1 for them, but a wrong byte in a room it
      // counted as succeeded is still an error (failed_rooms holds every
      // reason; errors only the first few).
      EXPECT_TRUE(WIFEXITED(o.status)) << o.name << " wait status " << o.status;
      for (const auto& e : o.summary["errors"]) {
        const std::string text = e.get<std::string>();
        if (text.find("bytes landed in its pages after it failed") != std::string::npos) {
          ++figures.late_landings;
        }
      }
      for (const auto& f : o.summary["failed_rooms"]) {
        EXPECT_EQ(f["reason"].get<std::string>().find(": got 0x"), std::string::npos)
            << o.name << ": room " << f["room"] << ": " << f["reason"];
      }
      EXPECT_GT(figures.late_landings, 0u) << o.name << " unverified: " << o.summary["errors"];
    } else {
      EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) == 0)
          << o.name << " exit status " << o.status << ": " << o.summary;
      EXPECT_TRUE(o.summary["verified"].get<bool>()) << o.name << ": " << o.summary["errors"];
    }
    for (const auto& f : o.summary["failed_rooms"]) {
      failures.push_back({f["at_ms"].get<int64_t>(), o.name + ": room " +
                                                         std::to_string(f["room"].get<uint64_t>()) +
                                                         ": " + f["reason"].get<std::string>()});
    }
    if (o.decode) {
      for (const auto& e : o.summary["events_us"]) {  // [room, epoch µs] of each success
        auto& [ranks, last] = successes[e[0].get<uint64_t>()];
        ++ranks;
        last = std::max(last, e[1].get<int64_t>() / 1000);
      }
    }
    // The decode engine a killed rank does not belong to loses nothing.
    // (A frozen rank is different: rooms of the other engine queued behind
    // the frozen one's at the prefill engine may time out, at most 3 (item
    // 3 of docs/reliability.md); they are counted, not excused silently.)
    const bool other_engine = o.decode && o.engine == 0;
    if ((other_engine && fault_ == Fault::kKillDecode) ||
        (o.decode && fault_ == Fault::kBootstrap)) {
      EXPECT_EQ(o.summary["failed"].get<uint64_t>(), 0u) << o.name << ": " << o.summary["errors"];
    }
    if (other_engine) figures.collateral += o.summary["failed"].get<uint64_t>();
  }
  std::sort(failures.begin(), failures.end());
  figures.failures = failures.size();
  if (!failures.empty()) figures.detection_ms = failures.front().first - fault_at_;
  // Rooms that succeeded whole: while the fault lasted, and the first after
  // it of the engine the fault touched (decode-1 for a frozen rank; any for
  // the links).
  uint64_t successes_during = 0;
  for (const auto& [room, s] : successes) {
    const auto [ranks, at] = s;
    if (ranks < kTp) continue;
    if (at >= fault_at_ && at < over_at_) ++successes_during;
    const bool touched = fault_ != Fault::kStopDecode || (room - 1) % kEngines == 1;
    if (over_at_ > 0 && at >= over_at_ && touched &&
        (!figures.recovery_ms || at - over_at_ < *figures.recovery_ms)) {
      figures.recovery_ms = at - over_at_;
    }
  }
  const std::string first = failures.empty() ? "" : failures.front().second;
  figures.first_failure = first;
  // Nothing failed before the fault (the detection time would be negative).
  EXPECT_TRUE(failures.empty() || failures.front().first >= fault_at_)
      << "a room failed before the fault: " << first;
  switch (fault_) {
    case Fault::kBootstrap:
      // Known peers need no service: nothing failed, rooms went on while it
      // was away, and every rank registered again once it was back.
      EXPECT_TRUE(failures.empty()) << first;
      EXPECT_GT(successes_during, 0u) << "no room succeeded while the service was away";
      EXPECT_TRUE(registered_again_) << "the restarted service did not learn every rank in "
                                     << kRecoverLimitMs << " ms; the lookup: " << last_lookup_;
      figures.reregistered_ms = reregistered_ms_;
      return;
    case Fault::kKillPrefill:
    case Fault::kKillDecode: {
      ASSERT_FALSE(failures.empty()) << "nobody noticed the killed rank";
      EXPECT_LE(*figures.detection_ms, kDetectLimitMs) << first;
      const std::string rank =
          fault_ == Fault::kKillPrefill ? "prefill dp 0 tp 1" : "decode-1 dp 0 tp 0";
      EXPECT_NE(first.find(rank), std::string::npos)
          << "the first failure does not name " << rank << ": " << first;
      return;
    }
    case Fault::kStopDecode:
    case Fault::kLinkDown:
    case Fault::kDataBlackhole:
      ASSERT_FALSE(failures.empty()) << "nobody noticed the fault";
      EXPECT_LE(*figures.detection_ms, kDetectLimitMs) << first;
      if (fault_ != Fault::kDataBlackhole) {
        const std::string rank = fault_ == Fault::kStopDecode ? "decode-1 dp 0 tp 0" : "dp 0 tp";
        EXPECT_NE(first.find(rank), std::string::npos) << first;
      }
      // Then the system heals by itself: a room succeeds within 5 s, and no
      // room fails later than that.
      ASSERT_TRUE(figures.recovery_ms.has_value()) << "no room succeeded after the fault";
      EXPECT_LE(*figures.recovery_ms, kRecoverLimitMs);
      // Later failures may only be the fault's tail: rooms the prefill
      // worker's in-order window held up behind rooms waiting for a data
      // timeout (item 3 of docs/reliability.md) time out, or find their
      // room closed. A connection lost again after healing is an error, and
      // so is a room refused as closed by a side that gave it up during the
      // fault while the other waited (the notice must reach it).
      for (const auto& [at, what] : failures) {
        if (at - over_at_ <= kRecoverLimitMs) continue;
        ++figures.late_failures;
        const bool tail = what.find(" within ") != std::string::npos ||
                          what.find("used and closed already") != std::string::npos;
        EXPECT_TRUE(tail) << "a room failed long after the fault: " << what;
      }
      return;
  }
}

// Whether the checks since part `from` of the test's result all passed:
// this trial's verdict, whatever earlier trials did.
bool trial_passed(const ::testing::TestResult& result, int from) {
  for (int i = from; i < result.total_part_count(); ++i) {
    if (result.GetTestPartResult(i).failed()) return false;
  }
  return true;
}

void run_campaign(const Case& c) {
  const char* report = std::getenv("PDKV_FAULT_REPORT");
  const ::testing::TestResult& result =
      *::testing::UnitTest::GetInstance()->current_test_info()->result();
  for (int t = 0; t < trials(); ++t) {
    SCOPED_TRACE("trial " + std::to_string(t + 1));
    Figures figures;
    const int parts_before = result.total_part_count();
    {
      Trial trial(c.path, c.fault);
      if (!trial.why_not().empty()) GTEST_SKIP() << trial.why_not();
      trial.run();
      if (::testing::Test::HasFatalFailure()) return;
      trial.check(figures);
    }  // every process ended, by pid; the namespaces removed
    const nlohmann::json line = {
        {"backend", c.path.name},
        {"fault", fault_name(c.fault)},
        {"ok", trial_passed(result, parts_before)},
        {"failures", figures.failures},
        {"detection_ms", figures.detection_ms ? nlohmann::json(*figures.detection_ms) : nullptr},
        {"recovery_ms", figures.recovery_ms ? nlohmann::json(*figures.recovery_ms) : nullptr},
        {"late_landings", figures.late_landings},
        {"reregistered_ms",
         figures.reregistered_ms ? nlohmann::json(*figures.reregistered_ms) : nullptr},
        {"collateral", figures.collateral},
        {"late_failures", figures.late_failures},
        {"first_failure", figures.first_failure}};
    std::printf("trial %s\n", line.dump().c_str());
    if (report != nullptr) std::ofstream(report, std::ios::app) << line.dump() << "\n";
    if (::testing::Test::HasFatalFailure()) return;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.path.name + "_" + fault_name(info.param.fault);
}

class FaultCampaign : public ::testing::TestWithParam<Case> {};
TEST_P(FaultCampaign, FailsNamedThenHealsAndNeverLiesAboutBytes) { run_campaign(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Campaign, FaultCampaign, ::testing::ValuesIn(cases(false)), case_name);

class KnownDefect : public ::testing::TestWithParam<Case> {};
TEST_P(KnownDefect, DISABLED_FailsNamedThenHealsAndNeverLiesAboutBytes) {
  run_campaign(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Campaign, KnownDefect, ::testing::ValuesIn(cases(true)), case_name);

}  // namespace
}  // namespace pdkv
