// Every limit, deadline and keepalive of the aggregation server, in one struct. Each field gives its
// unit, its default and why the default is what it is. Tests shrink the timings; a deployment
// mostly keeps the defaults and sets the addresses, the data directory and the TLS files.
//
//   ServerOptions opts;
//   opts.listen_address = "127.0.0.1:0";      // port 0: the kernel picks one; Server::port() tells
//   opts.data_dir = "/var/lib/fedlora";
//   FEDLORA_ASSIGN_OR_RETURN(auto server, Server::Create(opts, run, initial_adapter));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/defaults.h"
#include "core/tensor.h"

namespace fedlora {

// TLS for the federation port: all three files, so that every client presents a certificate signed
// by `client_ca_file` (mTLS) and its identity is the certificate's subject CN. Without TLS the server
// listens in plaintext, which ServerOptions::insecure must ask for and only a loopback address
// allows; identity then comes from the "fedlora-client-id" metadata entry (simulation and tests).
struct ServerTlsOptions {
  std::string cert_file;       // PEM server certificate chain
  std::string key_file;        // PEM private key of cert_file
  std::string client_ca_file;  // PEM CA bundle that signs client certificates
  // PEM CRL signed by client_ca_file; revoked certificates are refused at the handshake. Re-read
  // when the file changes and on Server::ReloadCrl (SIGHUP). Empty: no CRL.
  std::string crl_file;
  // Certificate CNs allowed to connect. Empty: any certificate client_ca_file signed.
  std::vector<std::string> allowed_client_ids;
  bool enabled() const {
    return !cert_file.empty() || !key_file.empty() || !client_ca_file.empty();
  }
};

struct ServerOptions {
  // Certificate CNs allowed to call the Admin service (ServerConfig.tls.operator_ids). With TLS these
  // alone may, whatever address they connect from; without TLS (loopback only), loopback callers.
  std::vector<std::string> operator_ids;

  // host:port for the Federation, Admin and health services. Port 0 picks a free port (tests).
  // Default loopback: exposing the server is a deployment decision, never an accident.
  std::string listen_address = "127.0.0.1:0";
  // host:port of the Prometheus text endpoint (HTTP/1.0 GET /metrics). Empty disables it. Port 0
  // picks a free port; Server::metrics_port() tells which.
  std::string metrics_address = "127.0.0.1:0";
  // host:port of a plaintext port serving only grpc.health.v1.Health, with the same statuses as
  // listen_address (ServerConfig.health_address): for probes without a client certificate, such
  // as Kubernetes' gRPC probes. Empty (the default) opens no such port; port 0 picks a free one.
  std::string health_address;
  // Directory holding the SQLite store and the blob files. Created when missing.
  std::string data_dir;
  // Directory of the per-round aggregation keys (server/aggregation_key.h), ServerConfig.key_dir.
  // Empty: data_dir + "/keys". Outside the store volume, a copy of the store opens nothing.
  std::string key_dir;
  // PEM X25519 public key file of the offline audit key (ServerConfig.audit_public_key_file,
  // server/audit_trail.h). Empty: no audit trail; every update is deleted with its round.
  std::string audit_public_key_file;
  ServerTlsOptions tls;
  // Serve plaintext without TLS (ServerConfig.insecure). Refused unless listen_address is loopback.
  // Default false: a server without TLS is a choice made explicitly, for simulation and tests.
  bool insecure = false;

