// Fuzzes the readers of two state files that outlive a process: the server optimizer's state
// (aggregation/server_optimizer.h, ServerOptimizer::LoadState, saved with every committed adapter)
// and a client's error-feedback residual (compression/error_feedback.h, ErrorFeedback::Load).
// A damaged disk, a half-copied state directory or a hand-edited file must give an error, never a
// crash or a state that breaks the next round.
//
// Input: one control byte, then the file. Bit 0: 0 the optimizer state, 1 the residual. Bits 1-2:
// the optimizer kind (sgd with momentum, adam, yogi, adagrad). The adapter is fixed: "lora_A" [2, 3]
// and "lora_B" [3].
//
// Checks beyond "no crash, no sanitizer report":
// - LoadState refuses with DataLoss and leaves the state unchanged (SaveState the same bytes);
//   a state it loads saves and loads again to the same bytes, and a step from it succeeds or
//   refuses with an error (never UB: the step count and moments come from the file);
// - ErrorFeedback::Load refuses with a message; a residual it loads saves and loads back to the
//   same tensors, and encoding an update with it succeeds or refuses with an error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "aggregation/fedavg.h"
#include "aggregation/server_optimizer.h"
#include "compression/codec.h"
#include "compression/error_feedback.h"
#include "fuzz/fuzz_util.h"

namespace {

constexpr char kRunId[] = "run-fuzz";

// Two files per process (.in and .out) in its scratch directory, removed at exit.
const std::string& Base() {
  static const std::string* base = new std::string(fedlora::fuzz::ScratchDir("state") + "/state");
  return *base;
}

using fedlora::fuzz::WriteFile;

std::vector<fedlora::UpdateTensor> Adapter(float value) {
  return {{"lora_A", {2, 3}, std::vector<float>(6, value)},
          {"lora_B", {3}, std::vector<float>(3, value)}};
}

bool SameBits(const std::vector<fedlora::UpdateTensor>& a,
              const std::vector<fedlora::UpdateTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape ||
        a[i].values.size() != b[i].values.size())
      return false;
    if (!a[i].values.empty() && std::memcmp(a[i].values.data(), b[i].values.data(),
                                            a[i].values.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

void FuzzOptimizerState(uint8_t control, std::string_view file) {
  using namespace fedlora;
  static const ServerOptimizerKind kKinds[] = {
      ServerOptimizerKind::kSgd, ServerOptimizerKind::kAdam, ServerOptimizerKind::kYogi,
      ServerOptimizerKind::kAdagrad};
  ServerOptimizerOptions options;
  options.kind = kKinds[(control >> 1) & 3];
  options.momentum = 0.9;  // sgd: stateful too
  auto opt = ServerOptimizer::Create(options, SpecFromUpdate(Adapter(0)));
  FUZZ_CHECK(opt.ok(), opt.status());
  auto before = opt->SaveState();
  FUZZ_CHECK(before.ok(), before.status());
  const absl::Status loaded = opt->LoadState(file);
  FUZZ_TRACE("optimizer %s, %zu bytes: %s\n",
             std::string(ServerOptimizerName(options.kind)).c_str(), file.size(),
             loaded.ToString().c_str());
  auto after = opt->SaveState();
  FUZZ_CHECK(after.ok(), after.status());
  if (!loaded.ok()) {
    FUZZ_CHECK(loaded.code() == absl::StatusCode::kDataLoss && !loaded.message().empty(), loaded);
    FUZZ_CHECK(*after == *before, "a refused state changed the optimizer");
    return;
  }
  auto again = ServerOptimizer::Create(options, SpecFromUpdate(Adapter(0)));
  FUZZ_CHECK(again.ok(), again.status());
  const absl::Status reloaded = again->LoadState(*after);
  FUZZ_CHECK(reloaded.ok(), reloaded);
  auto resaved = again->SaveState();
  FUZZ_CHECK(resaved.ok() && *resaved == *after,
             "a loaded state does not save and load to the same bytes");
  std::vector<UpdateTensor> global = Adapter(0.5f);
  const std::vector<UpdateTensor> global_before = global;
  const absl::Status stepped = opt->Step(Adapter(0.25f), global);
  if (!stepped.ok()) {
    FUZZ_CHECK(!stepped.message().empty(), stepped);
    FUZZ_CHECK(SameBits(global, global_before), "a refused step changed the adapter");
  }
}

void FuzzErrorFeedback(std::string_view file) {
  using namespace fedlora;
  const std::string in = Base() + ".in", out = Base() + ".out";
  FUZZ_CHECK(WriteFile(in, file), "cannot write " + in);
  auto ef = ErrorFeedback::Load(in, kRunId);
  FUZZ_TRACE("residual, %zu bytes: %s\n", file.size(), ef.status().ToString().c_str());
  if (!ef.ok()) {
    FUZZ_CHECK(!ef.status().message().empty(), ef.status());
    return;
  }
  const absl::Status saved = ef->Save(out, kRunId);
  if (saved.ok()) {
    auto back = ErrorFeedback::Load(out, kRunId);
    FUZZ_CHECK(back.ok(), back.status());
    FUZZ_CHECK(SameBits(back->residual(), ef->residual()),
               "a loaded residual does not save and load back");
  } else {
    FUZZ_CHECK(!saved.message().empty(), saved);
  }
  CodecOptions options;
  options.sparsifier = Sparsifier::kTopK;
  options.fraction = 0.5;
  auto encoded = ef->Encode(Adapter(0.125f), options);
  if (!encoded.ok()) FUZZ_CHECK(!encoded.status().message().empty(), encoded.status());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view file(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    FuzzOptimizerState(data[0], file);
  } else {
    FuzzErrorFeedback(file);
  }
  return 0;
}
