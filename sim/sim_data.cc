#include "sim/sim_data.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"
#include "train/train_config.h"

namespace fedlora::sim {
namespace {

// The partition key of every example of a JSONL file, in LoadDataset's order (blank lines skipped).
absl::StatusOr<std::vector<std::string>> ReadKeys(const std::string& path,
                                                  const std::string& field) {
  if (!absl::EndsWith(path, ".jsonl")) {
    return absl::UnimplementedError(
        absl::StrCat("BY_KEY partitioning reads JSONL only; ", path, " is not .jsonl"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<std::string> keys;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json obj, ParseJson(line, where));
    if (!obj.is_object() || !obj.contains(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no partition key field '", field, "'"));
    }
    const nlohmann::json& v = obj[field];
    keys.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  }
  return keys;
}

}  // namespace

int SimData::num_partition_labels() const {
  return std::max(1, static_cast<int>(workload.label_names.size()));
}

absl::StatusOr<SimData> LoadSimData(const v1::RunConfig& config, Device device, int num_models) {
  if (config.data().train_path().empty()) {
    return absl::InvalidArgumentError(
        "data.train_path is empty: the simulation partitions it across its clients");
  }
  if (config.data().eval_path().empty()) {
    return absl::InvalidArgumentError(
        "data.eval_path is empty: the simulation reports held-out metrics per round");
  }
  SimData out;
  // The pooled models both train (the virtual clients) and evaluate (round metrics): a
  // classifier's max_batch covers either batch; a decoder's is the training batch
  // (LmEvalBatchSize).
  FEDLORA_ASSIGN_OR_RETURN(out.workload,
                           LoadWorkload(config, {.model_path = config.model().path(),
                                                 .train_path = config.data().train_path(),
                                                 .eval_path = config.data().eval_path(),
                                                 .device = device,
                                                 .role = ModelRole::kTrainAndEvaluate,
                                                 .num_models = num_models}));
  if (config.simulation().partition() == v1::SimulationConfig::BY_KEY) {
    FEDLORA_ASSIGN_OR_RETURN(out.train_keys, ReadKeys(config.data().train_path(),
                                                      config.simulation().partition_key_field()));
    if (static_cast<int64_t>(out.train_keys.size()) != out.train_size()) {
      return absl::InternalError(absl::StrCat("read ", out.train_keys.size(), " keys for ",
                                              out.train_size(), " examples of ",
                                              config.data().train_path()));
    }
  }
  auto o = std::make_shared<TrainOptions>(
      TrainOptionsFromConfig(config.training(), out.workload.max_seq_len));
  o->eval_batch_size = ConfiguredEvalBatchSize(config.data());
  FEDLORA_RETURN_IF_ERROR_CTX(o->Validate(), "training config");
  out.train_options = std::move(o);
  return out;
}

}  // namespace fedlora::sim
