// Test-only crash injection. When the environment variable FEDLORA_TEST_CRASH_AT names a point
// (for example "before_ack"), the server raises SIGKILL on itself when it reaches that point, so
// that a crash test can check that a restarted server loses nothing acknowledged and counts
// nothing twice. Points (see server/coordinator_uploads.cc and server/coordinator_driver.cc):
//   before_ack          the update is complete and valid but not yet recorded in the store
//   after_ack           the update is durable in the store; the ack has not been sent
//   during_aggregation  the round is aggregating; some updates have been added
//   during_checkpoint   the new adapter blob is written; the round is not committed yet
// An optional "@N" suffix ("after_ack@3") crashes at the N-th time the point is reached (1-based);
// without it, the first. Unset in production: the check is one getenv at first use.
#pragma once

#include <string_view>

namespace fedlora {

void MaybeCrashAt(std::string_view point);

}  // namespace fedlora
