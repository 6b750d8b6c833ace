// The bootstrap service: where prefill ranks register and decode ranks learn
// a prefill engine's topology (DESIGN §4).
//
// Embed it in prefill rank 0 (BootstrapServer::start) or run it standalone
// (`pdkv bootstrap --port N`). It answers a topology query with "unavailable,
// retry" until every rank of the engine has registered, refuses a
// registration that disagrees with the engine's other ranks (naming both
// values), and lets a restarted rank replace its earlier incarnation.
//
// Thread-safety: start/shutdown from one thread; the service itself runs on
// gRPC's threads.
#pragma once

#include <memory>
#include <string>

#include "pdkv/security.h"
#include "pdkv/status.h"

namespace pdkv {

class BootstrapServer {
 public:
  // `address` is host:port; port 0 picks a free one (see port()). With a
  // secret in `security`, only callers holding it are served.
  static Result<std::unique_ptr<BootstrapServer>> start(const std::string& address,
                                                        const Security& security = {},
                                                        const Limits& limits = {});
  ~BootstrapServer();

  int port() const;
  // Blocks until shutdown() is called from another thread.
  void wait();
  void shutdown();

 private:
  struct Impl;
  explicit BootstrapServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdkv
