// The task, model, LoRA and training sections: their defaults (train/training_defaults.h holds the
// values) and their checks.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "config/sections.h"
#include "train/training_defaults.h"

namespace fedlora::config_internal {
namespace {

using v1::TaskConfig;
using v1::TrainingConfig;

// The last path component of a model directory, ignoring trailing slashes ("models/x/" -> "x").
std::string LastPathComponent(const std::string& path) {
  size_t end = path.find_last_not_of('/');
  if (end == std::string::npos) return "";
  size_t start = path.find_last_of('/', end);
  start = start == std::string::npos ? 0 : start + 1;
  return path.substr(start, end - start + 1);
}

void ApplyTaskDefaults(TaskConfig* task) {
  if (task->kind() == TaskConfig::KIND_UNSPECIFIED)
    task->set_kind(TaskConfig::SEQUENCE_CLASSIFICATION);
  if (task->kind() == TaskConfig::CAUSAL_LM) {
    if (task->prompt_field().empty()) task->set_prompt_field("prompt");
    if (task->response_field().empty()) task->set_response_field("response");
  } else {
    if (task->text_field().empty()) task->set_text_field("text");
    if (task->label_field().empty()) task->set_label_field("label");
  }
}

void ApplyLoraDefaults(v1::LoraConfig* lora, bool causal_lm) {
  if (!lora->has_rank()) lora->set_rank(kDefaultLoraRank);
  if (!lora->has_alpha()) lora->set_alpha(kDefaultLoraAlpha);
  if (lora->target_modules().empty()) {
    if (causal_lm) {
      for (const char* m :
           {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
        lora->add_target_modules(m);
    } else {
      lora->add_target_modules("query");
      lora->add_target_modules("value");
    }
  }
}

void ApplyOptimizerDefaults(TrainingConfig* t, bool causal_lm) {
  if (t->local_work_case() == TrainingConfig::LOCAL_WORK_NOT_SET)
    t->set_local_epochs(kDefaultLocalEpochs);
  if (!t->has_batch_size()) t->set_batch_size(kDefaultBatchSize);
  if (!t->has_learning_rate())
    t->set_learning_rate(causal_lm ? kDecoderDefaultLearningRate : kDefaultLearningRate);
  if (t->optimizer() == TrainingConfig::OPTIMIZER_UNSPECIFIED)
    t->set_optimizer(TrainingConfig::ADAMW);
  if (t->schedule() == TrainingConfig::SCHEDULE_UNSPECIFIED)
    t->set_schedule(TrainingConfig::CONSTANT);
  if (!t->has_grad_clip_norm()) t->set_grad_clip_norm(kDefaultGradClipNorm);
  if (!t->has_grad_accumulation()) t->set_grad_accumulation(kDefaultGradAccumulation);
  if (!t->has_adam_beta1()) t->set_adam_beta1(kDefaultAdamBeta1);
  if (!t->has_adam_beta2()) t->set_adam_beta2(kDefaultAdamBeta2);
  if (!t->has_adam_epsilon()) t->set_adam_epsilon(kDefaultAdamEpsilon);
}

}  // namespace

void ApplyTrainingDefaults(v1::RunConfig* c) {
  ApplyTaskDefaults(c->mutable_task());
  const bool causal_lm = c->task().kind() == TaskConfig::CAUSAL_LM;
  auto* model = c->mutable_model();
  if (model->id().empty()) model->set_id(LastPathComponent(model->path()));
  if (!model->has_max_seq_len())
    model->set_max_seq_len(causal_lm ? kDecoderDefaultMaxSeqLen : kDefaultMaxSeqLen);
  ApplyLoraDefaults(c->mutable_lora(), causal_lm);
  ApplyOptimizerDefaults(c->mutable_training(), causal_lm);
}

void ValidateModel(Problems& p, const v1::ModelConfig& m) {
  p.NonEmpty("model.path", m.path());
  if (m.id().empty() && !m.path().empty()) {
    p.Bad("model.path", Quoted(m.path()), "gives no model.id; set model.id");
  }
  if (!m.sha256().empty() && !IsLowerHex(m.sha256(), 64)) {
    p.Bad("model.sha256", Quoted(m.sha256()), "must be 64 lowercase hex characters");
  }
  p.Range<uint32_t>("model.max_seq_len", m.max_seq_len(), 1, 1u << 20);
  if (!v1::ModelConfig::Precision_IsValid(m.precision())) {
    p.Bad("model.precision", m.precision(), "is not a known precision (FP32, BF16, INT8)");
  }
}

void ValidateLora(Problems& p, const v1::LoraConfig& l) {
  p.Range<uint32_t>("lora.rank", l.rank(), 1, 4096);
  p.Positive("lora.alpha", l.alpha());
  p.RealRange("lora.dropout", l.dropout(), 0, false, 1, true);
  CheckNameList(p, "lora.target_modules", l.target_modules(), 1);
}

void ValidateTask(Problems& p, const TaskConfig& t) {
  if (!TaskConfig::Kind_IsValid(t.kind()) || t.kind() == TaskConfig::KIND_UNSPECIFIED) {
    p.Bad("task.kind", t.kind(), "is not a known task kind");
  } else if (t.kind() == TaskConfig::SEQUENCE_CLASSIFICATION) {
    CheckNameList(p, "task.labels", t.labels(), 2);
    p.NonEmpty("task.label_field", t.label_field());
    p.NonEmpty("task.text_field", t.text_field());
    if (!t.pair_field().empty() && t.pair_field() == t.text_field()) {
      p.Bad("task.pair_field", Quoted(t.pair_field()), "must differ from task.text_field");
    }
    for (const auto& [name, set] : {std::pair{"prompt_field", !t.prompt_field().empty()},
                                    {"response_field", !t.response_field().empty()},
                                    {"system_prompt", !t.system_prompt().empty()},
                                    {"chat_template", !t.chat_template().empty()},
                                    {"exact_match", t.exact_match()}}) {
      if (set)
        p.Add(absl::StrCat("task.", name, " belongs to CAUSAL_LM, not SEQUENCE_CLASSIFICATION"));
    }
  } else if (t.kind() == TaskConfig::CAUSAL_LM) {
    if (t.labels_size() > 0) {
      p.Add(absl::StrCat("task.labels has ", t.labels_size(), " entries; CAUSAL_LM takes none"));
    }
    for (const auto& [name, value] : {std::pair{"text_field", &t.text_field()},
                                      {"pair_field", &t.pair_field()},
                                      {"label_field", &t.label_field()}}) {
      if (!value->empty()) {
        p.Add(absl::StrCat("task.", name,
                           " belongs to SEQUENCE_CLASSIFICATION; CAUSAL_LM reads "
                           "task.prompt_field and task.response_field"));
      }
    }
    p.NonEmpty("task.prompt_field", t.prompt_field());
    p.NonEmpty("task.response_field", t.response_field());
    if (!t.prompt_field().empty() && t.prompt_field() == t.response_field()) {
      p.Bad("task.response_field", Quoted(t.response_field()),
            "must differ from task.prompt_field");
    }
  }
}

void ValidateTraining(Problems& p, const TrainingConfig& t) {
  switch (t.local_work_case()) {
    case TrainingConfig::kLocalEpochs:
      p.Range<uint32_t>("training.local_epochs", t.local_epochs(), 1, 1000);
      break;
    case TrainingConfig::kLocalSteps:
      p.Range<uint32_t>("training.local_steps", t.local_steps(), 1, 10'000'000);
      if (t.warmup_steps() > t.local_steps()) {
        p.Bad("training.warmup_steps", t.warmup_steps(),
              absl::StrCat("exceeds training.local_steps (", t.local_steps(), ")"));
      }
      break;
    case TrainingConfig::LOCAL_WORK_NOT_SET:
      p.Add("training: one of training.local_epochs or training.local_steps must be set");
      break;
  }
  p.Range<uint32_t>("training.batch_size", t.batch_size(), 1, 65536);
  p.Positive("training.learning_rate", t.learning_rate());
  if (!TrainingConfig::Optimizer_IsValid(t.optimizer()) ||
      t.optimizer() == TrainingConfig::OPTIMIZER_UNSPECIFIED) {
    p.Bad("training.optimizer", t.optimizer(), "is not a known optimizer");
  }
  if (!TrainingConfig::Schedule_IsValid(t.schedule()) ||
      t.schedule() == TrainingConfig::SCHEDULE_UNSPECIFIED) {
    p.Bad("training.schedule", t.schedule(), "is not a known schedule");
  }
  p.NonNegative("training.weight_decay", t.weight_decay());
  p.NonNegative("training.grad_clip_norm", t.grad_clip_norm());
  p.Range<uint32_t>("training.grad_accumulation", t.grad_accumulation(), 1, 1024);
  if (!TrainingConfig::Schedule_IsValid(t.round_schedule())) {
    p.Bad("training.round_schedule", t.round_schedule(), "is not a known schedule");
  }
  p.RealRange("training.adam_beta1", t.adam_beta1(), 0, false, 1, true);
  p.RealRange("training.adam_beta2", t.adam_beta2(), 0, false, 1, true);
  p.Positive("training.adam_epsilon", t.adam_epsilon());
  p.RealRange("training.momentum", t.momentum(), 0, false, 1, true);
  p.RealRange("training.logit_adjustment", t.logit_adjustment(), 0, false, 10, false);
}

void ValidatePrecisionForTask(Problems& p, const v1::RunConfig& c) {
  if (c.model().precision() == v1::ModelConfig::INT8 &&
      c.task().kind() != v1::TaskConfig::CAUSAL_LM) {
    p.Add(
        "model.precision INT8 applies to decoder models (task.kind CAUSAL_LM): encoders have no "
        "Q8_0 base");
  }
}

}  // namespace fedlora::config_internal
