// The A/B matrix (`kvgate bench`). Timing is read only when MatrixOptions::timing is on.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "kvgate/kv_store.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/sampler.hpp"

#if KVGATE_CUDA_BUILD
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#endif

#if __has_include("kvgate/kv_file.hpp")
#include "kvgate/kv_file.hpp"
#define KVGATE_MATRIX_HAVE_KV_FILE 1
#else
#define KVGATE_MATRIX_HAVE_KV_FILE 0
#endif

namespace kvgate::matrix {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Streaming and conversations land in the engine independently of this library: detect them.
template <class O>
bool set_resident(O& o, int w) {
  if constexpr (requires(O& x) { x.kv_resident = 1; }) {
    o.kv_resident = w;
    return true;
  } else {
    return w == 0;
  }
}

template <class S>
nlohmann::json stream_counters(const S& st) {
  if constexpr (requires(const S& s) { s.kv_block_misses; s.kv_block_lookups; }) {
    return {{"kv_block_lookups", st.kv_block_lookups}, {"kv_block_misses", st.kv_block_misses}};
  } else {
    return nlohmann::json::object();
  }
}

// Warm TTFT of a second turn: the first L tokens restored from a KV file, `turn` new tokens prefilled.
template <class E, class O>
std::optional<double> warm_ttft_ms(const Model& model, const O& eo, std::span<const int> prompt, int prefix,
                                   const std::string& file, std::string& reason) {
#if KVGATE_MATRIX_HAVE_KV_FILE
  if constexpr (requires(E& e, const KvFile& f, std::span<const int> p, const std::string& s) {
                  e.hydrate(f, p);
                  e.save_kv(s);
                }) {
    {
      E first(model, eo);
      first.prefill(prompt.first(static_cast<std::size_t>(prefix)));
      first.save_kv(file);
    }
    E second(model, eo);
    SamplerOptions so;
    const auto t0 = Clock::now();
    const KvFile f = read_kv_file(file);
    const int restored = second.hydrate(f, prompt);
    second.generate(prompt.subspan(static_cast<std::size_t>(restored)), 1, so);
    const double ms = ms_since(t0);
    std::error_code ec;
    std::filesystem::remove(file, ec);
    if (restored != prefix) {
      reason = "hydrate restored " + std::to_string(restored) + " of " + std::to_string(prefix) + " tokens";
      return std::nullopt;
    }
    return ms;
  } else {
    reason = "the engine has no conversation API";
    return std::nullopt;
  }
#else
  (void)model; (void)eo; (void)prompt; (void)prefix; (void)file;
  reason = "no conversation cache (kv_file.hpp) in this build";
  return std::nullopt;
#endif
}

// Timing of one CUDA row (device "cuda"): the same protocol as the CPU rows (generate one token from
// the prompt: TTFT and prefill tok/s; then decode_steps single-token steps with host argmax) on
// kvgate::cuda::CudaEngine. Returns an empty string when the row ran, else why it did not.
struct CudaTiming {
  double ttft_ms = 0, prefill_tok_s = 0, decode_tok_s = 0;
  std::size_t kv_bytes = 0, pool_bytes = 0;
  std::string effective;
  nlohmann::json counters = nlohmann::json::object();  // streaming: the window's lookups / misses
  std::optional<double> warm_ms;                       // warm TTFT (second turn hydrated from a KV file)
  std::string warm_reason;                             // why there is none
};
// warm_prompt: the second turn's prompt (empty: no warm TTFT, warm_reason says why); its first
// warm_prefix tokens are saved by a first engine and hydrated by a second, through `warm_file`.
std::string cuda_row(const Model& model, const EngineOptions& eo, std::span<const int> prompt, int decode_steps,
                     std::span<const int> warm_prompt, int warm_prefix, const std::string& warm_file, CudaTiming& out) {
#if KVGATE_CUDA_BUILD
  const auto& st = kvgate::cuda::device_status();
  if (!st.available) return st.reason;
  // The CUDA backend's own capability: resolve_kv(backend "cuda") refuses what its kernels cannot run.
  kvgate::cuda::register_capability();
  kvgate::cuda::CudaEngineOptions co;
  co.engine = eo;
  KvRequest req;
  req.flag = eo.kv.requested;
  req.backend = "cuda";
  co.engine.kv = resolve_kv(req, model.config, eo.block_size);
  // One untimed engine per process first: cuBLAS handles, module loading and the first graph
  // capture are one-time costs that would otherwise land in the first row's TTFT.
  static bool warmed = false;
  try {
    if (!warmed) {
      kvgate::cuda::CudaEngine w(model, co);
      SamplerOptions so;
      const int n = std::min<int>(static_cast<int>(prompt.size()), 8);
      w.generate(prompt.first(static_cast<std::size_t>(n)), 2, so);
      warmed = true;
    }
    kvgate::cuda::CudaEngine e(model, co);
    out.pool_bytes = e.stats().kv_pool_bytes;
    SamplerOptions so;
    const GenerateResult g = e.generate(prompt, 1, so);
    out.ttft_ms = e.stats().ttft_ms;
    out.prefill_tok_s = e.stats().prefill_tok_s();
    int tok = g.tokens.empty() ? 3 : g.tokens.front();
    const auto t0 = Clock::now();
    for (int s = 0; s < decode_steps; ++s) {
      const auto& lg = e.decode(tok);
      tok = static_cast<int>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    }
    out.decode_tok_s = decode_steps / (ms_since(t0) / 1000.0);
    out.kv_bytes = e.stats().kv_bytes;
    out.effective = e.stats().effective_kv;
    out.counters = stream_counters(e.stats());  // as the CPU rows: zeros when resident
    out.warm_ms.reset();
    if (!warm_prompt.empty())
      out.warm_ms = warm_ttft_ms<kvgate::cuda::CudaEngine>(model, co, warm_prompt, warm_prefix, warm_file, out.warm_reason);
  } catch (const std::exception& ex) {
    return std::string("CUDA engine refused or failed: ") + ex.what();
  }
  return {};
#else
  (void)model, (void)eo, (void)prompt, (void)decode_steps, (void)warm_prompt, (void)warm_prefix, (void)warm_file,
      (void)out;
  return "this build has no CUDA backend (configure with -DKVGATE_CUDA=ON where nvcc is installed)";
#endif
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}


std::size_t kv_bytes_per_token(const KvFormat& f, const ModelConfig& c, int block) {
  const PageGeometry g{block, c.n_kv_heads, c.head_dim};
  return static_cast<std::size_t>(c.n_layers) * (page_bytes(f.k, g) + page_bytes(f.v, g)) / static_cast<std::size_t>(block);
}

}  // namespace

