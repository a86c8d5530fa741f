// fedlora status: asks a running server for its run status (Admin.GetStatus) and, with --list-clients,
// its client list (Admin.ListClients); with --block ID (or --unblock ID) blocks a client instead
// (Admin.BlockClient). Prints a short view for people by default (tools/status_view.h), or one JSON
// document with --json.
//
//   fedlora status --server 127.0.0.1:50051 --insecure
//   fedlora status --server fl.example.org:50051 --ca ca.pem --cert operator.pem --key operator.key
//
// Over mTLS the Admin service answers the operator identities the server lists (--operators,
// server.tls.operator_ids) only; a plaintext server, loopback callers.
#include <grpcpp/grpcpp.h>

#include <ctime>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/rpc_status.h"
#include "core/status.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "tools/cli_tls.h"
#include "tools/common.h"
#include "tools/status_view.h"

namespace fedlora::tools {
namespace {

// What to ask for: the status, the client list, or a block (or its lifting) of one client.
struct Request {
  bool clients = false;
  bool json = false;
  std::string block, unblock, reason;
  int64_t deadline_ms = 10'000;
};

absl::Status Block(v1::Admin::Stub& stub, const std::string& address, const Request& r) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(r.deadline_ms));
  v1::BlockClientRequest req;
  req.set_client_id(r.block.empty() ? r.unblock : r.block);
  req.set_blocked(!r.block.empty());
  req.set_reason(r.reason);
  v1::BlockClientResponse response;
  FEDLORA_RETURN_IF_ERROR_CTX(FromGrpcStatus(stub.BlockClient(&ctx, req, &response)),
                              absl::StrCat("BlockClient at ", address));
  if (r.json) {
    FEDLORA_ASSIGN_OR_RETURN(std::string json, MessageJson(response));
    std::cout << json << std::endl;
  } else {
    std::cout << ClientsView({response.client()}, static_cast<int64_t>(std::time(nullptr)) * 1000);
  }
  return absl::OkStatus();
}

absl::Status Status(const std::string& address, const std::string& ca, const std::string& cert,
                    const std::string& key, bool insecure, const Request& r) {
  if (!r.block.empty() && !r.unblock.empty())
    return absl::InvalidArgumentError("--block and --unblock exclude each other");
  if (!r.reason.empty() && r.block.empty() && r.unblock.empty()) {
    return absl::InvalidArgumentError("--reason goes with --block or --unblock");
  }
  const bool clients = r.clients;
  const int64_t deadline_ms = r.deadline_ms;
  FEDLORA_ASSIGN_OR_RETURN(const CliTls tls, CliTlsCredentials(address, ca, cert, key, insecure));
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(address, tls.credentials));
  if (!r.block.empty() || !r.unblock.empty()) return tls.Explain(Block(*stub, address, r));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  v1::GetStatusResponse status;
  FEDLORA_RETURN_IF_ERROR_CTX(
      tls.Explain(FromGrpcStatus(stub->GetStatus(&ctx, v1::GetStatusRequest(), &status))),
      absl::StrCat("GetStatus from ", address));
  std::optional<v1::ListClientsResponse> list;
  if (clients) {
    grpc::ClientContext ctx2;
    ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    v1::ListClientsRequest req;
    req.set_include_inactive(true);
    list.emplace();
    FEDLORA_RETURN_IF_ERROR_CTX(FromGrpcStatus(stub->ListClients(&ctx2, req, &*list)),
                                absl::StrCat("ListClients from ", address));
  }
  if (r.json) {
    FEDLORA_ASSIGN_OR_RETURN(std::string json, StatusJson(status, list ? &*list : nullptr));
    std::cout << json << std::endl;
    return absl::OkStatus();
  }
  const int64_t now_ms = static_cast<int64_t>(std::time(nullptr)) * 1000;
  std::cout << StatusView(status, now_ms);
  if (list) {
    std::cout << "\n" << ClientsView({list->clients().begin(), list->clients().end()}, now_ms);
  }
  return absl::OkStatus();
}

}  // namespace

int RunStatus(int argc, char** argv) {
  FlagSet flags(
      argv[0],
      "Prints a running server's status (and clients): a short view, or JSON with --json.");
  std::string server, ca, cert, key;
  bool insecure = false;
  Request r;
  flags.AddString("server", &server, "host:port of the server", /*required=*/true);
  flags.AddString("ca", &ca, "PEM CA bundle for a TLS server");
  flags.AddString("cert", &cert, "PEM operator certificate (mTLS)");
  flags.AddString("key", &key, "PEM key of --cert");
  flags.AddBool("insecure", &insecure, "plaintext without TLS, to a loopback server only");
  flags.AddBool("list-clients", &r.clients, "also list the clients");
  flags.AddRenamed("clients", "list-clients", "--clients is a list of site ids elsewhere");
  flags.AddBool("json", &r.json,
                "print one JSON document: GetStatusResponse's fields (proto names, 64-bit integers "
                "as numbers), "
                "with --list-clients a \"clients\" array beside them");
  flags.AddString("block", &r.block,
                  "block this client id (durable; prints the client instead of the status)");
  flags.AddString("unblock", &r.unblock, "lift the block of this client id");
  flags.AddString("reason", &r.reason, "why, for the server's log (with --block or --unblock)");
  flags.AddInt("deadline-ms", &r.deadline_ms, "deadline of each call, milliseconds");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  absl::Status s = Status(server, ca, cert, key, insecure, r);
  return s.ok() ? kExitOk : Fail(argv[0], s);
}

}  // namespace fedlora::tools
