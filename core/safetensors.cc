#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {
namespace {

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr size_t kLengthPrefixBytes = 8;

absl::Status Bad(const std::string& where, std::string_view tensor, std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": tensor '", ToAbsl(tensor), "': ", ToAbsl(problem)));
}

// Reads a JSON array of non-negative integers that fit in int64.
absl::StatusOr<std::vector<int64_t>> NonNegativeInts(const nlohmann::json& v,
                                                     std::string_view field) {
  const std::string f(field);
  if (!v.is_array())
    return absl::InvalidArgumentError(
        absl::StrCat("'", f, "' must be an array, found ", ToAbsl(JsonTypeName(v))));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json& e = v[i];
    if (e.is_number_integer() && !e.is_number_unsigned() && e.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", f, "'[", i, "] is negative (", e.get<int64_t>(), ")"));
    }
    if (!e.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", f, "'[", i, "] must be a non-negative integer, found ", ToAbsl(JsonTypeName(e))));
    }
    const uint64_t u = e.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", f, "'[", i, "] = ", u, " does not fit in int64"));
    }
    out.push_back(static_cast<int64_t>(u));
  }
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated at Open: cannot overflow
  return n;
}

absl::Status SafetensorsTensor::CopyToF32(float* out) const {
  const size_t n = static_cast<size_t>(numel());
  if (dtype == DType::kF32) {
    std::memcpy(out, data, n * sizeof(float));
    return absl::OkStatus();
  }
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", name, "' has dtype ", std::string(DTypeName(dtype)), ", expected F32, F16 or BF16"));
  }
  std::vector<uint16_t> bits(n);  // the data may be unaligned
  std::memcpy(bits.data(), data, n * sizeof(uint16_t));
  if (dtype == DType::kBF16) {
    ConvertBF16ToF32(bits.data(), out, n);
  } else {
    ConvertF16ToF32(bits.data(), out, n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> SafetensorsTensor::ToF32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  FEDLORA_RETURN_IF_ERROR(CopyToF32(out.data()));
  return out;
}

absl::StatusOr<TensorView> SafetensorsTensor::view() const {
  return TensorView::CreateConst(data, dtype, shape, Device::kCpu);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  FEDLORA_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapped_ = std::move(mapped);
  file->base_ = file->mapped_.data();
  file->size_ = file->mapped_.size();
  FEDLORA_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes,
                                                                            std::string_view what) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::string(what);
  file->owned_ = std::move(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  FEDLORA_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::Status SafetensorsFile::Parse() {
  const std::string& where = path_;
  if (size_ < kLengthPrefixBytes) {
    return absl::DataLossError(absl::StrCat(
        where, ": file is ", size_, " bytes, shorter than the 8-byte header length prefix"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];  // little-endian
  if (header_len > kSafetensorsMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": header length ", header_len,
                                                   " bytes exceeds the limit of ",
                                                   kSafetensorsMaxHeaderBytes));
  }
  if (header_len > size_ - kLengthPrefixBytes) {
    return absl::DataLossError(absl::StrCat(where, ": header length ", header_len,
                                            " bytes but only ", size_ - kLengthPrefixBytes,
                                            " bytes follow the prefix (truncated file?)"));
  }
  const std::string_view header(reinterpret_cast<const char*>(base_) + kLengthPrefixBytes,
                                header_len);
  // The spec requires the header to start with '{'; checking it first also gives a clearer error
  // for a file that is not safetensors at all.
  if (header.empty() || header.front() != '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header does not start with '{' (not a safetensors file?)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(header, absl::StrCat(where, ": header")));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header must be a JSON object, found ", ToAbsl(JsonTypeName(json))));
  }
  data_section_ = base_ + kLengthPrefixBytes + header_len;
  const uint64_t data_size = size_ - kLengthPrefixBytes - header_len;

  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      if (v.is_null()) continue;  // the reference reader treats null as "no metadata"
      if (!v.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": '__metadata__' must be an object, found ", ToAbsl(JsonTypeName(v))));
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": '__metadata__' value of '",
                                                         m.key(), "' must be a string, found ",
                                                         ToAbsl(JsonTypeName(m.value()))));
        }
        metadata_.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    // Unknown extra fields in an entry are ignored, as the reference reader does.
    if (!v.is_object())
      return Bad(where, name,
                 absl::StrCat("entry must be an object, found ", ToAbsl(JsonTypeName(v))));
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!v.contains(field)) return Bad(where, name, absl::StrCat("missing '", field, "'"));
    }
    const nlohmann::json& dtype_json = v["dtype"];
    if (!dtype_json.is_string())
      return Bad(
          where, name,
          absl::StrCat("'dtype' must be a string, found ", ToAbsl(JsonTypeName(dtype_json))));
    auto dtype = ParseDType(dtype_json.get_ref<const std::string&>());
    if (!dtype.ok()) return Bad(where, name, ToStd(dtype.status().message()));
    auto shape = NonNegativeInts(v["shape"], "shape");
    if (!shape.ok()) return Bad(where, name, ToStd(shape.status().message()));
    auto offsets = NonNegativeInts(v["data_offsets"], "data_offsets");
    if (!offsets.ok()) return Bad(where, name, ToStd(offsets.status().message()));
    if (offsets->size() != 2) {
      return Bad(where, name,
                 absl::StrCat("'data_offsets' must have 2 elements, found ", offsets->size()));
    }
    auto nbytes = CheckedNbytes(*dtype, *shape);
    if (!nbytes.ok())
      return Bad(where, name,
                 absl::StrCat("shape ", ShapeString(*shape), ": ", nbytes.status().message()));
    const uint64_t begin = static_cast<uint64_t>((*offsets)[0]),
                   end = static_cast<uint64_t>((*offsets)[1]);
    if (begin > end)
      return Bad(where, name, absl::StrCat("data_offsets begin ", begin, " > end ", end));
    if (end > data_size) {
      // Most often a file cut short after its header (interrupted download or copy).
      return absl::DataLossError(absl::StrCat(where, ": tensor '", name, "': data_offsets end ",
                                              end, " is past the end of the ", data_size,
                                              "-byte data section (truncated file?)"));
    }
    if (end - begin != static_cast<uint64_t>(*nbytes)) {
      return Bad(
          where, name,
          absl::StrCat("data_offsets span ", end - begin, " bytes but ", ToAbsl(DTypeName(*dtype)),
                       " shape ", ShapeString(*shape), " needs ", *nbytes));
    }
    entries_.emplace(name, Entry{*dtype, std::move(*shape), begin, end});
  }

  // The tensors must tile [0, data_size) exactly, as the reference reader requires: walking them
  // in offset order, each must start where the previous ended.
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  by_offset.reserve(entries_.size());
  for (const auto& [name, e] : entries_) by_offset.emplace_back(&name, &e);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end, *a.first) <
           std::tie(b.second->begin, b.second->end, *b.first);
  });
  uint64_t cursor = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, e] : by_offset) {
    if (e->begin < cursor) {
      return Bad(where, *name,
                 absl::StrCat("data_offsets [", e->begin, ", ", e->end, ") overlap tensor '", *prev,
                              "' which ends at ", cursor));
    }
    if (e->begin > cursor) {
      return Bad(where, *name,
                 absl::StrCat("data_offsets begin ", e->begin,
                              " leaves a hole: the previous tensor ends at ", cursor));
    }
    cursor = e->end;
    prev = name;
  }
  if (cursor != data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensors cover ", cursor, " bytes of the ", data_size,
                     "-byte data section; the rest is unaccounted for"));
  }
  names_.reserve(entries_.size());
  for (const auto& [name, e] : entries_) names_.push_back(name);
  return absl::OkStatus();
}

