#include "tools/common.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "model/adapter_dir.h"
#include "model/bert_config.h"
#include "model/decoder_config.h"
#include "train/dataset.h"

namespace fedlora::tools {

void AddLogFlags(FlagSet& flags, LogFlags* log) {
  if (!flags.Has("log-level")) {
    flags.AddString("log-level", &log->level, "log threshold: debug, info, warning or error");
    flags.SetDefaultText("log-level", "$FEDLORA_LOG_LEVEL, else info");
  }
  if (!flags.Has("verbose"))
    flags.AddBool("verbose", &log->verbose, "log DEBUG lines too (--log-level debug)");
  if (!flags.Has("log-format")) {
    flags.AddString("log-format", &log->format,
                    "log lines as text, or json (one object per line: ts, level, file, line, msg)");
    flags.SetDefaultText("log-format", "$FEDLORA_LOG_FORMAT, else text");
  }
  if (!flags.Has("log-file")) {
    flags.AddString(
        "log-file", &log->file,
        "append the log to this file; WARNING and ERROR lines still reach stderr (-: stderr)");
  }
}

absl::Status ApplyLogLevelAndFormat(const LogFlags& log) {
  LogLevel level = GetLogLevel();
  if (!log.level.empty() && !ParseLogLevel(log.level, &level)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level: '", log.level, "' is not one of debug, info, warning, error"));
  }
  if (log.verbose) {
    if (!log.level.empty() && level != LogLevel::kDebug) {
      return absl::InvalidArgumentError(
          absl::StrCat("--verbose contradicts --log-level ", log.level));
    }
    level = LogLevel::kDebug;
  }
  LogFormat format = GetLogFormat();
  if (!log.format.empty() && !ParseLogFormat(log.format, &format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format: '", log.format, "' is not text or json"));
  }
  SetLogLevel(level);
  SetLogFormat(format);
  return absl::OkStatus();
}

std::string LogFilePath(const LogFlags& log) { return log.file == "-" ? std::string() : log.file; }

absl::Status OpenLogFile(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::error_code ec;  // a directory that cannot be made shows as SetLogFile's error
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  return SetLogFile(path);
}

std::optional<int> ParseFlagsOrExit(FlagSet& flags, int argc, char** argv, LogFlags* log) {
  AddLogFlags(flags, log);
  const absl::Status status = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!status.ok()) return UsageError(argv[0], std::string(status.message()));
  if (absl::Status s = ApplyLogLevelAndFormat(*log); !s.ok())
    return UsageError(argv[0], std::string(s.message()));
  return std::nullopt;
}

std::optional<int> ParseFlagsOrExit(FlagSet& flags, int argc, char** argv) {
  LogFlags log;
  if (auto code = ParseFlagsOrExit(flags, argc, argv, &log)) return code;
  if (absl::Status s = OpenLogFile(LogFilePath(log)); !s.ok()) return Fail(argv[0], s);
  return std::nullopt;
}

void SayAt(const char* file, int line, LogLevel level, const std::string& text) {
  std::string_view msg = text;
  if (!msg.empty() && msg.back() == '\n') msg.remove_suffix(1);
  if (GetLogFormat() == LogFormat::kJson) {
    std::fputs(
        FormatLogLine(LogFormat::kJson, level, file, line, std::chrono::system_clock::now(), msg)
            .c_str(),
        stderr);
  } else {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(msg.size()), msg.data());
  }
}

int Fail(const std::string& command, const absl::Status& status) {
  SayAt(__FILE__, __LINE__, LogLevel::kError,
        absl::StrCat(command, ": error: ", status.ToString()));
  return kExitFailure;
}