  // --- Per-client quotas (RESOURCE_EXHAUSTED past them) and the disk ------------------------------
  // Update bytes one client may stream in one round, resends and refused uploads included. Default
  // 1 GiB (4 x max_upload_bytes): room for resumes, while a client that uploads garbage in a loop is
  // stopped long before it fills the disk.
  int64_t max_client_bytes_per_round =
      int64_t{kDefaultClientBytesPerRoundUpdates * kDefaultMaxUpdateBytes};
  // Uploads one client may stream at once. Default 2: a retry may overlap a stream the server has
  // not seen end yet.
  int max_client_uploads_in_flight = kDefaultMaxClientUploadsInFlight;
  // New uploads (upload ids) one client may begin per round, charged at the header whether or not
  // any byte follows (ServerConfig.max_client_uploads_per_round). Default 4: one per task, plus
  // room for a client that restarted without its upload id; a stream of header-only uploads stops
  // here instead of leaving a row and a partial file each.
  int max_client_uploads_per_round = kDefaultMaxClientUploadsPerRound;
  // ReportMetrics calls one client may make per round. Default 4: one report per task, plus
  // retries.
  int max_client_reports_per_round = kDefaultMaxClientReportsPerRound;
  // Entries of one report's `extra` map. Default 64.
  int max_metrics_per_report = kDefaultMaxMetricsPerReport;
  // New uploads are refused while the store's file system has less free space than this plus the
  // update's size, bytes. Default 1 GiB.
  int64_t min_free_disk_bytes = int64_t{kDefaultMinFreeDiskBytes};
  // Test-only: the free bytes of the store's file system, in place of statvfs. Null in production.
  std::function<int64_t()> free_disk_bytes_for_test;

  // DownloadAdapter streams one client may have open at once, charged when the stream starts; more
  // are refused with RESOURCE_EXHAUSTED at once (ServerConfig.max_client_downloads_in_flight).
  // Default 2: a resume may overlap a stream the server has not seen end yet. Each open stream
  // holds a chunk (chunk_bytes) and gRPC's buffers, so unread streams cannot pile up.
  int max_client_downloads_in_flight = kDefaultMaxClientDownloadsInFlight;
  // Tasks that may wait in each of the server's worker queues (the unary RPCs that touch the
  // store, download starts, upload processing); a call that finds its queue full is refused with
  // RESOURCE_EXHAUSTED. Default 1024: far beyond what the workers clear in a second.
  int max_queued_tasks = 1024;

  // --- Transport limits --------------------------------------------------------------------------
  // Memory gRPC may use for the connections and calls of listen_address (grpc::ResourceQuota),
  // bytes (ServerConfig.grpc_memory_bytes). Default 1 GiB. Past it gRPC shrinks its read buffers
  // and flow-control windows and refuses new calls, instead of growing without end.
  int64_t grpc_memory_bytes = int64_t{kDefaultGrpcMemoryBytes};
  // Threads gRPC's resource quota lets it create for listen_address
  // (ServerConfig.grpc_max_threads). Default 256.
  int grpc_max_threads = kDefaultGrpcMaxThreads;
  // Calls one connection may have open at once on listen_address (HTTP/2 SETTINGS
  // max_concurrent_streams; ServerConfig.max_concurrent_streams). More wait on the client's side
  // for one to end. Default 1000: a client makes a handful at once, but the simulator's virtual
  // clients share one connection (gRPC pools it), each with a long poll held.
  int max_concurrent_streams = kDefaultMaxConcurrentStreams;
  // The same three for the plaintext health port, which anyone who reaches it may use: one Watch
  // or Check at a time per connection is all a probe needs. Defaults 4 streams, 32 MiB, 16 threads.
  int health_max_concurrent_streams = 4;
  int64_t health_grpc_memory_bytes = int64_t{32} << 20;
  int health_grpc_max_threads = 16;
  // Largest gRPC message accepted or sent, bytes. Default 8 MiB (ServerConfig.max_message_bytes):
  // one 1 MiB chunk plus framing fits with room to spare, and anything bigger is a broken or
  // hostile peer (chunks are the only big field on the wire).
  int max_message_bytes = kDefaultMaxMessageBytes;
  // HTTP/2 keepalive ping interval, milliseconds. Default 30 s: well under the 60-350 s idle
  // timeouts of common NATs and load balancers, so long training phases do not silently drop the
  // connection.
  int keepalive_time_ms = 30'000;
  // How long a keepalive ping may go unanswered before the connection is closed, milliseconds.
  // Default 10 s: a healthy peer answers in under a round trip; ten seconds covers a congested
  // link.
  int keepalive_timeout_ms = 10'000;
  // Connections are closed (GOAWAY; calls in flight get max_connection_age_grace_ms to finish, and
  // clients reconnect) after this long, milliseconds, so that a certificate revoked in the CRL or
  // dropped from the allowed list loses its open connection too, not only new ones. Default 10 min;
  // the grace, 10 min, is the SDK's transfer deadline.
  int max_connection_age_ms = 600'000;
  int max_connection_age_grace_ms = 600'000;
  // Shortest ping interval tolerated from clients, milliseconds (grpc.http2.min_ping_interval...).
  // Default 10 s: clients ping every 30 s; faster pings are misconfiguration or abuse.
  int min_client_ping_interval_ms = 10'000;

