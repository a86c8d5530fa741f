// A federation's adapters out of the server's store, as adapter directories
// (model/adapter_dir.h) with the run's labels, max_seq_len and prompt settings: what `fedlora
// export` and `fedlora server --out` write, through the same two functions.
//
//   FEDLORA_ASSIGN_OR_RETURN(RunAdapterFormat format, AdapterFormatForRun(config, ""));
//   FEDLORA_ASSIGN_OR_RETURN(int64_t round, ExportRound(store, blobs, run_id, 0, format, "out/adapter"));
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "fedlora/v1/config.pb.h"
#include "model/adapter_dir.h"

namespace fedlora {
class Store;
class BlobStore;
}  // namespace fedlora

namespace fedlora::tools {

// What every adapter of one run carries besides its weights.
struct RunAdapterFormat {
  nlohmann::json peft_config;  // adapter_config.json (base_model_name_or_path set when written)
  AdapterMetadata meta;        // round filled in per adapter
};

// The format of `config`'s adapters. The base model is `model_path` when given, else the config's
// model.path; its checkpoint is read as the run read it (its positions or context clamp
// max_seq_len; a decoder's chat template is resolved to its name). NotFound naming the path when
// the base model is not there; the config's own errors otherwise.
absl::StatusOr<RunAdapterFormat> AdapterFormatForRun(const v1::RunConfig& config,
                                                     const std::string& model_path);

// Writes committed round `round` of run `run_id` (0: its latest committed round) as an adapter
// directory at `dir`, its tensors exactly the stored blob's (checked against its SHA-256), and
// returns the round written. Reads the store only. NotFound: no such run, no committed round yet,
// no round `round`; FailedPrecondition: round `round` is not committed, or its adapter is no
// longer kept (server.retain_rounds); DataLoss: the blob is damaged; WriteAdapterDirectory's errors.
absl::StatusOr<int64_t> ExportRound(Store& store, const BlobStore& blobs, const std::string& run_id,
                                    int64_t round, const RunAdapterFormat& format,
                                    const std::string& dir);

// Writes the same round's adapter as a GGUF LoRA file for llama.cpp's --lora (model/gguf_lora.h)
// at `path`, and returns the round written. ExportRound's store errors; InvalidArgument for a
// classification run (an encoder's adapter) and WriteGgufLora's errors.
absl::StatusOr<int64_t> ExportRoundGguf(Store& store, const BlobStore& blobs,
                                        const std::string& run_id, int64_t round,
                                        const RunAdapterFormat& format, const std::string& path);

// Writes the adapter directory `dir` (written by fedlora or by PEFT) as a GGUF LoRA file at `path`.
// The base model is `model_path` when given, else the one fedlora_adapter.json records, else
// adapter_config.json's base_model_name_or_path. InvalidArgument for a classifier's adapter and for
// PEFT settings fedlora does not implement; NotFound for a missing file or base model (naming
// --model); WriteGgufLora's errors. Returns the base model (for llama.cpp's -m).
absl::StatusOr<std::string> ExportAdapterDirGguf(const std::string& dir,
                                                 const std::string& model_path,
                                                 const std::string& path);

}  // namespace fedlora::tools
