// fedlora client: joins a federation with the built-in LoRA trainer and the site's own data.
//
//   fedlora client --server 127.0.0.1:50051 --insecure --model models/all-MiniLM-L6-v2 --data site.jsonl --id site-7
//   fedlora client --server fl.example.org:50051 --model ... --data ... --ca ca.pem --cert site.pem --key site.key
//
// Each round: download the global adapter, fine-tune it locally on --data with the run's training
// settings (the SDK's built-in trainer, client/lora/lora_trainer.h: AdamW/LAMB/SGD, schedule,
// clipping; seeded by the task), upload the delta. The model architecture, LoRA shape and label set
// come from the server's run config, so the local model always matches the global adapter. Prints a
// JSON summary on stdout when the run ends.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "client/lora/lora_trainer.h"
#include "core/logging.h"
#include "core/status.h"
#include "fedlora/client.h"
#include "fedlora/v1/config.pb.h"
#include "kernels/base/context.h"
#include "kernels/base/device.h"
#include "kernels/threads.h"
#include "tools/common.h"
#include "train/train_config.h"
#include "workload/factory.h"

namespace fedlora::tools {
namespace {

// The site of the built-in LoRA trainer (client/lora/lora_trainer.h), built at the first task, when
// the run config is known: the run's model (workload/factory.h: a BertClassifier with the run's
// LoRA shape and labels, or a CausalLm) and --data tokenized for it. The model computes on
// `resolved` unless the run's precision needs the CPU (config/device_plan.h).
absl::StatusOr<LoraTrainer::Site> LoadSite(const std::string& model_dir,
                                           const std::string& data_path, const v1::RunConfig& c,
                                           const std::string& device_flag, Device resolved) {
  FEDLORA_ASSIGN_OR_RETURN(const DevicePlan devices,
                           PlanDevices(device_flag, resolved, RunRole::kClient, c));
  const Device device = devices.models;
  FEDLORA_ASSIGN_OR_RETURN(Workload w, LoadWorkload(c, {.model_path = model_dir,
                                                        .train_path = data_path,
                                                        .eval_path = "",
                                                        .device = device,
                                                        .role = ModelRole::kTrain}));
  FEDLORA_LOG(INFO) << "local model " << model_dir << " with " << w.train.size()
                    << (w.kind == v1::TaskConfig::CAUSAL_LM ? " conversations" : " examples")
                    << " from " << data_path;
  LoraTrainer::Site site;
  // The one model is lent to every task; the lease's deleter keeps it alive, not frees it.
  std::shared_ptr<LoraModel> model = std::move(w.models.front());
  site.acquire_model = [model] {
    return LoraTrainer::ModelLease(model.get(), [model](LoraModel*) {});
  };
  site.data = std::move(w.train);
  site.options =
      std::make_shared<const TrainOptions>(TrainOptionsFromConfig(c.training(), w.max_seq_len));
  site.log_tasks = true;
  return site;
}

// The command's flags.
struct ClientFlags {
  std::string server, model_dir, data_path, id, ca, cert, key;
  int threads = 0;
  int64_t max_tasks = 0;
  bool insecure = false;
  std::string server_pin;
  std::string device_flag = "cpu";
  std::string state_dir;
};

// --state-dir created when given; --model and --data must exist.
absl::Status PrepareLocalFiles(const ClientFlags& f) {
  if (!f.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.state_dir, ec);
    if (ec)
      return absl::PermissionDeniedError("cannot create --state-dir " + f.state_dir + ": " +
                                         ec.message());
  }
  if (!IsDirectory(f.model_dir) && !IsRegularFile(f.model_dir)) {
    return absl::NotFoundError("model " + f.model_dir + " not found");
  }
  if (!IsRegularFile(f.data_path))
    return absl::NotFoundError("data file " + f.data_path + " not found");
  return absl::OkStatus();
}

// The client's options from the flags, on `device`.
ClientOptions ClientOptionsFor(const ClientFlags& f, Device device) {
  ClientOptions options;
  options.has_cuda = device == Device::kCuda;
  options.device_name = options.has_cuda ? kernels::CudaDeviceDescription() : "cpu";
  options.encode_on_cuda = options.has_cuda;  // the update encodes where the site trains
  options.server_address = f.server;
  options.client_id = f.id;
  options.insecure = f.insecure;
  options.tls.root_ca_file = f.ca;
  options.tls.cert_file = f.cert;
  options.tls.key_file = f.key;
  options.tls.server_key_pin = f.server_pin;
  options.max_tasks = f.max_tasks;
  options.state_dir = f.state_dir;
  return options;
}

}  // namespace

int RunClient(int argc, char** argv) {
  FlagSet flags(argv[0], "Joins a federation and trains LoRA adapters on local data.");
  ClientFlags f;
  flags.AddString("server", &f.server, "host:port of the aggregation server", /*required=*/true);
  flags.AddString("model", &f.model_dir,
                  "local copy of the run's model (a directory with config.json and *.safetensors, "
                  "or a decoder's .gguf)",
                  true);
  flags.AddString(
      "data", &f.data_path,
      "the site's training data: labelled JSONL, CSV or TSV; a decoder run's JSONL conversations",
      true);
  flags.AddString("id", &f.id,
                  "client identity without TLS (with --insecure, loopback servers only)");
  flags.AddBool("insecure", &f.insecure, "plaintext without TLS, to a loopback server only");
  flags.AddString("ca", &f.ca, "PEM CA bundle the server certificate chains to (TLS)");
  flags.AddString("cert", &f.cert, "PEM client certificate: the identity with mTLS");
  flags.AddString("key", &f.key, "PEM key of --cert");
  flags.AddString("server-pin", &f.server_pin,
                  "SHA-256 of the server certificate's public key (`fedlora certs pin`): only that "
                  "key may sign "
                  "the aggregation keys this client seals its updates to");
  flags.AddInt("threads", &f.threads, "CPU threads for training (0: all cores)");
  flags.AddString(
      "device", &f.device_flag,
      "cpu, cuda or auto (the GPU when one is usable); a run with INT8 precision trains on the "
      "CPU (auto) or is refused (cuda)");
  flags.AddInt("max-tasks", &f.max_tasks,
               "stop after this many accepted updates (0: until the run ends)");
  flags.AddString("state-dir", &f.state_dir,
                  "directory for the site's state across restarts: the error-feedback residual of "
                  "a lossy codec "
                  "and the last global adapter, from which a downlink codec sends deltas (empty: "
                  "kept in memory)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (absl::Status s = PrepareLocalFiles(f); !s.ok()) return Fail(argv[0], s);
  kernels::SetNumThreads(f.threads);
  const absl::StatusOr<Device> device = ResolveDevice(f.device_flag);
  if (!device.ok()) return Fail(argv[0], device.status());

  const ClientOptions options = ClientOptionsFor(f, *device);
  LoraTrainer trainer([&f, &device](const v1::RunConfig& config) {
    return LoadSite(f.model_dir, f.data_path, config, f.device_flag, *device);
  });
  auto client = Client::Create(options, &trainer);
  if (!client.ok()) return Fail(argv[0], client.status());
  absl::StatusOr<RunSummary> summary = (*client)->RunUntilDone();
  if (!summary.ok()) return Fail(argv[0], summary.status());
  std::cout << "{\"tasks_completed\":" << summary->tasks_completed
            << ",\"tasks_failed\":" << summary->tasks_failed
            << ",\"final_round\":" << summary->final_round << ",\"final_adapter_sha256\":\""
            << summary->final_adapter_sha256 << "\"}" << std::endl;
  return kExitOk;
}

}  // namespace fedlora::tools
