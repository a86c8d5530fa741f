// fedlora client: joins a federation with the built-in LoRA trainer and the site's own data.
//
//   fedlora client --server 127.0.0.1:50051 --model models/all-MiniLM-L6-v2 --data site.jsonl --id site-7
//   fedlora client --server fl.example.org:50051 --model ... --data ... --ca ca.pem --cert site.pem --key site.key
//
// Each round: download the global adapter, fine-tune it locally on --data with the run's training
// settings (train/trainer.h: AdamW/LAMB/SGD, schedule, clipping; seeded by the task), upload the
// delta. The model architecture, LoRA shape and label set come from the server's run config, so the
// local model always matches the global adapter. Prints a JSON summary on stdout when the run ends.
#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "fedlora/client.h"
#include "fedlora/v1/config.pb.h"
#include "kernels/context.h"
#include "model/bert.h"
#include "tools/common.h"
#include "train/trainer.h"

namespace fedlora::tools {
namespace {

const char* OptimizerName(v1::TrainingConfig::Optimizer o) {
  switch (o) {
    case v1::TrainingConfig::LAMB:
      return "lamb";
    case v1::TrainingConfig::SGD:
      return "sgd";
    default:
      return "adamw";
  }
}

const char* ScheduleName(v1::TrainingConfig::Schedule s) {
  switch (s) {
    case v1::TrainingConfig::LINEAR:
      return "linear";
    case v1::TrainingConfig::COSINE:
      return "cosine";
    default:
      return "constant";
  }
}

// The built-in ClientTrainer: a BertClassifier with the run's LoRA shape, trained by train/'s
// Trainer on the site's data. The model is loaded at the first task, when the run config is known.
class BuiltInLoraTrainer : public ClientTrainer {
 public:
  BuiltInLoraTrainer(std::string model_dir, std::string data_path)
      : model_dir_(std::move(model_dir)), data_path_(std::move(data_path)) {}

  absl::StatusOr<TrainResult> Train(const TrainTask& task, const std::vector<NamedTensor>& global) override {
    v1::RunConfig config;
    google::protobuf::util::JsonParseOptions parse;
    parse.ignore_unknown_fields = true;
    if (!google::protobuf::util::JsonStringToMessage(task.run_config_json, &config, parse).ok()) {
      return absl::InvalidArgumentError("the server's run config is not valid JSON for fedlora.v1.RunConfig");
    }
    if (model_ == nullptr) FEDLORA_RETURN_IF_ERROR(Load(config));
    std::vector<Param>& params = model_->trainable_params();
    if (params.size() != global.size()) {
      return absl::FailedPreconditionError(absl::StrCat("the global adapter has ", global.size(),
                                                        " tensors; the local model has ", params.size()));
    }
    for (Param& p : params) {
      auto it = std::find_if(global.begin(), global.end(), [&](const NamedTensor& t) { return t.name == p.name; });
      if (it == global.end() || it->shape != p.shape) {
        return absl::FailedPreconditionError(absl::StrCat("global adapter lacks '", p.name, "' with the local shape"));
      }
      p.value = it->values;
    }
    const v1::TrainingConfig& tc = config.training();
    TrainOptions o;
    o.epochs = task.local_epochs > 0 ? static_cast<int>(task.local_epochs) : 1;
    o.max_steps = task.local_steps;
    o.batch_size = task.batch_size > 0 ? static_cast<int>(task.batch_size) : 16;
    o.max_seq_len = max_seq_;
    o.lr = static_cast<float>(task.learning_rate);
    o.optimizer = OptimizerName(tc.optimizer());
    o.weight_decay = static_cast<float>(tc.weight_decay());
    o.warmup_steps = tc.warmup_steps();
    o.schedule = ScheduleName(tc.schedule());
    o.grad_clip = static_cast<float>(tc.grad_clip_norm());
    o.grad_accumulation = tc.grad_accumulation() > 0 ? static_cast<int>(tc.grad_accumulation()) : 1;
    o.seed = task.seed;
    o.progress = false;
    fedlora::Trainer trainer(*model_, o);
    FEDLORA_RETURN_IF_ERROR(trainer.Train(data_, nullptr));

    TrainResult result;
    for (const Param& p : params) {
      auto it = std::find_if(global.begin(), global.end(), [&](const NamedTensor& t) { return t.name == p.name; });
      NamedTensor d{p.name, p.shape, std::vector<float>(p.value.size())};
      for (size_t i = 0; i < d.values.size(); ++i) d.values[i] = p.value[i] - it->values[i];
      result.delta.push_back(std::move(d));
    }
    result.num_examples = data_.size();
    const auto& history = trainer.history();
    if (!history.empty()) {
      result.train_loss_first = history.front().train_loss;
      result.train_loss_last = history.back().train_loss;
      result.steps = history.back().steps;
    }
    result.examples_processed = data_.size() * static_cast<int64_t>(history.size());
    FEDLORA_LOG(INFO) << "round " << task.round << ": trained " << result.steps << " steps, loss "
                      << result.train_loss_first << " -> " << result.train_loss_last;
    return result;
  }

