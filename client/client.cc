// The client SDK's ClientImpl: the run loop (join, wait for tasks, leave) and one task as its
// stages: fetch (fetch_stage.h), the secure-aggregation session (secagg_stage.h), train with
// heartbeats (train_stage.h), encode and seal (encode_stage.h), upload (upload_stage.h), then the
// metrics report. Every call goes through a Transport (transport.h): gRPC in Client::Create.
#include "fedlora/client.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/encode_stage.h"
#include "client/fetch_stage.h"
#include "client/grpc_transport.h"
#include "client/secagg_stage.h"
#include "client/session.h"
#include "client/task_failure.h"
#include "client/train_stage.h"
#include "client/transport.h"
#include "client/upload_stage.h"
#include "config/config_io.h"
#include "config/federated_tensors.h"
#include "core/logging.h"
#include "core/status.h"
#include "crypto/random.h"

namespace fedlora {
namespace {

using Clock = std::chrono::steady_clock;

// How long each stage of a task took, for its metrics report.
struct TaskTimes {
  Clock::time_point start, fetched, trained, sealed, uploaded;
};

class ClientImpl final : public Client {
 public:
  ClientImpl(ClientOptions options, ClientTrainer* trainer, std::unique_ptr<Transport> transport)
      : options_(std::move(options)),
        trainer_(trainer),
        session_(options_, std::move(transport)),
        fetcher_(session_),
        encoder_(session_) {}

  absl::StatusOr<RunSummary> RunUntilDone() override;
  void Stop() override { session_.Stop(); }

 private:
  // Ends the session; with an error, the server records the site as failed with it.
  void Leave(const absl::Status& error);
  // Leave(error), and the error RunUntilDone returns for it.
  absl::Status LeaveFailed(const absl::Status& error);
  // Joins (retried) and lets the trainer check the run (ClientTrainer::Prepare): a site that
  // cannot take part leaves at once.
  absl::Status JoinAndPrepare();
  // One WaitForTask (retried).
  absl::StatusOr<v1::WaitForTaskResponse> WaitForTask();
  // The summary of a finished run, with the final adapter when asked for.
  absl::StatusOr<RunSummary> Finished(const v1::RunFinished& finished, RunSummary summary);
  // What RunUntilDone does after a task failed: OK to go on (after a pause where due), else the
  // error it returns.
  absl::Status AfterFailedTask(absl::Status s, const v1::TrainTask& task, int* failed_in_a_row);
  // One task: returns OK when the update was accepted; a non-transient error means "give it up".
  absl::Status RunTask(const v1::TrainTask& task);
  // The update as the server receives it: masked under secure aggregation, else encoded with the
  // task's codec; then sealed.
  absl::StatusOr<SealedUpload> EncodeAndSeal(const v1::TrainTask& task, const TrainResult& result,
                                             int64_t claimed_examples, SecAggSession* secagg);
  // Best effort: a refusal does not undo the accepted update.
  void ReportMetrics(const v1::TrainTask& task, const TrainResult& result, const TaskTimes& times);

