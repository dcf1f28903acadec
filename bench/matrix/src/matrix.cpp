// The A/B matrix (`kvgate bench`). Timing is read only when MatrixOptions::timing is on.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
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
// `weights`: the device weights every engine of the row shares (null: each uploads its own, f32).
std::string cuda_row(const Model& model, const EngineOptions& eo, std::span<const int> prompt, int decode_steps,
                     std::span<const int> warm_prompt, int warm_prefix, const std::string& warm_file, CudaTiming& out,
                     const std::shared_ptr<const cuda::CudaModel>& weights) {
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
  co.shared_weights = weights;
  if (weights) co.weights = weights->weight_type();
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
      (void)out, (void)weights;
  return "this build has no CUDA backend (configure with -DKVGATE_CUDA=ON where nvcc is installed)";
#endif
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}


std::size_t kv_bytes_per_token(const KvFormat& f, const ModelConfig& c, int block, bool latent) {
  const HalfGeometries g = kv_half_geometries(c, block, latent);
  return static_cast<std::size_t>(c.n_layers) * (page_bytes(f.k, g.k) + page_bytes(f.v, g.v)) / static_cast<std::size_t>(block);
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

void apply_grid(MatrixOptions& mo, const GridOverrides& g) {
  auto& nd = mo.probe_specs["needle"];
  nd.kind = probes::ProbeKind::needle;
  if (!g.needle_lengths.empty()) nd.lengths = parse_int_list(g.needle_lengths);
  if (!g.needle_depths.empty()) nd.depths = parse_double_list(g.needle_depths);
  if (!g.needle_seeds.empty()) nd.seeds = parse_seed_list(g.needle_seeds);
  if (!g.counting_n.empty()) {
    mo.probe_specs["counting"].kind = probes::ProbeKind::counting;
    mo.probe_specs["counting"].lengths = parse_int_list(g.counting_n);
  }
  if (!g.echo_seeds.empty()) {
    mo.probe_specs["echo"].kind = probes::ProbeKind::echo;
    mo.probe_specs["echo"].seeds = parse_seed_list(g.echo_seeds);
  }
  if (!g.bench_lengths.empty()) mo.lengths = parse_int_list(g.bench_lengths);
  if (g.repeats > 0) mo.repeats = g.repeats;
}

void set_device(MatrixOptions& mo, const std::string& device, const std::string& cuda_weights) {
  if (device != "cpu" && device != "cuda") throw std::invalid_argument("--device must be cpu or cuda, not '" + device + "'");
  mo.devices = {device};
  mo.probe_device = device;
  mo.cuda_weights = cuda_weights;
  if (device == "cuda") {
    mo.quality = false;
    mo.windows = {0};  // streaming rows: the CPU matrix's (the CUDA window must hold a whole step)
  }
}

signoff::QualityOptions quality_options_for(const Model& m, const std::string& device, const std::vector<std::vector<int>>& corpus,
                                            int quality_tokens, int decode_path_tokens) {
  signoff::QualityOptions q;
  q.device = device;
  q.window = 512;
  std::size_t longest = 1;
  for (const auto& s : corpus) longest = std::max(longest, s.size());
  const int ctx = m.config.max_seq_len > 0 ? m.config.max_seq_len : static_cast<int>(longest);
  q.max_tokens = std::min<int>(ctx, static_cast<int>(longest));
  if (quality_tokens > 0) q.max_tokens = std::min(q.max_tokens, quality_tokens);
  q.decode_path_tokens = decode_path_tokens >= 0 ? decode_path_tokens : device == "cuda" ? 2048 : 0;
  q.compare_threads = 0;
  q.prefill_chunk = signoff_prefill_chunk(device);
  return q;
}

int signoff_prefill_chunk(const std::string& device) { return default_prefill_chunk(device); }

std::string quality_path_text(const std::string& device, int prefill_chunk) {
  const std::string engine = device == "cuda" ? "kvgate::cuda::CudaEngine (GPU)" : "kvgate::Engine (CPU)";
  return "teacher-forced on " + engine + ": a chunked prefill (" + std::to_string(prefill_chunk) +
         " tokens) whose chunks write K/V into the paged store in "
         "the format before attending over it, in windows of 512 positions, every format's engine in step with the "
         "baseline's; noise: the other float KV, and the baseline on the decode path (one decode step per token)";
}

ResolvedKv resolve_on_device(const ModelConfig& cfg, const KvFormat& format, int block_size, const std::string& device,
                             bool mla_latent) {
  if (device != "cpu" && device != "cuda") throw std::invalid_argument("--device must be cpu or cuda, not '" + device + "'");
  if (device == "cuda") {
#if KVGATE_CUDA_BUILD
    kvgate::cuda::register_capability();  // what the CUDA kernels can run (needs no device)
#else
    throw std::runtime_error("--device cuda: this build has no CUDA backend (configure with -DKVGATE_CUDA=ON where nvcc is installed)");
#endif
  }
  KvRequest req;
  req.flag = format;
  req.backend = device;
  req.mla_latent = mla_latent;
  return resolve_kv(req, cfg, block_size);
}

StageClock::StageClock() : t0_(std::chrono::duration<double>(Clock::now().time_since_epoch()).count()), last_(t0_) {}
void StageClock::done(const std::string& stage) {
  const double now = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "stage: %-40s %8.1f s   (total %8.1f s)\n", stage.c_str(), now - last_, now - t0_);
  stages_.push_back({{"stage", stage}, {"seconds", now - last_}});
  last_ = now;
}
nlohmann::json StageClock::to_json() const { return stages_; }

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

