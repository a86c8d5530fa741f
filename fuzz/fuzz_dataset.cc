// Fuzzes the training-data loaders: LoadDataset (train/dataset.h: JSONL, CSV and TSV labelled
// text), LoadLabelNames (a label file) and LoadLmDataset (train/lm_data.h: JSONL conversations
// for decoders, rendered with the ChatML template). A client's data files come from its operator
// or from a download; the loaders see them before anything else does.
//
// Input: byte 0 picks the loader (mod 5: 0 .jsonl, 1 .csv, 2 .tsv, 3 labels.txt, 4 LM .jsonl),
// byte 1 its options (below), the rest is the file, written to a directory of this process.
//
// Checks beyond "no crash, no sanitizer report", as the headers promise:
// - a refusal is InvalidArgument whose message names the file;
// - an accepted dataset has examples, each with a label index inside label_names, a text that is
//   not blank and not over max_text_bytes, a pair that is absent or non-empty and not over it;
//   the label names are distinct, and equal the given ones when options name them;
// - LoadDataset and LoadLabelNames round-trip: the dataset written back as CSV (every cell
//   quoted), or the names one per line, load to the same values;
// - the same file with one more "\n" at its end loads to the same result (a final line end is
//   optional in every format);
// - LoadLmDataset's examples fit max_seq_len, have a label per id (-100 or the id), at least one
//   target, and ids (and prompt ids) inside the vocabulary.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/bpe_tokenizer.h"
#include "model/decoder_tokenizer.h"
#include "train/dataset.h"
#include "train/lm_data.h"

namespace {

using namespace fedlora;

const std::string& Dir() { return fuzz::ScratchDir("dataset"); }

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = Dir() + "/" + name;
  FUZZ_CHECK(fuzz::WriteFile(path, bytes), "cannot write " + path);
  return path;
}

void CheckRefusal(const absl::Status& s, const std::string& path) {
  FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, s);
  FUZZ_CHECK(s.message().find(path) != std::string::npos,
             "the error does not name the file: " + s.ToString());
}

bool Blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

bool SameExamples(const Dataset& a, const Dataset& b) {
  if (a.label_names != b.label_names || a.examples.size() != b.examples.size()) return false;
  for (size_t i = 0; i < a.examples.size(); ++i) {
    const Example &x = a.examples[i], &y = b.examples[i];
    if (x.text != y.text || x.text_pair != y.text_pair || x.label != y.label) return false;
  }
  return true;
}

bool Same(const absl::StatusOr<Dataset>& a, const absl::StatusOr<Dataset>& b) {
  if (a.ok() != b.ok()) return false;
  return a.ok() ? SameExamples(*a, *b) : a.status() == b.status();
}

std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void CheckDataset(const Dataset& d, const DatasetOptions& o) {
  FUZZ_CHECK(!d.examples.empty(), "an accepted dataset without examples");
  if (!o.label_names.empty())
    FUZZ_CHECK(d.label_names == o.label_names, "label names differ from the given ones");
  // Up to 2^20 names (integer labels without names): a set, not a quadratic scan.
  const std::set<std::string> distinct(d.label_names.begin(), d.label_names.end());
  FUZZ_CHECK(distinct.size() == d.label_names.size(), "a label name twice");
  for (const Example& e : d.examples) {
    FUZZ_CHECK(e.label >= 0 && static_cast<size_t>(e.label) < d.label_names.size(),
               "label index out of range");
    FUZZ_CHECK(!Blank(e.text), "blank text accepted");
    FUZZ_CHECK(static_cast<int64_t>(e.text.size()) <= o.max_text_bytes, "text over max_text_bytes");
    if (e.text_pair.has_value()) {
      FUZZ_CHECK(!e.text_pair->empty(), "empty pair kept");
      FUZZ_CHECK(static_cast<int64_t>(e.text_pair->size()) <= o.max_text_bytes,
                 "pair over max_text_bytes");
    }
  }
}

// Writes `d` as CSV (every cell quoted) and loads it with its own label names.
void CheckRoundTrip(const Dataset& d, const DatasetOptions& o) {
  std::string csv = "text,text_pair,label\n";
  for (const Example& e : d.examples) {
    csv += Quoted(e.text) + "," + Quoted(e.text_pair.value_or("")) + "," +
           Quoted(d.label_names[e.label]) + "\r\n";
  }
  DatasetOptions again;
  again.label_names = d.label_names;
  again.max_text_bytes = o.max_text_bytes;
  auto back = LoadDataset(Write("again.csv", csv), again);
  FUZZ_CHECK(back.ok(), back.status());
  FUZZ_CHECK(SameExamples(d, *back), "the dataset written as CSV loads differently");
}

