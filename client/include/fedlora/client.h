// The fedlora client SDK: connects an edge site to an aggregation server and runs its share of the
// federation. The site's data never leaves it; only adapter deltas do.
//
//   fedlora::ClientOptions options;
//   options.server_address = "fl.example.org:50051";
//   options.tls = {.root_ca_file = "ca.pem", .cert_file = "site.pem", .key_file = "site.key"};
//   MyTrainer trainer;  // implements fedlora::ClientTrainer (see client_trainer.h)
//   FEDLORA_ASSIGN_OR_RETURN(auto client, fedlora::Client::Create(options, &trainer));
//   FEDLORA_ASSIGN_OR_RETURN(fedlora::RunSummary summary, client->RunUntilDone());
//
// RunUntilDone loops Join -> WaitForTask -> download the global adapter -> Train -> encode -> seal
// (AES-256-GCM to the run's aggregation key, bound to run, round, client and upload) -> upload
// (resumed after a broken stream, idempotent by upload id) -> report metrics, until the server says
// the run is over. Every call has a deadline; transient failures (server restarting, network cuts)
// are retried with exponential backoff and jitter; a lost session is re-joined. A connection that
// fails for a TLS reason (a certificate either side refuses, plaintext against TLS) is not
// retried: a handshake of the SDK's own says why (crypto/tls_probe.h), and RunUntilDone returns
// that error (FailedPrecondition or PermissionDenied) at once.
//
// Plain structs only: this header never shows protobuf, gRPC or CUDA types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fedlora/client_trainer.h"

