// `kvgate probe`: the needle / counting / echo probes (datasets/probes/RECIPE.md) on one model and
// KV format, greedy, exact scoring. --json prints one record (reports/schema/run.schema.json).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "kvgate/atomic_file.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate/resolve.hpp"

namespace kvgate::cli {

namespace {

struct ProbeOpts {
  std::string model, tokenizer, probe, lengths, depths, seeds, kv = "f32", kv_k, kv_v, out, emit;
  int threads = 1, echo_per_seed = 1;
  bool json = false, quick = false, strict = false;
};

// The probe model (datasets/models/probe) when present: it can follow the prompts; stories260K
// cannot, so it is only the fallback subject.
std::string default_model() {
  const std::string src = matrix::default_source_dir();
  const std::string probe = matrix::find_probe_model(src);
  return probe.empty() ? matrix::find_model("stories260K/stories260K.bin", src) : probe;
}

// Writes the cases of a probe as JSONL (prompt + expected answer) without running a model: the
// recipe's data for other implementations (the probe model's trainer). Token counts: the model's tokenizer
// when --model is given, else bytes + BOS (a byte-level vocabulary).
int emit_cases(const ProbeOpts& o, probes::ProbeKind kind, const Model* model) {
  probes::TokenCounter count = probes::byte_counter();
  if (model && model->tokenizer) {
    const Tokenizer* tok = model->tokenizer.get();
    count = [tok](const std::string& t) { return static_cast<int>(tok->encode(t, true).size()); };
  }
  std::string out;
  auto line = [&](nlohmann::json j) { out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"; };
  const auto lengths = o.lengths.empty() ? std::vector<int>{512} : matrix::parse_int_list(o.lengths);
  const auto depths = o.depths.empty() ? std::vector<double>{0.0, 0.5, 1.0} : matrix::parse_double_list(o.depths);
  const auto seeds = o.seeds.empty() ? std::vector<std::uint64_t>{1} : matrix::parse_seed_list(o.seeds);
  if (kind == probes::ProbeKind::needle) {
    for (int L : lengths)
      for (double d : depths)
        for (auto s : seeds) {
          const auto c = probes::make_needle(L, d, s, count);
          auto j = probes::to_json(c);
          j["probe"] = "needle";
          j["prompt"] = c.prompt;
          j["expected"] = c.key;
          line(j);
        }
  } else if (kind == probes::ProbeKind::counting) {
    for (int n : lengths) {
      const auto c = probes::make_counting(n);
      line({{"probe", "counting"}, {"n", n}, {"prompt", c.prompt}, {"expected", c.expected}});
    }
  } else {
    for (auto s : seeds)
      for (int i = 0; i < std::max(1, o.echo_per_seed); ++i) {
        const auto c = probes::make_echo(s, i);
        line({{"probe", "echo"}, {"seed", s}, {"index", i}, {"number", c.number}, {"prompt", c.prompt}, {"expected", c.number}});
      }
  }
  if (o.emit == "-") std::cout << out;
  else write_file_atomic(o.emit, out);
  return 0;
}

int run_probe_cmd(const ProbeOpts& o) {
  const auto kind = probes::parse_probe_kind(o.probe);
  if (!kind) throw std::invalid_argument("--probe must be needle, counting or echo (got '" + o.probe + "')");
  std::optional<KvFormat> flag;
  if (!o.kv_k.empty() || !o.kv_v.empty()) {
    flag = parse_kv_format("k=" + o.kv_k + ",v=" + o.kv_v);
    if (!flag) throw std::invalid_argument("--kv-k/--kv-v: unknown half format; known: " + known_formats_text());
  } else {
    flag = parse_kv_format(o.kv);
    if (!flag) throw std::invalid_argument("--kv '" + o.kv + "': unknown format; known: " + known_formats_text());
  }
  const std::string model_path = o.model.empty() ? default_model() : o.model;
  if (!o.emit.empty() && o.model.empty()) return emit_cases(o, *kind, nullptr);
  if (model_path.empty())
    throw std::invalid_argument("no --model given, and neither datasets/models/probe nor stories260K was found (set KVGATE_MODELS or pass --model PATH)");
  const Model model = load_model(model_path, o.tokenizer);
  if (!o.emit.empty()) return emit_cases(o, *kind, &model);

  KvRequest req;
  req.flag = flag;
  req.strict = o.strict;
  EngineOptions eo;
  eo.kv = resolve_kv(req, model.config, eo.block_size);
  eo.threads = o.threads;
  matrix::ProbeSpec spec = matrix::default_probe_spec(*kind, model, o.quick);
  if (!o.lengths.empty()) spec.lengths = matrix::parse_int_list(o.lengths);
  if (!o.depths.empty()) spec.depths = matrix::parse_double_list(o.depths);
  if (!o.seeds.empty()) spec.seeds = matrix::parse_seed_list(o.seeds);
  spec.echo_per_seed = o.echo_per_seed;

  const bool tty = isatty(STDERR_FILENO);
  nlohmann::json r = matrix::run_probe(model, eo, spec, [&](const std::string& line) {
    if (o.json) {
      if (tty) std::fprintf(stderr, "\r\033[K%s", line.c_str());
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  });
  if (o.json && tty) std::fprintf(stderr, "\r\033[K");
  matrix::ProvenanceOptions po;
  po.model = &model;
  po.threads = o.threads;
  po.seed = spec.seeds.empty() ? 0 : spec.seeds.front();
  r["provenance"] = matrix::provenance(po);
  const std::string text = r.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!o.out.empty()) write_file_atomic(o.out, text);
  if (o.json) {
    std::cout << text;
  } else {
    std::printf("probe %s, kv %s (requested %s%s%s), %d cases: %d passed, %d failed, %d skipped\n", o.probe.c_str(),
                r["kv"].get<std::string>().c_str(), r["kv_requested"].get<std::string>().c_str(),
                r["fallback_reason"].get<std::string>().empty() ? "" : ", fallback: ",
                r["fallback_reason"].get<std::string>().c_str(), r["cases"].get<int>(), r["passed"].get<int>(),
                r["failed"].get<int>(), r["skipped"].get<int>());
    std::printf("note: %s\n", r["subject_note"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace

void register_probe(CLI::App& app) {
  auto o = std::make_shared<ProbeOpts>();
  auto* sub = app.add_subcommand("probe", "Needle / counting / echo probes with exact scoring (datasets/probes/RECIPE.md)");
  sub->add_option("--model", o->model, "model (default: datasets/models/probe, else stories260K from $KVGATE_MODELS or ../shared/models)");
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer file when it is not beside the model");
  sub->add_option("--probe", o->probe, "needle | counting | echo")->required();
  sub->add_option("--lengths", o->lengths, "needle: context lengths in tokens; counting: N values (comma-separated)");
  sub->add_option("--depths", o->depths, "needle depths in [0,1] (comma-separated)");
  sub->add_option("--seeds", o->seeds, "seeds: 1,2,3 or 1..100 (needle, echo)");
  sub->add_option("--echo-per-seed", o->echo_per_seed, "echo numbers per seed")->capture_default_str();
  sub->add_option("--kv", o->kv, "KV preset or k=<K>,v=<V>")->capture_default_str();
  sub->add_option("--kv-k", o->kv_k, "K half format (with --kv-v)");
  sub->add_option("--kv-v", o->kv_v, "V half format (with --kv-k)");
  sub->add_flag("--strict-kv,--no-kv-fallback", o->strict, "fail instead of falling back to another KV format");
  sub->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  sub->add_flag("--quick", o->quick, "fewer default cases");
  sub->add_flag("--json", o->json, "print the record as JSON (keys probe, kv, cases, passed, results, ...)");
  sub->add_option("--out", o->out, "also write the JSON record to this file");
  sub->add_option("--emit", o->emit, "write the cases (prompt, expected) as JSONL to this file ('-' = stdout) and run nothing");
  on_run(sub, [o] { return run_probe_cmd(*o); });
}

}  // namespace kvgate::cli
