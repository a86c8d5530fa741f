// The live view of a run: a read-only page (GET /) and the JSON document it polls
// (GET /api/run.json), served on the metrics listener (server/metrics.h).
//
//   MetricsHttpOptions o;
//   o.page_paths = {kLiveViewPath, kRunJsonPath};
//   o.pages = [&](const HttpPageRequest& r) { return ServeLiveView(r, access, coordinator); };
//
// Access is the Admin service's rule (CheckOperatorRule, server/services.h): without TLS,
// loopback peers only (and a Host that is an address or localhost, so that a web page elsewhere
// cannot rebind its own name to 127.0.0.1 and read the run); under TLS the listener speaks HTTPS
// and only an operator's client certificate (ServerConfig.tls.operator_ids) that passes the
// federation port's own check (chain, validity, CRL, allow-list) gets the page. Others get 403
// with a one-line reason. The data is what `fedlora status` shows (Coordinator::GetStatus and
// ListClients) and the run config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/metrics.h"

namespace fedlora {

namespace crypto {
class ServerTls;
}
class Coordinator;

inline constexpr char kLiveViewPath[] = "/";
inline constexpr char kRunJsonPath[] = "/api/run.json";

struct LiveViewAccess {
  const crypto::ServerTls* tls = nullptr;  // null: plaintext, loopback peers only
  std::vector<std::string> operator_ids;
};

// Whether `address` (numeric, without a port: 127.0.0.1, ::1, ::ffff:127.0.0.1) is loopback.
bool IsLoopbackAddress(const std::string& address);

// OK when `request` may see the live view (see above), else PermissionDenied saying why.
absl::Status CheckLiveViewAccess(const HttpPageRequest& request, const LiveViewAccess& access);

// /api/run.json: GetStatus's fields (every committed round in "history"; proto names, 64-bit
// integers as numbers, server/status_json.h), "clients" (ListClients, inactive ones included),
// "config" (the run config) and "now_unix_ms" (the server's clock, for "12 s ago").
absl::StatusOr<std::string> RunJson(Coordinator& coordinator);

// The page: HTML, CSS, an inline SVG chart and one inline script that polls /api/run.json. No
// external assets. (live_view_page.cc)
const char* LiveViewPage();

// The handler for MetricsHttpOptions::pages: the page, the JSON, or 403 / 503 with a reason.
HttpPageReply ServeLiveView(const HttpPageRequest& request, const LiveViewAccess& access,
                            Coordinator& coordinator);

}  // namespace fedlora
