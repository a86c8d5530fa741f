#include "core/json.h"

#include <string>

#include "core/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ParseJson, ParsesValidDocument) {
  auto j = ParseJson(R"({"a": 1, "b": [true, null], "c": {"d": "e"}})", "doc");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["a"], 1);
  EXPECT_EQ((*j)["c"]["d"], "e");
}

TEST(ParseJson, SyntaxErrorNamesSourceAndBytePosition) {
  auto j = ParseJson(R"({"a": tru})", "config.json");
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(j.status()), HasSubstr("config.json"));
  EXPECT_THAT(Msg(j.status()),
              HasSubstr("at byte 10"));  // nlohmann counts from 1, at the bad token's end
}

TEST(ParseJson, RejectsBadInputWithoutThrowing) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "nul", "\"\\uZZZZ\"", "1 2", "\xff"}) {
    auto j = ParseJson(bad, "t");
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseJson, RejectsDuplicateKeysAtAnyDepth) {
  EXPECT_THAT(Msg(ParseJson(R"({"a":1,"a":2})", "t").status()), HasSubstr("duplicate key 'a'"));
  EXPECT_THAT(Msg(ParseJson(R"({"x":[{"k":1,"k":1}]})", "t").status()),
              HasSubstr("duplicate key 'k'"));
  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJson(R"([{"k":1},{"k":2}])", "t").ok());
  EXPECT_TRUE(ParseJson(R"({"k":{"k":{"k":1}}})", "t").ok());
}

TEST(ParseJson, DepthLimit) {
  const int limit = kMaxJsonDepth;
  EXPECT_TRUE(ParseJson(std::string(limit, '[') + std::string(limit, ']'), "t").ok());
  auto deep = ParseJson(std::string(limit + 1, '[') + std::string(limit + 1, ']'), "t");
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(deep.status()), HasSubstr("nesting"));
  // Brackets inside strings do not count, including after an escaped quote.
  EXPECT_TRUE(ParseJson("[\"\\\"" + std::string(1000, '[') + "\"]", "t").ok());
  // A million unclosed brackets: rejected quickly, no stack overflow.
  EXPECT_FALSE(ParseJson(std::string(1000000, '['), "t").ok());
}

TEST(ReadJsonFile, ReadsAndKeepsIoCodes) {
  coretest::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("c.json"), R"({"hidden_size": 384})").ok());
  auto j = ReadJsonFile(dir.File("c.json"));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(*GetInt(*j, "hidden_size", "c.json"), 384);
  EXPECT_EQ(ReadJsonFile(dir.File("missing.json")).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteFileAtomically(dir.File("bad.json"), "{oops").ok());
  auto bad = ReadJsonFile(dir.File("bad.json"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()), HasSubstr("bad.json"));
}

class Getters : public ::testing::Test {
 protected:
  nlohmann::json j_ = *ParseJson(R"({
      "i": 42, "neg": -7, "big": 18446744073709551615, "f": 2.5, "whole_f": 3.0,
      "s": "text", "b": true, "n": null, "ints": [1, -2, 3], "strs": ["x", "y"], "mixed": [1, "2"]
    })",
                                 "cfg");
};

TEST_F(Getters, ReturnValuesOfTheRightType) {
  EXPECT_EQ(*GetInt(j_, "i", "cfg"), 42);
  EXPECT_EQ(*GetInt(j_, "neg", "cfg"), -7);
  EXPECT_EQ(*GetString(j_, "s", "cfg"), "text");
  EXPECT_EQ(*GetDouble(j_, "f", "cfg"), 2.5);
  EXPECT_EQ(*GetDouble(j_, "i", "cfg"), 42.0);  // integers are numbers too
  EXPECT_EQ(*GetBool(j_, "b", "cfg"), true);
  EXPECT_THAT(*GetIntArray(j_, "ints", "cfg"), ElementsAre(1, -2, 3));
  EXPECT_THAT(*GetStringArray(j_, "strs", "cfg"), ElementsAre("x", "y"));
}

TEST_F(Getters, MissingKeyNamesKeyTypeAndContext) {
  auto r = GetInt(j_, "vocab_size", "config.json");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(r.status()), "config.json: missing required key 'vocab_size' (an integer (int64))");
}

TEST_F(Getters, WrongTypeNamesExpectedAndFound) {
  EXPECT_EQ(Msg(GetInt(j_, "s", "cfg").status()),
            "cfg: key 's' must be an integer (int64), found string");
  EXPECT_EQ(Msg(GetInt(j_, "f", "cfg").status()),
            "cfg: key 'f' must be an integer (int64), found floating-point number");
  EXPECT_FALSE(GetInt(j_, "whole_f", "cfg").ok());  // 3.0 is not an integer in JSON's type system
  EXPECT_EQ(Msg(GetInt(j_, "big", "cfg").status()),
            "cfg: key 'big' must be an integer (int64), found an integer beyond the int64 range");
  EXPECT_EQ(Msg(GetString(j_, "i", "cfg").status()),
            "cfg: key 'i' must be a string, found integer");
  EXPECT_EQ(Msg(GetBool(j_, "s", "cfg").status()), "cfg: key 's' must be a boolean, found string");
  EXPECT_EQ(Msg(GetDouble(j_, "b", "cfg").status()),
            "cfg: key 'b' must be a number, found boolean");
  EXPECT_EQ(Msg(GetString(j_, "n", "cfg").status()), "cfg: key 'n' must be a string, found null");
  EXPECT_EQ(Msg(GetIntArray(j_, "mixed", "cfg").status()),
            "cfg: key 'mixed' element 1 must be an integer (int64), found string");
  EXPECT_EQ(Msg(GetStringArray(j_, "s", "cfg").status()),
            "cfg: key 's' must be an array of strings, found string");
}

TEST_F(Getters, LookupInNonObjectIsAnError) {
  const nlohmann::json arr = nlohmann::json::array({1, 2});
  auto r = GetInt(arr, "x", "cfg");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("expected an object"));
  EXPECT_FALSE(GetIntOr(arr, "x", 1, "cfg").ok());
}

TEST_F(Getters, OptionalVariantsDefaultOnlyWhenAbsentOrNull) {
  EXPECT_EQ(*GetIntOr(j_, "absent", 5, "cfg"), 5);
  EXPECT_EQ(*GetIntOr(j_, "n", 5, "cfg"), 5);
  EXPECT_EQ(*GetIntOr(j_, "i", 5, "cfg"), 42);
  EXPECT_FALSE(GetIntOr(j_, "s", 5, "cfg").ok());  // present but wrong type is still an error
  EXPECT_EQ(*GetStringOr(j_, "absent", "dflt", "cfg"), "dflt");
  EXPECT_EQ(*GetStringOr(j_, "s", "dflt", "cfg"), "text");
  EXPECT_EQ(*GetDoubleOr(j_, "absent", 1e-12, "cfg"), 1e-12);
  EXPECT_EQ(*GetDoubleOr(j_, "f", 1e-12, "cfg"), 2.5);
  EXPECT_EQ(*GetBoolOr(j_, "absent", false, "cfg"), false);
  EXPECT_EQ(*GetBoolOr(j_, "b", false, "cfg"), true);
  EXPECT_FALSE(GetBoolOr(j_, "i", false, "cfg").ok());
}

}  // namespace
}  // namespace fedlora
