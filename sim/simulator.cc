// The simulation: an in-process server and virtual clients over loopback, the seeded faults, the
// round records and the progress line. Over 600 lines, not split yet: issue 37 replaces its twin
// encoder/decoder model pools with the LoRA workload seam, which is the split.
#include "sim/simulator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/lora_trainer.h"
#include "config/config_io.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/thread_budget.h"
#include "core/thread_pool.h"
#include "crypto/certs.h"
#include "fedlora/client.h"
#include "fedlora/client_trainer.h"
#include "kernels/context.h"
#include "model/adapter_dir.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "server/adapter_io.h"
#include "server/evaluator.h"
#include "server/server.h"
#include "sim/cut_proxy.h"
#include "sim/local_train.h"
#include "train/partition.h"
#include "train/train_config.h"

namespace fedlora::sim {
namespace {

using Clock = std::chrono::steady_clock;

// Salt of the fault stream: faults never share random bits with training or selection.
constexpr uint64_t kFaultSalt = 0x6661'756c'7473'0001ull;  // "faults"

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A fixed set of model instances that virtual clients (and the evaluator) borrow one at a time.
// Each model computes on a thread pool of its own, with a thread per core; while it is lent, its
// pool is a member of `budget`, which shares the cores among the models lent at the moment.
template <class Model>
class ModelPool {
 public:
  explicit ModelPool(ThreadBudget& budget) : budget_(budget) {}
  void Add(std::unique_ptr<Model> m) {
    auto threads = std::make_unique<ThreadPool>(budget_.cores());
    threads->SetWidth(1);
    m->SetThreadPool(threads.get());
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(m.get());
    threads_[m.get()] = std::move(threads);
    all_.push_back(std::move(m));
  }
  Model* Acquire() {
    Model* m = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !free_.empty(); });
      m = free_.back();
      free_.pop_back();
    }
    budget_.Join(threads_.at(m).get());
    return m;
  }
  // Every model at once (waits until none is lent), so that nothing else computes meanwhile.
  std::vector<Model*> AcquireAll() {
    std::vector<Model*> out;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return free_.size() == all_.size(); });
      out.swap(free_);
    }
    for (Model* m : out) budget_.Join(threads_.at(m).get());
    return out;
  }
  void ReleaseAll(std::vector<Model*> models) {
    for (Model* m : models) budget_.Leave(threads_.at(m).get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.insert(free_.end(), models.begin(), models.end());
    }
    cv_.notify_all();
  }
  void Release(Model* m) {
    budget_.Leave(threads_.at(m).get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(m);
    }
    cv_.notify_one();
  }

 private:
  ThreadBudget& budget_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Model*> free_;
  std::vector<std::unique_ptr<Model>> all_;
  // Written by Add only, before any model is lent.
  std::map<const Model*, std::unique_ptr<ThreadPool>> threads_;
};

template <class Model>
class Lease {
 public:
  explicit Lease(ModelPool<Model>& pool) : pool_(pool), model_(pool.Acquire()) {}
  ~Lease() { pool_.Release(model_); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Model& operator*() const { return *model_; }
  Model* operator->() const { return model_; }

 private:
  ModelPool<Model>& pool_;
  Model* model_;
};

struct FaultDecision {
  bool dropout = false;
  bool straggler = false;
  bool crash = false;
};

// Counters of one server round, filled by the clients' Train calls.
struct RoundStats {
  int selected = 0;
  int dropped = 0;
  int stragglers = 0;
  int crashed = 0;
  std::vector<double> train_losses;
};

class Simulation;

struct VirtualClient {
  int index = 0;
  std::string id;
  std::unique_ptr<LoraTrainer> local;  // the built-in trainer on this client's examples
  std::unique_ptr<CutProxy> proxy;     // only for clients that may crash mid-upload
  std::unique_ptr<ClientTrainer> trainer;
  std::thread thread;

  // Training progress of the task of round `task_round` (for the progress line).
  std::atomic<uint64_t> task_round{0};
  std::atomic<int64_t> steps_done{0};
  std::atomic<int64_t> steps_total{0};

  std::mutex mu;
  Client* client = nullptr;  // the live SDK client, while RunUntilDone runs
  bool vanished = false;
  int64_t commits_at_vanish = 0;
};

// The SDK's ClientTrainer for one virtual client: forwards to the simulation.
class SimClientTrainer final : public ClientTrainer {
 public:
  SimClientTrainer(Simulation* sim, VirtualClient* vc) : sim_(sim), vc_(vc) {}
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override;

 private:
  Simulation* sim_;
  VirtualClient* vc_;
};

class Simulation final : public Evaluator {
 public:
  Simulation(v1::RunConfig config, SimOptions options)
      : config_(std::move(config)), options_(std::move(options)) {}
  ~Simulation() override { StopEverything(); }

