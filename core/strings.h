// Conversions between std::string_view and absl::string_view. Debian's Abseil (20220623) is not
// built in "std mode", so the two are distinct types (see docs/DEVELOPING.md); our APIs take
// std::string_view and Abseil's (StrCat, Status messages) take absl::string_view.
//
//   absl::StrCat("dtype ", ToAbsl(DTypeName(d)));
//   std::string_view msg = ToStd(status.message());
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace fedlora {

inline absl::string_view ToAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace fedlora
