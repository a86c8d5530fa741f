// Helpers shared by the `fedlora` subcommands: flag handling with the standard exit codes, error
// reporting, the model and data flags of `train`, `eval` and `embed` as a run config, and small
// output writers.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "config/device_plan.h"  // --device, for every command
#include "core/logging.h"
#include "fedlora/v1/config.pb.h"
#include "model/decoder_tokenizer.h"
#include "model/tokenizer.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/trainer.h"

namespace fedlora::tools {

// The logging flags every command takes (core/logging.h). ParseFlagsOrExit registers them, each
// unless the command has registered a flag of that name itself.
//   --log-level debug|info|warning|error   default: FEDLORA_LOG_LEVEL, else info
//   --verbose                              the same as --log-level debug
//   --log-format text|json                 default: FEDLORA_LOG_FORMAT, else text
//   --log-file PATH                        append the log to PATH (its directory is made);
//                                          WARNING and ERROR lines are still copied to stderr
//                                          ("-": stderr only, the default)
struct LogFlags {
  std::string level;
  bool verbose = false;
  std::string format;
  std::string file;
};
void AddLogFlags(FlagSet& flags, LogFlags* log);

// A line for the person at the terminal, on stderr: as written, or under --log-format json as one
// log object (level, file, line, msg), so that a json log holds nothing but json. A trailing
// newline is dropped. FEDLORA_SAY("...%d...", n) formats it (absl::StrFormat) and says where.
void SayAt(const char* file, int line, LogLevel level, const std::string& text);
#define FEDLORA_SAY(...)                                                  \
  ::fedlora::tools::SayAt(__FILE__, __LINE__, ::fedlora::LogLevel::kInfo, \
                          ::absl::StrFormat(__VA_ARGS__))

// The fields of an encoder's labelled data (JSONL keys, or CSV/TSV columns), as a run config's
// task.text_field, pair_field and label_field name them: --text-field, --pair-field, --label-field.
struct EncoderDataFlags {
  std::string text_field = "text";
  std::string pair_field = "text_pair";  // the second text of a pair task, used when present
  std::string label_field = "label";
  // Whether any was given on the command line (decoders refuse them).
  bool any_given(const FlagSet& flags) const {
    return flags.WasSet("text-field") || flags.WasSet("pair-field") || flags.WasSet("label-field");
  }
};
void AddEncoderDataFlags(FlagSet& flags, EncoderDataFlags* fields);
// Empty unless the flags contradict themselves or the model: a decoder takes none of them (it
// reads --prompt-field and --response-field), a name is not empty, the text and pair fields differ.
std::string EncoderDataFlagsProblem(const EncoderDataFlags& fields, const FlagSet& flags,
                                    bool decoder);
// Checks the values (InvalidArgument naming the flag) and applies the level and the format.
absl::Status ApplyLogLevelAndFormat(const LogFlags& log);
// The file --log-file names: empty for none or "-".
std::string LogFilePath(const LogFlags& log);
// Creates the directories above `path` and sends the log there (SetLogFile); nothing for "".
absl::Status OpenLogFile(const std::string& path);

// Parses argv into `flags` plus the logging flags above. Returns nullopt when the command should
// go on, else the exit code to return at once: kExitOk after printing the help (--help),
// kExitUsage after printing the error and a pointer to --help, kExitFailure when the log file
// cannot be opened. On nullopt the log level, format and file are in effect. Call it once per
// FlagSet: the logging flags it adds write into storage that ends with the call.
std::optional<int> ParseFlagsOrExit(FlagSet& flags, int argc, char** argv);
// The same, but the log file is left to the caller (`fedlora simulate` picks a default one): *log
// holds the logging flags as given, the level and format are in effect.
std::optional<int> ParseFlagsOrExit(FlagSet& flags, int argc, char** argv, LogFlags* log);

// Prints "<command>: error: <message>" to stderr and returns kExitFailure.
int Fail(const std::string& command, const absl::Status& status);
// Prints "<command>: <message>" to stderr and returns kExitUsage (bad flag values).
int UsageError(const std::string& command, const std::string& message);

// --device: ResolveDevice, CpuOnlyWork, DeviceForRun and PlanDevices are in config/device_plan.h.

// Settings an adapter directory records (model/adapter_dir.h's fedlora_adapter.json) that a
// command's flags may also give: max_seq_len, and for decoders the system prompt and the chat
// template. A flag left out takes the adapter's value; a flag given with a value other than the
// adapter's wins and is said in one line on stderr ("<command>: --max-seq-len 128 differs from
// the adapter's 64 ..."). Reads nothing for an empty `adapter_dir`; errors as ReadAdapterMetadata.
struct AdapterSettings {
  int* max_seq_len = nullptr;  // null: the command does not take it
  bool max_seq_len_given = false;
  std::string* system = nullptr;
  bool system_given = false;
  std::string* chat_template = nullptr;
  bool chat_template_given = false;
};
absl::Status ApplyAdapterSettings(const std::string& command, const std::string& adapter_dir,
                                  const AdapterSettings& settings);

// What `fedlora train` and `fedlora eval` read a decoder's conversations with.
struct DecoderDataFlags {
  std::string chat_template;  // "" : the checkpoint's
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string system;        // system message before each prompt ("": none)
  bool exact_match = false;  // also score greedy generations
};

// How `fedlora train` and `fedlora eval` hold and multiply the frozen base.
struct PrecisionFlags {
  bool bf16 = false;       // bf16 weights, fp32 products
  bool bf16_math = false;  // bf16 weights and products (implies bf16)
  bool int8_math = false;  // decoders: the base held as Q8_0, int8 products; not with bf16
};
// InvalidArgument for --int8-math with --bf16 or --bf16-math.
absl::Status CheckPrecisionFlags(const PrecisionFlags& p);

// The run config `fedlora train`, `eval`, `embed` and `generate` load their model and data
// with (workload/factory.h LoadWorkload): task.kind CAUSAL_LM for a decoder (else
// SEQUENCE_CLASSIFICATION, its labels left to the data or the adapter), model.path and
// max_seq_len, model.precision (INT8 for --int8-math, BF16 for --bf16-math; --bf16 alone is
// WorkloadRequest::bf16_weights), and the task's fields, system prompt, chat template and
// exact-match from the flags. The commands add their LoRA, training, batch and label settings.
v1::RunConfig CommandRunConfig(const std::string& model, bool decoder, int max_seq_len,
                               const PrecisionFlags& precision, const DecoderDataFlags& data,
                               const EncoderDataFlags& fields);

// Writes a little-endian .npy (format version 1.0) holding a C-order array of `shape`.
absl::Status WriteNpyFloat(const std::string& path, const std::vector<float>& data,
                           const std::vector<int64_t>& shape);
absl::Status WriteNpyInt32(const std::string& path, const std::vector<int32_t>& data,
                           const std::vector<int64_t>& shape);

// The training options as metrics.json records them.
nlohmann::json TrainOptionsJson(const TrainOptions& o);

// Whether `path` names an existing directory / regular file.
bool IsDirectory(const std::string& path);
bool IsRegularFile(const std::string& path);

}  // namespace fedlora::tools
