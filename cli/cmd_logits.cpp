// `kvgate logits`: teacher-forced logits and plain greedy continuations for given token ids, for
// cross-checks against other implementations (datasets/models/probe/crosscheck.py).
#include <cstdint>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvgate/atomic_file.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/sampler.hpp"

namespace kvgate::cli {

namespace {

struct LogitsOpts {
  std::string model, tokenizer, kv = "f32", ids, logits_out;
  int greedy = 0;
  int threads = 0;
  bool json = false;
};

std::vector<int> parse_ids(const std::string& csv, int vocab) {
  std::vector<int> ids;
  std::size_t i = 0;
  while (i < csv.size()) {
    const std::size_t j = csv.find(',', i);
    const std::string item = csv.substr(i, j == std::string::npos ? std::string::npos : j - i);
    std::size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty())
      throw std::invalid_argument("--ids: '" + item + "' is not an integer (give comma-separated token ids)");
    if (v < 0 || v >= vocab)
      throw std::invalid_argument("--ids: token id " + item + " is outside the model's vocabulary [0, " +
                                  std::to_string(vocab) + ")");
    ids.push_back(v);
    if (j == std::string::npos) break;
    i = j + 1;
  }
  if (ids.empty()) throw std::invalid_argument("--ids is empty");
  return ids;
}

int run_logits(const LogitsOpts& o) {
  if (o.greedy < 0) throw std::invalid_argument("--greedy must be >= 0");
  const auto fmt = parse_kv_format(o.kv);
  if (!fmt) throw std::invalid_argument("unknown KV format '" + o.kv + "' (" + known_formats_text() + ")");
  const Model model = load_model(o.model, o.tokenizer);
  const std::vector<int> ids = parse_ids(o.ids, model.config.vocab_size);
  KvRequest req;
  req.flag = fmt;
  req.strict = true;  // a cross-check must run the format it names
  req.backend = "cpu";
  EngineOptions eo;
  eo.kv = resolve_kv(req, model.config, eo.block_size);
  eo.threads = o.threads;
  Engine engine(model, eo);

  nlohmann::json out;
  out["kv"] = o.kv;
  out["positions"] = ids.size();
  if (!o.logits_out.empty()) {
    // Row t: the logits after ids[0..t], float32 little-endian, [positions][vocab].
    const std::vector<float> all = engine.forward_all_logits(ids);
    write_file_atomic(o.logits_out, std::string_view(reinterpret_cast<const char*>(all.data()), all.size() * sizeof(float)));
    out["logits_out"] = o.logits_out;
    out["vocab"] = engine.vocab_size();
  }
  if (o.greedy > 0) {
    // Argmax over the whole vocabulary, EOS included, never stopping early.
    engine.reset();
    std::vector<int> gen;
    const std::vector<float>* l = &engine.prefill(ids);
    for (int s = 0; s < o.greedy; ++s) {
      const int t = argmax(*l);
      gen.push_back(t);
      if (s + 1 < o.greedy) l = &engine.decode(t);
    }
    out["tokens"] = gen;
  }
  if (o.json) std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

void register_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOpts>();
  auto* sub = app.add_subcommand("logits", "Teacher-forced logits / greedy tokens for given token ids (cross-checks)");
  sub->add_option("--model", o->model, "llama2.c .bin, .gguf, or a Hugging Face directory")->required();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer when it is not beside the model");
  sub->add_option("--kv", o->kv, "KV preset or k=<K>,v=<V>")->capture_default_str();
  sub->add_option("--ids", o->ids, "comma-separated token ids (BOS included if wanted)")->required();
  sub->add_option("--logits-out", o->logits_out, "write the logits of every position here (float32 [positions][vocab])");
  sub->add_option("--greedy", o->greedy, "then generate this many argmax tokens from the ids (EOS does not stop)");
  sub->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  sub->add_flag("--json", o->json, "print a JSON object (tokens, positions, ...)");
  on_run(sub, [o] { return run_logits(*o); });
}

}  // namespace kvgate::cli
