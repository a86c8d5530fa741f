// Status macros: errors are values (absl::Status / absl::StatusOr<T>), propagated with
// FEDLORA_RETURN_IF_ERROR and FEDLORA_ASSIGN_OR_RETURN. Checks (FEDLORA_CHECK) are for our own
// bugs only; anything a user, a peer or a file can cause returns a status instead.
//
//   absl::StatusOr<Model> Load(const std::string& dir) {
//     FEDLORA_ASSIGN_OR_RETURN(auto config, ReadJsonFile(dir + "/config.json"));
//     FEDLORA_RETURN_IF_ERROR(Validate(config));
//     ...
//   }
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define FEDLORA_INTERNAL_CONCAT_IMPL(a, b) a##b
#define FEDLORA_INTERNAL_CONCAT(a, b) FEDLORA_INTERNAL_CONCAT_IMPL(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define FEDLORA_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status _fedlora_status = (expr);           \
    if (!_fedlora_status.ok()) return _fedlora_status; \
  } while (0)

// `lhs` may be a declaration (`auto x`) or an existing lvalue. `rexpr` is an absl::StatusOr<T>.
#define FEDLORA_ASSIGN_OR_RETURN(lhs, rexpr)                                                    \
  FEDLORA_INTERNAL_ASSIGN_OR_RETURN(FEDLORA_INTERNAL_CONCAT(_fedlora_statusor_, __LINE__), lhs, \
                                    rexpr)

#define FEDLORA_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                      \
  if (!tmp.ok()) return std::move(tmp).status();           \
  lhs = std::move(tmp).value()

// Prefixes the message of a non-OK status with context, keeping its code.
namespace fedlora {
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}
}  // namespace fedlora

#define FEDLORA_RETURN_IF_ERROR_CTX(expr, context)                                     \
  do {                                                                                 \
    ::absl::Status _fedlora_status = (expr);                                           \
    if (!_fedlora_status.ok()) return ::fedlora::Annotate(_fedlora_status, (context)); \
  } while (0)

// Internal invariant: aborts with file and line. Never use for input validation.
#define FEDLORA_CHECK(cond)                                                                 \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FEDLORA_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
