#include "server/live_view.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/tls.h"
#include "server/coordinator.h"
#include "server/services.h"
#include "server/status_json.h"

namespace fedlora {
namespace {

// Without TLS a browser must name the listener by an address or localhost: a name it resolved
// could be an attacker's, rebound to 127.0.0.1 so that the attacker's page reads the run. Empty (an
// HTTP/1.0 client, not a browser) passes.
absl::Status CheckHost(const std::string& host_header) {
  std::string host = absl::AsciiStrToLower(host_header);
  if (host.empty() || (host.front() == '[' && host.find(']') != std::string::npos))
    return absl::OkStatus();
  if (const size_t colon = host.rfind(':'); colon != std::string::npos) host.resize(colon);
  in_addr v4{};
  if (host == "localhost" || inet_pton(AF_INET, host.c_str(), &v4) == 1) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the live view without TLS answers a Host that is an address or localhost only (not '",
      host_header.substr(0, 64), "'): a name could be rebound to this machine by a web page"));
}

HttpPageReply Refusal(int status, const absl::Status& why) {
  HttpPageReply r;
  r.status = status;
  r.body = absl::StrCat(why.message(), "\n");
  r.headers = {{"Cache-Control", "no-store"}};
  return r;
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

absl::Status CheckLiveViewAccess(const HttpPageRequest& request, const LiveViewAccess& access) {
  const bool tls = access.tls != nullptr;
  if (tls && !request.https) {
    // Not reached through MetricsHttpServer, which speaks HTTPS only under TLS; a guard all the same.
    return absl::PermissionDeniedError("the live view answers HTTPS only when the server runs TLS");
  }
  absl::StatusOr<std::string> identity = absl::StatusOr<std::string>("");
  if (tls) {
    identity =
        request.client_cert_pem.empty()
            ? absl::UnauthenticatedError("no client certificate")
            : access.tls->CheckClientCertificate(request.client_cert_pem, request.client_chain_pem);
  }
  FEDLORA_RETURN_IF_ERROR(CheckOperatorRule("the live view", tls,
                                            IsLoopbackAddress(request.peer_address),
                                            request.peer_address, identity, access.operator_ids));
  if (!tls) FEDLORA_RETURN_IF_ERROR(CheckHost(request.host));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RunJson(Coordinator& coordinator) {
  FEDLORA_ASSIGN_OR_RETURN(v1::GetStatusResponse status,
                           coordinator.GetStatus(v1::GetStatusRequest()));
  v1::ListClientsRequest list_request;
  list_request.set_include_inactive(true);
  FEDLORA_ASSIGN_OR_RETURN(v1::ListClientsResponse clients, coordinator.ListClients(list_request));
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json j, StatusJsonValue(status, &clients));
  FEDLORA_ASSIGN_OR_RETURN(j["config"], MessageJsonValue(coordinator.config()));
  j["now_unix_ms"] = coordinator.NowMs();
  return j.dump();
}

HttpPageReply ServeLiveView(const HttpPageRequest& request, const LiveViewAccess& access,
                            Coordinator& coordinator) {
  if (absl::Status allowed = CheckLiveViewAccess(request, access); !allowed.ok())
    return Refusal(403, allowed);
  HttpPageReply r;
  r.headers = {{"Cache-Control", "no-store"},
               {"X-Content-Type-Options", "nosniff"},
               {"Referrer-Policy", "no-referrer"},
               {"X-Frame-Options", "DENY"}};
  if (request.path == kRunJsonPath) {
    absl::StatusOr<std::string> json = RunJson(coordinator);
    if (!json.ok()) return Refusal(503, json.status());
    r.content_type = "application/json";
    r.body = *std::move(json);
    return r;
  }
  r.content_type = "text/html; charset=utf-8";
  // Nothing but this page's own inline script and style, and its fetches to this listener.
  r.headers.emplace_back(
      "Content-Security-Policy",
      "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
      "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
      "frame-ancestors 'none'");
  r.body = LiveViewPage();
  return r;
}

}  // namespace fedlora