  absl::StatusOr<SimResult> Run();

  // Called by SimClientTrainer::Train on the client's thread.
  absl::StatusOr<TrainResult> TrainClient(VirtualClient& vc, const TrainTask& task,
                                          const std::vector<NamedTensor>& global);
  // Evaluator: called by the server's driver before it commits each round.
  absl::StatusOr<std::map<std::string, double>> Evaluate(
      uint64_t round, const std::vector<UpdateTensor>& adapter) override;
  // Evaluator: a round data.eval_every_rounds does not evaluate; recorded without eval metrics.
  void Skipped(uint64_t round) override;

 private:
  absl::Status Setup();
  // Loads the adapter into every pooled model and evaluates it on the held-out set.
  template <class Model>
  absl::StatusOr<EvalFigures> EvaluateWith(ModelPool<Model>& pool,
                                           const std::vector<UpdateTensor>& adapter);
  // The pooled models' freshly initialised trainable params, sorted by name.
  template <class Model>
  std::vector<UpdateTensor> InitialAdapter(ModelPool<Model>& pool);
  // The site of virtual client `i`: its examples of the run's data, models from `pool`.
  template <class Model, class Data>
  LoraSite<Model, Data> ClientSite(ModelPool<Model>& pool, std::shared_ptr<const Data> data, int i);
  // Appends the round's record (eval figures NaN when skipped) and rewrites the reports.
  void RecordRound(uint64_t round, const EvalFigures& eval);
  // SimOptions::mtls: the run's PKI in <out_dir>/pki, and the server's TLS options for it.
  absl::StatusOr<ServerTlsOptions> MakePki(int num_clients) const;
  FaultDecision Decide(uint64_t round, int client) const;
  void ClientLoop(VirtualClient& vc);
  // Sleeps up to `seconds`; false when the simulation is stopping.
  bool SleepUnlessStopping(double seconds);
  void StopEverything();
  absl::Status WriteFinalOutputs(SimResult& result);
  // The in-process server of the run, started with `initial` as round 0's adapter.
  absl::Status StartServer(const std::vector<UpdateTensor>& initial, int num_clients);
  // Evaluates the untuned model (round 0), then waits for the run to finish, showing progress.
  absl::Status Watch(uint32_t rounds, const std::vector<UpdateTensor>& initial);
  // The progress line's tail: the round under way (sites training and their steps, or the
  // evaluation), and the latest held-out figure.
  std::string ProgressText();

  const v1::RunConfig config_;
  SimOptions options_;
  SimData data_;
  Partition partition_;
  // The cores, shared by the models lent at the moment (clients training, the evaluator).
  ThreadBudget budget_{0};
  // The models of the run's kind: classifiers (SEQUENCE_CLASSIFICATION) or decoders (CAUSAL_LM).
  ModelPool<BertClassifier> pool_{budget_};
  ModelPool<CausalLm> lm_pool_{budget_};
  int parallelism_ = 1;
  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<VirtualClient>> clients_;
  Clock::time_point start_;

  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  absl::Status client_error_;  // first unexpected client failure
  std::map<uint64_t, RoundStats> stats_;
  std::atomic<int64_t> evaluating_round_{-1};  // the round Evaluate is on, -1 when none
  std::vector<RoundRecord> records_;
  Clock::time_point last_commit_;
  int64_t last_accepted_ = 0, last_up_ = 0, last_down_ = 0, last_fp32_ = 0, last_down_full_ = 0;
};

absl::StatusOr<TrainResult> SimClientTrainer::Train(const TrainTask& task,
                                                    const std::vector<NamedTensor>& global) {
  return sim_->TrainClient(*vc_, task, global);
}

FaultDecision Simulation::Decide(uint64_t round, int client) const {
  const v1::SimulationConfig& s = config_.simulation();
  const uint64_t seed = config_.seed() ^ kFaultSalt;
  const uint64_t stream = MakeStream(static_cast<uint32_t>(round), static_cast<uint32_t>(client));
  FaultDecision d;
  // UniformAt is in [0, 1): probability 0 never fires, probability 1 always does.
  d.dropout = UniformAt(seed, stream, 0) < s.dropout_probability();
  d.straggler = !d.dropout && UniformAt(seed, stream, 1) < s.straggler_probability();
  d.crash = !d.dropout && UniformAt(seed, stream, 2) < s.crash_probability();
  for (const InjectedFault& f : options_.faults) {
    if (f.server_round != round || f.client != client) continue;
    if (f.kind == FaultKind::kDropout) d.dropout = true;
    if (f.kind == FaultKind::kStraggler) d.straggler = true;
    if (f.kind == FaultKind::kCrash) d.crash = true;
  }
  if (d.dropout) d.straggler = d.crash = false;
  return d;
}

bool Simulation::SleepUnlessStopping(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return !stop_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                            [this] { return stopping_; });
}