  const ClientOptions options_;
  ClientTrainer* const trainer_;
  Session session_;
  AdapterFetcher fetcher_;
  UpdateEncoder encoder_;
};

absl::StatusOr<v1::WaitForTaskResponse> ClientImpl::WaitForTask() {
  v1::WaitForTaskResponse response;
  FEDLORA_RETURN_IF_ERROR(session_.Retry("WaitForTask", [&] {
    v1::WaitForTaskRequest request;
    request.set_max_wait_seconds(static_cast<uint32_t>(options_.wait_for_task_seconds));
    request.set_held_adapter_sha256(fetcher_.held_sha256());
    return session_.transport().WaitForTask(
        session_.Meta(options_.wait_for_task_seconds * 1000 + 10'000), request, &response);
  }));
  return response;
}

absl::StatusOr<RunSummary> ClientImpl::Finished(const v1::RunFinished& finished,
                                                RunSummary summary) {
  if (finished.reason() == v1::RunFinished::FAILED) {
    return absl::AbortedError(absl::StrCat("the server stopped the run after round ",
                                           finished.final_round(),
                                           " on a failure it could not get past (see the "
                                           "server's log)"));
  }
  summary.final_round = finished.final_round();
  summary.adapters_downloaded = fetcher_.downloaded();
  summary.adapters_rebuilt = fetcher_.rebuilt();
  summary.adapters_reused = fetcher_.reused();
  summary.final_adapter_sha256 = finished.final_adapter().sha256();
  if (options_.download_final_adapter) {
    FEDLORA_ASSIGN_OR_RETURN(std::string blob, fetcher_.Download(finished.final_adapter()));
    FEDLORA_ASSIGN_OR_RETURN(summary.final_adapter, ParseAdapter(blob));
  }
  return summary;
}

absl::StatusOr<RunSummary> ClientImpl::RunUntilDone() {
  RunSummary summary;
  int failed_in_a_row = 0;  // tasks, the transient errors of RunTask
  fetcher_.LoadHeld();
  FEDLORA_RETURN_IF_ERROR(JoinAndPrepare());
  std::string waiting_for;  // the last "retry later" reason logged
  while (true) {
    if (session_.Stopped()) return absl::CancelledError("client stopped");
    FEDLORA_ASSIGN_OR_RETURN(v1::WaitForTaskResponse response, WaitForTask());
    if (response.has_run_finished()) {
      FEDLORA_ASSIGN_OR_RETURN(summary, Finished(response.run_finished(), std::move(summary)));
      break;
    }
    if (response.has_retry_later()) {
      if (response.retry_later().reason() != waiting_for) {
        waiting_for = response.retry_later().reason();
        FEDLORA_LOG(INFO) << session_.Who() << ": " << waiting_for.substr(0, 200);
      }
      const int64_t ms =
          int64_t{1000} * std::max<uint32_t>(1, response.retry_later().retry_after_seconds());
      if (!session_.SleepFor(ms)) return absl::CancelledError("client stopped");
      continue;
    }
    if (!response.has_task()) return absl::InternalError("WaitForTask answered with no outcome");
    absl::Status s = RunTask(response.task());
    if (s.ok()) {
      ++summary.tasks_completed;
      failed_in_a_row = 0;
    } else {
      ++summary.tasks_failed;
      FEDLORA_RETURN_IF_ERROR(AfterFailedTask(std::move(s), response.task(), &failed_in_a_row));
    }
    if (options_.max_tasks > 0 && summary.tasks_completed >= options_.max_tasks) break;
  }
  Leave(absl::OkStatus());
  return summary;
}

absl::Status ClientImpl::AfterFailedTask(absl::Status s, const v1::TrainTask& task,
                                         int* failed_in_a_row) {
  if (absl::IsCancelled(s) && session_.Stopped()) return s;
  if (IsFailureKind(s, "server")) {
    FEDLORA_LOG(INFO) << session_.Who() << ": " << s.message();
    return absl::OkStatus();
  }
  // The server hands a selected site its task again at once: wait before taking it, and stop after
  // max_attempts failures in a row.
  ++*failed_in_a_row;
  if (IsFailureKind(s, "local") || *failed_in_a_row >= options_.retry.max_attempts) {
    if (!IsFailureKind(s, "local")) {
      s = Annotate(s, absl::StrCat(*failed_in_a_row, " tasks in a row failed; the last"));
    }
    return LeaveFailed(s);
  }
  const int64_t wait_ms = session_.Backoff(*failed_in_a_row);
  FEDLORA_LOG(WARNING) << session_.Who() << ": task " << task.task_id()
                       << " given up (taken again in " << (wait_ms + 999) / 1000 << " s): " << s;
  if (!session_.SleepFor(wait_ms)) return absl::CancelledError("client stopped");
  return absl::OkStatus();
}

absl::Status ClientImpl::RunTask(const v1::TrainTask& task) {
  // Checked before any work: this client uploads sealed updates only.
  FEDLORA_RETURN_IF_ERROR(CheckAggregationKey(session_, task));
  TaskTimes times;
  times.start = Clock::now();
  std::unique_ptr<SecAggSession> secagg;
  if (task.has_secure_aggregation()) {
    // Its key steps come first, with every client of the round.
    const auto until =
        times.start + std::chrono::seconds(task.deadline_seconds()) + std::chrono::minutes(2);
    FEDLORA_ASSIGN_OR_RETURN(secagg, SecAggSession::Start(session_, task, until));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string blob, fetcher_.Fetch(task));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<NamedTensor> global, ParseAdapter(blob));
  times.fetched = Clock::now();

  const bool hide_statistics = HidesPerClientStatistics(session_.join().run_config());
  TrainOutcome trained = TrainWithHeartbeats(session_, *trainer_, task, global, hide_statistics);
  times.trained = Clock::now();
  if (trained.cancelled) {
    return WithFailureKind(absl::FailedPreconditionError(absl::StrCat(
                               "task ", task.task_id(), " was cancelled by the server")),
                           "server");
  }
  if (!trained.result.ok()) {
    absl::Status s = Annotate(trained.result.status(), "trainer");
    return IsPermanentTrainerError(s) ? WithFailureKind(std::move(s), "local") : s;
  }
  const TrainResult& result = *trained.result;
  if (result.num_examples < 1) {
    return WithFailureKind(absl::InvalidArgumentError("trainer returned num_examples < 1"),
                           "local");
  }
  // Under lora.freeze_a the delta leaves out every lora_A (config/federated_tensors.h).
  if (absl::Status s = CheckFederated(result.delta, session_.join().run_config()); !s.ok()) {
    return WithFailureKind(Annotate(s, "trainer"), "local");
  }
  // Under secure aggregation or DP the server learns nothing of this site's data size or loss.
  const int64_t claimed_examples = hide_statistics ? 1 : result.num_examples;
  FEDLORA_ASSIGN_OR_RETURN(SealedUpload sealed,
                           EncodeAndSeal(task, result, claimed_examples, secagg.get()));
  times.sealed = Clock::now();
  FEDLORA_RETURN_IF_ERROR(UploadUpdate(session_, task, sealed, result.delta));
  if (secagg != nullptr) secagg->Unmask();
  times.uploaded = Clock::now();
  if (secagg == nullptr) encoder_.Commit();  // accepted: what was not sent waits for the next one
  // No metrics report under secure aggregation or DP: the server refuses one.
  if (!hide_statistics) ReportMetrics(task, result, times);
  return absl::OkStatus();
}

absl::StatusOr<SealedUpload> ClientImpl::EncodeAndSeal(const v1::TrainTask& task,
                                                       const TrainResult& result,
                                                       int64_t claimed_examples,
                                                       SecAggSession* secagg) {
  SealedUpload out;
  // One upload id per task attempt: every retry and resume reuses it, so the server counts it once.
  FEDLORA_ASSIGN_OR_RETURN(const std::string random_id, crypto::RandomHex(16));
  out.upload_id = absl::StrCat("u-", random_id);
  out.num_examples = claimed_examples;
  std::string encoded;
  if (secagg != nullptr) {
    FEDLORA_ASSIGN_OR_RETURN(encoded, secagg->MaskedInput(result.delta));
  } else {
    FEDLORA_ASSIGN_OR_RETURN(encoded, encoder_.Encode(task, result.delta));
  }
  FEDLORA_ASSIGN_OR_RETURN(crypto::SealedBlob sealed,
                           SealForTask(session_, task, out.upload_id, claimed_examples, encoded));
  out.blob = std::move(sealed.blob);
  out.ephemeral_public_key = std::move(sealed.ephemeral_public_key);
  return out;
}

void ClientImpl::ReportMetrics(const v1::TrainTask& task, const TrainResult& result,
                               const TaskTimes& times) {
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  v1::MetricsReport report;
  report.set_round(task.round());
  report.set_task_id(task.task_id());
  report.set_train_loss_first(result.train_loss_first);
  report.set_train_loss_last(result.train_loss_last);
  report.set_examples_processed(static_cast<uint64_t>(result.examples_processed));
  report.set_steps(static_cast<uint64_t>(result.steps));
  report.set_download_seconds(seconds(times.start, times.fetched));
  report.set_train_seconds(seconds(times.fetched, times.trained));
  report.set_encode_seconds(seconds(times.trained, times.sealed));
  report.set_upload_seconds(seconds(times.sealed, times.uploaded));
  for (const auto& [k, v] : result.metrics) (*report.mutable_extra())[k] = v;
  absl::Status s = session_.Retry("ReportMetrics", [&] {
    v1::MetricsAck ack;
    return session_.transport().ReportMetrics(session_.Meta(options_.call_deadline_ms), report,
                                              &ack);
  });
  if (!s.ok()) {
    FEDLORA_LOG(WARNING) << session_.Who() << ": metrics for round " << task.round() << ": " << s;
  }
}

absl::Status ClientImpl::JoinAndPrepare() {
  FEDLORA_RETURN_IF_ERROR(session_.Retry("Join", [&] { return session_.JoinOnce(); }));
  const v1::JoinResponse& join = session_.join();
  FEDLORA_LOG(INFO) << session_.Who() << ": joined run '" << session_.run_id() << "' at "
                    << options_.server_address
                    << (join.current_round() > 0
                            ? absl::StrCat(" (round ", join.current_round(), " in progress)")
                            : "");
  absl::Status s = trainer_->Prepare(RunConfigToJson(join.run_config()));
  if (s.ok()) return s;
  s = Annotate(s, "trainer");
  if (IsPermanentTrainerError(s)) return LeaveFailed(s);
  // It may pass (a busy GPU): the first task tries again, under the task's rules.
  FEDLORA_LOG(WARNING) << session_.Who() << ": " << s;
  return absl::OkStatus();
}

absl::Status ClientImpl::LeaveFailed(const absl::Status& error) {
  Leave(error);
  return absl::Status(error.code(), absl::StrCat("this site cannot take part in run '",
                                                 session_.run_id(), "': ", error.message(),
                                                 " (it left the run; the server shows it as "
                                                 "FAILED until it joins again)"));
}

void ClientImpl::Leave(const absl::Status& error) {
  v1::LeaveRequest leave;
  leave.set_reason(error.ok() ? "finished" : "failed");
  if (!error.ok()) {
    leave.set_error(absl::StrCat(absl::StatusCodeToString(error.code()), ": ", error.message())
                        .substr(0, 1024));
  }
  v1::LeaveResponse left;
  absl::Status s =
      session_.transport().Leave(session_.Meta(options_.call_deadline_ms), leave, &left);
  // Best effort: without it the server times the session out and gives the task to another site.
  if (!s.ok() && !error.ok()) {
    FEDLORA_LOG(WARNING) << session_.Who() << ": telling the server of the failure: " << s;
  }
}

// The option checks that do not depend on the transport.
absl::Status CheckOptions(const ClientOptions& options, const ClientTrainer* trainer) {
  if (trainer == nullptr) return absl::InvalidArgumentError("Client::Create: trainer is null");
  if (options.server_address.empty())
    return absl::InvalidArgumentError("ClientOptions.server_address is empty");
  if (options.retry.max_attempts < 1)
    return absl::InvalidArgumentError("RetryPolicy.max_attempts must be >= 1");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> NewClientOverTransport(
    ClientOptions options, ClientTrainer* trainer, std::unique_ptr<Transport> transport) {
  FEDLORA_RETURN_IF_ERROR(CheckOptions(options, trainer));
  if (transport == nullptr) return absl::InvalidArgumentError("the transport is null");
  return std::unique_ptr<Client>(new ClientImpl(std::move(options), trainer, std::move(transport)));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options,
                                                       ClientTrainer* trainer) {
  FEDLORA_RETURN_IF_ERROR(CheckOptions(options, trainer));
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport, CreateGrpcTransport(options));
  return NewClientOverTransport(std::move(options), trainer, std::move(transport));
}

}  // namespace fedlora
