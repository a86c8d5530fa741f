// Internal to config/: each section of the run config, its defaults and its checks side by side in
// one file (training_section.cc, federation_section.cc, privacy_section.cc, codec_section.cc,
// server_section.cc). config_io.cc calls them in a fixed order, so that a config's defaults and
// its error message do not depend on how the sections are split.
#pragma once

#include "config/problems.h"
#include "fedlora/v1/config.pb.h"

namespace fedlora::config_internal {

// Task, model, LoRA and training (training_section.cc). Defaults first: the task kind decides the
// others'.
void ApplyTrainingDefaults(v1::RunConfig* c);
void ValidateModel(Problems& p, const v1::ModelConfig& m);
void ValidateLora(Problems& p, const v1::LoraConfig& l);
void ValidateTask(Problems& p, const v1::TaskConfig& t);
// model.precision against task.kind.
void ValidatePrecisionForTask(Problems& p, const v1::RunConfig& c);
void ValidateTraining(Problems& p, const v1::TrainingConfig& t);

// run_id, rounds, selection, aggregation, data and simulation (federation_section.cc). The
// aggregation defaults read privacy's switches, the simulation's checks the task kind.
void ApplyFederationDefaults(v1::RunConfig* c);
void ValidateRun(Problems& p, const v1::RunConfig& c);
void ValidateSelection(Problems& p, const v1::SelectionConfig& s);
void ValidateAggregation(Problems& p, const v1::RunConfig& c);
void ValidateData(Problems& p, const v1::DataConfig& d);
void ValidateSimulation(Problems& p, const v1::SimulationConfig& s);
// simulation.partition against task.kind.
void ValidatePartitionForTask(Problems& p, const v1::RunConfig& c);
bool IsAdaptiveServerStrategy(v1::AggregationConfig::Strategy s);
bool NeedsIndividualUpdates(v1::AggregationConfig::Strategy s);

// Differential privacy and secure aggregation (privacy_section.cc); defaults after selection's.
void ApplyPrivacyDefaults(v1::RunConfig* c);
void ValidatePrivacy(Problems& p, const v1::RunConfig& c);

// codec and downlink_codec (codec_section.cc); defaults after privacy's switches are known.
void ApplyCodecDefaults(v1::RunConfig* c);
// `field` names the spec ("codec" or "downlink_codec") in messages; `shared_scale`: the run has
// secure aggregation, whose QUANT stage has one scale for the whole update.
void ValidateCodec(Problems& p, const v1::CodecSpec& codec, const std::string& field,
                   bool shared_scale = false);

// The server's addresses, TLS, limits and store (server_section.cc).
void ApplyServerDefaults(v1::RunConfig* c);
void ValidateServer(Problems& p, const v1::ServerConfig& s);

}  // namespace fedlora::config_internal