namespace {

// The state of one matrix run, filled by the steps of run_matrix in order.
struct Fmt {
  std::string name;
  ResolvedKv kv;
};
struct MatrixRun {
  const Model& model;
  const MatrixOptions& o;
  const nlohmann::json& prov;
  const Progress& progress;
  int block = 16;
  std::vector<std::string> names;  // f32 first (the baseline), then the formats asked for
  std::vector<Fmt> fmts;
  std::vector<int> windows;
  std::optional<Corpus> corpus;
  std::vector<int> perf_ids;
  nlohmann::json per_format = nlohmann::json::array();
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json sensitivity = nullptr;
  std::vector<std::vector<float>> ref_logits;  // f32 KV's corpus logits (corpus_quality)
  nlohmann::json ablation = nlohmann::json::array();
  std::vector<std::string> notes;
  std::shared_ptr<const cuda::CudaModel> probe_weights;   // --device cuda probes: one upload for every format
  std::shared_ptr<const cuda::CudaModel> timing_weights;  // cuda timing rows: one upload for every row
  void say(const std::string& s) const {
    if (progress) progress(s);
  }
  // The MLA latent cache is asked for (o.mla_cache) and the matrix model has MLA.
  bool latent() const { return o.mla_cache == "latent" && model.config.mla.any(); }
  // Options of an engine over `cfg`'s model (the matrix model by default; the probe subject passes
  // its own: it runs the latent cache only when it is an MLA model itself).
  EngineOptions eo_for(const ResolvedKv& kv, int window, const ModelConfig* cfg = nullptr) const {
    EngineOptions eo;
    eo.kv = kv;
    eo.threads = o.threads;
    eo.block_size = block;
    eo.mla_cache = o.mla_cache == "latent" && (cfg ? cfg : &model.config)->mla.any() ? MlaCache::latent : MlaCache::expanded;
    set_resident(eo, window);
    return eo;
  }
  std::string tag(std::size_t fi) const {
    return "[" + std::to_string(fi + 1) + "/" + std::to_string(fmts.size()) + "] " + fmts[fi].name;
  }
};

const std::vector<std::string> kProbeNames = {"needle", "counting", "echo"};

// Step: every format resolved as a flag would be (a fallback is reported), f32 first.
void resolve_formats(MatrixRun& r) {
  r.names = {"f32"};
  for (const auto& f : r.o.formats)
    if (std::find(r.names.begin(), r.names.end(), f) == r.names.end()) r.names.push_back(f);
  for (const auto& n : r.names) {
    const auto f = parse_kv_format(n);
    if (!f) throw std::invalid_argument("unknown KV format '" + n + "'; known: " + known_formats_text());
    KvRequest req;
    req.flag = *f;
    req.mla_latent = r.latent();
    r.fmts.push_back({f->name(), resolve_kv(req, r.model.config, r.block)});
  }
}

// Step: the streaming windows the engine supports (0 = resident).
void resolve_windows(MatrixRun& r) {
  const bool streaming = engine_supports_streaming();
  for (int w : r.o.windows) {
    if (w > 0 && !streaming) {
      r.notes.push_back("streaming windows dropped: the engine has no --kv-resident");
      continue;
    }
    if (std::find(r.windows.begin(), r.windows.end(), w) == r.windows.end()) r.windows.push_back(w);
  }
  if (r.windows.empty()) r.windows = {0};
}

// Step: the corpus (checked against the vocabulary) and the timing prompt: the corpus tokens
// concatenated (real text), else a fixed ramp of ids.
void load_prompt(MatrixRun& r) {
  const ModelConfig& cfg = r.model.config;
  if (!r.o.corpus_path.empty()) {
    r.corpus = load_corpus(r.o.corpus_path);
    for (const auto& seq : r.corpus->sequences)
      for (int id : seq)
        if (id < 0 || id >= cfg.vocab_size)
          throw std::invalid_argument("corpus " + r.o.corpus_path + ": token id " + std::to_string(id) +
                                      " is outside the model's vocabulary [0, " + std::to_string(cfg.vocab_size) +
                                      ") -- it was sampled from another model; pass --corpus none or a corpus of this model");
    if (!r.corpus->model_fingerprint.empty() && r.corpus->model_fingerprint != r.model.fingerprint)
      r.notes.push_back("corpus " + r.o.corpus_path + " was sampled from model " + r.corpus->model_fingerprint + ", not " +
                        r.model.fingerprint + ": KL/top-1 are over its ids anyway");
  }
  if (r.corpus)
    for (const auto& s : r.corpus->sequences) r.perf_ids.insert(r.perf_ids.end(), s.begin(), s.end());
  if (r.perf_ids.empty()) r.perf_ids.push_back(cfg.bos_id);
  for (std::size_t i = 0; r.perf_ids.size() < static_cast<std::size_t>(std::max(cfg.max_seq_len, 1)); ++i)
    r.perf_ids.push_back(r.perf_ids[i % r.perf_ids.size()] == cfg.bos_id ? 3 : r.perf_ids[i % r.perf_ids.size()]);
}

// Step: bytes and capacity of every format.
void format_bytes(MatrixRun& r) {
  const ModelConfig& cfg = r.model.config;
  for (const auto& F : r.fmts) {
    nlohmann::json fj;
    fj["format"] = F.name;
    fj["k"] = std::string(name(F.kv.effective.k));
    fj["v"] = std::string(name(F.kv.effective.v));
    fj["requested"] = F.kv.requested.name();
    fj["effective"] = F.kv.effective.name();
    fj["fallback_reason"] = F.kv.fallback_reason;
    const HalfGeometries hg = kv_half_geometries(cfg, r.block, r.latent());
    const PageGeometry gk = hg.k, gv = hg.v;
    fj["bytes_per_cell"] = bytes_per_cell(F.kv.effective.k, gk) + bytes_per_cell(F.kv.effective.v, gv);
    fj["kv_bytes_per_token"] = kv_bytes_per_token(F.kv.effective, cfg, r.block, r.latent());
    StoreConfig sc;
    sc.format = F.kv.effective;
    sc.n_layers = cfg.n_layers;
    sc.n_kv_heads = gk.n_kv_heads;
    sc.head_dim = gk.head_dim;
    sc.v_head_dim = gv.head_dim;
    sc.block_size = r.block;
    fj["capacity_tokens"] = static_cast<long long>(blocks_for_budget(sc, r.o.budget_bytes)) * r.block;
    fj["kl_mean"] = fj["kl_p99"] = fj["kl_max"] = fj["top1"] = nullptr;
    fj["kl_positions"] = 0;
    fj["probes"] = nlohmann::json::object();
    r.per_format.push_back(fj);
  }
}

// Step: KL / top-1 of every format against f32 KV over the corpus (CPU engine).
void corpus_quality(MatrixRun& r) {
  if (!r.o.quality || !r.corpus) return;
  std::vector<std::vector<float>> ref;
  for (std::size_t fi = 0; fi < r.fmts.size(); ++fi) {
    r.say(r.tag(fi) + ": KL/top-1 over " + std::to_string(r.corpus->sequences.size()) + " corpus sequences");
    auto logits = corpus_logits(r.model, r.eo_for(r.fmts[fi].kv, 0), *r.corpus);
    if (fi == 0) ref = logits;
    if (fi == 0) r.ref_logits = logits;
    const Quality q = compare_logits(ref, logits, r.model.config.vocab_size);
    auto& fj = r.per_format[fi];
    fj["kl_mean"] = q.kl_mean;
    fj["kl_p99"] = q.kl_p99;
    fj["kl_max"] = q.kl_max;
    fj["top1"] = q.top1;
    fj["kl_positions"] = q.positions;
  }
}

// Step: the per-layer ablation -- each --layer-ablation format on one layer at a time, the rest on the
// f32 baseline, KL / top-1 against f32 KV over the corpus (the CPU engine's per-layer map).
void layer_ablation(MatrixRun& r) {
  if (r.o.layer_ablation.empty()) return;
  if (!r.o.quality || !r.corpus || r.ref_logits.empty()) {
    r.notes.push_back("layer ablation not measured: it needs the corpus quality step (a corpus, quality on)");
    return;
  }
  const ModelConfig& c = r.model.config;
  const PageGeometry g{r.block, c.n_kv_heads, c.head_dim};
  const KvFormat f32{HalfFormat::f32, HalfFormat::f32};
  if (!r.o.layer_ablation.empty() && r.latent()) {  // a per-layer map runs the expanded cache only
    r.notes.push_back("layer ablation not measured: --mla-cache latent takes one format for every layer");
    return;
  }
  for (const std::string& name : r.o.layer_ablation) {
    const auto f = parse_kv_format(name);
    if (!f) throw std::invalid_argument("--layer-ablation: unknown KV format '" + name + "' (" + known_formats_text() + ")");
    std::string refused;
    for (const HalfFormat h : {f->k, f->v})
      if (const Capability cap = supports(h, g); !cap.ok) refused = cap.reason;
    if (!refused.empty()) {
      r.notes.push_back("layer ablation of " + name + " not measured: its pages cannot hold this model's rows (" + refused + ")");
      continue;
    }
    for (int l = 0; l < c.n_layers; ++l) {
      r.say("layer ablation: " + name + " on layer " + std::to_string(l) + " of " + std::to_string(c.n_layers));
      EngineOptions eo = r.eo_for(r.fmts[0].kv, 0);  // the f32 baseline's options
      eo.kv_layers.assign(static_cast<std::size_t>(c.n_layers), f32);
      eo.kv_layers[static_cast<std::size_t>(l)] = *f;
      const Quality q = compare_logits(r.ref_logits, corpus_logits(r.model, eo, *r.corpus), c.vocab_size);
      r.ablation.push_back({{"format", f->name()},
                            {"layer", l},
                            {"map", kv_layer_map_name(eo.kv_layers)},
                            {"kl_mean", q.kl_mean},
                            {"kl_p99", q.kl_p99},
                            {"kl_max", q.kl_max},
                            {"top1", q.top1},
                            {"kl_positions", q.positions},
                            {"layer_kv_bytes_per_token",
                             static_cast<double>(page_bytes(f->k, g) + page_bytes(f->v, g)) / r.block}});
    }
  }
}

// Step: needle / counting / echo on the probe subject, per format, on the probe device; each case's
// output compared with the f32 run's.
void format_probes(MatrixRun& r) {
  const Model& pmodel = r.o.probe_model ? *r.o.probe_model : r.model;
  if (!r.o.probes || !pmodel.tokenizer) return;
  ProbeDevice dev;
  dev.device = r.o.probe_device;
  dev.cuda_weights = r.o.cuda_weights;
  if (dev.device == "cuda") {
    if (!r.probe_weights) r.probe_weights = shared_cuda_weights(pmodel, r.o.cuda_weights);
    dev.weights = r.probe_weights;
  }
  std::map<std::string, std::map<std::string, std::string>> f32_outputs;  // probe -> case id -> output
  for (std::size_t fi = 0; fi < r.fmts.size(); ++fi) {
    const auto& F = r.fmts[fi];
    // The probe subject resolves the requested format against its own geometry (a fallback there
    // is reported in the probe record, never hidden).
    KvRequest preq;
    preq.flag = F.kv.requested;
    preq.mla_latent = r.o.mla_cache == "latent" && pmodel.config.mla.any();
    const ResolvedKv pkv = r.o.probe_model ? resolve_kv(preq, pmodel.config, r.block) : F.kv;
    nlohmann::json pj = nlohmann::json::object();
    for (const auto& pn : kProbeNames) {
      const auto kind = *probes::parse_probe_kind(pn);
      const auto it = r.o.probe_specs.find(pn);
      const ProbeSpec spec = it != r.o.probe_specs.end() ? it->second : default_probe_spec(kind, pmodel, r.o.quick);
      // Probe outcomes do not depend on the thread count (MOD.engine.threads), so they use every core.
      EngineOptions peo = r.eo_for(pkv, 0, &pmodel.config);
      peo.threads = 0;
      if (dev.device == "cuda") peo.prefill_chunk = signoff_prefill_chunk("cuda");
      const auto res = run_probe(pmodel, peo, spec, [&](const std::string& line) { r.say(r.tag(fi) + ": " + line); }, &dev);
      int same = 0, ran = 0;
      for (const auto& c : res["results"]) {
        if (c.value("status", "") != "ran") continue;
        ++ran;
        const std::string id = c.value("id", ""), out = c.value("output", "");
        if (fi == 0) f32_outputs[pn][id] = out;
        else if (f32_outputs[pn].count(id) && f32_outputs[pn][id] == out) ++same;
      }
      if (fi == 0) same = ran;
      nlohmann::json s = {{"cases", res["cases"]}, {"passed", res["passed"]}, {"skipped", res["skipped"]},
                          {"ran", ran}, {"exact", ran ? double(res["passed"].get<int>()) / ran : 0.0},
                          {"same_as_f32", ran ? double(same) / ran : 0.0}, {"summary", res["summary"]},
                          {"backend", res["backend"]}};
      nlohmann::json cases = nlohmann::json::array();
      for (const auto& c : res["results"]) {
        nlohmann::json cc = {{"id", c["id"]}, {"status", c["status"]}, {"passed", c["passed"]}};
        if (c.contains("output")) cc["output"] = c["output"].get<std::string>().substr(0, 160);
        for (const char* k : {"first_divergence", "repeated", "dropped_digits", "length", "depth", "n"})
          if (c.contains(k)) cc[k] = c[k];
        cases.push_back(cc);
      }
      s["cases_detail"] = cases;
      pj[pn] = s;
    }
    r.per_format[fi]["probes"] = pj;
  }
}

// Step: each probe's sensitivity -- the smallest injected KV damage that turns it red, on the probe
// device: the CPU engine (the damage on the store read of the sensitivity baseline's KV) or the CUDA
// engine (the damage on the stored rows; one weight upload for every case).
void probe_sensitivities(MatrixRun& r) {
  const Model& pmodel = r.o.probe_model ? *r.o.probe_model : r.model;
  if (!r.o.probes || !pmodel.tokenizer || r.o.sensitivity_baseline.empty()) return;
  const auto f = parse_kv_format(r.o.sensitivity_baseline);
  if (!f) throw std::invalid_argument("sensitivity baseline '" + r.o.sensitivity_baseline + "' is not a KV format");
  KvRequest req;
  req.flag = *f;
  EngineOptions eo = r.eo_for(resolve_kv(req, pmodel.config, r.block), 0, &pmodel.config);
  eo.threads = 0;
  ProbeDevice dev;
  dev.device = r.o.probe_device;
  dev.cuda_weights = r.o.cuda_weights;
  if (dev.device == "cuda") {
    eo.prefill_chunk = signoff_prefill_chunk("cuda");  // as the format_probes step
    if (!r.probe_weights) r.probe_weights = shared_cuda_weights(pmodel, r.o.cuda_weights);  // format_probes' upload
    dev.weights = r.probe_weights;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& pn : kProbeNames) {
    const auto kind = *probes::parse_probe_kind(pn);
    const auto it = r.o.probe_specs.find(pn);
    const ProbeSpec spec = it != r.o.probe_specs.end() ? it->second : default_probe_spec(kind, pmodel, r.o.quick);
    // The baseline's undamaged outcomes from the format_probes step when it ran this format.
    const nlohmann::json* base_cases = nullptr;
    for (const auto& fj : r.per_format)
      if (fj.value("format", "") == f->name() && fj["probes"].contains(pn)) base_cases = &fj["probes"][pn]["cases_detail"];
    out.push_back(signoff::to_json(probe_sensitivity(pmodel, eo, spec, r.o.sensitivity, r.progress, base_cases, &dev)));
  }
  r.sensitivity = {{"baseline", f->name()}, {"engine", dev.device}, {"probes", out}};
}

// One timing row of the CUDA engine: `repeats` runs, medians.
void cuda_timing_row(MatrixRun& r, const Fmt& F, int L, int w, nlohmann::json& row) {
  const MatrixOptions& o = r.o;
  const ModelConfig& cfg = r.model.config;
  std::vector<double> ttft, prefill, decode, warm;
  CudaTiming ct;
  std::string why, warm_reason;
  const std::span<const int> prompt(r.perf_ids.data(), static_cast<std::size_t>(L));
  // The second turn of the warm TTFT, as the CPU rows: L tokens hydrated, warm_turn prefilled.
  std::span<const int> p2;
  std::string warm_file;
  if (o.timing && L + o.warm_turn + 1 <= cfg.max_seq_len && !o.cache_dir.empty()) {
    std::filesystem::create_directories(o.cache_dir);
    p2 = std::span<const int>(r.perf_ids.data(), static_cast<std::size_t>(L + o.warm_turn));
    warm_file = (std::filesystem::path(o.cache_dir) / "warm_cuda.kv").string();
  } else {
    warm_reason = !o.timing ? "timing off" : o.cache_dir.empty() ? "no cache folder" : "no room for the second turn";
  }
  for (int rep = 0; rep < std::max(1, o.repeats) && why.empty(); ++rep) {
    if (!r.timing_weights) {
      try {
        r.timing_weights = shared_cuda_weights(r.model, o.cuda_weights);
      } catch (const std::exception& e) {
        why = std::string("CUDA engine refused or failed: ") + e.what();
        break;
      }
    }
    EngineOptions ceo = r.eo_for(F.kv, w);
    ceo.prefill_chunk = signoff_prefill_chunk("cuda");
    why = cuda_row(r.model, ceo, prompt, o.decode_steps, p2, L, warm_file, ct, r.timing_weights);
    ttft.push_back(ct.ttft_ms);
    prefill.push_back(ct.prefill_tok_s);
    decode.push_back(ct.decode_tok_s);
    if (ct.warm_ms) warm.push_back(*ct.warm_ms);
    else if (!p2.empty()) warm_reason = ct.warm_reason;
  }
  if (!why.empty()) {
    row["status"] = "not_run";
    row["reason"] = why;
    return;
  }
  row["effective"] = ct.effective;
  if (ct.effective != F.kv.requested.name()) row["fallback_reason"] = "the CUDA backend holds " + ct.effective + " (resolve_kv backend cuda)";
  row["pool_bytes"] = ct.pool_bytes;
  row["kv_bytes"] = ct.kv_bytes;
  if (o.timing) {
    row["ttft_cold_ms"] = median(ttft);
    row["prefill_tok_s"] = median(prefill);
    row["decode_tok_s"] = median(decode);
    row["ttft_warm_ms"] = warm.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(warm));
  }
  row["warm_prefix_tokens"] = L;
  row["warm_new_tokens"] = o.warm_turn;
  if (warm.empty()) row["ttft_warm_reason"] = warm_reason;
  row.update(ct.counters);
}

