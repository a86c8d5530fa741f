#include "tools/adapter_export.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/update_io.h"
#include "core/status.h"
#include "model/decoder_tokenizer.h"
#include "model/peft.h"
#include "server/blob_store.h"
#include "server/store.h"
#include "tools/common.h"
#include "train/train_config.h"

namespace fedlora::tools {

absl::StatusOr<RunAdapterFormat> AdapterFormatForRun(const v1::RunConfig& config, const std::string& model_path) {
  const std::string path = model_path.empty() ? config.model().path() : model_path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("base model ", path, " (model.path of run '", config.run_id(),
                                            "') not found: name its location with --model"));
  }
  FEDLORA_RETURN_IF_ERROR(CheckModelFitsTask(path, config.task()));
  RunAdapterFormat format;
  const int configured = ConfiguredMaxSeqLen(config.model());
  if (config.task().kind() == v1::TaskConfig::CAUSAL_LM) {
    FEDLORA_ASSIGN_OR_RETURN(const int max_seq, DecoderMaxSeqLen(path, configured));
    FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok, LoadChatTokenizer(path, config.task().chat_template()));
    FEDLORA_ASSIGN_OR_RETURN(format.peft_config,
                             PeftDecoderAdapterConfig(DecoderOptionsFromConfig(config, max_seq).lora, ""));
    format.meta = AdapterMetadataForRun(config, max_seq, {}, std::string(tok.chat->name()));
  } else {
    FEDLORA_ASSIGN_OR_RETURN(const int max_seq, EffectiveMaxSeqLen(path, configured));
    const ModelOptions options = ModelOptionsFromConfig(config, max_seq, ModelRole::kEvaluate);
    FEDLORA_ASSIGN_OR_RETURN(format.peft_config, PeftEncoderAdapterConfig(options.lora, ""));
    format.meta = AdapterMetadataForRun(config, max_seq, {config.task().labels().begin(), config.task().labels().end()},
                                        "");
  }
  format.meta.base_model = path;
  return format;
}

absl::StatusOr<int64_t> ExportRound(Store& store, const BlobStore& blobs, const std::string& run_id, int64_t round,
                                    const RunAdapterFormat& format, const std::string& dir) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<RoundRecord> rounds, store.ListRounds(run_id));
  const RoundRecord* pick = nullptr;
  for (const RoundRecord& r : rounds) {
    if (round == 0 ? r.state == RoundState::kCommitted : r.round == round) pick = &r;
  }
  if (pick == nullptr) {
    if (round == 0) {
      return absl::NotFoundError(absl::StrCat("run '", run_id,
                                              "' has no committed round yet: there is no trained adapter to export"));
    }
    return absl::NotFoundError(absl::StrCat("run '", run_id, "' has no round ", round, " (its rounds: 1 to ",
                                            rounds.empty() ? 0 : rounds.back().round, ")"));
  }
  if (pick->state != RoundState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("round ", pick->round, " of run '", run_id, "' is ",
                                                      std::string(RoundStateName(pick->state)),
                                                      ", not committed: it has no adapter to export"));
  }
  if (pick->result_adapter_hash.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", pick->round, " of run '", run_id,
        "': its adapter is no longer kept (server.retain_rounds keeps the latest rounds' adapters; the latest "
        "committed one always)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, blobs.Get(pick->result_adapter_hash));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> adapter, AdapterFromSafetensors(bytes));
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const UpdateTensor& t : adapter) {
    tensors.push_back({t.name, DType::kF32, t.shape, t.values.data(), t.values.size() * sizeof(float)});
  }
  AdapterMetadata meta = format.meta;
  meta.run_id = run_id;
  meta.round = pick->round;
  FEDLORA_RETURN_IF_ERROR(WriteAdapterDirectory(dir, tensors, format.peft_config, meta));
  return pick->round;
}

}  // namespace fedlora::tools
