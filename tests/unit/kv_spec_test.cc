#include "pdkv/kv_spec.h"

#include <gtest/gtest.h>

namespace pdkv {
namespace {

KvSpec good() { return KvSpec{8, 128, 2, 16, 32, 1024, Layout::kNhd, false}; }

TEST(KvSpec, ValidSpecPasses) { EXPECT_TRUE(good().validate().is_ok()); }

TEST(KvSpec, SizesByHand) {
  const KvSpec s = good();
  EXPECT_EQ(s.head_bytes(), 256u);            // 128 x 2
  EXPECT_EQ(s.page_bytes(2), 16u * 2 * 256);  // page_size x heads x head bytes
  EXPECT_EQ(s.buffers_per_layer(), 2u);
  KvSpec mla = s;
  mla.mla = true;
  mla.total_heads = 1;
  EXPECT_EQ(mla.buffers_per_layer(), 1u);
}

struct BadField {
  const char* name;
  void (*mutate)(KvSpec&);
  const char* expected;
};

void PrintTo(const BadField& c, std::ostream* os) { *os << c.name; }

class KvSpecInvalid : public ::testing::TestWithParam<BadField> {};

TEST_P(KvSpecInvalid, NamesFieldAndValue) {
  KvSpec s = good();
  GetParam().mutate(s);
  const Status st = s.validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(GetParam().expected), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(
    Fields, KvSpecInvalid,
    ::testing::Values(
        BadField{"total_heads", [](KvSpec& s) { s.total_heads = 0; }, "KvSpec.total_heads is 0"},
        BadField{"head_dim", [](KvSpec& s) { s.head_dim = 0; }, "KvSpec.head_dim is 0"},
        BadField{"page_size", [](KvSpec& s) { s.page_size = 0; }, "KvSpec.page_size is 0"},
        BadField{"num_layers", [](KvSpec& s) { s.num_layers = 0; }, "KvSpec.num_layers is 0"},
        BadField{"num_pages", [](KvSpec& s) { s.num_pages = 0; }, "KvSpec.num_pages is 0"},
        BadField{"dtype_bytes", [](KvSpec& s) { s.dtype_bytes = 3; }, "KvSpec.dtype_bytes is 3"},
        BadField{"mla_heads", [](KvSpec& s) { s.mla = true; }, "KvSpec.total_heads is 8 with mla"},
        BadField{"pool_too_large", [](KvSpec& s) { s.num_pages = uint64_t{1} << 40; },
                 "exceeds 2^48"}));

TEST(KvSpec, CompatibilityNamesBothValues) {
  KvSpec a = good(), b = good();
  b.layout = Layout::kHnd;
  b.num_pages = 7;
  EXPECT_TRUE(check_compatible(a, b).is_ok());  // layout and pool size may differ
  b.head_dim = 64;
  EXPECT_EQ(check_compatible(a, b).message(),
            "KvSpec.head_dim differs: prefill has 128, decode has 64");
  b = good();
  b.page_size = 32;
  EXPECT_EQ(check_compatible(a, b).message(),
            "KvSpec.page_size differs: prefill has 16, decode has 32");
}

TEST(Layout, ParsesAndNames) {
  EXPECT_EQ(parse_layout("hnd").value(), Layout::kHnd);
  EXPECT_STREQ(layout_name(Layout::kNhd), "nhd");
  EXPECT_EQ(parse_layout("nchw").status().message(), "layout 'nchw' is neither 'nhd' nor 'hnd'");
}

}  // namespace
}  // namespace pdkv
