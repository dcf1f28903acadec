// Warm vs cold TTFT of a conversation's second turn on stories260K, per KV format, and the KV
// file's size per format (Google Benchmark):
//   BM_SecondTurnCold/<preset>  the whole transcript (turn 1 + its reply + the new text) is prefilled
//   BM_SecondTurnWarm/<preset>  the KV file is read, verified (checksums, version, compatibility)
//                               and hydrated; only the new text is prefilled
// Both stop at the first sampled token (TTFT). Turn 1: a 200-token prompt and a 48-token reply;
// turn 2 adds 12 tokens (249 transcript ids, 248 of them in the KV file). One thread; the engine is
// built once per benchmark (process start is not TTFT). Counters: ttft_ms, file_bytes,
// hydrated_tokens (and ttft_cpu_ms: this thread's CPU time, robust on a loaded machine). At exit:
// warm/cold per format (wall and CPU) and file size vs f32.
// Model: stories260K/stories260K.bin, found by kvgate::find_model (kvgate/model_paths.hpp).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <ctime>
#include <unistd.h>

#include "kvgate/engine.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/model_paths.hpp"
#include "kvgate/sampler.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// CPU time of this thread (user + system), in seconds: on a loaded machine the wall time of a
// single-threaded turn is inflated by waiting for a core, its CPU time is not.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

const kvgate::Model& model() {
  static std::unique_ptr<kvgate::Model> m = [] {
    // The source tree: $KVGATE_SOURCE_DIR, else the folder above this file's.
    const char* src = std::getenv("KVGATE_SOURCE_DIR");
    const std::string root =
        src && *src ? std::string(src) : std::filesystem::path(__FILE__).parent_path().parent_path().string();
    const kvgate::ModelLookup lk = kvgate::find_model("stories260K/stories260K.bin", root);
    if (!lk.found()) {
      std::fprintf(stderr, "bench_persist: %s\n", lk.message.c_str());
      std::exit(2);
    }
    return std::make_unique<kvgate::Model>(kvgate::load_model(lk.path));
  }();
  return *m;
}

const std::string& work_dir() {
  static const std::string d = [] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/kvgate-bench-persist.XXXXXX";
    if (!mkdtemp(tmpl.data())) std::exit(2);
    return tmpl;
  }();
  return d;
}

kvgate::KvFormat preset(int i) { return kvgate::presets()[static_cast<std::size_t>(i)].fmt; }
std::string preset_name(int i) { return std::string(kvgate::presets()[static_cast<std::size_t>(i)].name); }

kvgate::EngineOptions opts(int pi) {
  kvgate::EngineOptions o = kvgate::engine_options_for(preset(pi), 1);
  o.prefill_chunk = 512;
  return o;
}

// Turn 1 (prompt + greedy reply) saved to <work>/<preset>.kvf; returns the turn-2 prompt.
std::vector<int> prepare(int pi, std::string& path) {
  const kvgate::Model& m = model();
  kvgate::Engine e(m, opts(pi));
  std::vector<int> prompt(200);
  prompt[0] = m.config.bos_id;
  for (int i = 1; i < 200; ++i) prompt[static_cast<std::size_t>(i)] = 3 + (i * 37) % (m.config.vocab_size - 3);
  std::vector<int> transcript = prompt;
  int next = kvgate::argmax(e.prefill(prompt));
  for (int i = 0; i < 48; ++i) {
    transcript.push_back(next);
    next = kvgate::argmax(e.decode(next));
  }
  path = work_dir() + "/" + preset_name(pi) + ".kvf";
  const int pend[1] = {next};
  e.save_kv(path, pend);
  transcript.push_back(next);
  for (int i = 0; i < 12; ++i) transcript.push_back(3 + (i * 53) % (m.config.vocab_size - 3));
  return transcript;
}

struct Row {
  double cold_ms = 0, warm_ms = 0, cold_cpu_ms = 0, warm_cpu_ms = 0;
  std::uintmax_t file_bytes = 0;
  std::uint64_t kv_bytes = 0;
};
std::map<std::string, Row>& rows() {
  static std::map<std::string, Row> r;
  return r;
}

