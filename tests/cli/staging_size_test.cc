// The staging pool a worker asks for (Shape::staging_bytes), worked out by
// hand for each way heads can travel: whole shares, split shares, GQA
// replication and MLA. Too small and requests wait or fail; too large and
// long prompts do not fit the machine (32k tokens of llama3-8b at 2 -> 4
// once asked for 20 GiB).
#include <gtest/gtest.h>

#include "worker/worker.h"

namespace {

using pdkv::Role;
using pdkv::worker::Shape;

uint64_t staging(const Shape& shape, Role role, uint32_t rank) {
  auto bytes = shape.staging_bytes(role, rank);
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().message();
  return bytes.is_ok() ? *bytes : 0;
}

constexpr uint64_t kGiB = uint64_t{1} << 30;

struct Model {
  uint32_t heads, head_dim, dtype_bytes, page_size, layers;
  uint64_t tokens;
  uint32_t window;
};

Shape shape_of(const Model& m, uint32_t prefill_tp, uint32_t decode_tp) {
  Shape s;
  s.kv_heads = m.heads;
  s.head_dim = m.head_dim;
  s.dtype_bytes = m.dtype_bytes;
  s.page_size = m.page_size;
  s.layers = m.layers;
  s.tokens = m.tokens;
  s.window = m.window;
  s.prefill_tp = prefill_tp;
  s.decode_tp = decode_tp;
  return s;
}

// llama3-8b, 32k tokens, one request: a page item is 16 tokens x 256 B =
// 4 KiB a head; 2048 pages x 32 layers x K,V x 4 KiB = 512 MiB a head.
Shape llama_32k(uint32_t prefill_tp, uint32_t decode_tp) {
  return shape_of({8, 128, 2, 16, 32, 32768, 1}, prefill_tp, decode_tp);
}

TEST(StagingSize, SplitSharesSendEachHeadOnce) {
  // 2 -> 4: prefill rank 0 owns heads 0-3 and sends {0,1} to decode 0 and
  // {2,3} to decode 1: 4 heads, 2 GiB (sizing by D/P destinations: 4 GiB).
  const Shape s = llama_32k(2, 4);
  EXPECT_EQ(staging(s, Role::kPrefill, 0), 2 * kGiB);
  EXPECT_EQ(staging(s, Role::kPrefill, 1), 2 * kGiB);
  EXPECT_EQ(staging(s, Role::kDecode, 3), 1 * kGiB);  // heads 6, 7
}

TEST(StagingSize, MergedSharesAndEqualTp) {
  // 4 -> 2: each prefill rank sends its 2 heads once; decode ranks own 4.
  EXPECT_EQ(staging(llama_32k(4, 2), Role::kPrefill, 2), 1 * kGiB);
  EXPECT_EQ(staging(llama_32k(4, 2), Role::kDecode, 0), 2 * kGiB);
  EXPECT_EQ(staging(llama_32k(1, 1), Role::kPrefill, 0), 4 * kGiB);
  EXPECT_EQ(staging(llama_32k(1, 1), Role::kDecode, 0), 4 * kGiB);
}

// A small shape: a page item is 2 tokens x 4 B = 8 B a head; 2 pages x
// 1 layer x K,V x 8 B x window 3 = 96 B a head.
Shape small(uint32_t heads, uint32_t prefill_tp, uint32_t decode_tp) {
  return shape_of({heads, 4, 1, 2, 1, 4, 3}, prefill_tp, decode_tp);
}

TEST(StagingSize, ReplicatedHeadsAreGatheredOncePerDestination) {
  // 2 KV heads, 1 -> 4: decode ranks own heads 0, 0, 1, 1, all from rank 0.
  const Shape s = small(2, 1, 4);
  EXPECT_EQ(staging(s, Role::kPrefill, 0), 4 * 96u);
  EXPECT_EQ(staging(s, Role::kDecode, 2), 96u);
  // 2 -> 4: rank 0 owns head 0 and writes it to decode 0 and 1.
  EXPECT_EQ(staging(small(2, 2, 4), Role::kPrefill, 0), 2 * 96u);
}

TEST(StagingSize, MlaPagesGoWholeToDestinationsModPrefillTp) {
  // MLA, 2 -> 4: one latent "head"; prefill rank 0 writes decode 0 and 2.
  // Latent page item: 2 tokens x 4 B; no V buffer: 2 pages x 8 B x 3 = 48 B.
  Shape s = small(1, 2, 4);
  s.mla = true;
  EXPECT_EQ(staging(s, Role::kPrefill, 0), 2 * 48u);
  EXPECT_EQ(staging(s, Role::kDecode, 1), 48u);
}

TEST(StagingSize, ATpThatDoesNotDivideTheHeadsIsNamed) {
  const auto bytes = small(8, 2, 3).staging_bytes(Role::kDecode, 0);
  ASSERT_FALSE(bytes.is_ok());
  EXPECT_NE(bytes.status().message().find("decode TP"), std::string::npos)
      << bytes.status().message();
  EXPECT_NE(bytes.status().message().find("3"), std::string::npos) << bytes.status().message();
}

}  // namespace
