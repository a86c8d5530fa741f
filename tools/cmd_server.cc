// fedlora server: runs the aggregation server for the run described by a config file.
//
//   fedlora server --config run.json --cert server.pem --key server.key --client-ca ca.pem [--crl crl.pem]
//   fedlora server --config run.json --insecure          # plaintext, loopback addresses only
//
// The initial global adapter is the model's freshly initialised LoRA matrices and classifier (PEFT's
// initialisation, seeded by the run's seed), so every restart of a new run starts from the same
// bits. When data.eval_path is set, every new global adapter is evaluated on it (loss, accuracy,
// macro-F1 recorded with the round). Runs until SIGINT/SIGTERM, or until --linger-seconds after
// the run finished (clients then still fetch the final adapter); SIGHUP re-reads the TLS CRL.
// Prints the bound address on stdout.
#include <csignal>
#include <ctime>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "model/bert.h"
#include "proto/address.h"
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

struct ServeFlags {
  std::string config_path, listen, store, cert, key, client_ca, crl;
  bool insecure = false;
  int64_t linger_seconds = 30;
};

absl::Status Serve(const ServeFlags& f) {
  // Blocked before any thread starts (OpenBLAS's, gRPC's), so that only sigtimedwait below sees
  // them: SIGINT and SIGTERM stop the server, SIGHUP reloads the CRL.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Flags override the config before it is validated, so that the plaintext rule and the TLS checks
  // apply to them as to the config's own values.
  FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig config, LoadRunConfigFile(f.config_path, [&f](v1::RunConfig* c) {
                             v1::ServerConfig* s = c->mutable_server();
                             if (!f.listen.empty()) s->set_listen_address(f.listen);
                             if (!f.store.empty()) s->set_store_dir(f.store);
                             if (f.insecure) s->set_insecure(true);
                             if (!f.cert.empty()) s->mutable_tls()->set_cert_file(f.cert);
                             if (!f.key.empty()) s->mutable_tls()->set_key_file(f.key);
                             if (!f.client_ca.empty()) s->mutable_tls()->set_client_ca_file(f.client_ca);
                             if (!f.crl.empty()) s->mutable_tls()->set_crl_file(f.crl);
                           }));
  ServerOptions options = ServerOptionsFromRunConfig(config);
  // The plaintext rule before anything is loaded: a server that may not start says so at once.
  if (!options.tls.enabled()) {
    FEDLORA_RETURN_IF_ERROR(CheckPlaintextAllowed(options.listen_address, options.insecure, "server listen address"));
  }

  FEDLORA_RETURN_IF_ERROR(VerifyModelCheckpoint(config.model().path(), config.model()));
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

  FEDLORA_ASSIGN_OR_RETURN(auto server, Server::Create(options, config, std::move(initial), evaluator.get()));
  std::cout << "listening on " << server->address();
  if (server->metrics_port() != 0) std::cout << " (metrics on port " << server->metrics_port() << ")";
  std::cout << std::endl;

  int64_t finished_for_ms = 0;
  constexpr int64_t kPollMs = 200;
  while (true) {
    timespec wait{0, kPollMs * 1'000'000};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGHUP) {
      const absl::Status reloaded = server->ReloadCrl();
      FEDLORA_LOG(INFO) << "SIGHUP: " << (reloaded.ok() ? "CRL reloaded" : std::string(reloaded.message()));
      continue;
    }
    if (sig > 0) break;
    if (server->coordinator().finished()) {
      finished_for_ms += kPollMs;
      if (finished_for_ms >= f.linger_seconds * 1000) break;
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
  ServeFlags f;
  flags.AddString("config", &f.config_path, "run config (JSON, see proto/fedlora/v1/config.proto)", /*required=*/true);
  flags.AddString("listen", &f.listen, "host:port to listen on (overrides server.listen_address)");
  flags.AddString("store", &f.store, "store directory (overrides server.store_dir)");
  flags.AddString("cert", &f.cert, "PEM server certificate chain (overrides server.tls.cert_file)");
  flags.AddString("key", &f.key, "PEM key of --cert (overrides server.tls.key_file)");
  flags.AddString("client-ca", &f.client_ca, "PEM CA that signs client certificates (server.tls.client_ca_file)");
  flags.AddString("crl", &f.crl, "PEM CRL of revoked client certificates, re-read on change and SIGHUP");
  flags.AddBool("insecure", &f.insecure, "serve plaintext without TLS: loopback addresses only (server.insecure)");
  flags.AddInt("linger-seconds", &f.linger_seconds, "keep serving this long after the run finished");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  absl::Status s = Serve(f);
  return s.ok() ? kExitOk : Fail(argv[0], s);
}

}  // namespace fedlora::tools