bool engine_supports_streaming() {
  EngineOptions o;
  return set_resident(o, 1);
}

bool engine_supports_conversations() {
#if KVGATE_MATRIX_HAVE_KV_FILE
  return requires(Engine& e, const KvFile& f, std::span<const int> p) { e.hydrate(f, p); };
#else
  return false;
#endif
}

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;  // "k=int8,v=q4_0" stays one item when written as k=int8;v=q4_0 or in brackets
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ' && c != '[' && c != ']') {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  // Re-join "k=..." with a following "v=..." (a pair written with a comma).
  std::vector<std::string> joined;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i].rfind("k=", 0) == 0 && i + 1 < out.size() && out[i + 1].rfind("v=", 0) == 0) {
      joined.push_back(out[i] + "," + out[i + 1]);
      ++i;
    } else {
      joined.push_back(out[i]);
    }
  }
  for (auto& j : joined)
    for (auto& c : j)
      if (c == ';') c = ',';
  return joined;
}

std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> v;
  for (const auto& x : split_csv(s)) v.push_back(std::stoi(x));
  return v;
}
std::vector<double> parse_double_list(const std::string& s) {
  std::vector<double> v;
  for (const auto& x : split_csv(s)) v.push_back(std::stod(x));
  return v;
}
std::vector<std::uint64_t> parse_seed_list(const std::string& s) {
  std::vector<std::uint64_t> v;
  for (const auto& x : split_csv(s)) {
    if (const auto p = x.find(".."); p != std::string::npos) {
      const auto a = std::stoull(x.substr(0, p)), b = std::stoull(x.substr(p + 2));
      for (auto i = a; i <= b; ++i) v.push_back(i);
    } else {
      v.push_back(std::stoull(x));
    }
  }
  return v;
}