 private:
  absl::Status Load(const v1::RunConfig& c) {
    ModelOptions o;
    o.num_labels = c.task().labels_size() >= 2 ? c.task().labels_size() : 2;
    o.lora.rank = static_cast<int>(c.lora().rank());
    o.lora.alpha = static_cast<float>(c.lora().alpha());
    o.lora.dropout = static_cast<float>(c.lora().dropout());
    o.lora.target_modules.assign(c.lora().target_modules().begin(), c.lora().target_modules().end());
    o.seed = c.seed();
    o.max_seq = static_cast<int>(c.model().max_seq_len() > 0 ? c.model().max_seq_len() : 128);
    o.max_batch = static_cast<int>(c.training().batch_size() > 0 ? c.training().batch_size() : 16);
    o.base_model_name = c.model().id();
    FEDLORA_ASSIGN_OR_RETURN(model_, BertClassifier::Load(model_dir_, o));
    FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(model_dir_));
    FEDLORA_ASSIGN_OR_RETURN(max_seq_, EffectiveMaxSeqLen(model_dir_, o.max_seq));
    std::vector<std::string> labels(c.task().labels().begin(), c.task().labels().end());
    FEDLORA_ASSIGN_OR_RETURN(data_, LoadTokenizedDataset(data_path_, *tokenizer, max_seq_, labels));
    FEDLORA_LOG(INFO) << "local model " << model_dir_ << " with " << data_.size() << " examples from " << data_path_;
    return absl::OkStatus();
  }

  std::string model_dir_;
  std::string data_path_;
  std::unique_ptr<BertClassifier> model_;
  TokenizedDataset data_;
  int max_seq_ = 128;
};

}  // namespace

int RunClient(int argc, char** argv) {
  FlagSet flags(argv[0], "Joins a federation and trains LoRA adapters on local data.");
  std::string server, model_dir, data_path, id, ca, cert, key;
  int threads = 0;
  int64_t max_tasks = 0;
  flags.AddString("server", &server, "host:port of the aggregation server", /*required=*/true);
  flags.AddString("model", &model_dir, "local copy of the run's model (config.json, *.safetensors)", true);
  flags.AddString("data", &data_path, "the site's labelled training data (JSONL, CSV or TSV)", true);
  flags.AddString("id", &id, "client identity without TLS (loopback servers only)");
  flags.AddString("ca", &ca, "PEM CA bundle the server certificate chains to (TLS)");
  flags.AddString("cert", &cert, "PEM client certificate: the identity with mTLS");
  flags.AddString("key", &key, "PEM key of --cert");
  flags.AddInt("threads", &threads, "CPU threads for training (0: all cores)");
  flags.AddInt("max-tasks", &max_tasks, "stop after this many accepted updates (0: until the run ends)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (!IsDirectory(model_dir)) return Fail(argv[0], absl::NotFoundError("model directory " + model_dir + " not found"));
  if (!IsRegularFile(data_path)) return Fail(argv[0], absl::NotFoundError("data file " + data_path + " not found"));
  kernels::SetNumThreads(threads);

  ClientOptions options;
  options.server_address = server;
  options.client_id = id;
  options.tls.root_ca_file = ca;
  options.tls.cert_file = cert;
  options.tls.key_file = key;
  options.max_tasks = max_tasks;
  BuiltInLoraTrainer trainer(model_dir, data_path);
  auto client = Client::Create(options, &trainer);
  if (!client.ok()) return Fail(argv[0], client.status());
  absl::StatusOr<RunSummary> summary = (*client)->RunUntilDone();
  if (!summary.ok()) return Fail(argv[0], summary.status());
  std::cout << "{\"tasks_completed\":" << summary->tasks_completed << ",\"tasks_failed\":" << summary->tasks_failed
            << ",\"final_round\":" << summary->final_round << ",\"final_adapter_sha256\":\""
            << summary->final_adapter_sha256 << "\"}" << std::endl;
  return kExitOk;
}

}  // namespace fedlora::tools
