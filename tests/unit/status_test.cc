#include "pdkv/status.h"

#include <gtest/gtest.h>

#include <string>

namespace pdkv {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return Status::invalid_argument("value " + std::to_string(v) + " is not positive");
  return v;
}

Result<int> doubled(int v) {
  PDKV_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

Status check_positive(int v) {
  PDKV_RETURN_IF_ERROR(parse_positive(v).status());
  return Status::ok();
}

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = Status::out_of_range("page 9 of 8");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.to_string(), "out_of_range: page 9 of 8");
  EXPECT_EQ(s.with_context("decode").message(), "decode: page 9 of 8");
  EXPECT_EQ(s.with_context("decode").code(), StatusCode::kOutOfRange);
}

TEST(Result, ValueOrStatus) {
  EXPECT_EQ(doubled(4).value(), 8);
  Result<int> bad = doubled(-3);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "value -3 is not positive");
  EXPECT_TRUE(check_positive(1).is_ok());
  EXPECT_EQ(check_positive(0).code(), StatusCode::kInvalidArgument);
}

TEST(Result, OkStatusIsNotAValue) {
  Result<int> r{Status::ok()};
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfErrorAbortsWithMessage) {
  Result<int> bad = Status::not_found("room 7");
  EXPECT_DEATH((void)bad.value(), "room 7");
}

}  // namespace
}  // namespace pdkv