absl::StatusOr<TrainResult> Simulation::TrainClient(VirtualClient& vc, const TrainTask& task,
                                                    const std::vector<NamedTensor>& global) {
  const FaultDecision fault = Decide(task.round, vc.index);
  {
    std::lock_guard<std::mutex> lock(mu_);
    RoundStats& s = stats_[task.round];
    ++s.selected;
    s.dropped += fault.dropout ? 1 : 0;
    s.stragglers += fault.straggler ? 1 : 0;
    s.crashed += fault.crash ? 1 : 0;
  }
  if (fault.dropout) {
    // Vanish: the SDK client stops at once (no upload, no Leave, no heartbeats); ClientLoop brings
    // it back after the round is committed.
    std::lock_guard<std::mutex> lock(vc.mu);
    vc.vanished = true;
    vc.commits_at_vanish = server_->coordinator().rounds_committed();
    if (vc.client != nullptr) vc.client->Stop();
    return absl::AbortedError(
        absl::StrCat("simulated dropout of ", vc.id, " in round ", task.round));
  }

  TrainTask reporting = task;
  vc.steps_done.store(0);
  vc.steps_total.store(0);
  vc.task_round.store(task.round);
  reporting.report_progress = [&vc, &task](int64_t done, int64_t total) {
    vc.steps_total.store(total);
    vc.steps_done.store(done);
    if (task.report_progress) task.report_progress(done, total);
  };
  FEDLORA_ASSIGN_OR_RETURN(TrainResult result, vc.local->Train(reporting, global));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto mean = result.metrics.find("train_loss_mean");  // LoraTrainer always reports it
    if (mean != result.metrics.end()) stats_[task.round].train_losses.push_back(mean->second);
  }
  if (fault.crash && vc.proxy != nullptr) {
    // Cut after about half of the encoded update (4 bytes per fp32 value) has gone upstream.
    int64_t values = 0;
    for (const NamedTensor& d : result.delta) values += static_cast<int64_t>(d.values.size());
    vc.proxy->ArmCut(std::max<int64_t>(1, 2 * values));
  }
  if (fault.straggler && !SleepUnlessStopping(config_.simulation().straggler_delay_seconds())) {
    return absl::CancelledError("simulation stopping");
  }
  return result;
}

absl::StatusOr<std::map<std::string, double>> Simulation::Evaluate(
    uint64_t round, const std::vector<UpdateTensor>& adapter) {
  evaluating_round_.store(static_cast<int64_t>(round));
  absl::StatusOr<EvalFigures> evaluated =
      data_.causal_lm ? EvaluateWith(lm_pool_, adapter) : EvaluateWith(pool_, adapter);
  evaluating_round_.store(-1);
  FEDLORA_ASSIGN_OR_RETURN(const EvalFigures eval, std::move(evaluated));
  RecordRound(round, eval);
  if (!data_.causal_lm) {
    return std::map<std::string, double>{{"eval_accuracy", eval.accuracy},
                                         {"eval_loss", eval.loss},
                                         {"eval_macro_f1", eval.macro_f1}};
  }
  std::map<std::string, double> metrics{{"eval_loss", eval.loss},
                                        {"eval_perplexity", eval.perplexity}};
  if (data_.exact_match) metrics["eval_accuracy"] = eval.accuracy;
  return metrics;
}

template <class Model>
absl::StatusOr<EvalFigures> Simulation::EvaluateWith(ModelPool<Model>& pool,
                                                     const std::vector<UpdateTensor>& adapter) {
  // All pool models evaluate a slice each, in parallel: evaluation runs while the round is being
  // aggregated, when (without stragglers) no client trains, so the cores would idle otherwise.
  std::vector<Model*> models = pool.AcquireAll();
  absl::StatusOr<EvalFigures> evaluated = [&]() -> absl::StatusOr<EvalFigures> {
    for (Model* m : models) FEDLORA_RETURN_IF_ERROR(LoadAdapter(adapter, *m));
    const int batch =
        data_.causal_lm ? LmEvalBatchSize(config_) : ConfiguredEvalBatchSize(config_.data());
    return EvaluateOnHeldOut(models, data_, batch);
  }();
  pool.ReleaseAll(std::move(models));
  return evaluated;
}

