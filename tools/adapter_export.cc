#include "tools/adapter_export.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/update_io.h"
#include "core/json.h"
#include "core/status.h"
#include "model/decoder_tokenizer.h"
#include "model/gguf_lora.h"
#include "model/peft.h"
#include "server/blob_store.h"
#include "server/store.h"
#include "tools/common.h"
#include "train/train_config.h"
#include "workload/factory.h"

namespace fedlora::tools {

absl::StatusOr<RunAdapterFormat> AdapterFormatForRun(const v1::RunConfig& config,
                                                     const std::string& model_path) {
  const std::string path = model_path.empty() ? config.model().path() : model_path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("base model ", path, " (model.path of run '",
                                            config.run_id(),
                                            "') not found: name its location with --model"));
  }
  FEDLORA_RETURN_IF_ERROR(CheckModelFitsTask(path, config.task()));
  RunAdapterFormat format;
  FEDLORA_ASSIGN_OR_RETURN(const int max_seq, RunMaxSeqLen(config, path));
  if (config.task().kind() == v1::TaskConfig::CAUSAL_LM) {
    FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok,
                             LoadChatTokenizer(path, config.task().chat_template()));
    FEDLORA_ASSIGN_OR_RETURN(
        format.peft_config,
        PeftDecoderAdapterConfig(DecoderOptionsFromConfig(config, max_seq).lora, ""));
    format.meta = AdapterMetadataForRun(config, max_seq, {}, std::string(tok.chat->name()));
  } else {
    const ModelOptions options = ModelOptionsFromConfig(config, max_seq, ModelRole::kEvaluate);
    FEDLORA_ASSIGN_OR_RETURN(format.peft_config, PeftEncoderAdapterConfig(options.lora, ""));
    format.meta = AdapterMetadataForRun(
        config, max_seq, {config.task().labels().begin(), config.task().labels().end()}, "");
  }
  format.meta.base_model = path;
  return format;
}

namespace {

struct RoundAdapter {
  int64_t round = 0;
  std::vector<UpdateTensor> tensors;
};

// Committed round `round` (0: the latest) of `run_id` and its adapter's tensors.
absl::StatusOr<RoundAdapter> ReadRoundAdapter(Store& store, const BlobStore& blobs,
                                              const std::string& run_id, int64_t round) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store.ListRounds(run_id));
  const RoundRecord* pick = nullptr;
  for (const RoundRecord& r : rounds) {
    if (round == 0 ? r.state == RoundState::kCommitted : r.round == round) pick = &r;
  }
  if (pick == nullptr) {
    if (round == 0) {
      return absl::NotFoundError(absl::StrCat(
          "run '", run_id, "' has no committed round yet: there is no trained adapter to export"));
    }
    return absl::NotFoundError(absl::StrCat("run '", run_id, "' has no round ", round,
                                            " (its rounds: 1 to ",
                                            rounds.empty() ? 0 : rounds.back().round, ")"));
  }
  if (pick->state != RoundState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", pick->round, " of run '", run_id, "' is ",
        std::string(RoundStateName(pick->state)), ", not committed: it has no adapter to export"));
  }
  if (pick->result_adapter_hash.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", pick->round, " of run '", run_id,
                     "': its adapter is no longer kept (server.retain_rounds keeps the latest "
                     "rounds' adapters; the latest "
                     "committed one always)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, blobs.Get(pick->result_adapter_hash));
  RoundAdapter out{.round = pick->round, .tensors = {}};
  FEDLORA_ASSIGN_OR_RETURN(out.tensors, AdapterFromSafetensors(bytes));
  return out;
}

// r and lora_alpha of an adapter_config.json object.
absl::StatusOr<GgufLoraScale> ScaleOf(const nlohmann::json& peft_config, const std::string& what) {
  FEDLORA_ASSIGN_OR_RETURN(int64_t r, GetInt(peft_config, "r", what));
  FEDLORA_ASSIGN_OR_RETURN(double alpha, GetDouble(peft_config, "lora_alpha", what));
  if (r < 1 || r > (1 << 16)) return absl::InvalidArgumentError(absl::StrCat(what, ": r = ", r));
  return GgufLoraScale{.rank = static_cast<int>(r), .alpha = static_cast<float>(alpha)};
}

