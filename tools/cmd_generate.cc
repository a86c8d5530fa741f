// fedlora generate: completions of a decoder (optionally with a LoRA adapter) for prompts: greedy, or
// sampled (--temperature, --top-k, --top-p, --seed; model/sampling.h), printed at the end or as
// they come (--stream); --prompt - and --prompts - read stdin.
//
//   fedlora generate --model models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
//       --prompt "What is the capital of France?" [--adapter runs/x/adapter] [--max-new-tokens 64]
//
// The prompt is a user message rendered with the model's chat template (or --chat-template NAME);
// --raw sends it as plain text instead. --prompts FILE reads one JSON object a line, {"prompt": ...}
// (or {"messages": [...]}), and prints one JSON object a line, {"prompt": ..., "completion": ...}.
// Generation stops at the end-of-turn or end-of-sequence token, which is not printed. With an
// adapter that records its run's system prompt and chat template (fedlora_adapter.json), those are
// --system's and --chat-template's defaults; a flag that differs wins and is said on stderr.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "kernels/base/context.h"
#include "kernels/threads.h"
#include "model/decoder.h"
#include "model/decoder_tokenizer.h"
#include "model/sampling.h"
#include "tools/common.h"
#include "workload/factory.h"
#include "workload/lora_model.h"

namespace fedlora::tools {
namespace {

struct GenerateFlags {
  std::string model, adapter, prompt, prompts, chat_template, system;
  bool raw = false;
  bool stream = false;
  SamplingOptions sampling;
  bool seed_given = false;
  int max_new_tokens = 64;
  int threads = 0;
  std::string device = "cpu";  // --device: cpu, cuda, auto
  bool system_given = false, chat_template_given = false;
};

absl::StatusOr<std::vector<ChatMessage>> MessagesOf(const nlohmann::json& line,
                                                    const std::string& what) {
  if (line.contains("messages")) {
    const nlohmann::json& m = line["messages"];
    if (!m.is_array()) return absl::InvalidArgumentError(what + ": \"messages\" is not an array");
    std::vector<ChatMessage> out;
    for (const auto& item : m) {
      FEDLORA_ASSIGN_OR_RETURN(std::string role, GetString(item, "role", what));
      FEDLORA_ASSIGN_OR_RETURN(std::string content, GetString(item, "content", what));
      out.push_back({role, content});
    }
    return out;
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string prompt, GetString(line, "prompt", what));
  return std::vector<ChatMessage>{{"user", prompt}};
}

// --model must be a decoder checkpoint.
absl::Status CheckDecoderModel(const std::string& model) {
  if (!std::filesystem::exists(model))
    return absl::NotFoundError(absl::StrCat("--model ", model, " does not exist"));
  if (!IsDecoderCheckpoint(model)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model ", model,
        " is not a decoder checkpoint (a LLaMA or Qwen2 directory with config.json, or a "
        ".gguf): generate writes text with a decoder; an encoder classifies (fedlora eval) or "
        "embeds (fedlora embed)"));
  }
  return absl::OkStatus();
}

// The conversations to complete: --prompt ("-": read from stdin into f.prompt), or one a line of
// --prompts.
absl::StatusOr<std::vector<std::vector<ChatMessage>>> ReadConversations(GenerateFlags& f) {
  std::vector<std::vector<ChatMessage>> conversations;
  if (f.prompt == "-") {
    f.prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    while (!f.prompt.empty() && (f.prompt.back() == '\n' || f.prompt.back() == '\r'))
      f.prompt.pop_back();
    if (f.prompt.empty()) return absl::InvalidArgumentError("--prompt -: stdin held no prompt");
  }
  if (!f.prompts.empty()) {
    std::ifstream file;
    if (f.prompts != "-") file.open(f.prompts);
    std::istream& in = f.prompts == "-" ? std::cin : file;
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", f.prompts));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string what = absl::StrCat(f.prompts, ":", n);
      FEDLORA_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(line, what));
      FEDLORA_ASSIGN_OR_RETURN(auto messages, MessagesOf(j, what));
      conversations.push_back(std::move(messages));
    }
  } else {
    conversations.push_back({{"user", f.prompt}});
  }
  return conversations;
}