void FuzzDataset(const char* ext, uint8_t flags, const std::string& file) {
  DatasetOptions o;
  if (flags & 1) o.label_names = {"negative", "positive", "0", "1"};
  if (flags & 2) o.max_text_bytes = 16;
  const std::string name = std::string("data.") + ext;
  const std::string path = Write(name, file);
  auto d = LoadDataset(path, o);
  FUZZ_TRACE("%s: %s\n", name.c_str(), d.status().ToString().c_str());
  if (!d.ok()) {
    CheckRefusal(d.status(), path);
  } else {
    CheckDataset(*d, o);
    // An integer label up to 2^20 makes that many names: loading them again would take seconds
    // under the sanitizers (a timeout for libFuzzer), and checks nothing the small sets do not.
    if (d->label_names.size() > 4096) return;
    CheckRoundTrip(*d, o);
  }
  auto newline = LoadDataset(Write(name, file + "\n"), o);
  FUZZ_CHECK(Same(d, newline), "a final \"\\n\" changes the result: " + d.status().ToString() +
                                   " vs " + newline.status().ToString());
}

void FuzzLabelNames(const std::string& file) {
  const std::string path = Write("labels.txt", file);
  auto names = LoadLabelNames(path);
  if (!names.ok()) {
    CheckRefusal(names.status(), path);
    return;
  }
  std::string again;
  for (const std::string& n : *names) {
    FUZZ_CHECK(!n.empty() && n.back() != ' ' && n.back() != '\t' && n.back() != '\r' &&
                   n.find('\n') == std::string::npos,
               "label \"" + n + "\" kept trailing space or a line end");
    again += n + "\n";
  }
  auto back = LoadLabelNames(Write("labels.txt", again));
  FUZZ_CHECK(back.ok() && *back == *names, "label names written one per line load differently");
}

// A byte-level vocabulary without merges (printable ASCII, 'Ġ', 'Ċ', the ChatML control tokens),
// as tests/train/lm_trainer_test.cc builds it; bytes outside it encode to the byte tokens it lacks,
// which Encode must handle too.
const DecoderTokenizer& Tokenizer() {
  static const DecoderTokenizer* tok = [] {
    BpeTokenizer::Vocabulary v;
    for (char c = 33; c < 127; ++c) v.tokens.push_back(std::string(1, c));
    v.tokens.push_back("\xC4\xA0");
    v.tokens.push_back("\xC4\x8A");
    v.tokens.push_back("<|im_start|>");
    v.tokens.push_back("<|im_end|>");
    v.token_types.assign(v.tokens.size(), BpeTokenizer::kNormal);
    v.token_types[v.tokens.size() - 2] = BpeTokenizer::kControl;
    v.token_types[v.tokens.size() - 1] = BpeTokenizer::kControl;
    v.eos_id = static_cast<int32_t>(v.tokens.size() - 1);
    auto bpe = BpeTokenizer::Create(v);
    FUZZ_CHECK(bpe.ok(), bpe.status());
    auto* t = new DecoderTokenizer;
    t->tokenizer = std::move(*bpe);
    auto chat = ChatTemplate::FromName("chatml");
    FUZZ_CHECK(chat.ok(), chat.status());
    t->chat = *chat;
    return t;
  }();
  return *tok;
}

void FuzzLmDataset(uint8_t flags, const std::string& file) {
  const DecoderTokenizer& tok = Tokenizer();
  LmDataOptions o;
  o.max_seq_len = (flags & 0x3F) * 4;  // 0 .. 252: 0 refuses every line
  if (flags & 0x40) o.system = "Be brief.";
  if (flags & 0x80) o.response_field = "label";
  const std::string path = Write("chat.jsonl", file);
  auto d = LoadLmDataset(path, tok, o);
  FUZZ_TRACE("lm: %s\n", d.status().ToString().c_str());
  if (!d.ok()) {
    CheckRefusal(d.status(), path);
    return;
  }
  FUZZ_CHECK(!d->examples.empty(), "an accepted LM dataset without examples");
  const int64_t vocab = tok.tokenizer->vocab_size();
  for (const LmExample& e : d->examples) {
    FUZZ_CHECK(e.input_ids.size() <= static_cast<size_t>(o.max_seq_len),
               "an example over max_seq_len");
    FUZZ_CHECK(e.labels.size() == e.input_ids.size(), "labels and ids differ in length");
    FUZZ_CHECK(e.targets() > 0, "an example without targets");
    for (size_t i = 0; i < e.input_ids.size(); ++i) {
      FUZZ_CHECK(e.input_ids[i] >= 0 && e.input_ids[i] < vocab, "id outside the vocabulary");
      FUZZ_CHECK(e.labels[i] == -100 || e.labels[i] == e.input_ids[i],
                 "a label that is neither -100 nor the id");
    }
    for (int32_t id : e.prompt_ids)
      FUZZ_CHECK(id >= 0 && id < vocab, "prompt id outside the vocabulary");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string file(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 5) {
    case 0:
      FuzzDataset("jsonl", data[1], file);
      break;
    case 1:
      FuzzDataset("csv", data[1], file);
      break;
    case 2:
      FuzzDataset("tsv", data[1], file);
      break;
    case 3:
      FuzzLabelNames(file);
      break;
    default:
      FuzzLmDataset(data[1], file);
      break;
  }
  return 0;
}