template <class Model>
std::vector<UpdateTensor> Simulation::InitialAdapter(ModelPool<Model>& pool) {
  std::vector<UpdateTensor> initial;
  {
    Lease<Model> model(pool);
    for (const Param& p : model->trainable_params()) initial.push_back({p.name, p.shape, p.value});
  }
  std::sort(initial.begin(), initial.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return initial;
}

template <class Model, class Data>
LoraSite<Model, Data> Simulation::ClientSite(ModelPool<Model>& pool,
                                             std::shared_ptr<const Data> data, int i) {
  LoraSite<Model, Data> site;
  site.acquire_model = [&pool] {
    return typename LoraSite<Model, Data>::Lease(pool.Acquire(),
                                                 [&pool](Model* m) { pool.Release(m); });
  };
  site.data = std::move(data);
  site.indices = partition_.client_indices[static_cast<size_t>(i)];
  site.options = data_.train_options;
  return site;
}

void Simulation::Skipped(uint64_t round) {
  const double nan = std::nan("");
  RecordRound(round, EvalFigures{.loss = nan, .accuracy = nan, .macro_f1 = nan, .perplexity = nan});
}

void Simulation::RecordRound(uint64_t round, const EvalFigures& eval) {
  const ServerMetrics& m = server_->metrics();
  std::lock_guard<std::mutex> lock(mu_);
  RoundRecord r;
  if (!records_.empty() && records_.back().server_round == round && round != 0)
    records_.pop_back();  // a retry
  // The server's accountant has every round before this one committed: the previous record's
  // epsilon (this round's is known once it commits: the next record, or the end of the run, fills
  // it in).
  if (!records_.empty())
    records_.back().dp_epsilon = server_->coordinator().dp_epsilon().value_or(std::nan(""));
  r.round = static_cast<int>(records_.size());
  r.server_round = round;
  r.eval_accuracy = eval.accuracy;
  r.eval_loss = eval.loss;
  r.eval_macro_f1 = eval.macro_f1;
  r.eval_perplexity = eval.perplexity;
  const RoundStats& s = stats_[round];
  r.selected = s.selected;
  r.dropped = s.dropped;
  r.stragglers = s.stragglers;
  r.crashed = s.crashed;
  double sum = 0;
  for (double l : s.train_losses) sum += l;
  r.mean_train_loss =
      s.train_losses.empty() ? std::nan("") : sum / static_cast<double>(s.train_losses.size());
  const int64_t accepted = m.updates_accepted.load(), up = m.upload_bytes.load(),
                down = m.download_bytes.load();
  r.reported = static_cast<int>(accepted - last_accepted_);
  r.bytes_up = up - last_up_;
  r.bytes_down = down - last_down_;
  const int64_t fp32 = m.update_fp32_bytes.load();
  r.bytes_up_fp32 = fp32 - last_fp32_;
  last_fp32_ = fp32;
  const int64_t down_full = m.download_full_bytes.load();
  r.bytes_down_full = down_full - last_down_full_;
  last_down_full_ = down_full;
  last_accepted_ = accepted;
  last_up_ = up;
  last_down_ = down;
  r.round_seconds = SecondsSince(last_commit_);
  r.elapsed_seconds = SecondsSince(start_);
  last_commit_ = Clock::now();
  records_.push_back(r);
  absl::Status written =
      WriteRoundReports(options_.out_dir, records_, config_.run_id(), options_.references);
  if (!written.ok()) {
    FEDLORA_LOG(WARNING) << "simulate: writing the round reports: " << written;
  }
}

void Simulation::ClientLoop(VirtualClient& vc) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    ClientOptions o;
    o.server_address = vc.proxy != nullptr ? vc.proxy->address() : server_->address();
    o.client_id = vc.id;
    if (options_.mtls) {
      const std::string pki = options_.out_dir + "/pki/";
      o.tls.root_ca_file = pki + "ca.pem";
      o.tls.cert_file = pki + vc.id + ".pem";
      o.tls.key_file = pki + vc.id + ".key";
    } else {
      o.insecure = true;  // the simulation's own server, on loopback
    }
    o.has_cuda = options_.device == Device::kCuda;
    o.device_name = std::string(DeviceName(options_.device));
    o.wait_for_task_seconds = 5;  // short long polls: the run's end is noticed within seconds
    o.retry.initial_backoff_ms = 100;
    o.retry.max_backoff_ms = 2000;  // loopback: a failed call is a crash test, retry soon
    o.retry.max_attempts = 30;
    o.download_final_adapter = false;
    o.client_version = "fedlora-sim";
    o.state_dir =
        options_.out_dir + "/clients/" + vc.id;  // survives the client's simulated crashes
    std::error_code ec;
    std::filesystem::create_directories(o.state_dir, ec);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(o, vc.trainer.get());
    if (!client.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (client_error_.ok()) client_error_ = Annotate(client.status(), vc.id);
      stop_cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(vc.mu);
      vc.client = client->get();
    }
    absl::StatusOr<RunSummary> summary = (*client)->RunUntilDone();
    bool vanished = false;
    int64_t commits_at_vanish = 0;
    {
      std::lock_guard<std::mutex> lock(vc.mu);
      vc.client = nullptr;
      vanished = vc.vanished;
      commits_at_vanish = vc.commits_at_vanish;
      vc.vanished = false;
    }
    if (summary.ok()) return;  // the run finished
    if (vanished) {
      // Rejoin (a new session) once the round it vanished from has been committed.
      while (server_->coordinator().rounds_committed() <= commits_at_vanish &&
             !server_->coordinator().finished()) {
        if (!SleepUnlessStopping(0.05)) return;
      }
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_ && client_error_.ok()) client_error_ = Annotate(summary.status(), vc.id);
    stop_cv_.notify_all();
    return;
  }
}

