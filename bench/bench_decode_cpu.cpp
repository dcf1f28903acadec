// CPU engine throughput on stories260K (Google Benchmark):
//   BM_Decode/<preset>/threads:<n>   decode tok/s over 511 steps after BOS (the model's 512 context),
//                                    greedy tokens fed back, stop tokens ignored (run.c -n 512 does the same work)
//   BM_Prefill512/<preset>/...       prefill tok/s of a 512-token prompt (batched)
// Model: stories260K/stories260K.bin, found by kvgate::find_model (kvgate/model_paths.hpp).
// The counters tok_s (and, for decode, ratio_vs_f32 printed at exit) are what reports quote.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>

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
  std::vector<int> prompt(512);
  prompt[0] = m.config.bos_id;
  for (int i = 1; i < 512; ++i) prompt[static_cast<std::size_t>(i)] = 3 + (i * 37) % (m.config.vocab_size - 3);
  for (auto _ : st) {
    e.reset();
    benchmark::DoNotOptimize(e.prefill(prompt).data());
  }
  st.counters["tok_s"] = benchmark::Counter(512.0 * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.SetLabel(preset_name(pi) + " threads=" + std::to_string(e.stats().threads));
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
  return 0;
}
