// fedlora health: asks a server's grpc.health.v1.Health service whether it serves, for container
// health checks and Kubernetes exec probes. Prints the status; exits 0 only when it is SERVING.
//
//   fedlora health --server 127.0.0.1:8081 --insecure       # the server's plaintext health port
//   fedlora health --server fl.example.org:50051 --ca ca.pem --cert probe.pem --key probe.key
//
// --service names one service (fedlora.v1.Federation, fedlora.v1.Admin); empty: the whole server.
#include <grpcpp/grpcpp.h>

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/health_check.h"
#include "tools/cli_tls.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace fedlora::tools {

int RunHealth(int argc, char** argv) {
  FlagSet flags(
      argv[0], "Asks a server's gRPC health service whether it serves; exits 0 only when it does.");
  std::string server, service, ca, cert, key;
  bool insecure = false;
  int64_t deadline_ms = 5'000;
  flags.AddString("server", &server, "host:port of the server (or of its plaintext health port)",
                  /*required=*/true);
  flags.AddString("service", &service, "one service's full name; empty: the whole server");
  flags.AddString("ca", &ca, "PEM CA bundle for a TLS server");
  flags.AddString("cert", &cert, "PEM client certificate (mTLS)");
  flags.AddString("key", &key, "PEM key of --cert");
  flags.AddBool("insecure", &insecure,
                "plaintext without TLS (the server's health port), to a loopback address only");
  flags.AddInt("deadline-ms", &deadline_ms, "deadline of the call, milliseconds");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (deadline_ms <= 0)
    return Fail(argv[0], absl::InvalidArgumentError("--deadline-ms must be positive"));
  absl::StatusOr<CliTls> tls = CliTlsCredentials(server, ca, cert, key, insecure);
  if (!tls.ok()) return Fail(argv[0], tls.status());
  auto status = CheckHealth(grpc::CreateChannel(server, tls->credentials), service, deadline_ms);
  if (!status.ok()) return Fail(argv[0], tls->Explain(status.status()));
  std::cout << HealthStatusName(*status) << std::endl;
  return *status == HealthStatus::kServing ? kExitOk : kExitFailure;
}

}  // namespace fedlora::tools