// Each conversation (after --system, when given) as token ids: rendered with the chat template,
// or its messages' text as is with --raw; and the text of its last message.
void EncodePrompts(const GenerateFlags& f, const DecoderTokenizer& tok,
                   std::vector<std::vector<ChatMessage>>& conversations,
                   std::vector<std::vector<int32_t>>* prompts, std::vector<std::string>* texts) {
  for (auto& messages : conversations) {
    if (!f.system.empty()) messages.insert(messages.begin(), {"system", f.system});
    std::string text;
    if (f.raw) {
      for (const ChatMessage& m : messages) text += m.content;
      prompts->push_back(tok.tokenizer->Encode(text, /*add_special=*/true));
    } else {
      text = tok.chat->Render(messages, /*add_generation_prompt=*/true);
      prompts->push_back(tok.tokenizer->Encode(text, /*add_special=*/false));
    }
    texts->push_back(messages.back().content);
  }
}

// The decoder through the workload factory (as train and eval load theirs), with --adapter when
// given, planned for one conversation of `longest` prompt tokens and the new ones (clamped to the
// checkpoint's positions: CausalLm::Generate then refuses a prompt too long for them).
absl::StatusOr<Workload> LoadLm(const GenerateFlags& f, Device device, size_t longest) {
  v1::RunConfig config =
      CommandRunConfig(f.model, /*decoder=*/true, static_cast<int>(longest) + f.max_new_tokens,
                       PrecisionFlags{}, DecoderDataFlags{}, EncoderDataFlags{});
  config.mutable_training()->set_batch_size(1);
  return LoadWorkload(config, {.model_path = f.model,
                               .device = device,
                               .role = ModelRole::kEvaluate,
                               .adapter_path = f.adapter});
}

// The flags' generation settings; sampling without --seed draws one and logs it.
CausalLm::GenerateOptions GenerationOptions(const GenerateFlags& f, const DecoderTokenizer& tok) {
  CausalLm::GenerateOptions g;
  g.max_new_tokens = f.max_new_tokens;
  g.stop_ids = tok.stop_ids();
  g.sampling = f.sampling;
  if (!g.sampling.greedy() && !f.seed_given) {
    g.sampling.seed = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
    FEDLORA_LOG(INFO) << "sampling with --seed " << g.sampling.seed
                      << " (pass it to repeat this output)";
  }
  return g;
}

