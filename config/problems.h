// Internal to config/: the collector of a config's problems, shared by the section files.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace fedlora::config_internal {

// Collects every problem of a config, each naming its field path.
class Problems {
 public:
  void Add(std::string message) { messages_.push_back(std::move(message)); }

  // "<path> (<value>) <what>"
  template <typename T>
  void Bad(const std::string& path, const T& value, const std::string& what) {
    Add(absl::StrCat(path, " (", value, ") ", what));
  }

  template <typename T>
  void Range(const std::string& path, T value, T lo, T hi) {
    if (value < lo || value > hi) Bad(path, value, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  }

  // Finite and within [lo, hi], with either end optionally open.
  void RealRange(const std::string& path, double value, double lo, bool lo_open, double hi,
                 bool hi_open) {
    bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) &&
              (hi_open ? value < hi : value <= hi);
    if (!ok) {
      Bad(path, value,
          absl::StrCat("must be finite and in ", lo_open ? "(" : "[", lo, ", ", hi,
                       hi_open ? ")" : "]"));
    }
  }
  void Positive(const std::string& path, double value) {
    if (!(std::isfinite(value) && value > 0)) Bad(path, value, "must be finite and > 0");
  }
  void NonNegative(const std::string& path, double value) {
    if (!(std::isfinite(value) && value >= 0)) Bad(path, value, "must be finite and >= 0");
  }
  void NonEmpty(const std::string& path, const std::string& value) {
    if (value.empty()) Add(absl::StrCat(path, " must not be empty"));
  }

  absl::Status ToStatus() const {
    if (messages_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(messages_, "; "));
  }

 private:
  std::vector<std::string> messages_;
};

// Quotes a string for an error message.
std::string Quoted(const std::string& s);

// Whether `s` is `length` characters of [0-9a-f].
bool IsLowerHex(const std::string& s, size_t length);

// A list of at least `min_count` non-empty, distinct strings.
void CheckNameList(Problems& p, const std::string& path,
                   const google::protobuf::RepeatedPtrField<std::string>& names, size_t min_count);

}  // namespace fedlora::config_internal
