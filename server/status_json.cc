#include "server/status_json.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fedlora {
namespace {

using google::protobuf::FieldDescriptor;

void NumberizeValue(const FieldDescriptor& f, nlohmann::json& v);

// Protobuf's JSON writes 64-bit integers as strings; `j` (a `d` message) gets numbers instead.
void Numberize(const google::protobuf::Descriptor& d, nlohmann::json& j) {
  if (!j.is_object()) return;
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor& f = *d.field(i);
    auto it = j.find(f.name());
    if (it == j.end()) continue;
    if (f.is_map()) {
      for (auto& [key, value] : it->items()) NumberizeValue(*f.message_type()->map_value(), value);
    } else if (f.is_repeated()) {
      for (nlohmann::json& e : *it) NumberizeValue(f, e);
    } else {
      NumberizeValue(f, *it);
    }
  }
}

void NumberizeValue(const FieldDescriptor& f, nlohmann::json& v) {
  if (f.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    Numberize(*f.message_type(), v);
  } else if (f.cpp_type() == FieldDescriptor::CPPTYPE_INT64 && v.is_string()) {
    int64_t n = 0;
    if (absl::SimpleAtoi(v.get<std::string>(), &n)) v = n;
  } else if (f.cpp_type() == FieldDescriptor::CPPTYPE_UINT64 && v.is_string()) {
    uint64_t n = 0;
    if (absl::SimpleAtoi(v.get<std::string>(), &n)) v = n;
  }
}

}  // namespace

absl::StatusOr<nlohmann::json> MessageJsonValue(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  auto status = google::protobuf::util::MessageToJsonString(m, &text, options);
  if (!status.ok()) return absl::InternalError(absl::StrCat("printing JSON: ", status.ToString()));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InternalError("printing JSON: protobuf wrote what nlohmann cannot read");
  Numberize(*m.GetDescriptor(), j);
  return j;
}

absl::StatusOr<std::string> MessageJson(const google::protobuf::Message& message) {
  absl::StatusOr<nlohmann::json> j = MessageJsonValue(message);
  if (!j.ok()) return j.status();
  return j->dump(2);
}

absl::StatusOr<nlohmann::json> StatusJsonValue(const v1::GetStatusResponse& status,
                                               const v1::ListClientsResponse* clients) {
  absl::StatusOr<nlohmann::json> j = MessageJsonValue(status);
  if (!j.ok()) return j.status();
  if (clients != nullptr) {
    absl::StatusOr<nlohmann::json> list = MessageJsonValue(*clients);
    if (!list.ok()) return list.status();
    (*j)["clients"] = (*list)["clients"];
  }
  return j;
}

absl::StatusOr<std::string> StatusJson(const v1::GetStatusResponse& status,
                                       const v1::ListClientsResponse* clients) {
  absl::StatusOr<nlohmann::json> j = StatusJsonValue(status, clients);
  if (!j.ok()) return j.status();
  return j->dump(2);
}

}  // namespace fedlora
