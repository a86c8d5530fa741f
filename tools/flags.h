// Per-subcommand command-line flags for the `fedlora` tool.
//
//   FlagSet flags("fedlora train", "Fine-tunes LoRA adapters of a model on one dataset.");
//   std::string model_dir;
//   int64_t epochs = 3;
//   flags.AddString("model", &model_dir, "model directory (config.json, *.safetensors)",
//   /*required=*/true); flags.AddInt("epochs", &epochs, "passes over the training data");
//   FEDLORA_RETURN_IF_ERROR(flags.Parse(argc, argv));   // argv[0] is the subcommand name
//   if (flags.help_requested()) { std::cout << flags.Help(); return 0; }
//
// Why not absl::flags: its flags are process-wide globals, so every subcommand would accept every
// other subcommand's flags, and `fedlora eval --epochs 3` would pass silently. A FlagSet holds
// only its own command's flags, rejects anything else by name, and prints its own help.
//
// Syntax: `--name value` or `--name=value`; booleans also as bare `--name` (true), `--no-name`
// (false) or `--name=false`. `-h`/`--help` requests help; `-v` is `--verbose` where a command has
// it. `--` ends flags. Anything else not starting with `-` is a positional argument. Errors name a
// flag as it was typed, with the nearest flag name or, for a renamed flag, its new name. Values are checked in full ("12x" is not an integer) and against
// the type's range; a choice's value in any case. Not thread-safe; one FlagSet per parse.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fedlora::tools {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  // Each Add* registers --name writing into *out; the current *out is the default shown in help.
  void AddString(const std::string& name, std::string* out, const std::string& help,
                 bool required = false);
  void AddInt(const std::string& name, int64_t* out, const std::string& help,
              bool required = false);
  void AddInt(const std::string& name, int* out, const std::string& help, bool required = false);
  void AddUint(const std::string& name, uint64_t* out, const std::string& help);
  void AddFloat(const std::string& name, float* out, const std::string& help);
  void AddBool(const std::string& name, bool* out, const std::string& help);
  // Shows `text` as --name's default in help instead of its initial value: for a sentinel such as
  // -1 meaning "the config's".
  void SetDefaultText(const std::string& name, std::string text);
  // Refuses --old_name (and --no-old_name) with "--old_name was renamed to --new_name (why)", for a
  // flag whose name moved: each name means one thing across the commands. Not shown in help.
  void AddRenamed(const std::string& old_name, const std::string& new_name, const std::string& why);
  // A value from `choices` (lowercase), matched in any case as the run config's enum values are, and
  // stored as spelt in `choices` ("--optimizer ADAMW" -> "adamw"). Anything else is refused with
  // the valid values and the nearest one.
  void AddChoice(const std::string& name, std::string* out, std::vector<std::string> choices,
                 const std::string& help);

  // Parses argv[1..argc). InvalidArgument, naming the flag, for an unknown flag, a missing or
  // malformed value, a repeated flag, or (unless help was requested) a missing required flag.
  absl::Status Parse(int argc, char** argv);

  bool help_requested() const { return help_requested_; }
  // Whether --name appeared on the command line.
  bool WasSet(const std::string& name) const;
  // Whether --name is registered.
  bool Has(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  // "usage: <command> [flags]\n<summary>\n\nflags:\n  --name  help (default: x)\n..."
  std::string Help() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    std::string type;  // "string", "int", "float", "bool": shown in help and errors
    bool is_bool = false;
    bool required = false;
    bool set = false;
    std::function<absl::Status(const std::string&)> parse;
  };
  void Add(Flag flag);
  absl::Status UnknownFlag(const std::string& typed, const std::string& body) const;
  Flag* Find(const std::string& name);

  std::string command_;
  std::string summary_;
  struct Renamed {
    std::string old_name, new_name, why;
  };
  std::vector<Flag> flags_;
  std::vector<Renamed> renamed_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

// Splits "query,value" into {"query", "value"}, trimming spaces and dropping empty items.
std::vector<std::string> SplitList(const std::string& text);

}  // namespace fedlora::tools
