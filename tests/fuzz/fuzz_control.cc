// Control messages on a live engine pair: TransferInfo to the prefill rank,
// RoomStatus and RoomStatuses (several reports) to the decode rank,
// AbortRoom to the prefill rank, each from the input's bytes (through gRPC,
// as a peer would send them). Flag bits
// make some of them well-formed enough to reach deeper: this protocol
// version, a room id the engines share, the real peer's name. Every 1024
// inputs a real room must still move between the engines (liveness).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "bootstrap/client.h"
#include "engine/routing.h"
#include "pdkv.grpc.pb.h"
#include "pdkv/bootstrap.h"
#include "pdkv/engine.h"

namespace {

using namespace pdkv;
using namespace std::chrono_literals;

struct Live {
  std::unique_ptr<BootstrapServer> bootstrap;
  std::unique_ptr<Engine> prefill, decode;
  proto::RankRef prefill_ref, decode_ref;
  std::unique_ptr<proto::Control::Stub> to_prefill, to_decode;
  uint64_t next_room = 1ull << 60;
};

EngineConfig config(Role role, const std::string& bootstrap) {
  EngineConfig c;
  c.role = role;
  c.engine_id = role == Role::kPrefill ? "prefill" : "decode";
  c.kv = KvSpec{2, 4, 2, 4, 2, 16, Layout::kNhd, false};
  c.backend = "loopback";
  c.bootstrap_address = bootstrap;
  c.timeouts.bootstrap = 2s;
  c.timeouts.waiting_for_data = 2s;
  c.timeouts.transfer = 2s;
  c.limits.early_rooms = 256;
  c.limits.pending_lookups = 16;
  return c;
}

// The rank as the bootstrap service registered it (with its incarnation).
proto::RankRef ref(const std::string& bootstrap, const std::string& engine) {
  return engine::ref_of(
      bootstrap::Client(bootstrap, Security{}).topology(engine, 0, 5s).value().at(0));
}

Live& live() {
  static Live* l = [] {
    auto* l = new Live;
    l->bootstrap = BootstrapServer::start("127.0.0.1:0").value();
    const std::string address = "127.0.0.1:" + std::to_string(l->bootstrap->port());
    l->prefill = Engine::create(config(Role::kPrefill, address)).value();
    l->decode = Engine::create(config(Role::kDecode, address)).value();
    l->prefill_ref = ref(address, "prefill");
    l->decode_ref = ref(address, "decode");
    auto stub = [](const Engine& e) {
      return proto::Control::NewStub(
          grpc::CreateChannel(e.control_address(), grpc::InsecureChannelCredentials()));
    };
    l->to_prefill = stub(*l->prefill);
    l->to_decode = stub(*l->decode);
    return l;
  }();
  return *l;
}

// A room between the two engines must still succeed; the process stops if not.
void check_alive(Live& l) {
  const uint64_t room = l.next_room++;
  const std::vector<uint64_t> pages = {1, 2};
  auto rx = l.decode->receiver(room, "prefill").value();
  auto tx = l.prefill->sender(room, "decode").value();
  if (!rx->init().is_ok() || !rx->send_metadata(pages).is_ok() || !tx->init(2).is_ok() ||
      !tx->send(pages, true).is_ok()) {
    __builtin_trap();
  }
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (rx->poll() != PollState::kSuccess) {
    if (rx->poll() == PollState::kFailed || std::chrono::steady_clock::now() > until) {
      __builtin_trap();
    }
    std::this_thread::sleep_for(1ms);  // polling a result, not ordering threads
  }
}

template <typename Message>
void fix_up(Message& m, uint8_t flags) {
  if (flags & 1) m.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  if (flags & 2) m.set_room(m.room() % 16);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  Live& l = live();
  const uint8_t op = data[0] % 4, flags = data[1];
  const char* bytes = reinterpret_cast<const char*>(data + 2);
  const int length = static_cast<int>(size - 2);
  grpc::ClientContext ctx;
  // Some answers wait (an abort for writes to end, early metadata for a
  // lookup): the fuzzer moves on after a moment, the engine still answers.
  ctx.set_deadline(std::chrono::system_clock::now() + 100ms);
  proto::ControlReply reply;
  if (op == 0) {
    proto::TransferInfo info;
    if (!info.ParseFromArray(bytes, length)) return 0;
    fix_up(info, flags);
    if (flags & 4) *info.mutable_decode() = l.decode_ref;
    (void)l.to_prefill->SendTransferInfo(&ctx, info, &reply);
  } else if (op == 1) {
    proto::RoomStatus status;
    if (!status.ParseFromArray(bytes, length)) return 0;
    fix_up(status, flags);
    if (flags & 4) *status.mutable_prefill() = l.prefill_ref;
    (void)l.to_decode->ReportStatus(&ctx, status, &reply);
  } else if (op == 3) {
    proto::RoomStatuses batch;
    if (!batch.ParseFromArray(bytes, length)) return 0;
    if (flags & 1) batch.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    for (proto::RoomStatus& status : *batch.mutable_statuses()) {
      fix_up(status, flags);
      if (flags & 4) *status.mutable_prefill() = l.prefill_ref;
    }
    proto::ControlReplies replies;
    (void)l.to_decode->ReportStatuses(&ctx, batch, &replies);
  } else {
    proto::AbortRequest abort;
    if (!abort.ParseFromArray(bytes, length)) return 0;
    fix_up(abort, flags);
    if (flags & 4) *abort.mutable_decode() = l.decode_ref;
    (void)l.to_prefill->AbortRoom(&ctx, abort, &reply);
  }
  static uint64_t runs = 0;
  if (++runs % 1024 == 0) check_alive(l);
  return 0;
}
