#include "tools/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/did_you_mean.h"

namespace fedlora::tools {
namespace {

absl::Status BadValue(const std::string& name, const std::string& value, const std::string& type) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, ": '", value, "' is not a valid ", type));
}

}  // namespace

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::Add(Flag flag) { flags_.push_back(std::move(flag)); }

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

void FlagSet::AddString(const std::string& name, std::string* out, const std::string& help,
                        bool required) {
  Add({name, help, out->empty() ? "" : *out, "string", false, required, false,
       [out](const std::string& v) {
         *out = v;
         return absl::OkStatus();
       }});
}

void FlagSet::AddInt(const std::string& name, int64_t* out, const std::string& help,
                     bool required) {
  Add({name, help, absl::StrCat(*out), "int", false, required, false,
       [name, out](const std::string& v) {
         int64_t x;
         if (!absl::SimpleAtoi(v, &x)) return BadValue(name, v, "integer");
         *out = x;
         return absl::OkStatus();
       }});
}

void FlagSet::AddInt(const std::string& name, int* out, const std::string& help, bool required) {
  Add({name, help, absl::StrCat(*out), "int", false, required, false,
       [name, out](const std::string& v) {
         int x;  // SimpleAtoi into int rejects values outside int's range
         if (!absl::SimpleAtoi(v, &x)) return BadValue(name, v, "integer");
         *out = x;
         return absl::OkStatus();
       }});
}

void FlagSet::AddUint(const std::string& name, uint64_t* out, const std::string& help) {
  Add({name, help, absl::StrCat(*out), "uint", false, false, false,
       [name, out](const std::string& v) {
         uint64_t x;
         if (v.empty() || v[0] == '-' || !absl::SimpleAtoi(v, &x))
           return BadValue(name, v, "non-negative integer");
         *out = x;
         return absl::OkStatus();
       }});
}

void FlagSet::AddFloat(const std::string& name, float* out, const std::string& help) {
  Add({name, help, absl::StrFormat("%g", *out), "float", false, false, false,
       [name, out](const std::string& v) {
         float x;
         if (!absl::SimpleAtof(v, &x) || !std::isfinite(x))
           return BadValue(name, v, "finite number");
         *out = x;
         return absl::OkStatus();
       }});
}

void FlagSet::AddBool(const std::string& name, bool* out, const std::string& help) {
  Flag f{name,
         help,
         *out ? "true" : "false",
         "bool",
         true,
         false,
         false,
         [name, out](const std::string& v) {
           bool x;
           if (!absl::SimpleAtob(v, &x)) return BadValue(name, v, "boolean (true/false)");
           *out = x;
           return absl::OkStatus();
         }};
  Add(std::move(f));
}

void FlagSet::AddChoice(const std::string& name, std::string* out, std::vector<std::string> choices,
                        const std::string& help) {
  const std::string type = absl::StrJoin(choices, "|");
  Add({name, help, *out, type, false, false, false, [name, out, choices](const std::string& v) {
         for (const std::string& c : choices) {
           if (absl::EqualsIgnoreCase(c, v)) {
             *out = c;
             return absl::OkStatus();
           }
         }
         std::string message =
             absl::StrCat("--", name, ": unknown value '", v,
                          "'; valid: ", absl::StrJoin(choices, ", "), " (any case)");
         if (auto near = NearestName(v, choices))
           absl::StrAppend(&message, "; did you mean ", *near, "?");
         return absl::InvalidArgumentError(message);
       }});
}

void FlagSet::AddRenamed(const std::string& old_name, const std::string& new_name,
                         const std::string& why) {
  renamed_.push_back({old_name, new_name, why});
}

void FlagSet::SetDefaultText(const std::string& name, std::string text) {
  if (Flag* f = Find(name)) f->default_text = std::move(text);
}

bool FlagSet::Has(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return true;
  }
  return false;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status FlagSet::Parse(int argc, char** argv) {
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flags_done || arg.empty() || arg[0] != '-' || arg == "-") {
      positional_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      help_requested_ = true;
      continue;
    }
    // Accept "--name" and "-name", then split off "=value"; messages name the flag as typed.
    std::string body = arg.substr(arg.rfind("--", 0) == 0 ? 2 : 1);
    std::string value;
    bool has_value = false;
    if (const size_t eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
      has_value = true;
    }
    const std::string typed = arg.substr(0, arg.find('='));
    Flag* flag = Find(body);
    if (flag == nullptr && body == "v" && Has("verbose")) flag = Find("verbose");
    bool negated = false;
    if (flag == nullptr && body.rfind("no-", 0) == 0) {
      if (Flag* b = Find(body.substr(3)); b != nullptr && b->is_bool) {
        if (has_value) return absl::InvalidArgumentError(absl::StrCat(typed, " takes no value"));
        flag = b;
        negated = true;
      }
    }
    if (flag == nullptr) return UnknownFlag(typed, body);
    if (flag->set)
      return absl::InvalidArgumentError(absl::StrCat("--", flag->name, " given more than once"));
    if (!has_value) {
      if (flag->is_bool) {
        value = negated ? "false" : "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(typed, " needs a ", flag->type, " value"));
      }
    }
    if (absl::Status s = flag->parse(value); !s.ok()) return s;
    flag->set = true;
  }
  if (help_requested_) return absl::OkStatus();
  for (const Flag& f : flags_) {
    if (f.required && !f.set) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing required flag --", f.name, " (see '", command_, " --help')"));
    }
  }
  return absl::OkStatus();
}

absl::Status FlagSet::UnknownFlag(const std::string& typed, const std::string& body) const {
  const std::string plain = body.rfind("no-", 0) == 0 ? body.substr(3) : body;
  for (const Renamed& r : renamed_) {
    if (r.old_name == body || r.old_name == plain) {
      return absl::InvalidArgumentError(absl::StrCat(typed, " was renamed to --", r.new_name, " (",
                                                     r.why, "; see '", command_, " --help')"));
    }
  }
  std::string message = absl::StrCat("unknown flag ", typed, " for '", command_, "'");
  std::vector<std::string> names;
  for (const Flag& f : flags_) names.push_back(f.name);
  if (auto near = NearestName(body, names))
    absl::StrAppend(&message, "; did you mean --", *near, "?");
  absl::StrAppend(&message, " (see '", command_, " --help')");
  return absl::InvalidArgumentError(message);
}

std::string FlagSet::Help() const {
  std::string out = absl::StrCat("usage: ", command_, " [flags]\n", summary_, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    std::string left = f.is_bool ? absl::StrCat("  --[no-]", f.name)
                                 : absl::StrCat("  --", f.name, " <", f.type, ">");
    if (f.name == "verbose") left = "  -v, --[no-]verbose";
    absl::StrAppend(&out, absl::StrFormat("%-28s %s", left, f.help));
    if (f.required) {
      absl::StrAppend(&out, " (required)");
    } else if (!f.default_text.empty()) {
      absl::StrAppend(&out, " (default: ", f.default_text, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, absl::StrFormat("%-28s %s\n", "  -h, --help", "show this help"));
  return out;
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    absl::string_view trimmed = absl::StripAsciiWhitespace(piece);
    if (!trimmed.empty()) out.emplace_back(trimmed);
  }
  return out;
}

}  // namespace fedlora::tools
