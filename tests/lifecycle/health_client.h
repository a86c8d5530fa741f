// grpc.health.v1.Health from the client side, through gRPC's generic stub (the health proto is not
// generated in this project): HealthCheckRequest is field 1, the service name; HealthCheckResponse
// is field 1, the status enum. Check answers once; HealthWatch holds a Watch stream open and
// records every status the server sends on it.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fedlora::testing {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
inline constexpr int kHealthUnknown = 0;
inline constexpr int kHealthServing = 1;
inline constexpr int kHealthNotServing = 2;
inline constexpr int kHealthServiceUnknown = 3;  // Watch's answer for a name not registered

inline grpc::ByteBuffer HealthRequest(const std::string& service) {
  std::string bytes;
  if (!service.empty()) {  // names here are short: the length is one varint byte
    bytes = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  }
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// The status in a HealthCheckResponse; kHealthUnknown for an empty message, -1 for bytes that are
// not one.
inline int HealthStatusOf(const grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.empty()) return kHealthUnknown;
  if (bytes.size() == 2 && bytes[0] == '\x08') return bytes[1];
  return -1;
}

struct HealthAnswer {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;  // of the call
  int status = -1;                                    // when code is OK
};

// grpc.health.v1.Health/Check for `service` ("" is the whole server).
inline HealthAnswer CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service, int64_t deadline_ms = 5000) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call =
      generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", HealthRequest(service), &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  HealthAnswer answer;
  if (cq.Next(&tag, &ok) && ok) {
    answer.code = status.error_code();
    if (status.ok()) answer.status = HealthStatusOf(response);
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return answer;
}

// A grpc.health.v1.Health/Watch stream for `service`, read on its own thread until the server ends
// it or the watch is destroyed.
class HealthWatch {
 public:
  HealthWatch(const std::shared_ptr<grpc::Channel>& channel, const std::string& service)
      : stub_(channel), thread_([this, service] { Run(service); }) {}
  ~HealthWatch() {
    ctx_.TryCancel();
    thread_.join();
  }
  HealthWatch(const HealthWatch&) = delete;
  HealthWatch& operator=(const HealthWatch&) = delete;

  // Whether `status` arrived on the stream within `timeout_ms` (earlier arrivals count).
  bool WaitFor(int status, int64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
      for (int s : seen_) {
        if (s == status) return true;
      }
      return false;
    });
  }
  // Whether the server ended the stream within `timeout_ms`.
  bool WaitForEnd(int64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return ended_; });
  }
  std::vector<int> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void Run(const std::string& service) {
    grpc::CompletionQueue cq;
    void* tag = nullptr;
    bool ok = false;
    auto call = stub_.PrepareCall(&ctx_, "/grpc.health.v1.Health/Watch", &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    bool open = cq.Next(&tag, &ok) && ok;
    if (open) {
      call->Write(HealthRequest(service), reinterpret_cast<void*>(2));
      open = cq.Next(&tag, &ok) && ok;
    }
    if (open) {
      call->WritesDone(reinterpret_cast<void*>(3));
      open = cq.Next(&tag, &ok) && ok;
    }
    while (open) {
      grpc::ByteBuffer response;
      call->Read(&response, reinterpret_cast<void*>(4));
      if (!cq.Next(&tag, &ok) || !ok) break;
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(HealthStatusOf(response));
      cv_.notify_all();
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    cv_.notify_all();
  }

  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> seen_;
  bool ended_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace fedlora::testing
