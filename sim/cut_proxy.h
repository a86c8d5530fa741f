// A loopback TCP forwarder that can cut its connections after a given number of client-to-server
// bytes: how the simulator crashes a virtual client in the middle of an upload without touching the
// SDK. The client's channel points at the proxy; when the simulator arms it with "cut after N more
// bytes" (N = half of the coming upload), the proxy forwards exactly N more bytes upstream, then
// closes both sides of every connection it holds. gRPC sees a broken transport (Unavailable), the
// SDK backs off, reconnects through the proxy (disarmed by then) and resumes the upload from the
// chunks the server acknowledged as durable.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto proxy, CutProxy::Start("127.0.0.1:50051"));
//   client_options.server_address = proxy->address();
//   proxy->ArmCut(150'000);
//
// One thread per proxy runs a poll() loop over its listening socket and connections. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace fedlora::sim {

class CutProxy {
 public:
  // Listens on 127.0.0.1 (kernel-chosen port) and forwards to `upstream` ("127.0.0.1:port").
  // InvalidArgument for a malformed upstream, Unavailable when a socket cannot be made.
  static absl::StatusOr<std::unique_ptr<CutProxy>> Start(const std::string& upstream);
  ~CutProxy();  // stops the thread and closes every socket
  CutProxy(const CutProxy&) = delete;
  CutProxy& operator=(const CutProxy&) = delete;

  std::string address() const;
  // After `bytes` more client-to-server bytes, cut every connection (once). bytes >= 1.
  void ArmCut(int64_t bytes);
  // Connections cut so far.
  int64_t cuts() const { return cuts_.load(); }

 private:
  CutProxy(int listen_fd, int port, int upstream_port, int wake_fd_read, int wake_fd_write);
  void Loop();

  const int listen_fd_;
  const int port_;
  const int upstream_port_;
  const int wake_read_, wake_write_;
  std::atomic<int64_t> armed_{-1};  // bytes left before the cut; -1 = disarmed
  std::atomic<int64_t> cuts_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fedlora::sim