void Simulation::StopEverything() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  for (auto& vc : clients_) {
    std::lock_guard<std::mutex> lock(vc->mu);
    if (vc->client != nullptr) vc->client->Stop();
  }
  for (auto& vc : clients_) {
    if (vc->thread.joinable()) vc->thread.join();
  }
  if (server_ != nullptr) server_->Shutdown();
}

absl::Status Simulation::Setup() {
  const v1::SimulationConfig& sc = config_.simulation();
  const int num_clients =
      static_cast<int>(sc.has_num_clients() ? sc.num_clients() : kDefaultSimulatedClients);
  const int64_t per_round = config_.selection().has_clients_per_round()
                                ? config_.selection().clients_per_round()
                                : kDefaultClientsPerRound;
  if (options_.out_dir.empty()) return absl::InvalidArgumentError("simulate: no output directory");
  if (per_round > num_clients) {
    return absl::InvalidArgumentError(absl::StrCat("selection.clients_per_round (", per_round,
                                                   ") exceeds simulation.num_clients (",
                                                   num_clients, "): no round could ever fill"));
  }
  if (!(sc.crash_probability() >= 0 && sc.crash_probability() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulation.crash_probability ", sc.crash_probability(), " is not in [0, 1]"));
  }
  // Refuse what fedlora does not do yet, before anything is written (configs built in code skip
  // ValidateRunConfig).
  if (std::vector<std::string> refused = UnimplementedSettings(config_); !refused.empty()) {
    return absl::UnimplementedError(absl::StrCat("simulate: ", absl::StrJoin(refused, "; ")));
  }
  for (const InjectedFault& f : options_.faults) {
    if (f.client < 0 || f.client >= num_clients) {
      return absl::InvalidArgumentError(
          absl::StrCat("injected fault names client ", f.client, " of ", num_clients));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.out_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", options_.out_dir, ": ", ec.message()));
  // The store is the simulation's own: a leftover one would make the server resume an old run.
  std::filesystem::remove_all(options_.out_dir + "/store", ec);
  std::filesystem::remove_all(options_.out_dir + "/clients", ec);

  FEDLORA_RETURN_IF_ERROR(CheckModelFitsTask(config_.model().path(), config_.task()));
  FEDLORA_ASSIGN_OR_RETURN(data_, LoadSimData(config_));
  if (sc.partition() == v1::SimulationConfig::BY_KEY) {
    FEDLORA_ASSIGN_OR_RETURN(partition_,
                             PartitionByKey(data_.train_keys, num_clients, config_.seed()));
  } else {
    PartitionOptions po;
    po.num_clients = num_clients;
    po.seed = config_.seed();
    po.dirichlet_alpha = sc.has_dirichlet_alpha() ? sc.dirichlet_alpha() : kDefaultDirichletAlpha;
    po.scheme = sc.partition() == v1::SimulationConfig::DIRICHLET ? PartitionScheme::kDirichlet
                                                                  : PartitionScheme::kIid;
    if (sc.partition() == v1::SimulationConfig::LABEL_SHARDS) {
      po.scheme = PartitionScheme::kLabelShards;
      po.shards_per_client = static_cast<int>(sc.has_shards_per_client() ? sc.shards_per_client()
                                                                         : kDefaultShardsPerClient);
    }
    FEDLORA_ASSIGN_OR_RETURN(
        partition_, PartitionByLabel(data_.train_labels, data_.num_partition_labels(), po));
  }

  const int cores = budget_.cores();
  parallelism_ =
      std::min(sc.parallelism() > 0 ? static_cast<int>(sc.parallelism()) : cores, num_clients);
  // `parallelism` models train at once, each on its own thread pool whose width the budget sets
  // (all the cores for a client that trains alone). OpenBLAS runs single-threaded, so that a GEMM
  // is split over the model's pool instead (kernels/gemm.h); the kernels give the same bits at
  // every width, so a client's result does not depend on how many others train meanwhile.
  kernels::SetNumThreads(1);

  // One read-only copy of the base weights serves the whole pool; each model adds only its adapter,
  // head and activation buffers.
  FEDLORA_RETURN_IF_ERROR(VerifyModelCheckpoint(config_.model().path(), config_.model()));
  if (data_.causal_lm) {
    // Planned for the training batch; evaluation runs in batches of at most that (LmEvalBatchSize).
    DecoderOptions o = DecoderOptionsFromConfig(config_, data_.max_seq_len);
    o.device = options_.device;
    FEDLORA_ASSIGN_OR_RETURN(auto base, DecoderBase::Load(config_.model().path(), o));
    for (int i = 0; i < parallelism_; ++i) {
      FEDLORA_ASSIGN_OR_RETURN(auto model, CausalLm::Create(base, o));
      lm_pool_.Add(std::move(model));
    }
    return absl::OkStatus();
  }
  // The pooled models both train (the virtual clients) and evaluate (round metrics): max_batch
  // covers either batch; max_seq is LoadSimData's, already clamped to the checkpoint.
  ModelOptions mo =
      ModelOptionsFromConfig(config_, data_.max_seq_len, ModelRole::kTrainAndEvaluate);
  mo.device = options_.device;
  FEDLORA_ASSIGN_OR_RETURN(auto base, BertBase::Load(config_.model().path(), mo));
  for (int i = 0; i < parallelism_; ++i) {
    FEDLORA_ASSIGN_OR_RETURN(auto model, BertClassifier::Create(base, mo));
    pool_.Add(std::move(model));
  }
  return absl::OkStatus();
}

absl::Status Simulation::WriteFinalOutputs(SimResult& result) {
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(result.final_adapter));
  FEDLORA_RETURN_IF_ERROR(
      WriteFileAtomically(options_.out_dir + "/final_adapter.safetensors", bytes));
  // The final adapter with what is needed to use it: the run's labels, max_seq_len and prompts.
  AdapterMetadata meta = AdapterMetadataForRun(
      config_, data_.max_seq_len, data_.label_names,
      data_.causal_lm ? std::string(data_.tokenizer->chat->name()) : std::string());
  if (!result.rounds.empty()) meta.round = static_cast<int64_t>(result.rounds.back().server_round);
  if (data_.causal_lm) {
    Lease<CausalLm> model(lm_pool_);
    FEDLORA_RETURN_IF_ERROR(LoadAdapter(result.final_adapter, *model));
    FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(*model, meta, options_.out_dir + "/adapter"));
  } else {
    Lease<BertClassifier> model(pool_);
    FEDLORA_RETURN_IF_ERROR(LoadAdapter(result.final_adapter, *model));
    FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(*model, meta, options_.out_dir + "/adapter"));
  }
  nlohmann::json j;
  j["run_id"] = config_.run_id();
  j["seed"] = config_.seed();
  j["config"] =
      nlohmann::json::parse(RunConfigToJson(config_), nullptr, /*allow_exceptions=*/false);
  j["parallelism"] = parallelism_;
  j["client_sizes"] = result.client_sizes;
  j["client_label_histograms"] = result.client_label_histograms;
  j["label_names"] = data_.label_names;
  j["final_adapter_sha256"] = result.final_adapter_sha256;
  j["seconds"] = result.seconds;
  j["connection_cuts"] = result.connection_cuts;
  nlohmann::json rounds = nlohmann::json::array();
  for (const RoundRecord& r : result.rounds)
    rounds.push_back(nlohmann::json::parse(RoundRecordToJson(r)));
  j["rounds"] = rounds;
  if (!result.rounds.empty()) {
    const RoundRecord &first = result.rounds.front(), &last = result.rounds.back();
    if (!data_.causal_lm || data_.exact_match) {
      j["initial_accuracy"] = first.eval_accuracy;
      j["final_accuracy"] = last.eval_accuracy;
    }
    if (data_.causal_lm) {
      j["initial_perplexity"] = first.eval_perplexity;
      j["final_perplexity"] = last.eval_perplexity;
    }
    if (config_.privacy().dp().enabled()) {
      j["dp_epsilon"] = last.dp_epsilon;
      j["dp_delta"] = config_.privacy().dp().target_delta();
    }
  }
  return WriteFileAtomically(options_.out_dir + "/summary.json", j.dump(2) + "\n");
}