// One timing row of the CPU engine: `repeats` runs, medians.
void cpu_timing_row(MatrixRun& r, const Fmt& F, int L, int w, nlohmann::json& row) {
  const MatrixOptions& o = r.o;
  const ModelConfig& cfg = r.model.config;
  const EngineOptions eo = r.eo_for(F.kv, w);
  const std::span<const int> prompt(r.perf_ids.data(), static_cast<std::size_t>(L));
  std::vector<double> ttft, prefill, decode, warm;
  nlohmann::json counters;
  std::string warm_reason;
  for (int rep = 0; rep < std::max(1, o.repeats); ++rep) {
    Engine e(r.model, eo);
    row["pool_bytes"] = e.stats().kv_pool_bytes;
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
    row["kv_bytes"] = e.stats().kv_bytes;
    row["pipeline_stages"] = e.stats().pipeline_stages;
    row["tensor_parallel"] = e.stats().tensor_parallel;
    row["topology"] = e.stats().topology;
    row["gpus"] = e.stats().devices;
    if (o.timing && L + o.warm_turn + 1 <= cfg.max_seq_len && !o.cache_dir.empty()) {
      std::filesystem::create_directories(o.cache_dir);
      const std::span<const int> p2(r.perf_ids.data(), static_cast<std::size_t>(L + o.warm_turn));
      const auto v = warm_ttft_ms<Engine>(r.model, eo, p2, L, (std::filesystem::path(o.cache_dir) / "warm.kv").string(), warm_reason);
      if (v) warm.push_back(*v);
    } else if (warm_reason.empty()) {
      warm_reason = !o.timing ? "timing off" : o.cache_dir.empty() ? "no cache folder" : "no room for the second turn";
    }
  }
  if (o.timing) {
    row["ttft_cold_ms"] = median(ttft);
    row["prefill_tok_s"] = median(prefill);
    row["decode_tok_s"] = median(decode);
    row["ttft_warm_ms"] = warm.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(warm));
  }
  row["warm_prefix_tokens"] = L;
  row["warm_new_tokens"] = o.warm_turn;
  if (warm.empty()) row["ttft_warm_reason"] = warm_reason;
  row.update(counters);
}

