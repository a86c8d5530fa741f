// The simulation: an in-process server and virtual clients over loopback, the seeded faults
// (sim/sim_setup.h) and attacks (sim/attack_board.h), the round records and the progress line.
// The models, data and evaluator are the run's workload (sim/sim_data.h, workload/factory.h) in
// one pool. About 640 lines: one class, Simulation, whose steps share its state; the progress line
// and the round records are what would move out next, with the class into a header of its own.
#include "sim/simulator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/lora/lora_trainer.h"
#include "config/config_io.h"
#include "config/defaults.h"
#include "config/resolved.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/thread_budget.h"
#include "fedlora/client.h"
#include "fedlora/client_trainer.h"
#include "kernels/base/context.h"
#include "kernels/threads.h"
#include "model/adapter_dir.h"
#include "server/adapter_io.h"
#include "server/evaluator.h"
#include "server/server.h"
#include "sim/attack_board.h"
#include "sim/cut_proxy.h"
#include "sim/model_pool.h"
#include "sim/sim_data.h"
#include "sim/sim_setup.h"
#include "train/partition.h"
#include "train/train_config.h"

namespace fedlora::sim {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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
  Simulation(ResolvedRunConfig run, SimOptions options)
      : run_(std::move(run)), options_(std::move(options)) {}
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
  absl::StatusOr<EvalFigures> EvaluateWithPool(const std::vector<UpdateTensor>& adapter);
  // The pooled models' freshly initialised trainable params, sorted by name.
  std::vector<UpdateTensor> InitialAdapter();
  // The site of virtual client `i`: its examples of the run's data, models from the pool.
  LoraSite ClientSite(int i);
  // Appends the round's record (eval figures NaN when skipped) and rewrites the reports.
  void RecordRound(uint64_t round, const EvalFigures& eval);
  void ClientLoop(VirtualClient& vc);
  // Sleeps up to `seconds`; false when the simulation is stopping.
  bool SleepUnlessStopping(double seconds);
  void StopEverything();
  absl::Status WriteFinalOutputs(SimResult& result);
  // The in-process server of the run, started with `initial` as round 0's adapter.
  absl::Status StartServer(const std::vector<UpdateTensor>& initial, int num_clients);
  // The attack board's view of server round `round` (sim/attack_board.h).
  std::optional<AttackBoard::Cohort> CohortOf(uint64_t round);
  // Evaluates the untuned model (round 0), then waits for the run to finish, showing progress.
  absl::Status Watch(uint32_t rounds, const std::vector<UpdateTensor>& initial);
  // The progress line's tail: the round under way (sites training and their steps, or the
  // evaluation), and the latest held-out figure.
  std::string ProgressText();

  const ResolvedRunConfig run_;                // handed to the server as it is
  const v1::RunConfig& config_ = run_.config;  // run_'s config, not a copy
  SimOptions options_;
  SimData data_;
  Partition partition_;
  // The cores, shared by the models lent at the moment (clients training, the evaluator).
  ThreadBudget budget_{0};
  // The run's models (classifiers or decoders), one base shared by all.
  ModelPool pool_{budget_};
  int parallelism_ = 1;
  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<VirtualClient>> clients_;
  std::map<std::string, int> client_index_;  // id -> index
  AttackBoard attacks_{config_, [this](uint64_t round) { return CohortOf(round); }};
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

bool Simulation::SleepUnlessStopping(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return !stop_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                            [this] { return stopping_; });
}

absl::StatusOr<TrainResult> Simulation::TrainClient(VirtualClient& vc, const TrainTask& task,
                                                    const std::vector<NamedTensor>& global) {
  const FaultDecision fault = DecideFaults(config_, options_.faults, task.round, vc.index);
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
  // A malicious client's forgery; under LIE and min-max a round's clients publish their deltas.
  FEDLORA_RETURN_IF_ERROR(attacks_.Apply(task.round, vc.index, result.delta));
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
  absl::StatusOr<EvalFigures> evaluated = EvaluateWithPool(adapter);
  evaluating_round_.store(-1);
  FEDLORA_ASSIGN_OR_RETURN(const EvalFigures eval, std::move(evaluated));
  RecordRound(round, eval);
  return data_.workload.evaluator->Metrics(eval);
}

absl::StatusOr<EvalFigures> Simulation::EvaluateWithPool(const std::vector<UpdateTensor>& adapter) {
  // All pool models evaluate a slice each, in parallel: evaluation runs while the round is being
  // aggregated, when (without stragglers) no client trains, so the cores would idle otherwise.
  std::vector<LoraModel*> models = pool_.AcquireAll();
  absl::StatusOr<EvalFigures> evaluated = [&]() -> absl::StatusOr<EvalFigures> {
    for (LoraModel* m : models) FEDLORA_RETURN_IF_ERROR(LoadAdapter(adapter, *m));
    return data_.workload.evaluator->Evaluate(models);
  }();
  pool_.ReleaseAll(std::move(models));
  return evaluated;
}

