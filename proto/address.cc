#include "proto/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fedlora {

bool SplitHostPort(std::string_view address, std::string* host, uint32_t* port) {
  std::string_view port_text;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() || address[close + 1] != ':')
      return false;
    *host = std::string(address.substr(1, close - 1));
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return false;
    *host = std::string(address.substr(0, colon));
    if (host->find(':') != std::string::npos) return false;
    port_text = address.substr(colon + 1);
  }
  if (host->empty() || port_text.empty() || port_text.size() > 5) return false;
  for (char c : port_text) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(std::string(port_text), port) && *port <= 65535;
}

bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string h(host);
  const std::string lower = absl::AsciiStrToLower(h);
  if (lower == "localhost" || lower == "localhost.") return true;
  unsigned char v4[4];
  if (inet_pton(AF_INET, h.c_str(), v4) == 1) return v4[0] == 127;
  struct in6_addr v6 {};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

absl::Status CheckPlaintextAllowed(std::string_view address, bool insecure,
                                   std::string_view what_view) {
  const std::string what(what_view), shown(address);
  if (address.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  constexpr char kUseTls[] =
      "use TLS (the server: --cert/--key/--client-ca; a client: --ca/--cert/--key; `fedlora certs "
      "dev` makes a "
      "development CA and certificates)";
  std::string_view rest = address;
  bool local = false;
  if (rest.starts_with("unix:") || rest.starts_with("unix-abstract:")) {
    local = true;
  } else {
    for (std::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
      if (rest.starts_with(scheme)) {
        rest.remove_prefix(scheme.size());
        break;
      }
    }
    std::string_view host = rest;
    if (rest.starts_with("[")) {
      const size_t close = rest.find(']');
      host = close == std::string_view::npos ? std::string_view() : rest.substr(0, close + 1);
    } else if (rest.find(':') == rest.rfind(':') && rest.find(':') != std::string_view::npos) {
      host = rest.substr(0, rest.find(':'));  // host:port; two or more colons: a bare IPv6 address
    }
    local = IsLoopbackHost(host);
  }
  if (!local) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " '", shown, "' is not a loopback address, so plaintext is refused: ", kUseTls,
        ", or --insecure on a loopback address (127.0.0.1, [::1], localhost)"));
  }
  if (!insecure) {
    return absl::FailedPreconditionError(
        absl::StrCat("plaintext on the ", what, " '", shown,
                     "' needs the explicit --insecure flag; otherwise ", kUseTls));
  }
  return absl::OkStatus();
}

}  // namespace fedlora