// Step: the timing rows, device x format x context x window.
void timing_rows(MatrixRun& r) {
  const MatrixOptions& o = r.o;
  const ModelConfig& cfg = r.model.config;
  const nlohmann::json brief = provenance_brief(r.prov);
  const std::size_t total_rows = o.devices.size() * r.fmts.size() * o.lengths.size() * r.windows.size();
  std::size_t row_no = 0;
  for (const auto& device : o.devices)
    for (std::size_t fi = 0; fi < r.fmts.size(); ++fi)
      for (int L : o.lengths)
        for (int w : r.windows) {
          ++row_no;
          const auto& F = r.fmts[fi];
          const auto& fj = r.per_format[fi];
          nlohmann::json row;
          row["format"] = F.name;
          row["device"] = device;
          row["context"] = L;
          row["window"] = w;
          row["fallback_reason"] = F.kv.fallback_reason;
          row["effective"] = F.kv.effective.name();
          row["kv_bytes_per_token"] = fj["kv_bytes_per_token"];
          row["capacity_tokens"] = fj["capacity_tokens"];
          row["budget_bytes"] = o.budget_bytes;
          row["decode_steps"] = o.decode_steps;
          for (const char* k : {"kl_mean", "kl_p99", "top1"}) row[k] = fj[k];
          for (const auto& pn : kProbeNames) {
            const bool has = fj["probes"].contains(pn);
            row[pn + "_exact"] = has ? fj["probes"][pn]["exact"] : nlohmann::json(nullptr);
            row[pn + "_same_as_f32"] = has ? fj["probes"][pn]["same_as_f32"] : nlohmann::json(nullptr);
          }
          row["counting_repeated"] =
              fj["probes"].contains("counting") ? fj["probes"]["counting"]["summary"]["repeated"] : nlohmann::json(nullptr);
          row["echo_dropped_digits"] =
              fj["probes"].contains("echo") ? fj["probes"]["echo"]["summary"]["dropped_digits"] : nlohmann::json(nullptr);
          row["provenance"] = brief;
          // Topology of the engine that measured the row: the matrix runs the unsplit engine (one
          // store, one device); a split run (EngineOptions::pipeline_stages) reports its stages here.
          row["pipeline_stages"] = 1;
          row["tensor_parallel"] = 1;
          row["topology"] = "single";
          row["gpus"] = device == "cuda" ? 1 : 0;
          for (const char* k : {"pool_bytes", "ttft_cold_ms", "ttft_warm_ms", "prefill_tok_s", "decode_tok_s"}) row[k] = nullptr;
          row["status"] = "ok";
          row["reason"] = "";
          r.say("[row " + std::to_string(row_no) + "/" + std::to_string(total_rows) + "] " + device + " " + F.name +
                " ctx=" + std::to_string(L) + " window=" + std::to_string(w));
          if (L + o.decode_steps + 1 > (cfg.max_seq_len > 0 ? cfg.max_seq_len : L + o.decode_steps + 1)) {
            row["status"] = "skipped";
            row["reason"] = "context " + std::to_string(L) + " + " + std::to_string(o.decode_steps) +
                            " decode steps exceed the model's " + std::to_string(cfg.max_seq_len);
          } else if (device == "cuda") {
            cuda_timing_row(r, F, L, w, row);
          } else if (device != "cpu") {
            row["status"] = "not_run";
            row["reason"] = "unknown device '" + device + "' (known: cpu, cuda)";
          } else {
            cpu_timing_row(r, F, L, w, row);
          }
          r.rows.push_back(row);
        }
}

