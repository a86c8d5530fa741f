#include "core/status.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace fedlora {
namespace {

absl::Status FailIf(bool fail) {
  return fail ? absl::InvalidArgumentError("bad") : absl::OkStatus();
}

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Chain(bool fail, int* calls) {
  FEDLORA_RETURN_IF_ERROR(FailIf(fail));
  ++*calls;
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int x) {
  FEDLORA_ASSIGN_OR_RETURN(int h, Half(x));
  FEDLORA_ASSIGN_OR_RETURN(auto q, Half(h));
  return q;
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int v) {
  if (v < 0) return absl::OutOfRangeError("negative");
  return std::make_unique<int>(v);
}

absl::StatusOr<int> Unbox(int v) {
  std::unique_ptr<int> box;
  FEDLORA_ASSIGN_OR_RETURN(box, MakeBox(v));  // assigns to an existing move-only lvalue
  return *box;
}

absl::Status WithContext() {
  FEDLORA_RETURN_IF_ERROR_CTX(FailIf(true), "loading config.json");
  return absl::OkStatus();
}

TEST(StatusMacros, ReturnIfErrorStopsAtFirstError) {
  int calls = 0;
  EXPECT_TRUE(Chain(false, &calls).ok());
  EXPECT_EQ(calls, 1);
  const absl::Status s = Chain(true, &calls);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad");
  EXPECT_EQ(calls, 1);
}

TEST(StatusMacros, AssignOrReturnPropagatesValueAndError) {
  EXPECT_EQ(*Quarter(12), 3);
  EXPECT_EQ(Quarter(6).status().message(), "odd");  // 6 -> 3 -> odd
  EXPECT_EQ(Quarter(5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacros, AssignOrReturnMovesIntoExistingLvalue) {
  EXPECT_EQ(*Unbox(7), 7);
  EXPECT_EQ(Unbox(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(StatusMacros, ContextKeepsCodeAndPrefixesMessage) {
  const absl::Status s = WithContext();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "loading config.json: bad");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace fedlora
