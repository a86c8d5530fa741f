// Server-side evaluation hook: called with every new global adapter before its round is committed.
// The real evaluators live with the programs that own a model (tools/cmd_server.cc, the
// simulator), both through workload/evaluator.h; the server only knows this interface. A server
// created with no evaluator skips evaluation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"

namespace fedlora {

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // Evaluates `adapter` (the new global adapter after round `round`) and returns named metrics, for
  // example {"eval_loss": 0.41, "eval_accuracy": 0.87}. An error never blocks the round: the server
  // logs it and commits the round without metrics, so a failing evaluator (a busy GPU) cannot stall
  // training. Called from the server's aggregation thread only, one call at a time.
  virtual absl::StatusOr<std::map<std::string, double>> Evaluate(
      uint64_t round, const std::vector<UpdateTensor>& adapter) = 0;
  // Called instead of Evaluate for a round that data.eval_every_rounds skips (the last round is
  // always evaluated), from the same thread. The default does nothing.
  virtual void Skipped(uint64_t round) { (void)round; }
};

}  // namespace fedlora