absl::StatusOr<ServerTlsOptions> Simulation::MakePki(int num_clients) const {
  const std::string dir = options_.out_dir + "/pki/";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating ", dir, ": ", ec.message()));
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  crypto::CertificateRequest r;
  r.common_name = "fedlora simulation CA";
  r.not_after_unix_s = now + 7 * 86400;
  FEDLORA_ASSIGN_OR_RETURN(crypto::PemPair ca, crypto::CreateCertificateAuthority(r));
  auto write = [&dir](const std::string& name, const crypto::PemPair& pair) -> absl::Status {
    FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(dir + name + ".pem", pair.cert_pem));
    return WriteFileAtomically(dir + name + ".key", pair.key_pem);
  };
  FEDLORA_RETURN_IF_ERROR(write("ca", ca));
  r.common_name = "localhost";
  r.ip_addresses = {"127.0.0.1"};
  r.dns_names = {"localhost"};
  FEDLORA_ASSIGN_OR_RETURN(crypto::PemPair server, crypto::IssueServerCertificate(ca, r));
  FEDLORA_RETURN_IF_ERROR(write("server", server));
  r.ip_addresses.clear();
  r.dns_names.clear();
  for (int i = 0; i < num_clients; ++i) {
    r.common_name = absl::StrFormat("sim-client-%05d", i);
    FEDLORA_ASSIGN_OR_RETURN(crypto::PemPair client, crypto::IssueClientCertificate(ca, r));
    FEDLORA_RETURN_IF_ERROR(write(r.common_name, client));
  }
  ServerTlsOptions tls;
  tls.cert_file = dir + "server.pem";
  tls.key_file = dir + "server.key";
  tls.client_ca_file = dir + "ca.pem";
  return tls;
}