void BM_SecondTurnCold(benchmark::State& st) {
  const int pi = static_cast<int>(st.range(0));
  std::string path;
  const std::vector<int> prompt = prepare(pi, path);
  kvgate::Engine e(model(), opts(pi));
  double total = 0, cpu = 0;
  for (auto _ : st) {
    e.reset();
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_s();
    const int tok = kvgate::argmax(e.prefill(prompt));
    cpu += thread_cpu_s() - c0;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(dt);
    total += dt;
    benchmark::DoNotOptimize(tok);
  }
  const double ms = total / static_cast<double>(st.iterations()) * 1e3;
  const double cpu_ms = cpu / static_cast<double>(st.iterations()) * 1e3;
  st.counters["ttft_ms"] = ms;
  st.counters["ttft_cpu_ms"] = cpu_ms;
  st.counters["prefilled"] = static_cast<double>(prompt.size());
  st.SetLabel(preset_name(pi));
  rows()[preset_name(pi)].cold_ms = ms;
  rows()[preset_name(pi)].cold_cpu_ms = cpu_ms;
}

void BM_SecondTurnWarm(benchmark::State& st) {
  const int pi = static_cast<int>(st.range(0));
  std::string path;
  const std::vector<int> prompt = prepare(pi, path);
  kvgate::Engine e(model(), opts(pi));
  double total = 0, cpu = 0;
  int hydrated = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_s();
    const kvgate::KvFile f = kvgate::read_kv_file(path);  // read + every check
    hydrated = e.hydrate(f, prompt);
    const int tok = kvgate::argmax(e.prefill(std::span<const int>(prompt).subspan(static_cast<std::size_t>(hydrated))));
    cpu += thread_cpu_s() - c0;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(dt);
    total += dt;
    benchmark::DoNotOptimize(tok);
  }
  const double ms = total / static_cast<double>(st.iterations()) * 1e3;
  const std::uintmax_t bytes = std::filesystem::file_size(path);
  const double cpu_ms = cpu / static_cast<double>(st.iterations()) * 1e3;
  st.counters["ttft_ms"] = ms;
  st.counters["ttft_cpu_ms"] = cpu_ms;
  st.counters["file_bytes"] = static_cast<double>(bytes);
  st.counters["hydrated_tokens"] = hydrated;
  st.counters["prefilled"] = static_cast<double>(prompt.size()) - hydrated;
  st.SetLabel(preset_name(pi));
  Row& r = rows()[preset_name(pi)];
  r.warm_ms = ms;
  r.warm_cpu_ms = cpu_ms;
  r.file_bytes = bytes;
  r.kv_bytes = e.stats().kv_bytes;
}

void args(benchmark::internal::Benchmark* b) {
  for (int p = 0; p < static_cast<int>(kvgate::presets().size()); ++p) b->Arg(p);
  b->ArgName("preset");
}

BENCHMARK(BM_SecondTurnCold)->Apply(args)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK(BM_SecondTurnWarm)->Apply(args)->Unit(benchmark::kMillisecond)->UseManualTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const auto& r = rows();
  const auto f32 = r.find("f32");
  std::printf("\nsecond turn on stories260K (248 saved K/V rows, 13 tokens to prefill when warm, 261 when cold): warm vs cold TTFT, file size\n");
  std::printf("  %-10s %10s %10s %10s %11s %11s %11s %11s %12s %12s\n", "format", "cold ms", "warm ms", "warm/cold",
              "cold cpu ms", "warm cpu ms", "cpu w/c", "cold/warm", "file bytes", "file vs f32");
  for (const auto& [name, row] : r) {
    const double ratio = row.cold_ms > 0 ? row.warm_ms / row.cold_ms : 0;
    const double size_ratio = f32 != r.end() && f32->second.file_bytes > 0
                                  ? static_cast<double>(row.file_bytes) / static_cast<double>(f32->second.file_bytes)
                                  : 0;
    const double cpu_ratio = row.cold_cpu_ms > 0 ? row.warm_cpu_ms / row.cold_cpu_ms : 0;
    std::printf("  %-10s %10.3f %10.3f %10.3f %11.3f %11.3f %11.3f %10.1fx %12ju %12.3f\n", name.c_str(), row.cold_ms,
                row.warm_ms, ratio, row.cold_cpu_ms, row.warm_cpu_ms, cpu_ratio,
                cpu_ratio > 0 ? 1.0 / cpu_ratio : 0.0, row.file_bytes, size_ratio);
  }
  std::error_code ec;
  std::filesystem::remove_all(work_dir(), ec);
  return 0;
}
