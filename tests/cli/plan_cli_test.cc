// `pdkv plan` as a user runs it: exact JSON, table output, and exit status 2
// with one line on stderr for invalid input.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "support/run_command.h"

namespace {

using pdkv::testing::CommandResult;

CommandResult run_pdkv(const std::string& args) {
  return pdkv::testing::run_command(std::string(PDKV_BIN) + " " + args);
}

TEST(PlanCli, JsonGqaReplication) {
  const CommandResult r = run_pdkv("plan --kv-heads 2 --prefill-tp 1 --decode-tp 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "{\"segments\":["
            "{\"src_rank\":0,\"dst_rank\":0,\"src_head\":0,\"dst_head\":0,\"num_heads\":1},"
            "{\"src_rank\":0,\"dst_rank\":1,\"src_head\":0,\"dst_head\":0,\"num_heads\":1},"
            "{\"src_rank\":0,\"dst_rank\":2,\"src_head\":1,\"dst_head\":0,\"num_heads\":1},"
            "{\"src_rank\":0,\"dst_rank\":3,\"src_head\":1,\"dst_head\":0,\"num_heads\":1}]}\n");
  EXPECT_EQ(r.err, "");
}

TEST(PlanCli, JsonTp4To2MergesContiguousHeads) {
  const CommandResult r = run_pdkv("plan --kv-heads 8 --prefill-tp 4 --decode-tp 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "{\"segments\":["
            "{\"src_rank\":0,\"dst_rank\":0,\"src_head\":0,\"dst_head\":0,\"num_heads\":2},"
            "{\"src_rank\":1,\"dst_rank\":0,\"src_head\":0,\"dst_head\":2,\"num_heads\":2},"
            "{\"src_rank\":2,\"dst_rank\":1,\"src_head\":0,\"dst_head\":0,\"num_heads\":2},"
            "{\"src_rank\":3,\"dst_rank\":1,\"src_head\":0,\"dst_head\":2,\"num_heads\":2}]}\n");
}

TEST(PlanCli, JsonMla) {
  const CommandResult r = run_pdkv("plan --mla --prefill-tp 2 --decode-tp 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "{\"segments\":["
            "{\"src_rank\":0,\"dst_rank\":0,\"src_head\":0,\"dst_head\":0,\"num_heads\":0,"
            "\"whole_page\":true},"
            "{\"src_rank\":0,\"dst_rank\":2,\"src_head\":0,\"dst_head\":0,\"num_heads\":0,"
            "\"whole_page\":true},"
            "{\"src_rank\":1,\"dst_rank\":1,\"src_head\":0,\"dst_head\":0,\"num_heads\":0,"
            "\"whole_page\":true},"
            "{\"src_rank\":1,\"dst_rank\":3,\"src_head\":0,\"dst_head\":0,\"num_heads\":0,"
            "\"whole_page\":true}]}\n");
}

TEST(PlanCli, TableNamesGlobalHeads) {
  const CommandResult r = run_pdkv("plan --kv-heads 2 --prefill-tp 1 --decode-tp 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 KV heads: prefill TP 1 -> decode TP 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("       0        2        1        0         1  [1, 2)"), std::string::npos)
      << r.out;
}

TEST(PlanCli, FragmentStatsByHand) {
  // 8 heads, TP 2 -> 4, nhd, 16 tokens/page, head vector 128 x 2 = 256 B,
  // 3 pages, 2 layers: each pair moves 2 heads per token (512 B), strided on
  // the prefill side, so one fragment per (layer, K/V, page, token) = 2*2*3*16
  // = 192 after coalescing, 384 head vectors before; bytes 192 * 512.
  const CommandResult r =
      run_pdkv("plan --kv-heads 8 --prefill-tp 2 --decode-tp 4 --pages 3 --layers 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"fragments\":[{\"src_rank\":0,\"dst_rank\":0,\"bytes\":98304,"
                       "\"fragments_before\":384,\"fragments_after\":192}"),
            std::string::npos)
      << r.out;
  const CommandResult hnd =
      run_pdkv("plan --kv-heads 8 --prefill-tp 2 --decode-tp 4 --pages 3 --layers 2 --layout hnd");
  ASSERT_EQ(hnd.exit_code, 0) << hnd.err;
  // Head-major: one fragment per (layer, K/V, page) = 12, of 98304 / 12 = 8192 B.
  EXPECT_NE(hnd.out.find("98304          384           12             8192"), std::string::npos)
      << hnd.out;
}

struct Invalid {
  const char* name;
  const char* args;
  const char* message;
};

void PrintTo(const Invalid& c, std::ostream* os) { *os << c.name; }

class PlanCliInvalid : public ::testing::TestWithParam<Invalid> {};

TEST_P(PlanCliInvalid, ExitTwoWithOneLine) {
  const CommandResult r = run_pdkv(GetParam().args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, std::string(GetParam().message) + "\n");
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, PlanCliInvalid,
    ::testing::Values(
        Invalid{"indivisible_split", "plan --kv-heads 8 --prefill-tp 3 --decode-tp 2",
                "pdkv plan: 8 KV heads cannot be split over prefill TP 3: 8 % 3 = 2 (the rank "
                "count must divide the KV heads, or be a multiple of them)"},
        Invalid{"indivisible_replication", "plan --kv-heads 8 --prefill-tp 1 --decode-tp 12",
                "pdkv plan: decode TP 12 cannot replicate 8 KV heads: 12 % 8 = 4 (a rank count "
                "above the KV heads must be a multiple of them)"},
        Invalid{"mla_with_heads", "plan --kv-heads 8 --prefill-tp 1 --decode-tp 2 --mla",
                "pdkv plan: --kv-heads 8 with --mla: MLA has no head axis; give --kv-heads 1 or "
                "leave it out"},
        Invalid{"no_heads", "plan --prefill-tp 1 --decode-tp 2",
                "pdkv plan: --kv-heads is required (or --mla)"},
        Invalid{"bad_dtype",
                "plan --kv-heads 8 --prefill-tp 2 --decode-tp 2 --pages 4 --dtype-bytes 3",
                "pdkv plan: KvSpec.dtype_bytes is 3; it must be 1, 2, 4 or 8"}));

TEST(PlanCliInvalid, ZeroAndGarbageAreRefusedByTheParser) {
  for (const char* args : {"plan --kv-heads 0 --prefill-tp 1 --decode-tp 1",
                           "plan --kv-heads 8 --prefill-tp 0 --decode-tp 1",
                           "plan --kv-heads eight --prefill-tp 1 --decode-tp 1",
                           "plan --kv-heads 8 --prefill-tp 1 --decode-tp 1 --layout chw"}) {
    const CommandResult r = run_pdkv(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("pdkv: ", 0), 0u) << r.err;
  }
}

}  // namespace