bool SafetensorsFile::Contains(std::string_view name) const {
  return entries_.find(name) != entries_.end();
}

absl::StatusOr<SafetensorsTensor> SafetensorsFile::Get(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named '",
                                            absl::string_view(name.data(), name.size()), "'"));
  }
  const Entry& e = it->second;
  SafetensorsTensor t;
  t.name = it->first;
  t.dtype = e.dtype;
  t.shape = e.shape;
  t.data = data_section_ + e.begin;
  t.size = static_cast<size_t>(e.end - e.begin);
  return t;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<SafetensorsTensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  // Layout order: element size descending, then name. With the data section starting at a
  // multiple of 8 and every size a power of two, each tensor then starts aligned to its own
  // element size.
  std::vector<const SafetensorsTensorToWrite*> order;
  order.reserve(tensors.size());
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("safetensors writer: empty tensor name");
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          "safetensors writer: '__metadata__' is reserved and cannot name a tensor");
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer: duplicate tensor name '", t.name, "'"));
    }
    auto nbytes = CheckedNbytes(t.dtype, t.shape);
    if (!nbytes.ok())
      return Annotate(nbytes.status(), absl::StrCat("safetensors writer: tensor '", t.name, "'"));
    if (static_cast<uint64_t>(*nbytes) != t.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors writer: tensor '", t.name, "' has ", t.size, " bytes but ",
          ToAbsl(DTypeName(t.dtype)), " shape ", ShapeString(t.shape), " needs ", *nbytes));
    }
    if (t.size > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer: tensor '", t.name, "' has null data"));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const size_t sa = DTypeSize(a->dtype), sb = DTypeSize(b->dtype);
    if (sa != sb) return sa > sb;
    return a->name < b->name;
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) {
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto* t : order) {
    header[t->name] = {{"dtype", std::string(DTypeName(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->size}}};
    offset += t->size;
  }
  std::string json;
  try {
    // dump() throws on invalid UTF-8 in a name or metadata value: JSON cannot carry it.
    json = header.dump();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors writer: cannot serialize header: ", e.what()));
  }
  json.append((8 - json.size() % 8) % 8, ' ');  // pad so the data section starts 8-aligned

  std::string out;
  out.reserve(kLengthPrefixBytes + json.size() + offset);
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += json;
  for (const auto* t : order) {
    if (t->size > 0) out.append(static_cast<const char*>(t->data), t->size);
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, SerializeSafetensors(tensors, metadata));
  return WriteFileAtomically(path, bytes);
}

}  // namespace fedlora
