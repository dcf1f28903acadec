// CPU engine throughput on stories260K (Google Benchmark):
//   BM_Decode/<preset>/threads:<n>   decode tok/s over 511 steps after BOS (the model's 512 context),
//                                    greedy tokens fed back, stop tokens ignored (run.c -n 512 does the same work)
//   BM_Prefill512/<preset>/...       prefill tok/s of a 512-token prompt (batched)
//   BM_DecodeAtDepth/<preset>        only with KVGATE_BENCH_MODEL=<path> (any model load_model reads:
//                                    a Hugging Face directory such as `kvgate synth`'s, a GGUF, a
//                                    llama2.c .bin): KVGATE_BENCH_STEPS (default 32) greedy decode
//                                    steps after a KVGATE_BENCH_CONTEXT-token prompt (default 2048),
//                                    one thread, the presets of KVGATE_BENCH_FORMATS (default
//                                    f32,int8). The prompt is prefilled once per format (untimed);
//                                    each repetition (one iteration) truncates back to it and
//                                    decodes, timed in thread-CPU seconds. Run it with
//                                    --benchmark_repetitions=N --benchmark_enable_random_interleaving=true:
//                                    the formats' repetitions alternate, and the exit summary prints
//                                    each format's per-repetition rates and its median over f32's.
// Model: stories260K/stories260K.bin, found by kvgate::find_model (kvgate/model_paths.hpp).
// The counters tok_s (and, for decode, ratio_vs_f32 printed at exit) are what reports quote.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/model_paths.hpp"
#include "kvgate/sampler.hpp"

#ifndef KVGATE_SOURCE_DIR_DEFAULT
#define KVGATE_SOURCE_DIR_DEFAULT ""
#endif

