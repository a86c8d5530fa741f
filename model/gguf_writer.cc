#include "model/gguf_writer.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/gguf.h"

namespace fedlora {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;  // GGUF's default: no general.alignment key needed
constexpr uint32_t kGgmlTypeF32 = 0;

template <class T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the machines fedlora builds for are little-endian
  out->append(b, sizeof(T));
}

void PutString(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

std::string Typed(GgufType type, std::string value) {
  std::string out;
  Put<uint32_t>(&out, static_cast<uint32_t>(type));
  return out + value;
}

void Pad(std::string* out) {
  out->append((kAlignment - out->size() % kAlignment) % kAlignment, '\0');
}

}  // namespace

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  std::string v;
  PutString(&v, value);
  kvs_.emplace_back(std::string(key), Typed(GgufType::kString, std::move(v)));
}

void GgufWriter::AddUint32(const std::string& key, uint32_t value) {
  std::string v;
  Put(&v, value);
  kvs_.emplace_back(std::string(key), Typed(GgufType::kUint32, std::move(v)));
}

void GgufWriter::AddFloat32(const std::string& key, float value) {
  std::string v;
  Put(&v, value);
  kvs_.emplace_back(std::string(key), Typed(GgufType::kFloat32, std::move(v)));
}

absl::Status GgufWriter::AddTensorF32(const std::string& name, std::vector<int64_t> shape,
                                      std::vector<float> values) {
  const std::string what = absl::StrCat("GGUF tensor '", name, "': ");
  if (name.empty() || name.size() > kGgufMaxTensorName) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "a name of ", name.size(), " bytes (1 to ", kGgufMaxTensorName, ")"));
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) return absl::InvalidArgumentError(what + "written twice");
  }
  if (shape.empty() || shape.size() > static_cast<size_t>(kGgufMaxDims)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, shape.size(), " dimensions (1 to ", kGgufMaxDims, ")"));
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 1 || d > (int64_t{1} << 40))
      return absl::InvalidArgumentError(absl::StrCat(what, "dimension ", d));
    n *= d;
  }
  if (n != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, values.size(), " values for a shape of ", n));
  }
  tensors_.push_back({std::string(name), std::move(shape), std::move(values)});
  return absl::OkStatus();
}

absl::StatusOr<std::string> GgufWriter::Serialize() const {
  std::set<std::string_view> keys;
  for (const auto& [key, value] : kvs_) {
    if (key.empty() || !keys.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF metadata key '", key, "' is empty or repeated"));
    }
  }
  std::string out = "GGUF";
  Put(&out, kVersion);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, kvs_.size());
  for (const auto& [key, value] : kvs_) {
    PutString(&out, key);
    out += value;
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d)
      Put<uint64_t>(&out, static_cast<uint64_t>(*d));
    Put(&out, kGgmlTypeF32);
    Put(&out, offset);
    const uint64_t bytes = t.values.size() * sizeof(float);
    offset += (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  Pad(&out);
  for (const Tensor& t : tensors_) {
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
    Pad(&out);
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  absl::StatusOr<std::string> bytes = Serialize();
  if (!bytes.ok())
    return absl::Status(bytes.status().code(), absl::StrCat(path, ": ", bytes.status().message()));
  return WriteFileAtomically(path, *bytes);
}

}  // namespace fedlora
