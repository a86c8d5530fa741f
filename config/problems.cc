#include "config/problems.h"

#include <set>

#include "absl/strings/escaping.h"

namespace fedlora::config_internal {

std::string Quoted(const std::string& s) { return absl::StrCat("\"", absl::CEscape(s), "\""); }

bool IsLowerHex(const std::string& s, size_t length) {
  if (s.size() != length) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void CheckNameList(Problems& p, const std::string& path,
                   const google::protobuf::RepeatedPtrField<std::string>& names, size_t min_count) {
  if (static_cast<size_t>(names.size()) < min_count) {
    p.Add(absl::StrCat(path, " has ", names.size(), " entries, needs at least ", min_count));
  }
  std::set<std::string> seen;
  for (int i = 0; i < names.size(); ++i) {
    std::string item = absl::StrCat(path, "[", i, "]");
    if (names[i].empty()) p.Add(absl::StrCat(item, " must not be empty"));
    if (!seen.insert(names[i]).second) p.Bad(item, Quoted(names[i]), "is a duplicate");
  }
}

}  // namespace fedlora::config_internal