namespace fedlora {

// TLS with a client certificate (the server derives the client's identity from it); all three
// files are needed. All empty: plaintext, which ClientOptions.insecure must ask for and only a
// loopback server address allows; the identity is then `ClientOptions.client_id`.
struct ClientTlsOptions {
  std::string root_ca_file;  // PEM bundle the server certificate must chain to
  std::string cert_file;     // PEM client certificate chain
  std::string key_file;      // PEM private key of cert_file
  // Expected server name when it differs from the address's host (tests with a fixed certificate).
  std::string server_name_override;
  // The server certificate's key pin: SHA-256 of its SubjectPublicKeyInfo, 64 lowercase hex digits
  // (`fedlora certs dev` prints it; `fedlora certs pin` computes it). Set, a round's aggregation
  // key must be signed by that key; empty, by a certificate of root_ca_file valid for the server
  // name, which a TLS-terminating proxy with a certificate from the same CA also has.
  std::string server_key_pin;
  bool enabled() const { return !root_ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// Exponential backoff with jitter for transient failures (Unavailable, DeadlineExceeded, Aborted,
// a broken stream). Attempt n waits min(max_backoff_ms, initial_backoff_ms * multiplier^(n-1)),
// scaled by a uniform factor in [1 - jitter, 1 + jitter] so that clients restarted together do not
// retry in lockstep.
struct RetryPolicy {
  // Tries per operation, including the first. Default 10: with the defaults below that is about
  // three minutes of trying, enough to ride out a server restart.
  int max_attempts = 10;
  int64_t initial_backoff_ms = 200;  // default 200 ms: a quick second try for a blip
  double multiplier = 2.0;           // default 2: the usual doubling
  int64_t max_backoff_ms = 30'000;   // default 30 s: cap so a recovered server is noticed soon
  double jitter = 0.2;               // default +-20%
};

struct ClientOptions {
  // host:port of the aggregation server. Required.
  std::string server_address;
  // Identity sent in plaintext mode (ignored with TLS, where the certificate decides). Default empty:
  // required without TLS.
  std::string client_id;
  ClientTlsOptions tls;
  // Talk plaintext to a loopback server (simulation, tests). Default false: without TLS, Create
  // refuses unless this is set and server_address is 127.0.0.0/8, [::1] or localhost.
  bool insecure = false;
  RetryPolicy retry;

  // --- Deadlines, milliseconds (every RPC has one) ---
  // Join, Heartbeat, GetUploadStatus, ReportMetrics, Leave. Default 10 s: these are small messages;
  // ten seconds covers a congested link, anything slower is better retried.
  int64_t call_deadline_ms = 10'000;
  // How long the server may hold WaitForTask before answering, seconds. Default 20 s: long polls
  // keep clients responsive without hammering the server. The call's deadline adds 10 s to it.
  int64_t wait_for_task_seconds = 20;
  // One DownloadAdapter or UploadUpdate stream. Default 10 min: 100 MB at ~2 Mbit/s; a cut stream
  // resumes where it stopped, so a long deadline wastes nothing.
  int64_t transfer_deadline_ms = 600'000;
  // Largest gRPC message sent or received, bytes. Default 8 MiB (matches the server default; one
  // 1 MiB chunk plus framing).
  int max_message_bytes = 8 << 20;

  // Also download the final global adapter when the run finishes (RunSummary.final_adapter).
  // Default true.
  bool download_final_adapter = true;
  // Stop after this many tasks were trained and uploaded; 0 (default) runs until the run finishes.
  int64_t max_tasks = 0;
  // Version string sent in Join, for the server's logs. Default empty: this SDK's version.
  std::string client_version;
  // The device the site trains on, reported in Join's capabilities (the server logs it) and used
  // for nothing else: "cpu", or the GPU's description with has_cuda set.
  std::string device_name = "cpu";
  bool has_cuda = false;
  // Run the update's top-k and quantization stages on the GPU (the same bytes as on the host); a
  // low-rank codec, which has no GPU path, encodes on the host. Needs a CUDA build and device: the
  // first update fails otherwise. Default false: the host.
  bool encode_on_cuda = false;
  // Directory for the site's state that must outlive a restart: the error-feedback residual of a
  // lossy update codec (error_feedback.safetensors, written atomically after each accepted update)
  // and the last global adapter (global_adapter.safetensors), from which a run with a downlink
  // codec sends deltas. Default empty: both live in memory only and a restart loses them.
  std::string state_dir;
};

struct RunSummary {
  int64_t tasks_completed = 0;  // updates this client had accepted
  int64_t tasks_failed =
      0;  // tasks given up (trainer error, update refused, round closed), then taken again
  uint64_t final_round = 0;  // the run's last committed round
  // How the tasks' global adapters arrived: downloaded whole, rebuilt from a downlink delta chain,
  // or already held.
  int64_t adapters_downloaded = 0;
  int64_t adapters_rebuilt = 0;
  int64_t adapters_reused = 0;
  std::string final_adapter_sha256;
  std::vector<NamedTensor> final_adapter;  // empty unless download_final_adapter
};

class Client {
 public:
  // Checks the options and opens the channel (no network traffic until RunUntilDone). `trainer` is
  // not owned and must outlive the client. InvalidArgument for a missing address or identity, an
  // incomplete TLS setup, or plaintext not allowed (see `insecure`); NotFound / PermissionDenied
  // for unreadable TLS files.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options,
                                                        ClientTrainer* trainer);
  virtual ~Client() = default;

  // Runs until the server reports the run finished, max_tasks are done, Stop() is called
  // (Cancelled), or retries are exhausted (the last transient error); Aborted when the server
  // stopped the run on a failure (RunFinished FAILED). A trainer error that trying again cannot fix,
  // or RetryPolicy.max_attempts failed tasks in a row, end it too: the client leaves with the
  // error, which the server shows (see ClientTrainer::Train), and returns it. Not thread-safe: call
  // it from one thread at a time.
  virtual absl::StatusOr<RunSummary> RunUntilDone() = 0;
  // Asks RunUntilDone to return soon (it finishes the RPC in flight, leaves, and returns
  // Cancelled). Thread-safe.
  virtual void Stop() = 0;
};

}  // namespace fedlora