absl::Status CheckGgufTarget(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is a directory: --gguf names the file to write"));
  }
  return absl::OkStatus();
}

constexpr char kEncoderRefusal[] =
    "is a classifier's (an encoder's): llama.cpp's --lora applies LoRA to decoders (LLaMA, Qwen2) "
    "only, so "
    "--gguf converts causal-LM adapters";

}  // namespace

absl::StatusOr<int64_t> ExportRound(Store& store, const BlobStore& blobs, const std::string& run_id,
                                    int64_t round, const RunAdapterFormat& format,
                                    const std::string& dir) {
  FEDLORA_ASSIGN_OR_RETURN(RoundAdapter adapter, ReadRoundAdapter(store, blobs, run_id, round));
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const UpdateTensor& t : adapter.tensors) {
    tensors.push_back(
        {t.name, DType::kF32, t.shape, t.values.data(), t.values.size() * sizeof(float)});
  }
  AdapterMetadata meta = format.meta;
  meta.run_id = run_id;
  meta.round = adapter.round;
  FEDLORA_RETURN_IF_ERROR(WriteAdapterDirectory(dir, tensors, format.peft_config, meta));
  return adapter.round;
}

absl::StatusOr<int64_t> ExportRoundGguf(Store& store, const BlobStore& blobs,
                                        const std::string& run_id, int64_t round,
                                        const RunAdapterFormat& format, const std::string& path) {
  if (format.meta.task != AdapterTask::kCausalLm) {
    return absl::InvalidArgumentError(
        absl::StrCat("the adapter of run '", run_id, "' ", kEncoderRefusal));
  }
  FEDLORA_RETURN_IF_ERROR(CheckGgufTarget(path));
  FEDLORA_ASSIGN_OR_RETURN(GgufLoraScale scale,
                           ScaleOf(format.peft_config, "the run's LoRA settings"));
  FEDLORA_ASSIGN_OR_RETURN(RoundAdapter adapter, ReadRoundAdapter(store, blobs, run_id, round));
  FEDLORA_RETURN_IF_ERROR(WriteGgufLora(adapter.tensors, scale, format.meta.base_model, path));
  return adapter.round;
}

absl::StatusOr<std::string> ExportAdapterDirGguf(const std::string& dir,
                                                 const std::string& model_path,
                                                 const std::string& path) {
  const std::string config_path = dir + "/" + kPeftConfigFile;
  std::error_code ec;
  if (!std::filesystem::exists(config_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, " is not an adapter directory (", config_path, " does not exist)"));
  }
  FEDLORA_RETURN_IF_ERROR(CheckGgufTarget(path));
  FEDLORA_ASSIGN_OR_RETURN(AdapterDirInfo info, ReadAdapterMetadata(dir));
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(config_path));
  const bool classifier = (info.task && *info.task == "sequence_classification") ||
                          (cfg.is_object() && cfg.value("task_type", "") == "SEQ_CLS");
  if (classifier)
    return absl::InvalidArgumentError(absl::StrCat("the adapter ", dir, " ", kEncoderRefusal));
  FEDLORA_ASSIGN_OR_RETURN(LoraOptions lora,
                           ReadPeftLoraOptions(dir));  // refuses what fedlora does not implement
  FEDLORA_ASSIGN_OR_RETURN(std::string base, AdapterBaseModel(dir, model_path));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<AdapterTensor> tensors, ReadAdapterTensors(dir));
  FEDLORA_RETURN_IF_ERROR(
      WriteGgufLora(tensors, {.rank = lora.rank, .alpha = lora.alpha}, base, path));
  return base;
}

}  // namespace fedlora::tools
