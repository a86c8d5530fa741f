#include "client/train_stage.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "config/config_io.h"

namespace fedlora {
namespace {

// Until the server has said: the shortest interval it may ask for.
constexpr int64_t kFirstAnswerRetryMs = 1000;
// next_heartbeat_seconds is clamped to the run config's range for it.
constexpr uint32_t kMaxHeartbeatSeconds = 3600;

}  // namespace

TrainTask TrainerTask(const v1::TrainTask& task, const v1::RunConfig& config) {
  TrainTask t;
  t.round = task.round();
  t.task_id = task.task_id();
  t.seed = task.seed();
  t.local_epochs = task.training().has_local_epochs() ? task.training().local_epochs() : 0;
  t.local_steps = task.training().has_local_steps() ? task.training().local_steps() : 0;
  if (t.local_epochs == 0 && t.local_steps == 0) t.local_epochs = 1;
  t.batch_size = task.training().batch_size();
  t.learning_rate = task.training().learning_rate();
  t.proximal_mu = task.proximal_mu();
  t.deadline_seconds = task.deadline_seconds();
  t.run_config_json = RunConfigToJson(config);
  return t;
}

TrainOutcome TrainWithHeartbeats(Session& session, ClientTrainer& trainer,
                                 const v1::TrainTask& task, const std::vector<NamedTensor>& global,
                                 bool hide_statistics) {
  TrainTask t = TrainerTask(task, session.join().run_config());
  std::atomic<int64_t> steps_done{0};
  std::atomic<int64_t> steps_total{0};
  t.report_progress = [&steps_done, &steps_total](int64_t done, int64_t total) {
    steps_total.store(total);
    steps_done.store(done);
  };
  std::atomic<bool> cancelled{false};
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  auto beat = [&] {
    v1::HeartbeatRequest request;
    request.set_task_id(task.task_id());
    request.set_state(v1::CLIENT_STATE_TRAINING);
    if (!hide_statistics) {
      request.set_steps_done(static_cast<uint64_t>(std::max<int64_t>(0, steps_done.load())));
      request.set_steps_total(static_cast<uint64_t>(std::max<int64_t>(0, steps_total.load())));
    }
    v1::HeartbeatResponse response;
    const absl::Status s = session.transport().Heartbeat(
        session.Meta(session.options().call_deadline_ms), request, &response);
    if (!s.ok()) return;
    if (response.action() == v1::HeartbeatResponse::CANCEL_TASK) cancelled.store(true);
    if (response.next_heartbeat_seconds() > 0) {
      session.set_heartbeat_ms(int64_t{1000} *
                               std::min(response.next_heartbeat_seconds(), kMaxHeartbeatSeconds));
    }
  };
  std::thread heartbeat([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      lock.unlock();
      beat();
      lock.lock();
      const int64_t ms = session.heartbeat_ms() > 0 ? session.heartbeat_ms() : kFirstAnswerRetryMs;
      cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stop; });
    }
  });
  TrainOutcome outcome{trainer.Train(t, global), false};
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  heartbeat.join();
  outcome.cancelled = cancelled.load();
  return outcome;
}

}  // namespace fedlora
