// Provenance of every bench/probe/sign-off record: commit, CPU, GPU, driver, CUDA, compiler and
// flags, seed, model hash (llama-bench style). SHA-256 is FIPS 180-4, written here (no dependency).
#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvgate/build_paths.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate/model_paths.hpp"
#include "kvgate/parallel.hpp"

#ifndef KVGATE_SOURCE_DIR_DEFAULT
#define KVGATE_SOURCE_DIR_DEFAULT "."
#endif
#ifndef KVGATE_CXX_FLAGS
#define KVGATE_CXX_FLAGS ""
#endif
#ifndef KVGATE_BUILD_TYPE
#define KVGATE_BUILD_TYPE ""
#endif
#ifndef KVGATE_CUDA_BUILD
#define KVGATE_CUDA_BUILD 0
#endif

namespace kvgate::matrix {

namespace {

struct Sha256 {
  std::uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::uint8_t buf[64];
  std::size_t len = 0;
  std::uint64_t total = 0;
  static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const std::uint8_t* p) {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (std::uint32_t(p[4 * i]) << 24) | (std::uint32_t(p[4 * i + 1]) << 16) | (std::uint32_t(p[4 * i + 2]) << 8) |
             std::uint32_t(p[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const std::uint32_t ch = (e & f) ^ (~e & g);
      const std::uint32_t t1 = hh + S1 + ch + k[i] + w[i];
      const std::uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const std::uint32_t mj = (a & b) ^ (a & c) ^ (b & c);
      const std::uint32_t t2 = S0 + mj;
      hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  void update(const std::uint8_t* p, std::size_t n) {
    total += n;
    while (n > 0) {
      const std::size_t take = std::min<std::size_t>(64 - len, n);
      std::memcpy(buf + len, p, take);
      len += take; p += take; n -= take;
      if (len == 64) { block(buf); len = 0; }
    }
  }
  std::string hex() {
    const std::uint64_t bits = total * 8;
    const std::uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (len != 56) update(&zero, 1);
    std::uint8_t lb[8];
    for (int i = 0; i < 8; ++i) lb[i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
    update(lb, 8);
    char out[65];
    for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h[i]);
    return std::string(out, 64);
  }
};

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

// Output of a shell command (stderr dropped), or empty.
std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char b[4096];
  std::size_t n;
  while ((n = std::fread(b, 1, sizeof b, p)) > 0) out.append(b, n);
  pclose(p);
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return trim(line.substr(line.find(':') + 1));
  return "unknown";
}

}  // namespace

std::string sha256_hex(const void* data, std::size_t n) {
  Sha256 s;
  s.update(static_cast<const std::uint8_t*>(data), n);
  return s.hex();
}

std::string sha256_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  Sha256 s;
  std::vector<char> b(1 << 16);
  while (f) {
    f.read(b.data(), static_cast<std::streamsize>(b.size()));
    const auto n = f.gcount();
    if (n > 0) s.update(reinterpret_cast<const std::uint8_t*>(b.data()), static_cast<std::size_t>(n));
  }
  return s.hex();
}

std::string default_source_dir() {
  const std::string top = trim(capture("git rev-parse --show-toplevel"));
  if (!top.empty() && std::filesystem::exists(std::filesystem::path(top) / "datasets" / "corpora")) return top;
  return KVGATE_SOURCE_DIR_DEFAULT;
}

std::vector<std::string> model_dirs(const std::string& source_dir) {
  return kvgate::model_dirs(source_dir.empty() ? default_source_dir() : source_dir);
}

std::string find_model(const std::string& rel, const std::string& source_dir) {
  return kvgate::find_model(rel, source_dir.empty() ? default_source_dir() : source_dir).path;
}

std::string find_probe_model(const std::string& source_dir) {
  if (const char* e = std::getenv("KVGATE_PROBE_MODEL"); e && *e) return e;
  const auto p = std::filesystem::path(source_dir) / "datasets" / "models" / "probe";
  return std::filesystem::exists(p / "config.json") ? p.string() : std::string();
}

CommitStamp commit_stamp(const nlohmann::json& p) {
  CommitStamp s;
  if (!p.is_object()) return s;
  const nlohmann::json& commit = p.value("git_commit", nlohmann::json(nullptr));
  const nlohmann::json& dirty = p.value("git_dirty", nlohmann::json(nullptr));
  if (commit.is_string()) s.commit = commit.get<std::string>();
  s.dirty = dirty.is_boolean() && dirty.get<bool>();
  return s;
}

nlohmann::json provenance(const ProvenanceOptions& o) {
  nlohmann::json j;
  const std::string src = o.source_dir.empty() ? default_source_dir() : o.source_dir;
  const std::string git = "git -C " + shell_quote(src) + " ";
  const std::string commit = trim(capture(git + "rev-parse HEAD"));
  j["git_commit"] = commit.empty() ? nlohmann::json(nullptr) : nlohmann::json(commit);
  j["git_dirty"] = commit.empty() ? nlohmann::json(nullptr)
                                  : nlohmann::json(!trim(capture(git + "status --porcelain --untracked-files=no")).empty());
  j["kvgate_version"] = "0.1.0";
  j["cpu_model"] = cpu_model();
  j["cpu_cores"] = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  utsname u{};
  if (uname(&u) == 0) j["os"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  // GPU: nvidia-smi when present (a CPU machine reports none).
  nlohmann::json gpus = nlohmann::json::array();
  std::string driver;
  std::istringstream smi(capture("nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader"));
  for (std::string line; std::getline(smi, line);) {
    line = trim(line);
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(trim(x));
    gpus.push_back({{"name", f.size() > 0 ? f[0] : ""}, {"memory", f.size() > 1 ? f[1] : ""}});
    if (f.size() > 2) driver = f[2];
  }
  j["gpus"] = gpus;
  j["gpu_driver"] = driver.empty() ? nlohmann::json(nullptr) : nlohmann::json(driver);
  // Device count and how the GPUs are linked (a multi-GPU field report says which rig it came from).
  j["gpu_count"] = static_cast<int>(gpus.size());
  const std::string topo = gpus.size() > 1 ? gpu_topology(capture("nvidia-smi topo -m"), static_cast<int>(gpus.size()))
                                           : gpu_topology("", static_cast<int>(gpus.size()));
  j["gpu_topology"] = topo.empty() ? nlohmann::json(nullptr) : nlohmann::json(topo);
  std::string cuda;
  const std::string smi_head = capture("nvidia-smi");
  if (const auto p = smi_head.find("CUDA Version:"); p != std::string::npos) {
    std::istringstream s(smi_head.substr(p + 13));
    s >> cuda;
  }
  j["cuda_version"] = cuda.empty() ? nlohmann::json(nullptr) : nlohmann::json(cuda);
  j["cuda_build"] = KVGATE_CUDA_BUILD != 0;
#if defined(__clang__)
  j["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  j["compiler"] = std::string("gcc ") + __VERSION__;
#else
  j["compiler"] = "unknown";
#endif
  j["cxx_flags"] = trim(KVGATE_CXX_FLAGS);
  j["build_type"] = KVGATE_BUILD_TYPE;
  j["seed"] = o.seed;
  j["threads"] = o.threads;
  if (o.model) {
    const Model& m = *o.model;
    nlohmann::json mj;
    mj["path"] = m.path;
    mj["name"] = std::filesystem::path(m.path).filename().string();
    mj["kind"] = m.source_kind;
    mj["fingerprint"] = m.fingerprint;
    std::string sha;
    if (std::filesystem::is_regular_file(m.path)) {
      sha = sha256_file(m.path);
    } else if (std::filesystem::is_directory(m.path)) {  // HF directory: hash of the files' hashes
      std::vector<std::string> files;
      for (const auto& e : std::filesystem::directory_iterator(m.path))
        if (e.is_regular_file()) files.push_back(e.path().filename().string());
      std::sort(files.begin(), files.end());
      std::vector<std::string> sums(files.size());  // one file per thread: a sharded 8B model in seconds
      parallel_indices(files.size(), 0, [&](std::size_t i) { sums[i] = sha256_file((std::filesystem::path(m.path) / files[i]).string()); });
      std::string cat;
      for (std::size_t i = 0; i < files.size(); ++i) cat += files[i] + ":" + sums[i] + "\n";
      sha = sha256_hex(cat.data(), cat.size());
    }
    mj["sha256"] = sha;
    const auto& c = m.config;
    mj["config"] = {{"arch", c.arch},         {"dim", c.dim},           {"n_layers", c.n_layers},
                    {"n_heads", c.n_heads},   {"n_kv_heads", c.n_kv_heads}, {"head_dim", c.head_dim},
                    {"vocab_size", c.vocab_size}, {"max_seq_len", c.max_seq_len}};
    j["model"] = mj;
  } else {
    j["model"] = nullptr;
  }
  return j;
}

std::string gpu_topology(const std::string& topo_m, int n_gpus) {
  if (n_gpus <= 0) return "";
  if (n_gpus == 1) return "single";
  // Rows "GPUi <link to GPU0> <link to GPU1> ... <CPU affinity> ...", the diagonal "X".
  std::vector<std::vector<std::string>> link(static_cast<std::size_t>(n_gpus),
                                             std::vector<std::string>(static_cast<std::size_t>(n_gpus), "?"));
  std::istringstream in(topo_m);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string head;
    ls >> head;
    if (head.rfind("GPU", 0) != 0 || head.size() < 4) continue;
    int i = -1;
    try {
      i = std::stoi(head.substr(3));
    } catch (const std::exception&) {
      continue;
    }
    if (i < 0 || i >= n_gpus) continue;
    for (int k = 0; k < n_gpus; ++k) {
      std::string cell;
      if (!(ls >> cell)) break;
      link[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)] = cell;
    }
  }
  std::string out;
  for (int i = 0; i < n_gpus; ++i)
    for (int k = i + 1; k < n_gpus; ++k)
      out += (out.empty() ? "" : ",") + ("GPU" + std::to_string(i) + "-GPU" + std::to_string(k) + ":" +
                                        link[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)]);
  return out;
}

