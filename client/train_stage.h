// A task's training stage: the trainer's TrainTask from the server's, and ClientTrainer::Train with
// heartbeats beside it. The first heartbeat goes when training starts; each next one after the
// server's last HeartbeatResponse.next_heartbeat_seconds (the one source of the interval; 1 s
// until the server has answered). A CANCEL_TASK answer marks the task cancelled.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "client/session.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/config.pb.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

// The trainer's view of `task` (one local epoch when the task names no amount of work).
TrainTask TrainerTask(const v1::TrainTask& task, const v1::RunConfig& config);

struct TrainOutcome {
  absl::StatusOr<TrainResult> result;
  bool cancelled = false;  // the server answered a heartbeat with CANCEL_TASK
};

// Trains, heartbeating meanwhile; with `hide_statistics` the heartbeats carry no step counts (under
// secure aggregation or DP a step count would disclose the data's size).
TrainOutcome TrainWithHeartbeats(Session& session, ClientTrainer& trainer,
                                 const v1::TrainTask& task, const std::vector<NamedTensor>& global,
                                 bool hide_statistics);

}  // namespace fedlora
