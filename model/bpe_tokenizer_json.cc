// BpeTokenizer::FromTokenizerJson: a Hugging Face tokenizer.json to a BpeTokenizer::Spec. Every
// field is either understood or refused; nothing is silently ignored.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/json.h"
#include "core/status.h"
#include "core/strings.h"
#include "model/bpe_tokenizer.h"

namespace fedlora {
namespace {

using nlohmann::json;

constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;

absl::Status Refuse(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// Refuses keys of `obj` outside `known`: an unknown option may change the ids.
absl::Status OnlyKeys(const json& obj, const std::string& field,
                      std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Refuse(absl::StrCat(field, ".", key), "this field is not supported");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TypeOf(const json& obj, const std::string& field) {
  if (!obj.is_object())
    return Refuse(field, absl::StrCat("expected an object, got ", ToAbsl(JsonTypeName(obj))));
  return GetString(obj, "type", field);
}

// A JSON field that must be null or absent (or, with `allow_empty`, "").
absl::Status MustBeUnset(const json& obj, const std::string& key, const std::string& field,
                         bool allow_empty) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (allow_empty && it->is_string() && it->get<std::string>().empty()) return absl::OkStatus();
  return Refuse(absl::StrCat(field, ".", key),
                absl::StrCat("is ", it->dump(), "; only null is supported"));
}

absl::Status ParseNormalizer(const json& n, const std::string& field, bool* nfc) {
  if (n.is_null()) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(std::string type, TypeOf(n, field));
  if (type == "NFC") {
    FEDLORA_RETURN_IF_ERROR(OnlyKeys(n, field, {"type"}));
    *nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    FEDLORA_RETURN_IF_ERROR(OnlyKeys(n, field, {"type", "normalizers"}));
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array())
      return Refuse(field, "Sequence without a \"normalizers\" array");
    for (size_t i = 0; i < it->size(); ++i) {
      FEDLORA_RETURN_IF_ERROR(
          ParseNormalizer((*it)[i], absl::StrCat(field, ".normalizers[", i, "]"), nfc));
    }
    return absl::OkStatus();
  }
  return Refuse(field, absl::StrCat("normalizer type ", type, " is not supported (only NFC)"));
}

absl::Status ParsePreTokenizer(const json& p, const std::string& field, bpe::PreTokenizer* pre) {
  FEDLORA_ASSIGN_OR_RETURN(std::string type, TypeOf(p, field));
  if (pre->has_byte_level()) return Refuse(field, "ByteLevel must be the last pre-tokenizer");
  if (type == "Sequence") {
    FEDLORA_RETURN_IF_ERROR(OnlyKeys(p, field, {"type", "pretokenizers"}));
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array())
      return Refuse(field, "Sequence without a \"pretokenizers\" array");
    for (size_t i = 0; i < it->size(); ++i) {
      FEDLORA_RETURN_IF_ERROR(
          ParsePreTokenizer((*it)[i], absl::StrCat(field, ".pretokenizers[", i, "]"), pre));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    FEDLORA_RETURN_IF_ERROR(
        OnlyKeys(p, field, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    FEDLORA_ASSIGN_OR_RETURN(bool add_prefix_space, GetBoolOr(p, "add_prefix_space", true, field));
    FEDLORA_ASSIGN_OR_RETURN(bool use_regex, GetBoolOr(p, "use_regex", true, field));
    FEDLORA_RETURN_IF_ERROR(GetBoolOr(p, "trim_offsets", true, field).status());  // offsets only
    return pre->SetByteLevel(add_prefix_space, use_regex);
  }
  if (type == "Digits") {
    FEDLORA_RETURN_IF_ERROR(OnlyKeys(p, field, {"type", "individual_digits"}));
    FEDLORA_ASSIGN_OR_RETURN(bool individual, GetBoolOr(p, "individual_digits", false, field));
    // Runs of numeric characters are Contiguous, which Isolated on a run of them equals.
    auto re = bpe::Regex::Shared(individual ? std::string(bpe::kDigitPattern)
                                            : std::string(bpe::kDigitPattern) + "+");
    if (!re.ok()) return Annotate(re.status(), field);
    pre->AddSplit(*std::move(re), false);
    return absl::OkStatus();
  }
  if (type == "Split") {
    FEDLORA_RETURN_IF_ERROR(OnlyKeys(p, field, {"type", "pattern", "behavior", "invert"}));
    FEDLORA_ASSIGN_OR_RETURN(bool invert, GetBoolOr(p, "invert", false, field));
    if (invert) return Refuse(absl::StrCat(field, ".invert"), "true is not supported");
    FEDLORA_ASSIGN_OR_RETURN(std::string behavior, GetString(p, "behavior", field));
    if (behavior != "Isolated" && behavior != "Removed") {
      return Refuse(absl::StrCat(field, ".behavior"),
                    absl::StrCat(behavior, " is not supported (only Isolated and Removed)"));
    }
    auto pit = p.find("pattern");
    if (pit == p.end() || !pit->is_object() || pit->size() != 1) {
      return Refuse(absl::StrCat(field, ".pattern"),
                    "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string pfield = absl::StrCat(field, ".pattern");
    absl::StatusOr<std::shared_ptr<const bpe::Regex>> re = absl::InvalidArgumentError("");
    if (pit->contains("Regex")) {
      FEDLORA_ASSIGN_OR_RETURN(std::string pattern, GetString(*pit, "Regex", pfield));
      re = bpe::Regex::Shared(pattern);
    } else if (pit->contains("String")) {
      FEDLORA_ASSIGN_OR_RETURN(std::string literal, GetString(*pit, "String", pfield));
      re = bpe::Regex::Literal(literal);
    } else {
      return Refuse(pfield, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    if (!re.ok()) return Annotate(re.status(), pfield);
    pre->AddSplit(*std::move(re), behavior == "Removed");
    return absl::OkStatus();
  }
  return Refuse(field, absl::StrCat("pre-tokenizer type ", type,
                                    " is not supported (ByteLevel, Split, Digits, Sequence)"));
}

// TemplateProcessing's single template: special tokens before and after $A.
absl::Status ParseTemplate(const json& p, const std::string& field, std::vector<int32_t>* prefix,
                           std::vector<int32_t>* suffix) {
  FEDLORA_RETURN_IF_ERROR(OnlyKeys(p, field, {"type", "single", "pair", "special_tokens"}));
  auto single = p.find("single");
  auto specials = p.find("special_tokens");
  if (single == p.end() || !single->is_array()) return Refuse(field, "no \"single\" array");
  if (specials == p.end() || !specials->is_object())
    return Refuse(field, "no \"special_tokens\" object");
  bool seen_a = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string ifield = absl::StrCat(field, ".single[", i, "]");
    if (!item.is_object() || item.size() != 1)
      return Refuse(ifield, "expected {\"SpecialToken\"|\"Sequence\": ...}");
    if (item.contains("Sequence")) {
      FEDLORA_ASSIGN_OR_RETURN(std::string id, GetString(item["Sequence"], "id", ifield));
      if (id != "A" || seen_a)
        return Refuse(ifield, "the single template must hold $A exactly once");
      seen_a = true;
      continue;
    }
    if (!item.contains("SpecialToken"))
      return Refuse(ifield, "expected {\"SpecialToken\"|\"Sequence\": ...}");
    FEDLORA_ASSIGN_OR_RETURN(std::string name, GetString(item["SpecialToken"], "id", ifield));
    auto st = specials->find(name);
    if (st == specials->end())
      return Refuse(ifield, absl::StrCat("special token ", name, " is not in special_tokens"));
    FEDLORA_ASSIGN_OR_RETURN(
        std::vector<int64_t> ids,
        GetIntArray(*st, "ids", absl::StrCat(field, ".special_tokens.", name)));
    for (int64_t id : ids) {
      if (id < 0 || id > kMaxId) return Refuse(ifield, absl::StrCat("id ", id, " out of range"));
      (seen_a ? suffix : prefix)->push_back(static_cast<int32_t>(id));
    }
  }
  if (!seen_a) return Refuse(field, "the single template has no $A");
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const json& p, const std::string& field,
                                std::vector<int32_t>* prefix, std::vector<int32_t>* suffix,
                                bool* seen_template) {
  if (p.is_null()) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(std::string type, TypeOf(p, field));
  if (type == "ByteLevel") {  // adjusts offsets only
    return OnlyKeys(p, field, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
  }
  if (type == "TemplateProcessing") {
    if (*seen_template) return Refuse(field, "a second TemplateProcessing");
    *seen_template = true;
    return ParseTemplate(p, field, prefix, suffix);
  }
  if (type == "Sequence") {
    FEDLORA_RETURN_IF_ERROR(OnlyKeys(p, field, {"type", "processors"}));
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array())
      return Refuse(field, "Sequence without a \"processors\" array");
    for (size_t i = 0; i < it->size(); ++i) {
      FEDLORA_RETURN_IF_ERROR(ParsePostProcessor(
          (*it)[i], absl::StrCat(field, ".processors[", i, "]"), prefix, suffix, seen_template));
    }
    return absl::OkStatus();
  }
  return Refuse(field, absl::StrCat("post-processor type ", type,
                                    " is not supported (ByteLevel, TemplateProcessing, Sequence)"));
}

absl::Status ParseDecoder(const json& d, const std::string& field) {
  if (d.is_null())
    return Refuse(field, "null (tokens joined by spaces) is not supported; expected ByteLevel");
  FEDLORA_ASSIGN_OR_RETURN(std::string type, TypeOf(d, field));
  if (type != "ByteLevel")
    return Refuse(field, absl::StrCat("decoder type ", type, " is not supported (only ByteLevel)"));
  return OnlyKeys(d, field, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
}

absl::Status ParseModel(const json& m, BpeTokenizer::Spec* spec, std::string* unk_token) {
  const std::string field = "model";
  FEDLORA_ASSIGN_OR_RETURN(std::string type, TypeOf(m, field));
  if (type != "BPE")
    return Refuse("model.type", absl::StrCat(type, " is not supported (only BPE)"));
  FEDLORA_RETURN_IF_ERROR(
      OnlyKeys(m, field,
               {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}));
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return Refuse("model.dropout", absl::StrCat(it->dump(), ": BPE dropout is not supported"));
    }
  }
  FEDLORA_RETURN_IF_ERROR(MustBeUnset(m, "continuing_subword_prefix", field, true));
  FEDLORA_RETURN_IF_ERROR(MustBeUnset(m, "end_of_word_suffix", field, true));
  FEDLORA_ASSIGN_OR_RETURN(bool byte_fallback, GetBoolOr(m, "byte_fallback", false, field));
  if (byte_fallback)
    return Refuse("model.byte_fallback", "true (SentencePiece-style byte tokens) is not supported");
  FEDLORA_ASSIGN_OR_RETURN(spec->fuse_unk, GetBoolOr(m, "fuse_unk", false, field));
  FEDLORA_ASSIGN_OR_RETURN(spec->ignore_merges, GetBoolOr(m, "ignore_merges", false, field));
  FEDLORA_ASSIGN_OR_RETURN(*unk_token, GetStringOr(m, "unk_token", "", field));

  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object()) return Refuse("model.vocab", "missing or not an object");
  int64_t max_id = -1;
  for (const auto& [token, id] : vit->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxId) {
      return Refuse(absl::StrCat("model.vocab[\"", token, "\"]"),
                    absl::StrCat("not an id in [0, ", kMaxId, "]"));
    }
    if (token.empty()) return Refuse("model.vocab", "an empty token");
    max_id = std::max(max_id, id.get<int64_t>());
  }
  const int64_t entries = static_cast<int64_t>(vit->size());
  if (max_id + 1 - entries > 65536) {
    return Refuse("model.vocab",
                  absl::StrCat("the largest id is ", max_id, " for ", entries, " tokens"));
  }
  spec->id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  spec->present.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vit->items()) {
    const auto i = static_cast<size_t>(id.get<int64_t>());
    if (spec->present[i]) {
      return Refuse("model.vocab", absl::StrCat("tokens '", spec->id_to_token[i], "' and '", token,
                                                "' share id ", i));
    }
    spec->present[i] = true;
    spec->id_to_token[i] = token;
  }

  auto mit = m.find("merges");
  if (mit == m.end() || !mit->is_array()) return Refuse("model.merges", "missing or not an array");
  spec->merges.reserve(mit->size());
  for (size_t r = 0; r < mit->size(); ++r) {
    const json& item = (*mit)[r];
    const std::string mfield = absl::StrCat("model.merges[", r, "]");
    if (item.is_string()) {
      const std::string s = item.get<std::string>();
      const size_t sp = s.find(' ');
      // HF splits on ' ' and wants exactly two parts.
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Refuse(mfield, absl::StrCat("'", s, "' is not 'left right'"));
      }
      spec->merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (item.is_array() && item.size() == 2 && item[0].is_string() && item[1].is_string()) {
      spec->merges.emplace_back(item[0].get<std::string>(), item[1].get<std::string>());
    } else {
      return Refuse(mfield, "expected \"left right\" or [\"left\", \"right\"]");
    }
  }
  return absl::OkStatus();
}

// added_tokens, with the ids Hugging Face assigns checked against the file's.
absl::Status ParseAddedTokens(const json& list,
                              const absl::flat_hash_map<std::string, int32_t>& model_vocab,
                              BpeTokenizer::Spec* spec) {
  if (list.is_null()) return absl::OkStatus();
  if (!list.is_array()) return Refuse("added_tokens", "not an array");
  absl::flat_hash_map<std::string, int32_t> added;
  int64_t max_added = -1;
  const auto model_size = static_cast<int64_t>(model_vocab.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object()) return Refuse(field, "not an object");
    FEDLORA_RETURN_IF_ERROR(OnlyKeys(
        t, field, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}));
    BpeTokenizer::AddedToken a;
    FEDLORA_ASSIGN_OR_RETURN(int64_t id, GetInt(t, "id", field));
    FEDLORA_ASSIGN_OR_RETURN(a.content, GetString(t, "content", field));
    FEDLORA_ASSIGN_OR_RETURN(bool single_word, GetBoolOr(t, "single_word", false, field));
    FEDLORA_ASSIGN_OR_RETURN(a.lstrip, GetBoolOr(t, "lstrip", false, field));
    FEDLORA_ASSIGN_OR_RETURN(a.rstrip, GetBoolOr(t, "rstrip", false, field));
    FEDLORA_ASSIGN_OR_RETURN(a.special, GetBoolOr(t, "special", false, field));
    FEDLORA_ASSIGN_OR_RETURN(a.normalized, GetBoolOr(t, "normalized", !a.special, field));
    if (single_word) return Refuse(absl::StrCat(field, ".single_word"), "true is not supported");
    if (a.content.empty()) return Refuse(field, "empty content");
    if (id < 0 || id > kMaxId) return Refuse(field, absl::StrCat("id ", id, " out of range"));
    // The id HF gives: an existing one, else the next free one after the model's (its
    // AddedVocabulary::add_tokens).
    int64_t expected;
    if (auto it = added.find(a.content); it != added.end()) {
      expected = it->second;
    } else if (auto jt = model_vocab.find(a.content); jt != model_vocab.end()) {
      expected = jt->second;
    } else if (max_added < 0) {
      expected = model_size;
    } else {
      expected = (max_added >= model_size || model_size == 0) ? max_added + 1 : model_size;
    }
    if (id != expected) {
      return Refuse(field, absl::StrCat("'", a.content, "' has id ", id,
                                        ", but Hugging Face would give it id ", expected));
    }
    a.id = static_cast<int32_t>(id);
    max_added = std::max(max_added, id);
    added.emplace(a.content, a.id);
    spec->added.push_back(std::move(a));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromTokenizerJsonText(
    std::string_view text, std::string_view origin, const JsonOptions& options) {
  FEDLORA_ASSIGN_OR_RETURN(json root, ParseJson(text, origin));
  auto fail = [&](const absl::Status& s) { return Annotate(s, ToAbsl(origin)); };
  if (!root.is_object()) return fail(absl::InvalidArgumentError("not a JSON object"));
  if (auto s = OnlyKeys(root, "tokenizer.json",
                        {"version", "truncation", "padding", "added_tokens", "normalizer",
                         "pre_tokenizer", "post_processor", "decoder", "model"});
      !s.ok()) {
    return fail(s);
  }
  if (auto it = root.find("version");
      it != root.end() && !(it->is_string() && it->get<std::string>() == "1.0")) {
    return fail(Refuse("version", absl::StrCat(it->dump(), " is not \"1.0\"")));
  }
  for (const char* key : {"truncation", "padding"}) {
    if (auto s = MustBeUnset(root, key, "tokenizer.json", false); !s.ok()) return fail(s);
  }
  auto model = root.find("model");
  if (model == root.end()) return fail(absl::InvalidArgumentError("no \"model\""));
  Spec spec;
  std::string unk_token;
  if (auto s = ParseModel(*model, &spec, &unk_token); !s.ok()) return fail(s);
  absl::flat_hash_map<std::string, int32_t> model_vocab;
  for (size_t i = 0; i < spec.id_to_token.size(); ++i) {
    if (spec.present[i]) model_vocab.emplace(spec.id_to_token[i], static_cast<int32_t>(i));
  }
  if (!unk_token.empty()) {
    auto it = model_vocab.find(unk_token);
    if (it == model_vocab.end()) {
      return fail(
          Refuse("model.unk_token", absl::StrCat("'", unk_token, "' is not in model.vocab")));
    }
    spec.model_unk = spec.unk = it->second;
  }
  auto get = [&](const char* key) -> const json& {
    static const json* const kNull = new json(nullptr);
    auto it = root.find(key);
    return it == root.end() ? *kNull : *it;
  };
  if (auto s = ParseAddedTokens(get("added_tokens"), model_vocab, &spec); !s.ok()) return fail(s);
  if (auto s = ParseNormalizer(get("normalizer"), "normalizer", &spec.nfc); !s.ok()) return fail(s);
  const json& pre = get("pre_tokenizer");
  if (pre.is_null())
    return fail(Refuse("pre_tokenizer", "null is not supported; expected ByteLevel"));
  if (auto s = ParsePreTokenizer(pre, "pre_tokenizer", &spec.pre); !s.ok()) return fail(s);
  if (!spec.pre.has_byte_level())
    return fail(Refuse("pre_tokenizer", "no ByteLevel step (needed last)"));
  bool seen_template = false;
  if (auto s = ParsePostProcessor(get("post_processor"), "post_processor", &spec.prefix,
                                  &spec.suffix, &seen_template);
      !s.ok()) {
    return fail(s);
  }
  if (auto s = ParseDecoder(get("decoder"), "decoder"); !s.ok()) return fail(s);

  if (spec.prefix.size() == 1) spec.bos = spec.prefix[0];
  if (spec.suffix.size() == 1) spec.eos = spec.suffix[0];
  auto resolve = [&](const std::string& name, const char* what, int32_t* id) -> absl::Status {
    if (name.empty()) return absl::OkStatus();
    for (const AddedToken& a : spec.added) {
      if (a.content == name) {
        *id = a.id;
        return absl::OkStatus();
      }
    }
    auto it = model_vocab.find(name);
    if (it == model_vocab.end()) return Refuse(what, absl::StrCat("'", name, "' is not a token"));
    *id = it->second;
    return absl::OkStatus();
  };
  if (auto s = resolve(options.bos_token, "bos_token", &spec.bos); !s.ok()) return fail(s);
  if (auto s = resolve(options.eos_token, "eos_token", &spec.eos); !s.ok()) return fail(s);
  if (auto s = resolve(options.pad_token, "pad_token", &spec.pad); !s.ok()) return fail(s);
  auto tok = Build(std::move(spec));
  if (!tok.ok()) return fail(tok.status());
  return tok;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromTokenizerJson(
    const std::string& path, const JsonOptions& options) {
  FEDLORA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromTokenizerJsonText(text, path, options);
}

}  // namespace fedlora