  // --- Chunking ------------------------------------------------------------------------------------
  // Size of DownloadAdapter chunks, bytes. Default 1 MiB: large enough that per-message overhead
  // (~100 bytes of framing plus a 64-byte hash) is negligible, small enough that a resume after a
  // cut wastes little and that a chunk fits comfortably under max_message_bytes.
  int64_t chunk_bytes = kDefaultChunkSizeBytes;
  // Largest upload chunk accepted, bytes. Default 1 MiB (the client's default chunk size). A larger
  // chunk is refused with InvalidArgument before it is hashed or written. Must stay below
  // max_message_bytes minus ~64 KiB for the other fields.
  int64_t max_upload_chunk_bytes = kDefaultChunkSizeBytes;
  // Largest encoded update accepted, bytes, whatever the header declares. Default 256 MiB
  // (ServerConfig.max_update_bytes): a BERT-base LoRA update at rank 64 is ~40 MB in fp32; this
  // leaves room for big decoders without letting one client fill the disk. Decoding is further
  // capped at the run's adapter size (its exact element count).
  int64_t max_upload_bytes = int64_t{kDefaultMaxUpdateBytes};
  // An upload's received bytes are fsynced and recorded as resumable progress every this many
  // bytes (and when the stream ends), bytes. Default 8 MiB: one fsync per 8 chunks costs ~1 ms of
  // disk time per 8 MiB received. Checkpoints run beside the stream, one at a time; when the disk
  // is slower than the stream they cover more than this, and the stream waits for the disk only
  // once twice this is pending. So after a server crash a resume re-sends at most about four times
  // this (the checkpoint in flight and what came after it); after a broken stream, nothing.
  int64_t upload_sync_bytes = 8 << 20;
  // Threads that process upload messages (hash, write, fsync, decode, store), so that gRPC's few
  // callback threads never block on disk and the fsyncs of concurrent uploads overlap (the file
  // system and WalSyncer batch them); as many again run the uploads' periodic checkpoints beside
  // their streams. Default 8: the benchmark's concurrency; they mostly wait. 0 processes messages
  // on gRPC's threads and checkpoints inline.
  int upload_workers = 8;
  // Threads that answer the unary RPCs which touch the store (Join, ReportMetrics,
  // GetUploadStatus), and as many again that load, verify and chunk-hash a global adapter for
  // downloads (once per adapter: download_cache.h), so that neither a burst of joins nor every
  // client downloading at once holds gRPC's callback threads. Default 4.
  int io_workers = 4;
  // Niceness added to the threads of bulk work: upload processing (hash, unseal, validate),
  // download indexing, aggregation and evaluation. When the cores are busy, gRPC's threads and
  // the unary RPCs (Heartbeat, WaitForTask, Join) run first, and the bulk work takes what is left.
  // 0 runs everything at the server's own priority; at most 19.
  int bulk_work_nice = 10;
  // Where a round's updates are summed (aggregation/fedavg.h): kCuda keeps the exact fixed-point
  // sums in GPU memory, with the same bits as kCpu. The server fails to start when kCuda is asked
  // for and CUDA is not usable. Default kCpu.
  Device aggregation_device = Device::kCpu;
  // Longest a WaitForTask long poll is held, milliseconds, whatever the client asks for. Default
  // 30 s: below common proxy idle timeouts (60 s), so a held call is never cut by the network.
  int64_t max_long_poll_ms = 30'000;
  // WaitForTask polls one client may have held at once; more are answered at once with "retry
  // later". Default 2: the client's poll, and a retry beside one whose connection it lost.
  int max_client_held_polls = 2;