absl::Status Simulation::StartServer(const std::vector<UpdateTensor>& initial, int num_clients) {
  ServerOptions so = ServerOptionsFromRunConfig(config_);
  so.listen_address = "127.0.0.1:0";
  so.metrics_address.clear();
  so.data_dir = options_.out_dir + "/store";
  so.tls = {};
  so.insecure = !options_.mtls;
  if (options_.mtls) {
    FEDLORA_ASSIGN_OR_RETURN(so.tls, MakePki(num_clients));
  }
  so.selection_window_ms = options_.selection_window_ms;
  // Sample each round from all live clients, not from the first to poll: with partial
  // participation the selection is then a function of the seed, and the run reproducible.
  so.select_when_quota_reached = false;
  so.expected_clients = num_clients;
  so.tick_ms = options_.tick_ms;
  // Durable progress every chunk, so that a cut upload resumes where it stopped.
  so.upload_sync_bytes = so.max_upload_chunk_bytes;
  so.aggregation_device = options_.device;  // the sums, like the models, on the simulation's device
  FEDLORA_ASSIGN_OR_RETURN(server_, Server::Create(so, config_, initial, this));

  return absl::OkStatus();
}

absl::StatusOr<SimResult> Simulation::Run() {
  start_ = Clock::now();
  FEDLORA_RETURN_IF_ERROR(Setup());
  const int num_clients = partition_.num_clients();
  const uint32_t rounds = ConfiguredRounds(config_);

  // The initial adapter: the model's freshly initialised trainable params (seeded by config.seed).
  const std::vector<UpdateTensor> initial =
      data_.causal_lm ? InitialAdapter(lm_pool_) : InitialAdapter(pool_);
  const std::string task = data_.causal_lm
                               ? std::string("conversations")
                               : absl::StrCat("examples, ", data_.label_names.size(), " labels");
  std::fprintf(stderr,
               "simulate: %d clients (%lld train / %lld held-out %s), %u rounds, parallelism %d\n",
               num_clients, static_cast<long long>(data_.train_size()),
               static_cast<long long>(data_.eval_size()), task.c_str(), rounds, parallelism_);

  FEDLORA_RETURN_IF_ERROR(StartServer(initial, num_clients));
  const bool may_crash =
      config_.simulation().crash_probability() > 0 ||
      std::any_of(options_.faults.begin(), options_.faults.end(),
                  [](const InjectedFault& f) { return f.kind == FaultKind::kCrash; });
  for (int i = 0; i < num_clients; ++i) {
    auto vc = std::make_unique<VirtualClient>();
    vc->index = i;
    vc->id = absl::StrFormat("sim-client-%05d", i);
    vc->local = data_.causal_lm
                    ? std::make_unique<LoraTrainer>(ClientSite(lm_pool_, data_.lm_train, i))
                    : std::make_unique<LoraTrainer>(ClientSite(pool_, data_.train, i));
    vc->trainer = std::make_unique<SimClientTrainer>(this, vc.get());
    if (may_crash) {
      FEDLORA_ASSIGN_OR_RETURN(vc->proxy, CutProxy::Start(server_->address()));
    }
    clients_.push_back(std::move(vc));
  }

  const absl::Status outcome = Watch(rounds, initial);
  if (outcome.ok()) {
    // Every client sees RunFinished at its next poll (within wait_for_task_seconds + retry_after).
    for (auto& vc : clients_) vc->thread.join();
  }
  SimResult result;
  result.final_adapter = server_->coordinator().global_adapter();
  result.final_adapter_sha256 = server_->coordinator().global_adapter_sha256();
  for (const auto& vc : clients_)
    result.connection_cuts += vc->proxy != nullptr ? vc->proxy->cuts() : 0;
  StopEverything();
  FEDLORA_RETURN_IF_ERROR(outcome);

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!records_.empty())
      records_.back().dp_epsilon = server_->coordinator().dp_epsilon().value_or(std::nan(""));
    result.rounds = records_;
  }
  result.client_sizes = partition_.Sizes();
  result.client_label_histograms =
      LabelHistograms(partition_, data_.train_labels, data_.num_partition_labels());
  result.seconds = SecondsSince(start_);
  FEDLORA_RETURN_IF_ERROR(
      WriteRoundReports(options_.out_dir, result.rounds, config_.run_id(), options_.references));
  FEDLORA_RETURN_IF_ERROR(WriteFinalOutputs(result));
  return result;
}

