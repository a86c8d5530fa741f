// fedlora merge: an adapter folded into its base, as a Hugging Face model directory that
// transformers loads with no PEFT (model/merge.h).
//
//   fedlora merge --adapter runs/x/adapter --out runs/x/merged [--model PATH]
#include <iostream>
#include <string>

#include "model/merge.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/flags.h"

namespace fedlora::tools {

int RunMerge(int argc, char** argv) {
  const std::string command = argv[0];
  std::string adapter, out, model;
  FlagSet flags(command,
                "Writes the base model with an adapter's LoRA deltas folded in (W + alpha/r * B @ "
                "A) as a Hugging\n"
                "Face model directory (model.safetensors, config.json, tokenizer files) that "
                "transformers loads\n"
                "without PEFT; a classifier's head and labels (id2label) included. The base must "
                "be a safetensors\n"
                "checkpoint: for a GGUF base use `fedlora export --adapter DIR --gguf OUT.gguf` "
                "and llama.cpp's --lora.");
  flags.AddString("adapter", &adapter,
                  "the adapter directory (train, simulate, server --out, export, or PEFT)",
                  /*required=*/true);
  flags.AddString("out", &out,
                  "the model directory to write (replaced whole if merge wrote it before)",
                  /*required=*/true);
  flags.AddString("model", &model,
                  "the base model, where the adapter's record does not name it from here");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (!flags.positional().empty())
    return UsageError(command, "unexpected argument '" + flags.positional()[0] + "'");
  if (absl::Status s = MergeAdapter(adapter, model, out); !s.ok()) return Fail(command, s);
  std::cout << adapter << " merged into its base, written to " << out << std::endl;
  return kExitOk;
}

}  // namespace fedlora::tools