nlohmann::json provenance_brief(const nlohmann::json& p) {
  nlohmann::json b;
  b["git_commit"] = p.value("git_commit", nlohmann::json(nullptr));
  b["cpu_model"] = p.value("cpu_model", "");
  b["cpu_cores"] = p.value("cpu_cores", 0);
  std::string gpu;
  for (const auto& g : p.value("gpus", nlohmann::json::array())) gpu += (gpu.empty() ? "" : "; ") + g.value("name", "");
  b["gpu"] = gpu.empty() ? nlohmann::json(nullptr) : nlohmann::json(gpu);
  b["gpu_driver"] = p.value("gpu_driver", nlohmann::json(nullptr));
  b["gpu_count"] = p.value("gpu_count", static_cast<int>(p.value("gpus", nlohmann::json::array()).size()));
  b["gpu_topology"] = p.value("gpu_topology", nlohmann::json(nullptr));
  b["cuda_version"] = p.value("cuda_version", nlohmann::json(nullptr));
  b["compiler"] = p.value("compiler", "");
  b["cxx_flags"] = p.value("cxx_flags", "");
  b["seed"] = p.value("seed", 0);
  b["threads"] = p.value("threads", 1);
  const auto& m = p.contains("model") ? p["model"] : nlohmann::json(nullptr);
  b["model_sha256"] = m.is_object() ? m.value("sha256", "") : "";
  b["model_fingerprint"] = m.is_object() ? m.value("fingerprint", "") : "";
  return b;
}

nlohmann::json environment(const ProvenanceOptions& o) {
  nlohmann::json e = provenance(o);
  std::ifstream mem("/proc/meminfo");
  for (std::string line; std::getline(mem, line);)
    if (line.rfind("MemTotal", 0) == 0) e["memory_total"] = trim(line.substr(line.find(':') + 1));
  const std::string smi = capture("nvidia-smi -L");
  e["nvidia_smi_L"] = trim(smi);
  e["nvcc"] = trim(capture("nvcc --version | tail -n 2 | head -n 1"));
  e["cmake"] = trim(capture("cmake --version | head -n 1"));
  return e;
}

}  // namespace kvgate::matrix
