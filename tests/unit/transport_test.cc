// The transport registry and the test-only loopback transport.
#include "pdkv/transport.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace pdkv {
namespace {

TEST(TransportRegistry, UnknownNameListsWhatIsBuilt) {
  auto t = create_transport("carrier-pigeon");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("no transport backend named 'carrier-pigeon' (built: "),
            std::string::npos);
  EXPECT_NE(t.status().message().find("loopback"), std::string::npos);
}

TEST(TransportRegistry, DuplicateNameRefused) {
  EXPECT_FALSE(register_transport("loopback", [](const TransportOptions&) {
    return Result<std::unique_ptr<Transport>>(Status::internal("never"));
  }));
}

class Loopback : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = std::move(create_transport("loopback")).value();
    b_ = std::move(create_transport("loopback")).value();
    src_.resize(256);
    std::iota(src_.begin(), src_.end(), 0);
    dst_.assign(256, 0xEE);
    src_key_ = a_->register_region({src_.data(), src_.size()}).value();
    dst_key_ = b_->register_region({dst_.data(), dst_.size()}).value();
    peer_ = a_->connect(b_->descriptor()).value();
  }
  std::unique_ptr<Transport> a_, b_;
  std::vector<uint8_t> src_, dst_;
  RegionKey src_key_ = 0, dst_key_ = 0;
  PeerId peer_ = 0;
};

TEST_F(Loopback, WritesLandAndCompleteOnce) {
  const std::vector<WriteOp> ops = {{src_key_, 10, dst_key_, 0, 4},
                                    {src_key_, 200, dst_key_, 100, 2}};
  const BatchId batch = a_->write(peer_, ops).value();
  EXPECT_EQ(a_->poll(batch).state, BatchState::kDone);
  EXPECT_EQ(a_->poll(batch).error.code(), StatusCode::kNotFound);
  EXPECT_EQ(dst_[0], 10);
  EXPECT_EQ(dst_[3], 13);
  EXPECT_EQ(dst_[4], 0xEE);
  EXPECT_EQ(dst_[100], 200);
  EXPECT_EQ(dst_[101], 201);
}

TEST_F(Loopback, OutOfRegionWriteRefusedBeforeAnyByteMoves) {
  const std::vector<WriteOp> ops = {{src_key_, 0, dst_key_, 0, 4}, {src_key_, 0, dst_key_, 250, 8}};
  auto batch = a_->write(peer_, ops);
  ASSERT_FALSE(batch.is_ok());
  EXPECT_EQ(batch.status().message(),
            "write 1: remote bytes [250, 258) outside remote region 0 of 256 bytes");
  EXPECT_EQ(dst_[0], 0xEE);
  EXPECT_EQ(a_->write(peer_, std::vector<WriteOp>{{3, 0, dst_key_, 0, 1}}).status().message(),
            "write 0: local region 3 is not registered (1 are)");
}

TEST_F(Loopback, FailedPeerRefusesWritesAndCallsBackOnce) {
  int calls = 0;
  std::string reason;
  a_->set_peer_failure_callback([&](PeerId p, const Status& s) {
    EXPECT_EQ(p, peer_);
    ++calls;
    reason = s.message();
  });
  a_->fail_peer(peer_, Status::unavailable("decode/0 died"));
  a_->fail_peer(peer_, Status::unavailable("again"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(reason, "decode/0 died");
  EXPECT_EQ(
      a_->write(peer_, std::vector<WriteOp>{{src_key_, 0, dst_key_, 0, 1}}).status().message(),
      "decode/0 died");
}

TEST_F(Loopback, GonePeerIsAnErrorNotACrash) {
  const std::string desc = b_->descriptor();
  b_.reset();
  auto batch = a_->write(peer_, std::vector<WriteOp>{{src_key_, 0, 0, 0, 1}});
  EXPECT_EQ(batch.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(a_->connect(desc).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(a_->connect("ucx:xyz").status().message(), "not a loopback descriptor: 'ucx:xyz'");
}

}  // namespace
}  // namespace pdkv
