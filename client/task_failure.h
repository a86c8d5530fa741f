// What a task's error means to RunUntilDone, carried as a payload of the status the task's stages
// return: "local", the site cannot train (its data, model or settings do not fit the run): trying
// again gives the same error, so the client leaves with it; "server", the server cancelled the
// task: the next WaitForTask has the answer. Without the payload the error may pass (a GPU blip, a
// network cut beyond the retries): the client waits and takes the task again, max_attempts in a
// row.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace fedlora {

inline constexpr char kTaskFailureUrl[] = "fedlora.dev/client/task-failure";

inline absl::Status WithFailureKind(absl::Status s, absl::string_view kind) {
  s.SetPayload(kTaskFailureUrl, absl::Cord(kind));
  return s;
}

inline bool IsFailureKind(const absl::Status& s, absl::string_view kind) {
  const auto p = s.GetPayload(kTaskFailureUrl);
  return p.has_value() && *p == kind;
}

// A trainer's error that trying again cannot fix: the site's own files or settings are wrong.
// Unavailable, ResourceExhausted, Internal and the like may pass.
inline bool IsPermanentTrainerError(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) || absl::IsNotFound(s) ||
         absl::IsUnimplemented(s) || absl::IsPermissionDenied(s) || absl::IsOutOfRange(s) ||
         absl::IsDataLoss(s) || absl::IsAlreadyExists(s);
}

}  // namespace fedlora