// Step: ratios against the f32 row of the same device, context and window.
void f32_ratios(MatrixRun& r) {
  for (auto& row : r.rows)
    for (const auto& b : r.rows) {
      if (b["format"] != "f32" || b["device"] != row["device"] || b["context"] != row["context"] || b["window"] != row["window"])
        continue;
      auto ratio = [](const nlohmann::json& a, const nlohmann::json& c) {
        return (a.is_number() && c.is_number() && c.get<double>() > 0) ? nlohmann::json(a.get<double>() / c.get<double>())
                                                                         : nlohmann::json(nullptr);
      };
      row["kv_bytes_vs_f32"] = ratio(row["kv_bytes_per_token"], b["kv_bytes_per_token"]);
      row["decode_vs_f32"] = ratio(row["decode_tok_s"], b["decode_tok_s"]);
      row["prefill_vs_f32"] = ratio(row["prefill_tok_s"], b["prefill_tok_s"]);
    }
}

// Step: the record.
nlohmann::json matrix_record(const MatrixRun& r) {
  const MatrixOptions& o = r.o;
  nlohmann::json m;
  m["schema"] = kMatrixSchema;
  m["kind"] = "matrix";
  m["baseline"] = "f32";
  m["provenance"] = r.prov;
  m["subject_note"] = o.probe_model
                          ? "Probes (needle, counting, echo) ran on the probe model " + o.probe_model_path + " (" +
                                o.probe_model->fingerprint + "); KL/top-1 and timing on the matrix model. " +
                                subject_note(*o.probe_model)
                          : subject_note(r.model);
  nlohmann::json probe_cfg = nlohmann::json::object();
  for (const auto& [k, s] : o.probe_specs)
    probe_cfg[k] = {{"lengths", s.lengths}, {"depths", s.depths}, {"seeds", s.seeds}};
  m["config"] = {{"formats", r.names},
                 {"lengths", o.lengths},
                 {"windows", r.windows},
                 {"devices", o.devices},
                 {"decode_steps", o.decode_steps},
                 {"warm_turn", o.warm_turn},
                 {"repeats", o.repeats},
                 {"budget_bytes", o.budget_bytes},
                 {"threads", o.threads},
                 {"timing", o.timing},
                 {"quick", o.quick},
                 {"block_size", r.block},
                 {"mla_cache", o.mla_cache},
                 {"corpus", o.corpus_path.empty() ? nlohmann::json(nullptr)
                                                  : nlohmann::json(std::filesystem::path(o.corpus_path).filename().string())},
                 {"streaming_supported", engine_supports_streaming()},
                 {"conversations_supported", engine_supports_conversations()},
                 {"probes", probe_cfg},
                 {"probe_device", o.probe_device},
                 {"probe_subject", o.probe_model ? nlohmann::json({{"path", o.probe_model_path},
                                                                  {"fingerprint", o.probe_model->fingerprint}})
                                                 : nlohmann::json(nullptr)}};
  nlohmann::json notes = r.notes;
  if (!o.timing) notes.push_back("timing off (--no-timing): TTFT and tok/s are null");
  m["notes"] = notes;
  m["formats"] = r.per_format;
  m["rows"] = r.rows;
  if (!r.o.layer_ablation.empty()) m["layer_ablation"] = r.ablation;
  if (!r.sensitivity.is_null()) m["probe_sensitivity"] = r.sensitivity;
  return m;
}

}  // namespace

// The matrix as a list of named steps over one MatrixRun.
nlohmann::json run_matrix(const Model& model, const MatrixOptions& o, const nlohmann::json& prov, const Progress& progress) {
  if (o.mla_cache != "expanded" && o.mla_cache != "latent")
    throw std::invalid_argument("--mla-cache: '" + o.mla_cache + "' is not an MLA cache layout; give expanded or latent");
  if (o.mla_cache == "latent" && !model.config.mla.any())
    throw std::invalid_argument("--mla-cache latent applies to multi-head latent attention models (DeepSeek-V2/V3: "
                                "kv_lora_rank in config.json); the matrix model (" + model.config.arch +
                                ") has none: drop the flag");
  MatrixRun r{model, o, prov, progress};
  resolve_formats(r);
  resolve_windows(r);
  load_prompt(r);
  format_bytes(r);
  corpus_quality(r);
  layer_ablation(r);
  format_probes(r);
  probe_sensitivities(r);
  r.probe_weights.reset();  // the GPU memory goes back before the timing rows
  timing_rows(r);
  r.timing_weights.reset();
  f32_ratios(r);
  return matrix_record(r);
}

}  // namespace kvgate::matrix