absl::Status Simulation::Watch(uint32_t rounds, const std::vector<UpdateTensor>& initial) {
  ProgressOptions po;
  po.unit = "round";
  // The progress line is console output, not a log line: away from a terminal too it goes to
  // stderr (plain lines, newline-ended), even when the log goes to a file.
  po.is_tty = ::isatty(STDERR_FILENO) == 1 ? 1 : 0;
  po.emit = [tty = po.is_tty == 1](std::string_view text) {
    const std::string s = tty ? std::string(text) : absl::StrCat(ToAbsl(text), "\n");
    ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
    (void)unused;
  };
  std::optional<Progress> progress;
  if (options_.progress) progress.emplace("simulate", rounds, po);
  // Round 0: the untuned model (before any training), shown as it runs; no client has a task yet.
  {
    last_commit_ = Clock::now();
    std::atomic<bool> done{false};
    absl::Status evaluated;
    std::thread round0([&] {
      evaluated = Evaluate(0, initial).status();
      done.store(true);
    });
    while (!done.load()) {
      if (progress) progress->Update(0, ProgressText());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    round0.join();
    FEDLORA_RETURN_IF_ERROR(evaluated);
  }
  for (auto& vc : clients_) {
    VirtualClient* p = vc.get();
    p->thread = std::thread([this, p] { ClientLoop(*p); });
  }
  absl::Status outcome;
  while (true) {
    const bool finished = server_->WaitUntilFinished(200);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!client_error_.ok()) outcome = client_error_;
    }
    if (progress) progress->Update(server_->coordinator().rounds_committed(), ProgressText());
    if (finished || !outcome.ok()) break;
    if (options_.max_seconds > 0 && SecondsSince(start_) > options_.max_seconds) {
      outcome = absl::DeadlineExceededError(absl::StrCat(
          "simulation did not finish within ", options_.max_seconds, " s (",
          server_->coordinator().rounds_committed(), " of ", rounds, " rounds committed)"));
      break;
    }
  }
  if (progress) progress->Finish();
  return outcome;
}

std::string Simulation::ProgressText() {
  std::string text;
  const int64_t evaluating = evaluating_round_.load();
  if (evaluating == 0) {
    text = "round 0: evaluating the untuned model";
  } else if (evaluating > 0) {
    text = absl::StrCat("round ", evaluating, ": evaluating");
  } else {
    const uint64_t round = static_cast<uint64_t>(server_->coordinator().rounds_committed()) + 1;
    int training = 0;
    int64_t done = 0, total = 0;
    for (const auto& vc : clients_) {
      if (vc->task_round.load() != round || vc->steps_total.load() <= 0) continue;
      ++training;
      done += vc->steps_done.load();
      total += vc->steps_total.load();
    }
    if (training > 0) {
      text = absl::StrFormat("round %d: %d site%s at step %d/%d", round, training,
                             training == 1 ? "" : "s", done, total);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto r = records_.rbegin(); r != records_.rend(); ++r) {  // the latest evaluated round
    std::string figure;
    if (std::isfinite(r->eval_accuracy)) {
      figure = absl::StrFormat("accuracy=%.4f", r->eval_accuracy);
    } else if (std::isfinite(r->eval_perplexity)) {
      figure = absl::StrFormat("perplexity=%.3f", r->eval_perplexity);
    } else {
      continue;
    }
    return text.empty() ? figure : absl::StrCat(text, ", ", figure);
  }
  return text;
}

}  // namespace

absl::StatusOr<SimResult> RunSimulation(const v1::RunConfig& config, const SimOptions& options) {
  FEDLORA_RETURN_IF_ERROR(ValidateRunConfig(config));
  Simulation sim(config, options);
  return sim.Run();
}

}  // namespace fedlora::sim