namespace {

const kvgate::Model& model() {
  static std::unique_ptr<kvgate::Model> m = [] {
    const char* src = std::getenv("KVGATE_SOURCE_DIR");
    const kvgate::ModelLookup lk =
        kvgate::find_model("stories260K/stories260K.bin", src && *src ? src : KVGATE_SOURCE_DIR_DEFAULT);
    if (!lk.found()) {
      std::fprintf(stderr, "bench_decode_cpu: %s\n", lk.message.c_str());
      std::exit(2);
    }
    return std::make_unique<kvgate::Model>(kvgate::load_model(lk.path));
  }();
  return *m;
}

struct Rates {
  double wall = 0, cpu = 0;
};
std::map<std::string, Rates>& decode_rates() {
  static std::map<std::string, Rates> r;
  return r;
}

// CPU time of the calling thread: robust to other processes sharing the cores (the wall-clock
// rate is what users see; on a loaded machine the two differ).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

kvgate::KvFormat preset(int i) { return kvgate::presets()[static_cast<std::size_t>(i)].fmt; }
std::string preset_name(int i) { return std::string(kvgate::presets()[static_cast<std::size_t>(i)].name); }

// An n-token prompt: BOS (where the model has one), then a fixed walk over the vocabulary.
std::vector<int> walk_prompt(const kvgate::Model& m, int n) {
  std::vector<int> p(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = 3 + (i * 37) % (m.config.vocab_size - 3);
  if (m.config.bos_id >= 0) p[0] = m.config.bos_id;
  return p;
}

void BM_Decode(benchmark::State& st) {
  const int pi = static_cast<int>(st.range(0)), threads = static_cast<int>(st.range(1));
  const kvgate::Model& m = model();
  kvgate::EngineOptions o = kvgate::engine_options_for(preset(pi), threads);
  kvgate::Engine e(m, o);
  const int steps = m.config.max_seq_len - 1;
  long long toks = 0;
  double secs = 0, cpu = 0;
  for (auto _ : st) {
    e.reset();
    const int bos = m.config.bos_id;
    int next = kvgate::argmax(e.prefill(std::span<const int>(&bos, 1)));
    const double c0 = thread_cpu_seconds();
    for (int i = 0; i < steps; ++i) next = kvgate::argmax(e.decode(next));
    cpu += thread_cpu_seconds() - c0;
    toks += steps;
    secs += e.stats().decode_seconds;
    benchmark::DoNotOptimize(next);
  }
  const double rate = secs > 0 ? static_cast<double>(toks) / secs : 0;
  const double cpu_rate = cpu > 0 ? static_cast<double>(toks) / cpu : 0;
  st.counters["tok_s"] = rate;
  if (threads == 1) st.counters["tok_s_cpu"] = cpu_rate;  // one thread: its CPU time is the whole cost
  st.counters["kv_bytes"] = static_cast<double>(e.stats().kv_bytes);
  st.SetLabel(preset_name(pi) + " threads=" + std::to_string(e.stats().threads));
  decode_rates()[preset_name(pi) + "/" + std::to_string(threads)] = {rate, threads == 1 ? cpu_rate : 0};
}

void BM_Prefill512(benchmark::State& st) {
  const int pi = static_cast<int>(st.range(0)), threads = static_cast<int>(st.range(1));
  const kvgate::Model& m = model();
  kvgate::EngineOptions o = kvgate::engine_options_for(preset(pi), threads);
  o.prefill_chunk = 512;
  kvgate::Engine e(m, o);
  const std::vector<int> prompt = walk_prompt(m, 512);
  for (auto _ : st) {
    e.reset();
    benchmark::DoNotOptimize(e.prefill(prompt).data());
  }
  st.counters["tok_s"] = benchmark::Counter(512.0 * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.SetLabel(preset_name(pi) + " threads=" + std::to_string(e.stats().threads));
}

// ---- BM_DecodeAtDepth: a user-given model at a given depth (KVGATE_BENCH_MODEL) ----
// A positive integer from the environment (unset or empty: dflt); anything else exits 2 naming it.
int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  const std::string s(v);
  int x = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec != std::errc() || end != s.data() + s.size() || x < 1) {
    std::fprintf(stderr, "bench_decode_cpu: %s=%s: expected a positive integer\n", name, v);
    std::exit(2);
  }
  return x;
}
const kvgate::Model& depth_model() {
  static std::unique_ptr<kvgate::Model> m = std::make_unique<kvgate::Model>(kvgate::load_model(std::getenv("KVGATE_BENCH_MODEL")));
  return *m;
}
// Per preset: an engine holding the prompt (prefilled once), and its repetitions' thread-CPU rates.
struct DepthRun {
  std::unique_ptr<kvgate::Engine> engine;
  int next = 0;
  std::vector<double> cpu_rates;
};
std::map<int, DepthRun>& depth_runs() {
  static std::map<int, DepthRun> r;
  return r;
}

void BM_DecodeAtDepth(benchmark::State& st) {
  const int pi = static_cast<int>(st.range(0));
  const kvgate::Model& m = depth_model();
  const int ctx = env_int("KVGATE_BENCH_CONTEXT", 2048), steps = env_int("KVGATE_BENCH_STEPS", 32);
  if (ctx + steps > m.config.max_seq_len) {
    st.SkipWithError("KVGATE_BENCH_CONTEXT + KVGATE_BENCH_STEPS must fit the model's max_seq_len");
    return;
  }
  DepthRun& run = depth_runs()[pi];
  if (!run.engine) {  // the prompt, prefilled once per format
    run.engine = std::make_unique<kvgate::Engine>(m, kvgate::engine_options_for(preset(pi), 1));
    run.next = kvgate::argmax(run.engine->prefill(walk_prompt(m, ctx)));
  }
  kvgate::Engine& e = *run.engine;
  long long toks = 0;
  double cpu = 0;
  for (auto _ : st) {
    e.truncate(ctx);
    int next = run.next;
    const double c0 = thread_cpu_seconds();
    for (int i = 0; i < steps; ++i) next = kvgate::argmax(e.decode(next));
    cpu += thread_cpu_seconds() - c0;
    toks += steps;
    benchmark::DoNotOptimize(next);
  }
  const double cpu_rate = cpu > 0 ? static_cast<double>(toks) / cpu : 0;
  st.counters["tok_s_cpu"] = cpu_rate;
  st.counters["kv_bytes"] = static_cast<double>(e.stats().kv_bytes);
  st.SetLabel(preset_name(pi) + " context=" + std::to_string(ctx) + " steps=" + std::to_string(steps));
  run.cpu_rates.push_back(cpu_rate);
}

// The presets named by KVGATE_BENCH_FORMATS (comma-separated; an unknown name exits 2 naming it).
void depth_args(benchmark::internal::Benchmark* b) {
  const char* f = std::getenv("KVGATE_BENCH_FORMATS");
  const std::string list = f && *f ? f : "f32,int8";
  const int n = static_cast<int>(kvgate::presets().size());
  for (std::size_t a = 0; a <= list.size();) {
    const std::size_t z = std::min(list.find(',', a), list.size());
    const std::string name = list.substr(a, z - a);
    int p = 0;
    while (p < n && preset_name(p) != name) ++p;
    if (p == n) {
      std::fprintf(stderr, "bench_decode_cpu: KVGATE_BENCH_FORMATS=%s: '%s' is not a preset (kvgate formats lists them)\n",
                   list.c_str(), name.c_str());
      std::exit(2);
    }
    b->Args({p});
    a = z + 1;
  }
  b->ArgNames({"preset"});
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void print_depth_summary() {
  const auto& runs = depth_runs();
  const auto f32 = std::find_if(runs.begin(), runs.end(), [](const auto& r) { return preset_name(r.first) == "f32"; });
  const double base = f32 == runs.end() ? 0 : median(f32->second.cpu_rates);
  std::printf("\nBM_DecodeAtDepth (%s): decode tok/s per thread-CPU-second, each repetition, median, median / f32's\n",
              std::getenv("KVGATE_BENCH_MODEL"));
  for (const auto& [pi, run] : runs) {
    std::printf("  %-10s", preset_name(pi).c_str());
    for (const double r : run.cpu_rates) std::printf(" %.3f", r);
    const double med = median(run.cpu_rates);
    std::printf("   median %.3f", med);
    if (base > 0) std::printf("   ratio %.3f", med / base);
    std::printf("\n");
  }
}

int all_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void args(benchmark::internal::Benchmark* b) {
  for (int p = 0; p < static_cast<int>(kvgate::presets().size()); ++p) {
    b->Args({p, 1});
    if (all_threads() > 1) b->Args({p, all_threads()});
  }
  b->ArgNames({"preset", "threads"});
}

BENCHMARK(BM_Decode)->Apply(args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Prefill512)->Apply(args)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  const char* depth_model_path = std::getenv("KVGATE_BENCH_MODEL");
  if (depth_model_path && *depth_model_path) {  // registered only when asked for: it loads a second model
    try {
      depth_model();
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "bench_decode_cpu: KVGATE_BENCH_MODEL=%s: %s\n", depth_model_path, ex.what());
      return 2;
    }
    benchmark::RegisterBenchmark("BM_DecodeAtDepth", BM_DecodeAtDepth)
        ->Apply(depth_args)
        ->Iterations(1)  // one timed decode run per repetition (no calibration calls in the summary)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // Ratios against f32 KV at the same thread count (the bar: int8 within 10% of f32).
  auto& r = decode_rates();
  bool header = false;
  for (const auto& [k, v] : r) {
    const auto slash = k.find('/');
    const auto f32 = r.find("f32" + k.substr(slash));
    if (f32 == r.end() || f32->second.wall <= 0) continue;
    if (!header) {
      std::printf("\ndecode tok/s vs f32 KV (same threads); cpu = per thread-CPU-second (1 thread only)\n");
      header = true;
    }
    std::printf("  %-14s %10.1f tok/s  ratio %.3f", k.c_str(), v.wall, v.wall / f32->second.wall);
    if (v.cpu > 0 && f32->second.cpu > 0)
      std::printf("   cpu %10.1f tok/s  ratio %.3f", v.cpu, v.cpu / f32->second.cpu);
    std::printf("\n");
  }
  if (!depth_runs().empty()) print_depth_summary();
  return 0;
}
