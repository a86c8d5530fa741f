#include "crypto/grpc_log.h"

#include <grpc/support/log.h>

#include <mutex>
#include <string_view>

#include "core/logging.h"

namespace fedlora::crypto {
namespace {

// A failed certificate check, or a TLS server choosing its only certificate for an unknown name:
// what fedlora's own messages say with the certificate and the fix.
bool DuplicatesFedlorasReport(std::string_view file, std::string_view message) {
  if (file.find("ssl_transport_security.cc") == std::string_view::npos) return false;
  return message.find("certificate verify failed") != std::string_view::npos ||
         message.find("No match found for server name") != std::string_view::npos;
}

void Log(gpr_log_func_args* args) {
  const std::string_view file = args->file != nullptr ? args->file : "grpc";
  std::string_view message = args->message != nullptr ? args->message : "";
  LogLevel level = args->severity == GPR_LOG_SEVERITY_ERROR  ? LogLevel::kError
                   : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                             : LogLevel::kDebug;
  if (DuplicatesFedlorasReport(file, message)) level = LogLevel::kDebug;
  // What a server sees when a client speaks plaintext (or HTTP/1) to its TLS port.
  const bool not_tls = file.find("ssl_transport_security.cc") != std::string_view::npos &&
                       (message.find("wrong version number") != std::string_view::npos ||
                        message.find("http request") != std::string_view::npos);
  if (not_tls) level = LogLevel::kWarning;
  if (level < GetLogLevel()) return;
  LogMessage(level, args->file != nullptr ? args->file : "grpc", args->line).stream()
      << (not_tls
              ? "TLS handshake failed: the peer does not speak TLS (a plaintext client?); gRPC: "
              : "gRPC: ")
      << message;
}

}  // namespace

void RouteGrpcLogs() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(Log); });
}

}  // namespace fedlora::crypto
