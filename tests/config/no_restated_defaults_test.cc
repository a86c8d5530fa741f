// Every run-config default is written once (config/defaults.h, train/training_defaults.h,
// compression/codec.h): no source outside config/ falls back on a literal for an unset config
// field, as `t.has_learning_rate() ? t.learning_rate() : 5e-4` or
// `s.store_dir().empty() ? "fedlora_store" : s.store_dir()` did in 24 places. A fallback reads the
// constant instead, so that a default changed in one place reaches every consumer.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fedlora/v1/config.pb.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

namespace fs = std::filesystem;

// The names of every field of RunConfig and of the messages under it.
void CollectFieldNames(const google::protobuf::Descriptor* d, std::set<std::string>* names,
                       std::set<const google::protobuf::Descriptor*>* seen) {
  if (!seen->insert(d).second) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    names->insert(f->name());
    if (f->message_type() != nullptr) CollectFieldNames(f->message_type(), names, seen);
  }
}

// The statements of `text` (split at ';'), each with its whitespace runs made one space.
std::vector<std::string> Statements(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  bool space = false;
  for (char c : text) {
    if (c == ';') {
      out.push_back(current);
      current.clear();
    } else if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      space = true;
    } else {
      if (space && !current.empty()) current += ' ';
      space = false;
      current += c;
    }
  }
  out.push_back(current);
  return out;
}

// "<file>: <field> falls back on <literal>" for each literal fallback on a config field in `text`.
std::vector<std::string> LiteralFallbacks(const std::string& file, const std::string& text,
                                          const std::set<std::string>& fields) {
  // `has_x() ? ... : <number or string>` and `x().empty() ? "<string>"`; 0 and "" are proto's own
  // "unset", not a default.
  static const std::regex has(R"(\bhas_(\w+)\(\)\s*\?[^?:]*:\s*\(?\s*(-?[0-9][\w.+-]*|"[^"]*"))");
  static const std::regex empty(R"(\b(\w+)\(\)\.empty\(\)\s*\?\s*("[^"]+"))");
  std::vector<std::string> out;
  for (const std::string& statement : Statements(text)) {
    for (const std::regex* re : {&has, &empty}) {
      for (std::sregex_iterator m(statement.begin(), statement.end(), *re), end; m != end; ++m) {
        const std::string field = (*m)[1];
        const std::string literal = (*m)[2];
        if (fields.count(field) == 0) continue;
        if (literal == "0" || literal == "0.0" || literal == "0u" || literal == "\"\"") continue;
        out.push_back(file + ": " + field + " falls back on " + literal);
      }
    }
  }
  return out;
}

TEST(NoRestatedDefaults, NoSourceOutsideConfigFallsBackOnALiteral) {
  const char* root = std::getenv("FEDLORA_SOURCE_DIR");
  ASSERT_NE(root, nullptr) << "FEDLORA_SOURCE_DIR is not set; run this test through ctest";
  std::set<std::string> fields;
  std::set<const google::protobuf::Descriptor*> seen;
  CollectFieldNames(v1::RunConfig::descriptor(), &fields, &seen);
  ASSERT_TRUE(fields.count("learning_rate") && fields.count("store_dir"));

  // The modules that take a run config, below and above config/.
  std::vector<std::string> found;
  int files = 0;
  for (const char* module : {"aggregation", "client", "compression", "core", "crypto", "kernels",
                             "model", "privacy", "server", "sim", "tools", "train"}) {
    const fs::path dir = fs::path(root) / module;
    if (!fs::is_directory(dir)) continue;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h" && ext != ".cu")) continue;
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      ++files;
      for (std::string& f :
           LiteralFallbacks(fs::relative(e.path(), root).string(), text.str(), fields)) {
        found.push_back(std::move(f));
      }
    }
  }
  EXPECT_GT(files, 100) << "the sources were not found under " << root;
  for (const std::string& f : found) ADD_FAILURE() << f << ": read the default's constant";
}

// The scan itself finds the forms it looks for (and leaves proto's "unset" 0 alone).
TEST(NoRestatedDefaults, TheScanFindsLiteralFallbacks) {
  const std::set<std::string> fields = {"learning_rate", "store_dir", "local_epochs"};
  const std::string text = R"(
    const double base = t.has_learning_rate() ? t.learning_rate()
                                              : 5e-4;
    o.data_dir = s.store_dir().empty() ? "fedlora_store" : s.store_dir();
    t.local_epochs = x.has_local_epochs() ? x.local_epochs() : 0;
    o.lr = t.has_learning_rate() ? t.learning_rate() : kDefaultLearningRate;
    auto n = pair.has_value() ? 3 : 2;)";
  const std::vector<std::string> found = LiteralFallbacks("f.cc", text, fields);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0], "f.cc: learning_rate falls back on 5e-4");
  EXPECT_EQ(found[1], "f.cc: store_dir falls back on \"fedlora_store\"");
}

}  // namespace
}  // namespace fedlora
