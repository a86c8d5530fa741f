// fedlora server: runs the aggregation server for the run described by a config file.
//
//   fedlora server --config run.json
//
// The initial global adapter is the model's freshly initialised LoRA matrices and classifier (PEFT's
// initialisation, seeded by the run's seed), so every restart of a new run starts from the same
// bits. When data.eval_path is set, every new global adapter is evaluated on it (loss, accuracy,
// macro-F1 recorded with the round). Runs until SIGINT/SIGTERM, or until --linger-seconds after
// the run finished (clients then still fetch the final adapter). Prints the bound address on stdout.
#include <csignal>
#include <ctime>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "model/bert.h"
#include "proto/config_io.h"
#include "server/server.h"
#include "tools/common.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace fedlora::tools {
namespace {

// Server-side evaluation of each new global adapter on the held-out set.
class HeldOutEvaluator : public Evaluator {
 public:
  HeldOutEvaluator(std::unique_ptr<BertClassifier> model, TokenizedDataset data, int batch_size)
      : model_(std::move(model)), data_(std::move(data)), batch_size_(batch_size) {}

  absl::StatusOr<std::map<std::string, double>> Evaluate(uint64_t round,
                                                         const std::vector<UpdateTensor>& adapter) override {
    for (Param& p : model_->trainable_params()) {
      auto it = std::find_if(adapter.begin(), adapter.end(), [&](const UpdateTensor& t) { return t.name == p.name; });
      if (it == adapter.end() || it->values.size() != p.value.size()) {
        return absl::InvalidArgumentError(absl::StrCat("adapter lacks parameter '", p.name, "'"));
      }
      p.value = it->values;
    }
    FEDLORA_ASSIGN_OR_RETURN(EvalResult r, fedlora::Evaluate(*model_, data_, batch_size_));
    FEDLORA_LOG(INFO) << "round " << round << " eval: " << r.ToJson();
    return std::map<std::string, double>{{"eval_loss", r.loss}, {"eval_accuracy", r.accuracy}, {"macro_f1", r.macro_f1}};
  }

 private:
  std::unique_ptr<BertClassifier> model_;
  TokenizedDataset data_;
  int batch_size_;
};

absl::Status Serve(const std::string& config_path, const std::string& listen, const std::string& store,
                   int64_t linger_seconds) {
  FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig config, LoadRunConfigFile(config_path));
  ServerOptions options = ServerOptionsFromRunConfig(config);
  if (!listen.empty()) options.listen_address = listen;
  if (!store.empty()) options.data_dir = store;

  // Sized for the held-out evaluation batches; max_seq clamped to the checkpoint's position table.
  FEDLORA_ASSIGN_OR_RETURN(const int max_seq,
                           EffectiveMaxSeqLen(config.model().path(), ConfiguredMaxSeqLen(config.model())));
  const ModelOptions model_options = ModelOptionsFromConfig(config, max_seq, ModelRole::kEvaluate);
  FEDLORA_ASSIGN_OR_RETURN(auto model, BertClassifier::Load(config.model().path(), model_options));
  std::vector<UpdateTensor> initial;
  for (const Param& p : model->trainable_params()) initial.push_back({p.name, p.shape, p.value});

  std::unique_ptr<Evaluator> evaluator;
  if (!config.data().eval_path().empty()) {
    FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(config.model().path()));
    FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset eval,
                             LoadTokenizedDataset(config.data().eval_path(), *tokenizer, max_seq, config.task()));
    evaluator = std::make_unique<HeldOutEvaluator>(std::move(model), std::move(eval),
                                                   model_options.max_batch);
  }

  // Block the stop signals in every thread (gRPC's included) so that only sigtimedwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  FEDLORA_ASSIGN_OR_RETURN(auto server, Server::Create(options, config, std::move(initial), evaluator.get()));
  std::cout << "listening on " << server->address();
  if (server->metrics_port() != 0) std::cout << " (metrics on port " << server->metrics_port() << ")";
  std::cout << std::endl;

  int64_t finished_for_ms = 0;
  constexpr int64_t kPollMs = 200;
  while (true) {
    timespec wait{0, kPollMs * 1'000'000};
    if (sigtimedwait(&stop, nullptr, &wait) > 0) break;
    if (server->coordinator().finished()) {
      finished_for_ms += kPollMs;
      if (finished_for_ms >= linger_seconds * 1000) break;
    }
  }
  server->Shutdown();
  std::cout << "run finished: " << server->coordinator().rounds_committed() << " rounds committed, adapter "
            << server->coordinator().global_adapter_sha256() << std::endl;
  return absl::OkStatus();
}

}  // namespace

int RunServer(int argc, char** argv) {
  FlagSet flags(argv[0], "Runs the aggregation server for a run config.");
  std::string config_path, listen, store;
  int64_t linger_seconds = 30;
  flags.AddString("config", &config_path, "run config (JSON, see proto/fedlora/v1/config.proto)", /*required=*/true);
  flags.AddString("listen", &listen, "host:port to listen on (overrides server.listen_address)");
  flags.AddString("store", &store, "store directory (overrides server.store_dir)");
  flags.AddInt("linger-seconds", &linger_seconds, "keep serving this long after the run finished");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  absl::Status s = Serve(config_path, listen, store, linger_seconds);
  return s.ok() ? kExitOk : Fail(argv[0], s);
}

}  // namespace fedlora::tools
