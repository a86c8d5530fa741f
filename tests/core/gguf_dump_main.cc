// gguf_dump: a test helper that opens a GGUF file with core/gguf.h and writes what it read, for
// tests/core/gguf_reference_test.py to compare with gguf-py.
//
//   gguf_dump FILE OUTDIR [TENSOR...]
//
// Writes OUTDIR/dump.json: {"version", "alignment", "data_offset", "metadata": [{"key": hex,
// "value": V}] in file order, "tensors": [{"name": hex, "type", "type_id", "ne", "offset", "size",
// "rows", "row_bytes", "file"}] in file order}, where V is {"type": "UINT32", "value": 5} for a
// scalar (integers exact, floats as doubles, strings as hex of their bytes) and {"type": "ARRAY",
// "elem": "INT32", "values": [...]} for an array (elements as the "value" of a scalar, nested
// arrays as V). Each listed tensor (every tensor when none is named) is dequantized to
// OUTDIR/<i>.f32 (raw little-endian fp32, i its index in the file) and "file" names it.
// Exit status: 0; 1 when the file is refused (the status on stderr); 2 for bad arguments.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "core/gguf.h"
#include "core/strings.h"

namespace {

using fedlora::GgufType;
using fedlora::GgufValue;

std::string Hex(std::string_view s) { return absl::BytesToHexString(fedlora::ToAbsl(s)); }

nlohmann::json Scalar(const GgufValue& v) {
  switch (v.type()) {
    case GgufType::kUint8:
    case GgufType::kUint16:
    case GgufType::kUint32:
    case GgufType::kUint64:
      return *v.AsUint();
    case GgufType::kInt8:
    case GgufType::kInt16:
    case GgufType::kInt32:
    case GgufType::kInt64:
      return *v.AsInt();
    case GgufType::kFloat32:
    case GgufType::kFloat64:
      return *v.AsFloat();
    case GgufType::kBool:
      return *v.AsBool();
    case GgufType::kString:
      return Hex(*v.AsString());
    default:
      return nullptr;
  }
}

nlohmann::json Value(const GgufValue& v) {
  nlohmann::json out = {{"type", std::string(fedlora::GgufTypeName(v.type()))}};
  if (v.type() != GgufType::kArray) {
    out["value"] = Scalar(v);
    return out;
  }
  out["elem"] = std::string(fedlora::GgufTypeName(v.array_type()));
  nlohmann::json values = nlohmann::json::array();
  for (uint64_t i = 0; i < v.array_size(); ++i) {
    auto e = v.Element(i);
    values.push_back(v.array_type() == GgufType::kArray ? Value(*e) : Scalar(*e));
  }
  out["values"] = std::move(values);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gguf_dump FILE OUTDIR [TENSOR...]\n");
    return 2;
  }
  const std::string outdir = argv[2];
  const std::set<std::string> wanted(argv + 3, argv + argc);
  auto file = fedlora::GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  const fedlora::GgufFile& f = **file;
  nlohmann::json dump = {
      {"version", f.version()}, {"alignment", f.alignment()}, {"data_offset", f.data_offset()}};
  nlohmann::json metadata = nlohmann::json::array();
  for (std::string_view key : f.keys()) {
    metadata.push_back({{"key", Hex(key)}, {"value", Value(**f.Find(key))}});
  }
  dump["metadata"] = std::move(metadata);
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const fedlora::GgufTensor& t = f.tensors()[i];
    nlohmann::json j = {{"name", Hex(t.name)},
                        {"type", std::string(fedlora::GgmlTypeName(t.type))},
                        {"type_id", static_cast<uint32_t>(t.type)},
                        {"ne", t.ne},
                        {"offset", t.offset},
                        {"size", t.size},
                        {"rows", t.rows()},
                        {"row_bytes", t.row_bytes()}};
    if (wanted.empty() || wanted.count(std::string(t.name)) != 0) {
      std::vector<float> values(static_cast<size_t>(t.numel()));
      const absl::Status s = t.DequantizeRows(0, t.rows(), values.data());
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
      const std::string name = std::to_string(i) + ".f32";
      std::ofstream out(outdir + "/" + name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(values.data()),
                static_cast<std::streamsize>(values.size() * 4));
      if (!out) {
        std::fprintf(stderr, "cannot write %s/%s\n", outdir.c_str(), name.c_str());
        return 2;
      }
      j["file"] = name;
    }
    tensors.push_back(std::move(j));
  }
  dump["tensors"] = std::move(tensors);
  std::ofstream out(outdir + "/dump.json");
  out << dump.dump();
  if (!out) {
    std::fprintf(stderr, "cannot write %s/dump.json\n", outdir.c_str());
    return 2;
  }
  return 0;
}
