// Two transports of one backend, a patterned source region on one and a
// destination region on the other, connected sender -> receiver: the fixture
// of the backend tests. Derive from it to use its members directly.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "pdkv/transport.h"
#include "support/poll.h"

namespace pdkv::testing {

// Waits for a batch to end; its final status (still kInProgress on timeout).
inline BatchStatus wait_batch(Transport& t, BatchId batch,
                              std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  BatchStatus st;
  poll_until([&] { return (st = t.poll(batch)).state != BatchState::kInProgress; }, limit);
  return st;
}

class TransportPair {
 protected:
  // How the sender connects to a descriptor (a test may wrap it, e.g. to run
  // it inside a network namespace).
  using ConnectFn = std::function<Result<PeerId>(Transport&, const std::string&)>;

  // Registers `bytes` on each side (source filled with a pattern, destination
  // with 0xEE) and connects sender -> receiver.
  void connect(size_t bytes, const ConnectFn& how = nullptr) {
    src_.resize(bytes);
    for (size_t i = 0; i < bytes; ++i) src_[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
    dst_.assign(bytes, 0xEE);
    src_key_ = sender_->register_region({src_.data(), src_.size()}).value();
    dst_key_ = receiver_->register_region({dst_.data(), dst_.size()}).value();
    receiver_->release_to_peers();  // the 0xEE fill comes before the peer's writes
    const std::string desc = receiver_->descriptor();
    auto peer = how ? how(*sender_, desc) : sender_->connect(desc);
    ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
    peer_ = *peer;
  }
  // The destination bytes, once a batch is done: the receiver orders what
  // peers wrote before this thread reads it (acquire_remote_writes).
  // Refills the destination with 0xEE before the next batch.
  void reset_destination() {
    std::fill(dst_.begin(), dst_.end(), 0xEE);
    receiver_->release_to_peers();
  }
  const std::vector<uint8_t>& received() {
    receiver_->acquire_remote_writes();
    return dst_;
  }

  // Memory first: it outlives the transports, whose threads may touch it.
  std::vector<uint8_t> src_, dst_;
  std::unique_ptr<Transport> sender_, receiver_;
  RegionKey src_key_ = 0, dst_key_ = 0;
  PeerId peer_ = 0;
};

}  // namespace pdkv::testing
