// The run config's defaults, each written once (proto/fedlora/v1/config.proto documents them).
// ApplyRunConfigDefaults (config/config_io.h) fills a config with them; code that takes a config
// built by hand (tests, embedders) and ServerOptions' own defaults read the same constants.
//
// The domain modules own their sections' defaults: training and LoRA in train/training_defaults.h,
// the codec stages' parameters in compression/codec.h. This header gathers the rest, and includes
// nothing but <cstdint>, so that any module above config/ may read it.
#pragma once

#include <cstdint>

namespace fedlora {

// Run.
inline constexpr char kDefaultRunId[] = "default";
inline constexpr uint32_t kDefaultRounds = 10;

// Selection.
inline constexpr uint32_t kDefaultClientsPerRound = 10;
inline constexpr double kDefaultOverSelection = 1.3;
// selection.min_clients unless set: half of clients_per_round, rounded up.
inline constexpr uint32_t DefaultMinClients(uint32_t clients_per_round) {
  return (clients_per_round + 1) / 2;
}
inline constexpr uint32_t kDefaultRoundDeadlineSeconds = 600;
inline constexpr uint32_t kDefaultHeartbeatIntervalSeconds = 10;
inline constexpr uint32_t kDefaultHeartbeatTimeoutSeconds = 30;  // three missed heartbeats
inline constexpr uint32_t kDefaultRetryAfterSeconds = 5;

// Aggregation. server_learning_rate unless set: 1 (plain FedAvg's step) for FEDAVG, FEDPROX and the
// robust strategies, 0.01 for the adaptive optimizers (FEDADAM, FEDYOGI, FEDADAGRAD).
inline constexpr double kDefaultServerLearningRate = 1.0;
inline constexpr double kDefaultAdaptiveServerLearningRate = 0.01;
inline constexpr double kDefaultProximalMu = 0.0;          // any strategy but FEDPROX
inline constexpr double kDefaultFedProxProximalMu = 0.01;  // FEDPROX
inline constexpr double kDefaultServerBeta1 = 0.9;
inline constexpr double kDefaultServerBeta2 = 0.99;
inline constexpr double kDefaultServerTau = 1e-3;

// Differential privacy.
inline constexpr double kDefaultDpTargetDelta = 1e-5;
inline constexpr double kDefaultAdaptiveClippingTargetQuantile = 0.5;
inline constexpr double kDefaultAdaptiveClippingLearningRate = 0.2;

// Data.
inline constexpr uint32_t kDefaultEvalEveryRounds = 1;

// Server.
inline constexpr char kDefaultListenAddress[] = "127.0.0.1:50051";
inline constexpr char kDefaultStoreDir[] = "fedlora_store";
inline constexpr uint32_t kDefaultChunkSizeBytes = 1u << 20;      // 1 MiB
inline constexpr uint32_t kMinChunkSizeBytes = 4u << 10;          // 4 KiB
inline constexpr uint32_t kMaxChunkSizeBytes = 64u << 20;         // 64 MiB
inline constexpr uint64_t kDefaultMaxUpdateBytes = 256ull << 20;  // 256 MiB
inline constexpr uint32_t kDefaultMaxMessageBytes = 8u << 20;     // 8 MiB
// server.max_client_bytes_per_round unless set: four updates of max_update_bytes.
inline constexpr uint64_t kDefaultClientBytesPerRoundUpdates = 4;
inline constexpr uint32_t kDefaultMaxClientUploadsInFlight = 2;
inline constexpr uint32_t kDefaultMaxClientUploadsPerRound = 4;
inline constexpr uint32_t kDefaultMaxClientReportsPerRound = 4;
inline constexpr uint32_t kDefaultMaxMetricsPerReport = 64;
inline constexpr uint64_t kDefaultMinFreeDiskBytes = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint32_t kDefaultMaxAggregationAttempts = 3;
inline constexpr uint64_t kDefaultGrpcMemoryBytes = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint32_t kDefaultGrpcMaxThreads = 256;
inline constexpr uint32_t kDefaultMaxConcurrentStreams = 1000;
inline constexpr uint32_t kDefaultMaxClientDownloadsInFlight = 2;
inline constexpr uint32_t kDefaultRetainRounds = 10;
// Room for the fields around a chunk's data in one gRPC message (index, offset, hash, framing).
inline constexpr uint32_t kChunkMessageOverheadBytes = 64u << 10;  // 64 KiB

// Simulation.
inline constexpr uint32_t kDefaultSimulatedClients = 10;
inline constexpr double kDefaultDirichletAlpha = 0.5;
inline constexpr uint32_t kDefaultShardsPerClient = 2;
// simulation.attack.scale unless set, by kind: SIGN_FLIP's factor, SCALE's factor (model
// replacement), GAUSSIAN's standard deviation. LITTLE_IS_ENOUGH computes its z unless set, and
// MIN_MAX takes none.
inline constexpr double kDefaultSignFlipScale = 1.0;
inline constexpr double kDefaultScaleAttackFactor = 1000.0;
inline constexpr double kDefaultGaussianAttackStddev = 0.1;

// Config files larger than this are refused before they are read (a config is a few KiB).
inline constexpr uint64_t kMaxRunConfigFileBytes = 16ull << 20;  // 16 MiB

}  // namespace fedlora