Corpus load_corpus(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("corpus '" + path + "' not found");
  const auto j = nlohmann::json::parse(f);
  Corpus c;
  c.path = path;
  c.model_fingerprint = j.value("model_fingerprint", "");
  for (const auto& s : j.at("sequences")) c.sequences.push_back(s.at("tokens").get<std::vector<int>>());
  return c;
}

std::vector<std::vector<float>> corpus_logits(const Model& model, const EngineOptions& eo, const Corpus& corpus) {
  std::vector<std::vector<float>> out;
  Engine engine(model, eo);
  for (const auto& seq : corpus.sequences) {
    engine.reset();
    const int n = std::min<int>(static_cast<int>(seq.size()), engine.max_context());
    out.push_back(engine.forward_all_logits(std::span<const int>(seq).first(static_cast<std::size_t>(n))));
  }
  return out;
}

Quality compare_logits(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& got, int vocab) {
  Quality q;
  std::vector<double> kls;
  long long agree = 0;
  std::vector<double> lp(static_cast<std::size_t>(vocab)), lq(static_cast<std::size_t>(vocab));
  auto log_softmax = [vocab](const float* x, std::vector<double>& o) {
    double mx = x[0];
    for (int i = 1; i < vocab; ++i) mx = std::max(mx, double(x[i]));
    double s = 0;
    for (int i = 0; i < vocab; ++i) s += std::exp(double(x[i]) - mx);
    const double ls = std::log(s) + mx;
    for (int i = 0; i < vocab; ++i) o[i] = double(x[i]) - ls;
  };
  for (std::size_t s = 0; s < ref.size() && s < got.size(); ++s) {
    const std::size_t n = std::min(ref[s].size(), got[s].size()) / static_cast<std::size_t>(vocab);
    for (std::size_t t = 0; t < n; ++t) {
      const float* a = ref[s].data() + t * vocab;
      const float* b = got[s].data() + t * vocab;
      log_softmax(a, lp);
      log_softmax(b, lq);
      double kl = 0;
      for (int i = 0; i < vocab; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
      kls.push_back(std::max(0.0, kl));
      agree += argmax(std::span<const float>(a, vocab)) == argmax(std::span<const float>(b, vocab));
    }
  }
  q.positions = static_cast<long long>(kls.size());
  if (kls.empty()) return q;
  double sum = 0;
  for (double k : kls) sum += k;
  q.kl_mean = sum / kls.size();
  std::sort(kls.begin(), kls.end());
  q.kl_p99 = kls[std::min(kls.size() - 1, static_cast<std::size_t>(std::ceil(0.99 * kls.size())) - 1)];
  q.kl_max = kls.back();
  q.top1 = double(agree) / kls.size();
  return q;
}

MatrixOptions default_matrix_options(const Model& m, bool quick) {
  MatrixOptions o;
  o.quick = quick;
  for (const auto& p : presets()) o.formats.emplace_back(p.name);
  o.formats.emplace_back("k=q8_0,v=q4_0");  // llama.cpp's common -ctk q8_0 -ctv q4_0 pair
  const int ctx = m.config.max_seq_len > 0 ? m.config.max_seq_len : 2048;
  o.decode_steps = 32;
  if (ctx <= 1024) {
    o.lengths = quick ? std::vector<int>{ctx / 4, ctx / 2, ctx - 64} : std::vector<int>{ctx / 8, ctx / 4, ctx / 2, 3 * ctx / 4, ctx - 64};
  } else {
    for (int L : {512, 1024, 2048, 4096, 8192, 16384, 32768})
      if (L + o.decode_steps + 32 <= ctx) o.lengths.push_back(L);
    if (quick && o.lengths.size() > 3) o.lengths = {o.lengths.front(), o.lengths[o.lengths.size() / 2], o.lengths.back()};
  }
  o.windows = {0};
  if (engine_supports_streaming()) o.windows.push_back(std::max(16, o.lengths.front() / 2));
  o.repeats = quick ? 3 : 5;
  for (auto k : {probes::ProbeKind::needle, probes::ProbeKind::counting, probes::ProbeKind::echo})
    o.probe_specs[probes::to_string(k)] = default_probe_spec(k, m, quick);
  return o;
}

nlohmann::json run_matrix(const Model& model, const MatrixOptions& o, const nlohmann::json& prov, const Progress& progress) {
  const ModelConfig& cfg = model.config;
  const int block = 16;
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };

  // Formats: f32 first (the baseline), each resolved as a flag would be (a fallback is reported).
  std::vector<std::string> names = {"f32"};
  for (const auto& f : o.formats)
    if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(f);
  struct Fmt {
    std::string name;
    ResolvedKv kv;
  };
  std::vector<Fmt> fmts;
  for (const auto& n : names) {
    const auto f = parse_kv_format(n);
    if (!f) throw std::invalid_argument("unknown KV format '" + n + "'; known: " + known_formats_text());
    KvRequest req;
    req.flag = *f;
    fmts.push_back({f->name(), resolve_kv(req, cfg, block)});
  }
  auto eo_for = [&](const ResolvedKv& kv, int window) {
    EngineOptions eo;
    eo.kv = kv;
    eo.threads = o.threads;
    eo.block_size = block;
    set_resident(eo, window);
    return eo;
  };
  const bool streaming = engine_supports_streaming();
  std::vector<int> windows;
  std::string windows_note;
  for (int w : o.windows) {
    if (w > 0 && !streaming) {
      windows_note = "streaming windows dropped: the engine has no --kv-resident";
      continue;
    }
    if (std::find(windows.begin(), windows.end(), w) == windows.end()) windows.push_back(w);
  }
  if (windows.empty()) windows = {0};

  // Perf prompt: the corpus tokens concatenated (real text), else a fixed ramp of ids.
  std::optional<Corpus> corpus;
  std::string corpus_note;
  if (!o.corpus_path.empty()) {
    corpus = load_corpus(o.corpus_path);
    for (const auto& seq : corpus->sequences)
      for (int id : seq)
        if (id < 0 || id >= cfg.vocab_size)
          throw std::invalid_argument("corpus " + o.corpus_path + ": token id " + std::to_string(id) +
                                      " is outside the model's vocabulary [0, " + std::to_string(cfg.vocab_size) +
                                      ") -- it was sampled from another model; pass --corpus none or a corpus of this model");
    if (!corpus->model_fingerprint.empty() && corpus->model_fingerprint != model.fingerprint)
      corpus_note = "corpus " + o.corpus_path + " was sampled from model " + corpus->model_fingerprint + ", not " +
                    model.fingerprint + ": KL/top-1 are over its ids anyway";
  }
  std::vector<int> perf_ids;
  if (corpus)
    for (const auto& s : corpus->sequences) perf_ids.insert(perf_ids.end(), s.begin(), s.end());
  if (perf_ids.empty()) perf_ids.push_back(cfg.bos_id);
  for (std::size_t i = 0; perf_ids.size() < static_cast<std::size_t>(std::max(cfg.max_seq_len, 1)); ++i)
    perf_ids.push_back(perf_ids[i % perf_ids.size()] == cfg.bos_id ? 3 : perf_ids[i % perf_ids.size()]);

  // --- per format: quality and probes ---------------------------------------------------------
  nlohmann::json per_format = nlohmann::json::array();
  std::vector<std::vector<float>> ref_logits;
  std::map<std::string, std::map<std::string, std::string>> f32_outputs;  // probe -> case id -> output
  const std::vector<std::string> probe_names = {"needle", "counting", "echo"};
  for (std::size_t fi = 0; fi < fmts.size(); ++fi) {
    const auto& F = fmts[fi];
    nlohmann::json fj;
    fj["format"] = F.name;
    fj["k"] = std::string(name(F.kv.effective.k));
    fj["v"] = std::string(name(F.kv.effective.v));
    fj["requested"] = F.kv.requested.name();
    fj["effective"] = F.kv.effective.name();
    fj["fallback_reason"] = F.kv.fallback_reason;
    const PageGeometry g{block, cfg.n_kv_heads, cfg.head_dim};
    fj["bytes_per_cell"] = bytes_per_cell(F.kv.effective.k, g) + bytes_per_cell(F.kv.effective.v, g);
    fj["kv_bytes_per_token"] = kv_bytes_per_token(F.kv.effective, cfg, block);
    fj["capacity_tokens"] =
        static_cast<long long>(blocks_for_budget(F.kv.effective, g, cfg.n_layers, o.budget_bytes)) * block;
    if (o.quality && corpus) {
      say("[" + std::to_string(fi + 1) + "/" + std::to_string(fmts.size()) + "] " + F.name + ": KL/top-1 over " +
          std::to_string(corpus->sequences.size()) + " corpus sequences");
      auto logits = corpus_logits(model, eo_for(F.kv, 0), *corpus);
      if (fi == 0) ref_logits = logits;
      const Quality q = compare_logits(ref_logits, logits, cfg.vocab_size);
      fj["kl_mean"] = q.kl_mean;
      fj["kl_p99"] = q.kl_p99;
      fj["kl_max"] = q.kl_max;
      fj["top1"] = q.top1;
      fj["kl_positions"] = q.positions;
    } else {
      fj["kl_mean"] = fj["kl_p99"] = fj["kl_max"] = fj["top1"] = nullptr;
      fj["kl_positions"] = 0;
    }
    nlohmann::json pj = nlohmann::json::object();
    const Model& pmodel = o.probe_model ? *o.probe_model : model;
    if (o.probes && pmodel.tokenizer) {
      // The probe subject resolves the requested format against its own geometry (a fallback there
      // is reported in the probe record, never hidden).
      KvRequest preq;
      preq.flag = F.kv.requested;
      const ResolvedKv pkv = o.probe_model ? resolve_kv(preq, pmodel.config, block) : F.kv;
      for (const auto& pn : probe_names) {
        const auto kind = *probes::parse_probe_kind(pn);
        const auto it = o.probe_specs.find(pn);
        const ProbeSpec spec = it != o.probe_specs.end() ? it->second : default_probe_spec(kind, pmodel, o.quick);
        // Probe outcomes do not depend on the thread count (MOD.engine.threads), so they use every core.
        EngineOptions peo = eo_for(pkv, 0);
        peo.threads = 0;
        const auto r = run_probe(pmodel, peo, spec, [&](const std::string& line) {
          say("[" + std::to_string(fi + 1) + "/" + std::to_string(fmts.size()) + "] " + F.name + ": " + line);
        });
        int same = 0, ran = 0;
        for (const auto& c : r["results"]) {
          if (c.value("status", "") != "ran") continue;
          ++ran;
          const std::string id = c.value("id", ""), out = c.value("output", "");
          if (fi == 0) f32_outputs[pn][id] = out;
          else if (f32_outputs[pn].count(id) && f32_outputs[pn][id] == out) ++same;
        }
        if (fi == 0) same = ran;
        nlohmann::json s = {{"cases", r["cases"]}, {"passed", r["passed"]}, {"skipped", r["skipped"]},
                            {"ran", ran}, {"exact", ran ? double(r["passed"].get<int>()) / ran : 0.0},
                            {"same_as_f32", ran ? double(same) / ran : 0.0}, {"summary", r["summary"]}};
        nlohmann::json cases = nlohmann::json::array();
        for (const auto& c : r["results"]) {
          nlohmann::json cc = {{"id", c["id"]}, {"status", c["status"]}, {"passed", c["passed"]}};
          if (c.contains("output")) cc["output"] = c["output"].get<std::string>().substr(0, 160);
          for (const char* k : {"first_divergence", "repeated", "dropped_digits", "length", "depth", "n"})
            if (c.contains(k)) cc[k] = c[k];
          cases.push_back(cc);
        }
        s["cases_detail"] = cases;
        pj[pn] = s;
      }
    }
    fj["probes"] = pj;
    per_format.push_back(fj);
  }

  // --- timing rows: device x format x context x window ------------------------------------------
  nlohmann::json rows = nlohmann::json::array();
  const nlohmann::json brief = provenance_brief(prov);
  const std::size_t total_rows = o.devices.size() * fmts.size() * o.lengths.size() * windows.size();
  std::size_t row_no = 0;
  for (const auto& device : o.devices)
    for (std::size_t fi = 0; fi < fmts.size(); ++fi)
      for (int L : o.lengths)
        for (int w : windows) {
          ++row_no;
          const auto& F = fmts[fi];
          const auto& fj = per_format[fi];
          nlohmann::json r;
          r["format"] = F.name;
          r["device"] = device;
          r["context"] = L;
          r["window"] = w;
          r["fallback_reason"] = F.kv.fallback_reason;
          r["effective"] = F.kv.effective.name();
          r["kv_bytes_per_token"] = fj["kv_bytes_per_token"];
          r["capacity_tokens"] = fj["capacity_tokens"];
          r["budget_bytes"] = o.budget_bytes;
          r["decode_steps"] = o.decode_steps;
          for (const char* k : {"kl_mean", "kl_p99", "top1"}) r[k] = fj[k];
          for (const auto& pn : probe_names) {
            const bool has = fj["probes"].contains(pn);
            r[pn + "_exact"] = has ? fj["probes"][pn]["exact"] : nlohmann::json(nullptr);
            r[pn + "_same_as_f32"] = has ? fj["probes"][pn]["same_as_f32"] : nlohmann::json(nullptr);
          }
          r["counting_repeated"] =
              fj["probes"].contains("counting") ? fj["probes"]["counting"]["summary"]["repeated"] : nlohmann::json(nullptr);
          r["echo_dropped_digits"] =
              fj["probes"].contains("echo") ? fj["probes"]["echo"]["summary"]["dropped_digits"] : nlohmann::json(nullptr);
          r["provenance"] = brief;
          for (const char* k : {"pool_bytes", "ttft_cold_ms", "ttft_warm_ms", "prefill_tok_s", "decode_tok_s"}) r[k] = nullptr;
          r["status"] = "ok";
          r["reason"] = "";
          say("[row " + std::to_string(row_no) + "/" + std::to_string(total_rows) + "] " + device + " " + F.name +
              " ctx=" + std::to_string(L) + " window=" + std::to_string(w));
          if (L + o.decode_steps + 1 > (cfg.max_seq_len > 0 ? cfg.max_seq_len : L + o.decode_steps + 1)) {
            r["status"] = "skipped";
            r["reason"] = "context " + std::to_string(L) + " + " + std::to_string(o.decode_steps) +
                          " decode steps exceed the model's " + std::to_string(cfg.max_seq_len);
            rows.push_back(r);
            continue;
          }
          if (device == "cuda") {
            std::vector<double> ttft, prefill, decode, warm;
            CudaTiming ct;
            std::string why, warm_reason;
            const std::span<const int> prompt(perf_ids.data(), static_cast<std::size_t>(L));
            // The second turn of the warm TTFT, as the CPU rows: L tokens hydrated, warm_turn prefilled.
            std::span<const int> p2;
            std::string warm_file;
            if (o.timing && L + o.warm_turn + 1 <= cfg.max_seq_len && !o.cache_dir.empty()) {
              std::filesystem::create_directories(o.cache_dir);
              p2 = std::span<const int>(perf_ids.data(), static_cast<std::size_t>(L + o.warm_turn));
              warm_file = (std::filesystem::path(o.cache_dir) / "warm_cuda.kv").string();
            } else {
              warm_reason = !o.timing ? "timing off" : o.cache_dir.empty() ? "no cache folder" : "no room for the second turn";
            }
            for (int rep = 0; rep < std::max(1, o.repeats) && why.empty(); ++rep) {
              why = cuda_row(model, eo_for(F.kv, w), prompt, o.decode_steps, p2, L, warm_file, ct);
              ttft.push_back(ct.ttft_ms);
              prefill.push_back(ct.prefill_tok_s);
              decode.push_back(ct.decode_tok_s);
              if (ct.warm_ms) warm.push_back(*ct.warm_ms);
              else if (!p2.empty()) warm_reason = ct.warm_reason;
            }
            if (!why.empty()) {
              r["status"] = "not_run";
              r["reason"] = why;
            } else {
              r["effective"] = ct.effective;
              if (ct.effective != F.kv.requested.name())
                r["fallback_reason"] = "the CUDA backend holds " + ct.effective + " (resolve_kv backend cuda)";
              r["pool_bytes"] = ct.pool_bytes;
              r["kv_bytes"] = ct.kv_bytes;
              if (o.timing) {
                r["ttft_cold_ms"] = median(ttft);
                r["prefill_tok_s"] = median(prefill);
                r["decode_tok_s"] = median(decode);
                r["ttft_warm_ms"] = warm.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(warm));
              }
              r["warm_prefix_tokens"] = L;
              r["warm_new_tokens"] = o.warm_turn;
              if (warm.empty()) r["ttft_warm_reason"] = warm_reason;
              r.update(ct.counters);
            }
            rows.push_back(r);
            continue;
          }
          if (device != "cpu") {
            r["status"] = "not_run";
            r["reason"] = "unknown device '" + device + "' (known: cpu, cuda)";
            rows.push_back(r);
            continue;
          }
          const EngineOptions eo = eo_for(F.kv, w);
          const std::span<const int> prompt(perf_ids.data(), static_cast<std::size_t>(L));
          std::vector<double> ttft, prefill, decode, warm;
          nlohmann::json counters;
          std::string warm_reason;
          for (int rep = 0; rep < std::max(1, o.repeats); ++rep) {
            Engine e(model, eo);
            r["pool_bytes"] = e.stats().kv_pool_bytes;
            SamplerOptions so;
            const GenerateResult g = e.generate(prompt, 1, so);
            int tok = g.tokens.empty() ? 3 : g.tokens.front();
            if (o.timing) {
              ttft.push_back(e.stats().ttft_ms);
              prefill.push_back(e.stats().prefill_tok_s());
            }
            const auto t0 = o.timing ? Clock::now() : Clock::time_point{};
            for (int s = 0; s < o.decode_steps; ++s) tok = argmax(e.decode(tok));
            if (o.timing) decode.push_back(o.decode_steps / (ms_since(t0) / 1000.0));
            counters = stream_counters(e.stats());
            r["kv_bytes"] = e.stats().kv_bytes;
            if (o.timing && L + o.warm_turn + 1 <= cfg.max_seq_len && !o.cache_dir.empty()) {
              std::filesystem::create_directories(o.cache_dir);
              const std::span<const int> p2(perf_ids.data(), static_cast<std::size_t>(L + o.warm_turn));
              const auto v = warm_ttft_ms<Engine>(model, eo, p2, L,
                                                  (std::filesystem::path(o.cache_dir) / "warm.kv").string(), warm_reason);
              if (v) warm.push_back(*v);
            } else if (warm_reason.empty()) {
              warm_reason = !o.timing ? "timing off" : o.cache_dir.empty() ? "no cache folder" : "no room for the second turn";
            }
          }
          if (o.timing) {
            r["ttft_cold_ms"] = median(ttft);
            r["prefill_tok_s"] = median(prefill);
            r["decode_tok_s"] = median(decode);
            r["ttft_warm_ms"] = warm.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(warm));
          }
          r["warm_prefix_tokens"] = L;
          r["warm_new_tokens"] = o.warm_turn;
          if (warm.empty()) r["ttft_warm_reason"] = warm_reason;
          r.update(counters);
          rows.push_back(r);
        }

  // Ratios against the f32 row of the same device, context and window.
  for (auto& r : rows) {
    for (const auto& b : rows) {
      if (b["format"] != "f32" || b["device"] != r["device"] || b["context"] != r["context"] || b["window"] != r["window"])
        continue;
      auto ratio = [](const nlohmann::json& a, const nlohmann::json& c) {
        return (a.is_number() && c.is_number() && c.get<double>() > 0) ? nlohmann::json(a.get<double>() / c.get<double>())
                                                                         : nlohmann::json(nullptr);
      };
      r["kv_bytes_vs_f32"] = ratio(r["kv_bytes_per_token"], b["kv_bytes_per_token"]);
      r["decode_vs_f32"] = ratio(r["decode_tok_s"], b["decode_tok_s"]);
      r["prefill_vs_f32"] = ratio(r["prefill_tok_s"], b["prefill_tok_s"]);
    }
  }

  nlohmann::json m;
  m["schema"] = kMatrixSchema;
  m["kind"] = "matrix";
  m["baseline"] = "f32";
  m["provenance"] = prov;
  m["subject_note"] = o.probe_model
                          ? "Probes (needle, counting, echo) ran on the probe model " + o.probe_model_path + " (" +
                                o.probe_model->fingerprint + "); KL/top-1 and timing on the matrix model. " +
                                subject_note(*o.probe_model)
                          : subject_note(model);
  nlohmann::json probe_cfg = nlohmann::json::object();
  for (const auto& [k, s] : o.probe_specs)
    probe_cfg[k] = {{"lengths", s.lengths}, {"depths", s.depths}, {"seeds", s.seeds}};
  m["config"] = {{"formats", names},
                 {"lengths", o.lengths},
                 {"windows", windows},
                 {"devices", o.devices},
                 {"decode_steps", o.decode_steps},
                 {"warm_turn", o.warm_turn},
                 {"repeats", o.repeats},
                 {"budget_bytes", o.budget_bytes},
                 {"threads", o.threads},
                 {"timing", o.timing},
                 {"quick", o.quick},
                 {"block_size", block},
                 {"corpus", o.corpus_path.empty() ? nlohmann::json(nullptr)
                                                  : nlohmann::json(std::filesystem::path(o.corpus_path).filename().string())},
                 {"streaming_supported", streaming},
                 {"conversations_supported", engine_supports_conversations()},
                 {"probes", probe_cfg},
                 {"probe_subject", o.probe_model ? nlohmann::json({{"path", o.probe_model_path},
                                                                  {"fingerprint", o.probe_model->fingerprint}})
                                                 : nlohmann::json(nullptr)}};
  nlohmann::json notes = nlohmann::json::array();
  if (!windows_note.empty()) notes.push_back(windows_note);
  if (!corpus_note.empty()) notes.push_back(corpus_note);
  if (!o.timing) notes.push_back("timing off (--no-timing): TTFT and tok/s are null");
  m["notes"] = notes;
  m["formats"] = per_format;
  m["rows"] = rows;
  return m;
}

}  // namespace kvgate::matrix