// Generates each prompt's completion and prints it: as it comes (--stream), as plain text
// (--prompt), or as a JSON line with its prompt (--prompts).
absl::Status PrintCompletions(const GenerateFlags& f, const DecoderTokenizer& tok, CausalLm& lm,
                              CausalLm::GenerateOptions g,
                              const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<std::string>& texts) {
  // --stream: each token's text as soon as it is whole (a multi-byte character may take several).
  std::vector<int32_t> so_far;
  std::string printed;
  if (f.stream) {
    g.on_token = [&](int32_t t) {
      if (std::find(g.stop_ids.begin(), g.stop_ids.end(), t) != g.stop_ids.end()) return;
      so_far.push_back(t);
      const std::string text = tok.tokenizer->Decode(so_far, /*skip_special=*/true);
      if (text.starts_with(printed) && !text.ends_with("\xEF\xBF\xBD")) {
        std::cout << text.substr(printed.size()) << std::flush;
        printed = text;
      }
    };
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<int32_t> out, lm.Generate(prompts[i], g));
    if (!out.empty() &&
        std::find(g.stop_ids.begin(), g.stop_ids.end(), out.back()) != g.stop_ids.end())
      out.pop_back();
    const std::string completion = tok.tokenizer->Decode(out, /*skip_special=*/true);
    if (f.stream) {
      std::cout << (completion.starts_with(printed) ? completion.substr(printed.size()) : "")
                << "\n";
    } else if (f.prompts.empty()) {
      std::cout << completion << "\n";
    } else {
      std::cout << nlohmann::json{{"prompt", texts[i]}, {"completion", completion}}.dump() << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status Generate(GenerateFlags f) {
  FEDLORA_RETURN_IF_ERROR(CheckDecoderModel(f.model));
  FEDLORA_ASSIGN_OR_RETURN(const Device device, ResolveDevice(f.device));
  if (!f.raw) {
    FEDLORA_RETURN_IF_ERROR(ApplyAdapterSettings("fedlora generate", f.adapter,
                                                 {.system = &f.system,
                                                  .system_given = f.system_given,
                                                  .chat_template = &f.chat_template,
                                                  .chat_template_given = f.chat_template_given}));
  }
  kernels::SetNumThreads(f.threads);
  FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok, LoadDecoderTokenizer(f.model, f.chat_template));
  if (!f.raw && !tok.chat.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.model,
        " has no chat template: pass --chat-template chatml|smollm2|qwen2|llama3, or --raw"));
  }
  // The prompts, as token ids ("-": from stdin).
  FEDLORA_ASSIGN_OR_RETURN(std::vector<std::vector<ChatMessage>> conversations,
                           ReadConversations(f));
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;
  EncodePrompts(f, tok, conversations, &prompts, &texts);
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  FEDLORA_ASSIGN_OR_RETURN(Workload w, LoadLm(f, device, longest));
  CausalLm& lm = static_cast<CausalLmModel&>(*w.models[0]).model();
  return PrintCompletions(f, tok, lm, GenerationOptions(f, tok), prompts, texts);
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  const std::string command = argv[0];
  GenerateFlags f;
  FlagSet flags(command,
                "Completions of a decoder (and a LoRA adapter) for prompts: greedy, or sampled "
                "with --temperature.");
  flags.AddString("model", &f.model,
                  "decoder: a .gguf file or a directory with config.json and safetensors", true);
  flags.AddString("adapter", &f.adapter,
                  "PEFT LoRA adapter directory (from fedlora train or PEFT)");
  flags.AddString("prompt", &f.prompt, "the user message (-: read it from stdin)");
  flags.AddString("prompts", &f.prompts,
                  "JSONL file of {\"prompt\": ...} or {\"messages\": [...]} (-: stdin)");
  flags.AddString("system", &f.system, "a system message before the prompt");
  flags.SetDefaultText("system", "the adapter's, else none");
  flags.AddString("chat-template", &f.chat_template,
                  "chatml, smollm2, qwen2 or llama3 instead of the model's");
  flags.SetDefaultText("chat-template", "the adapter's, else the model's");
  flags.AddBool("raw", &f.raw, "send the prompt as plain text, without a chat template");
  flags.AddInt("max-new-tokens", &f.max_new_tokens, "tokens to generate at most");
  flags.AddFloat("temperature", &f.sampling.temperature,
                 "0: greedy; > 0: sample from softmax(logits / temperature)");
  flags.AddInt("top-k", &f.sampling.top_k, "sampling: keep the k most likely tokens (0: all)");
  flags.AddFloat("top-p", &f.sampling.top_p,
                 "sampling: keep the fewest most likely tokens holding this probability");
  flags.AddUint("seed", &f.sampling.seed,
                "sampling: the random stream (the same seed gives the same output)");
  flags.SetDefaultText("seed", "random, logged");
  flags.AddBool("stream", &f.stream, "print the completion as it is generated (with --prompt)");
  flags.AddInt("threads", &f.threads, "CPU threads (0: all cores)");
  flags.AddString("device", &f.device, "cpu, cuda or auto (the GPU when one is usable)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (!flags.positional().empty())
    return UsageError(command, "unexpected argument '" + flags.positional()[0] + "'");
  f.system_given = flags.WasSet("system");
  f.chat_template_given = flags.WasSet("chat-template");
  if (f.prompt.empty() == f.prompts.empty())
    return UsageError(command, "give exactly one of --prompt and --prompts");
  if (f.max_new_tokens < 1 || f.max_new_tokens > 32768)
    return UsageError(command, "--max-new-tokens must be in [1, 32768]");
  f.seed_given = flags.WasSet("seed");
  if (absl::Status s = CheckSamplingOptions(f.sampling); !s.ok())
    return UsageError(command, std::string(s.message()));
  if (f.sampling.greedy() && (flags.WasSet("top-k") || flags.WasSet("top-p") || f.seed_given)) {
    return UsageError(
        command, "--top-k, --top-p and --seed shape sampling: give --temperature > 0 with them");
  }
  if (f.stream && !f.prompts.empty())
    return UsageError(command, "--stream goes with --prompt, not --prompts");
  if (f.threads < 0) return UsageError(command, "--threads must be >= 0");
  if (absl::Status s = Generate(f); !s.ok()) return Fail(command, s);
  return kExitOk;
}

}  // namespace fedlora::tools