std::vector<UpdateTensor> Simulation::InitialAdapter() {
  std::vector<UpdateTensor> initial = AdapterOf(*Lease(pool_));
  std::sort(initial.begin(), initial.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return initial;
}

LoraSite Simulation::ClientSite(int i) {
  LoraSite site;
  site.acquire_model = [this] {
    return LoraSite::Lease(pool_.Acquire(), [this](LoraModel* m) { pool_.Release(m); });
  };
  site.data = data_.workload.train;
  site.indices = partition_.client_indices[static_cast<size_t>(i)];
  site.options = data_.train_options;
  return site;
}

void Simulation::Skipped(uint64_t round) {
  const double nan = std::nan("");
  RecordRound(
      round,
      EvalFigures{.loss = nan, .accuracy = nan, .macro_f1 = nan, .perplexity = nan, .json = ""});
}

void Simulation::RecordRound(uint64_t round, const EvalFigures& eval) {
  const ServerMetrics& m = server_->metrics();
  std::lock_guard<std::mutex> lock(mu_);
  RoundRecord r;
  if (!records_.empty() && records_.back().server_round == round && round != 0)
    records_.pop_back();  // a retry
  // The server's accountant has every round before this one committed: the previous record's epsilon
  // (this round's is known once it commits: the next record, or the end of the run, fills it in).
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
    const ClientOptions o = VirtualClientOptions(
        options_, vc.proxy != nullptr ? vc.proxy->address() : server_->address(), vc.id);
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
  attacks_.Stop();
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
  FEDLORA_RETURN_IF_ERROR(CheckSimulation(config_, options_, num_clients));
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
  FEDLORA_ASSIGN_OR_RETURN(data_, LoadSimData(config_, options_.device, parallelism_));
  for (auto& model : data_.workload.models) pool_.Add(std::move(model));
  data_.workload.models.clear();
  FEDLORA_ASSIGN_OR_RETURN(partition_, PartitionClients(config_, data_, num_clients));
  return absl::OkStatus();
}

absl::Status Simulation::WriteFinalOutputs(SimResult& result) {
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, AdapterToSafetensors(result.final_adapter));
  FEDLORA_RETURN_IF_ERROR(
      WriteFileAtomically(options_.out_dir + "/final_adapter.safetensors", bytes));
  // The final adapter with what is needed to use it: the run's labels, max_seq_len and prompts.
  const Workload& w = data_.workload;
  AdapterMetadata meta =
      AdapterMetadataForRun(config_, w.max_seq_len, w.label_names, w.chat_template_name());
  if (!result.rounds.empty()) meta.round = static_cast<int64_t>(result.rounds.back().server_round);
  {
    Lease model(pool_);
    FEDLORA_RETURN_IF_ERROR(LoadAdapter(result.final_adapter, *model));
    FEDLORA_RETURN_IF_ERROR(model->SaveAdapter(meta, options_.out_dir + "/adapter"));
  }
  return WriteSummary(config_, result, parallelism_, w.label_names, options_.out_dir);
}

absl::Status Simulation::StartServer(const std::vector<UpdateTensor>& initial, int num_clients) {
  ServerOptions so = ServerOptionsFromRunConfig(run_);
  so.listen_address = "127.0.0.1:0";
  so.metrics_address.clear();
  so.data_dir = options_.out_dir + "/store";
  so.tls = {};
  so.insecure = !options_.mtls;
  if (options_.mtls) {
    FEDLORA_ASSIGN_OR_RETURN(so.tls, MakeSimulationPki(options_.out_dir, num_clients));
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
  FEDLORA_ASSIGN_OR_RETURN(server_, Server::Create(so, run_, initial, this));

  return absl::OkStatus();
}

std::optional<AttackBoard::Cohort> Simulation::CohortOf(uint64_t round) {
  const Coordinator& coordinator = server_->coordinator();
  std::optional<Coordinator::Cohort> selected =
      coordinator.SelectedCohort(static_cast<int64_t>(round));
  if (!selected.has_value()) return std::nullopt;
  AttackBoard::Cohort cohort;
  cohort.ms_left = selected->deadline_ms - coordinator.NowMs();
  for (const std::string& id : selected->clients) {
    auto it = client_index_.find(id);
    // Dropouts vanish after selection and never train.
    if (it != client_index_.end() &&
        !DecideFaults(config_, options_.faults, round, it->second).dropout)
      cohort.trainers.insert(it->second);
  }
  return cohort;
}

absl::StatusOr<SimResult> Simulation::Run() {
  start_ = Clock::now();
  FEDLORA_RETURN_IF_ERROR(Setup());
  const int num_clients = partition_.num_clients();
  const uint32_t rounds = ConfiguredRounds(config_);

  // The initial adapter: the model's freshly initialised trainable params (seeded by config.seed).
  const std::vector<UpdateTensor> initial = InitialAdapter();
  const std::string task =
      data_.causal_lm() ? std::string("conversations")
                        : absl::StrCat("examples, ", data_.workload.label_names.size(), " labels");
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
    client_index_[vc->id] = i;
    vc->local = std::make_unique<LoraTrainer>(ClientSite(i));
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
      LabelHistograms(partition_, data_.workload.train_labels, data_.num_partition_labels());
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

absl::StatusOr<SimResult> RunSimulation(ResolvedRunConfig run, const SimOptions& options) {
  FEDLORA_RETURN_IF_ERROR(ValidateRunConfig(run.config));
  Simulation sim(std::move(run), options);
  return sim.Run();
}

absl::StatusOr<SimResult> RunSimulation(const v1::RunConfig& config, const SimOptions& options) {
  FEDLORA_RETURN_IF_ERROR(ValidateRunConfig(config));
  FEDLORA_ASSIGN_OR_RETURN(ResolvedRunConfig run, ResolveRunConfig(config));
  return RunSimulation(std::move(run), options);
}

}  // namespace fedlora::sim