int UsageError(const std::string& command, const std::string& message) {
  SayAt(__FILE__, __LINE__, LogLevel::kError, absl::StrCat(command, ": ", message));
  return kExitUsage;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

nlohmann::json TrainOptionsJson(const TrainOptions& o) {
  return {{"epochs", o.epochs},
          {"max_steps", o.max_steps},
          {"batch_size", o.batch_size},
          {"max_seq_len", o.max_seq_len},
          {"lr", o.lr},
          {"optimizer", o.optimizer},
          {"weight_decay", o.weight_decay},
          {"warmup_steps", o.warmup_steps},
          {"schedule", o.schedule},
          {"grad_clip", o.grad_clip},
          {"grad_accumulation", o.grad_accumulation},
          {"logit_adjustment", o.logit_adjustment},
          {"momentum", o.momentum},
          {"seed", o.seed},
          {"group_by_length", o.group_by_length}};
}

namespace {

void Note(const std::string& command, const std::string& flag, const std::string& given,
          const std::string& recorded, const std::string& adapter_dir) {
  FEDLORA_SAY("%s: %s %s differs from the adapter's %s (%s/%s): figures may differ from the run's",
              command, flag, given, recorded, adapter_dir, kAdapterMetadataFile);
}

std::string Quoted(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

absl::Status ApplyAdapterSettings(const std::string& command, const std::string& adapter_dir,
                                  const AdapterSettings& s) {
  if (adapter_dir.empty()) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(AdapterDirInfo info, ReadAdapterMetadata(adapter_dir));
  if (s.max_seq_len != nullptr && info.max_seq_len) {
    if (!s.max_seq_len_given) {
      *s.max_seq_len = *info.max_seq_len;
    } else if (*s.max_seq_len != *info.max_seq_len) {
      Note(command, "--max-seq-len", std::to_string(*s.max_seq_len),
           std::to_string(*info.max_seq_len), adapter_dir);
    }
  }
  if (s.system != nullptr && info.system_prompt) {
    if (!s.system_given) {
      *s.system = *info.system_prompt;
    } else if (*s.system != *info.system_prompt) {
      Note(command, "--system", Quoted(*s.system), Quoted(*info.system_prompt), adapter_dir);
    }
  }
  if (s.chat_template != nullptr && info.chat_template) {
    if (!s.chat_template_given) {
      *s.chat_template = *info.chat_template;
    } else if (*s.chat_template != *info.chat_template) {
      Note(command, "--chat-template", *s.chat_template, *info.chat_template, adapter_dir);
    }
  }
  return absl::OkStatus();
}

void AddEncoderDataFlags(FlagSet& flags, EncoderDataFlags* fields) {
  flags.AddString("text-field", &fields->text_field,
                  "encoders: JSONL field (or CSV/TSV column) of the text");
  flags.AddString("pair-field", &fields->pair_field,
                  "encoders: field of a pair task's second text (used when the data has it)");
  flags.AddString("label-field", &fields->label_field,
                  "encoders: field of the label (a name or its index)");
}

std::string EncoderDataFlagsProblem(const EncoderDataFlags& fields, const FlagSet& flags,
                                    bool decoder) {
  if (decoder && fields.any_given(flags)) {
    return "--text-field, --pair-field and --label-field apply to encoder models only (a decoder "
           "reads "
           "--prompt-field and --response-field)";
  }
  if (fields.text_field.empty() || fields.pair_field.empty() || fields.label_field.empty()) {
    return "--text-field, --pair-field and --label-field must not be empty";
  }
  if (fields.text_field == fields.pair_field || fields.text_field == fields.label_field ||
      fields.pair_field == fields.label_field) {
    return "--text-field, --pair-field and --label-field must name different fields";
  }
  return "";
}

absl::Status CheckPrecisionFlags(const PrecisionFlags& p) {
  if (p.int8_math && (p.bf16 || p.bf16_math)) {
    return absl::InvalidArgumentError(
        "--int8-math holds the base as Q8_0: not with --bf16 or --bf16-math");
  }
  return absl::OkStatus();
}

v1::RunConfig CommandRunConfig(const std::string& model, bool decoder, int max_seq_len,
                               const PrecisionFlags& precision, const DecoderDataFlags& data,
                               const EncoderDataFlags& fields) {
  v1::RunConfig config;
  v1::ModelConfig& m = *config.mutable_model();
  m.set_path(model);
  m.set_max_seq_len(static_cast<uint32_t>(max_seq_len));
  if (precision.int8_math) {
    m.set_precision(v1::ModelConfig::INT8);
  } else if (precision.bf16_math) {
    m.set_precision(v1::ModelConfig::BF16);
  }
  v1::TaskConfig& task = *config.mutable_task();
  task.set_kind(decoder ? v1::TaskConfig::CAUSAL_LM : v1::TaskConfig::SEQUENCE_CLASSIFICATION);
  task.set_text_field(fields.text_field);
  task.set_pair_field(fields.pair_field);
  task.set_label_field(fields.label_field);
  task.set_prompt_field(data.prompt_field);
  task.set_response_field(data.response_field);
  task.set_system_prompt(data.system);
  task.set_chat_template(data.chat_template);
  task.set_exact_match(data.exact_match);
  return config;
}

namespace {

// .npy v1.0: magic, version, little-endian uint16 header length, then a Python dict literal
// padded with spaces and ended by '\n' so that the data starts at a multiple of 64 bytes.
absl::Status WriteNpy(const std::string& path, const char* descr, const void* data, size_t bytes,
                      const std::vector<int64_t>& shape) {
  // A 1-tuple needs its trailing comma: "(5,)".
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(static_cast<const char*>(data), bytes);
  return WriteFileAtomically(path, out);
}

}  // namespace

absl::Status WriteNpyFloat(const std::string& path, const std::vector<float>& data,
                           const std::vector<int64_t>& shape) {
  return WriteNpy(path, "<f4", data.data(), data.size() * sizeof(float), shape);
}

absl::Status WriteNpyInt32(const std::string& path, const std::vector<int32_t>& data,
                           const std::vector<int64_t>& shape) {
  return WriteNpy(path, "<i4", data.data(), data.size() * sizeof(int32_t), shape);
}

}  // namespace fedlora::tools
