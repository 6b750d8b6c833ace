// A C++ program built against an installed pdkv (find_package(pdkv),
// pdkv::pdkv): the C++ API's version of consumer.c. One prefill and one
// decode engine, one room of 4 pages over the backend named by argv[1],
// every decode byte compared with the prefill's pattern. Exits 0 only then.
#include <pdkv/bootstrap.h>
#include <pdkv/engine.h>

#include <cstdio>
#include <cstring>

namespace {

template <typename T>
T must(pdkv::Result<T> result, const char* what) {
  if (!result.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", what, result.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(result).value();
}

void must(const pdkv::Status& status, const char* what) {
  if (!status.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.to_string().c_str());
    std::exit(1);
  }
}

std::unique_ptr<pdkv::Engine> start(pdkv::Role role, const char* id, const char* backend,
                                    const std::string& bootstrap) {
  pdkv::EngineConfig config;
  config.role = role;
  config.engine_id = id;
  config.backend = backend;
  config.kv = pdkv::KvSpec{2, 8, 2, 4, 2, 16, pdkv::Layout::kNhd, false};
  config.bootstrap_address = bootstrap;
  return must(pdkv::Engine::create(config), "Engine::create");
}

unsigned char pattern(size_t buffer, uint64_t offset) {
  return static_cast<unsigned char>(buffer * 131 + offset * 7 + 1);
}

}  // namespace

int main(int argc, char** argv) {
  const char* backend = argc > 1 ? argv[1] : "mooncake";
  auto server = must(pdkv::BootstrapServer::start("127.0.0.1:0"), "BootstrapServer::start");
  const std::string bootstrap = "127.0.0.1:" + std::to_string(server->port());
  auto prefill = start(pdkv::Role::kPrefill, "p", backend, bootstrap);
  auto decode = start(pdkv::Role::kDecode, "d", backend, bootstrap);

  const uint64_t page_bytes = 128;
  const uint64_t src_pages[] = {3, 0, 7, 1}, dst_pages[] = {9, 2, 5, 14};
  const auto& kv = prefill->pools().kv;
  for (size_t b = 0; b < kv.size(); ++b) {
    auto* bytes = static_cast<unsigned char*>(kv[b].base);
    for (uint64_t i = 0; i < kv[b].length; ++i) bytes[i] = pattern(b, i);
  }

  auto sender = must(prefill->sender(42), "Engine::sender");
  auto receiver = must(decode->receiver(42, "p"), "Engine::receiver");
  must(receiver->init(), "Receiver::init");
  must(receiver->send_metadata(dst_pages), "Receiver::send_metadata");
  must(sender->init(4), "Sender::init");
  bool sent = false;
  const auto ended = [](pdkv::PollState s) {
    return s == pdkv::PollState::kSuccess || s == pdkv::PollState::kFailed;
  };
  while (!ended(sender->poll()) || !ended(receiver->poll())) {
    (void)decode->wait_for_changes(std::chrono::milliseconds(50));
    if (!sent && sender->poll() == pdkv::PollState::kWaitingForInput) {
      must(sender->send(src_pages, true), "Sender::send");
      sent = true;
    }
  }
  if (receiver->poll() != pdkv::PollState::kSuccess) {
    std::fprintf(stderr, "transfer failed: %s\n", receiver->failure().to_string().c_str());
    return 1;
  }
  uint64_t wrong = 0;
  const auto& dst = decode->pools().kv;
  for (size_t b = 0; b < dst.size(); ++b) {
    const auto* bytes = static_cast<const unsigned char*>(dst[b].base);
    for (int p = 0; p < 4; ++p) {
      for (uint64_t i = 0; i < page_bytes; ++i) {
        if (bytes[dst_pages[p] * page_bytes + i] != pattern(b, src_pages[p] * page_bytes + i)) {
          ++wrong;
        }
      }
    }
  }
  std::printf("c++ consumer: over %s: 4 pages, %llu bytes, %llu wrong\n", backend,
              static_cast<unsigned long long>(receiver->metrics().bytes),
              static_cast<unsigned long long>(wrong));
  return wrong == 0 ? 0 : 1;
}