  // --- Rounds and clients --------------------------------------------------------------------------
  // The counts (clients per round, over-selection, min clients, rounds) come from the run config's
  // SelectionConfig. The timings below default to the run config's seconds through ServerOptionsFromRunConfig() (server.h);
  // they are milliseconds here so that tests can run a whole federation in a few seconds.
  //
  // Seconds from a round's start until its uploads are no longer accepted, in milliseconds.
  // Default 600 s (SelectionConfig.round_deadline_seconds).
  int64_t round_deadline_ms = int64_t{1000} * kDefaultRoundDeadlineSeconds;
  // What clients are told to wait before polling WaitForTask again when they are not selected,
  // milliseconds. Default 5 s (SelectionConfig.retry_after_seconds): selection windows last
  // seconds; polling faster only adds load.
  int64_t retry_after_ms = int64_t{1000} * kDefaultRetryAfterSeconds;
  // How long the server collects candidates before sampling a round's clients, milliseconds, unless
  // the quota (target x over-selection) is reached first or every live client is already waiting.
  // Default 10 s: two polls of a client at the default retry_after.
  int64_t selection_window_ms = 10'000;
  // Select as soon as the quota of candidates is waiting (true: a deployment starts rounds early),
  // or only once every live client is waiting or the window has passed (false: the choice then
  // depends on the seed alone, not on which clients polled first, as a reproducible simulation needs).
  bool select_when_quota_reached = true;
  // How many clients must have joined before "every live client is waiting" may close a selection;
  // the selection window still closes it with fewer. 0 (the default): no such floor. The simulator
  // sets it to its number of virtual clients: otherwise round 1 samples from whichever clients had
  // joined when the first few polled, which depends on thread timing, and the run is not reproducible.
  int64_t expected_clients = 0;
  // A client silent (no RPC of any kind) for longer than this is considered dead: it is not
  // selected, and its task is handed to someone else, milliseconds. Default 30 s
  // (SelectionConfig.heartbeat_timeout_seconds): three missed heartbeats.
  int64_t heartbeat_timeout_ms = int64_t{1000} * kDefaultHeartbeatTimeoutSeconds;
  // Interval at which clients holding a task are asked to heartbeat, milliseconds (sent in
  // JoinResponse). Default 10 s (SelectionConfig.heartbeat_interval_seconds).
  int64_t heartbeat_interval_ms = int64_t{1000} * kDefaultHeartbeatIntervalSeconds;
  // Period of the round driver's timer that checks deadlines and dead clients, milliseconds.
  // Default 200 ms: deadlines are seconds to hours; 200 ms keeps the lateness bounded and cheap.
  int64_t tick_ms = 200;
  // Tries at aggregating (and committing) a closed round before giving it up, with a pause of
  // 1 s, 2 s, 4 s ... (at most 30 s) between tries; a failure that does not pass (a corrupt update
  // blob) must not hold the run forever. Default 3 (ServerConfig.max_aggregation_attempts).
  int max_aggregation_attempts = kDefaultMaxAggregationAttempts;
  // What giving a round up means. false (the default): the round is abandoned and the next one
  // trains from the same adapter. true: the run stops; clients are told RunFinished(FAILED) and the
  // round stays aggregating in the store, so that a restarted server tries it again
  // (ServerConfig.stop_on_aggregation_failure).
  bool stop_on_aggregation_failure = false;
  // Committed rounds whose blobs (adapter, optimizer state, downlink adapter and delta) are kept,
  // counting back from the latest (ServerConfig.retain_rounds); older ones are deleted at each
  // round's close and their rows' hashes cleared. Never fewer than aggregation.average_last_rounds
  // - 1, nor than 1. 0 keeps every round. Default 10.
  int64_t retain_rounds = kDefaultRetainRounds;
  // Seed for client sampling. 0 (the default) means "the run config's seed". Sampling is a pure
  // function of (seed, round, candidate set), so a restarted server chooses the same way.
  uint64_t selection_seed = 0;
};

}  // namespace fedlora
