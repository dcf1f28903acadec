// `kvgate synth`: deterministic random-weight Hugging Face directories (see kvgate/synth.hpp).
// This file is compiled with -ffp-contract=off (runtime/CMakeLists.txt): the normal generator's
// arithmetic must round identically everywhere.
#include "kvgate/synth.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_set>

#include "kvgate/atomic_file.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/parallel.hpp"
#include "kvgate/tokenizer_bpe.hpp"

namespace kvgate {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- PRNG ------------------------------------------------------------------------------------------

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
std::uint64_t fnv1a64(const std::string& s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

// ln(x) for x > 0 from IEEE basic operations only: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// ln(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716, series to s^27.
double det_log(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // exact
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e -= 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 1.0 / 27.0;
  for (int k = 12; k >= 0; --k) p = p * s2 + 1.0 / static_cast<double>(2 * k + 1);
  constexpr double kLn2 = 0.69314718055994530942;
  return static_cast<double>(e) * kLn2 + 2.0 * s * p;
}

// cos and sin of 2*pi*u for u in [0, 1): exact quarter-turn reduction, Taylor series on
// [-pi/4, pi/4].
void det_sincos_turn(double u, double* c, double* s) {
  const double t = 4.0 * u;  // exact
  const double qd = std::floor(t + 0.5);
  const double r = t - qd;   // exact, in [-0.5, 0.5]
  const int q = static_cast<int>(qd) & 3;
  constexpr double kHalfPi = 1.57079632679489661923;
  const double x = r * kHalfPi, x2 = x * x;
  // sin x = x (1 - x^2/(2*3) (1 - x^2/(4*5) (1 - ...))), cos x = 1 - x^2/(1*2) (1 - x^2/(3*4) (...)).
  double sn = 1.0, cs = 1.0;
  for (int k = 11; k >= 1; --k) {
    sn = 1.0 - x2 / static_cast<double>((2 * k) * (2 * k + 1)) * sn;
    cs = 1.0 - x2 / static_cast<double>((2 * k - 1) * (2 * k)) * cs;
  }
  sn *= x;
  switch (q) {
    case 0: *c = cs; *s = sn; break;
    case 1: *c = -sn; *s = cs; break;
    case 2: *c = -cs; *s = -sn; break;
    default: *c = sn; *s = -cs; break;
  }
}
}  // namespace

SynthRng::SynthRng(std::uint64_t seed) {
  std::uint64_t x = seed;
  for (auto& w : s) w = splitmix64(x);
}

std::uint64_t SynthRng::next() {
  const std::uint64_t result = rotl(s[1] * 5, 7) * 9;
  const std::uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double SynthRng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

void synth_normals(SynthRng& rng, float stddev, float* out, std::size_t n) {
  const double sd = stddev;
  for (std::size_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - rng.uniform();  // (0, 1]
    const double u2 = rng.uniform();
    const double rad = std::sqrt(-2.0 * det_log(u1));  // sqrt is correctly rounded (IEEE)
    double c = 0, s = 0;
    det_sincos_turn(u2, &c, &s);
    out[i] = static_cast<float>(rad * c * sd);
    if (i + 1 < n) out[i + 1] = static_cast<float>(rad * s * sd);
  }
}

// ---- atomic streaming file (the weights are too large for write_file_atomic's one buffer) ----------

namespace {

class AtomicFile {
 public:
  explicit AtomicFile(fs::path path) : path_(std::move(path)) {
    std::string tmp_name(".");
    tmp_name += path_.filename().string();
    tmp_name += ".tmp.";
    tmp_name += std::to_string(::getpid());
    tmp_ = path_.parent_path() / tmp_name;
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error("cannot create '" + tmp_.string() + "': " + std::strerror(errno));
    buf_.reserve(kBuf);
  }
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* p, std::size_t n) {
    const auto* b = static_cast<const char*>(p);
    if (buf_.size() + n > kBuf) flush();
    if (n >= kBuf) {
      raw_write(b, n);
    } else {
      buf_.insert(buf_.end(), b, b + n);
    }
    written_ += n;
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  std::uint64_t written() const { return written_; }

  void commit() {
    flush();
    if (::fsync(fd_) != 0) throw std::runtime_error("fsync '" + tmp_.string() + "': " + std::strerror(errno));
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw std::runtime_error("close '" + tmp_.string() + "': " + std::strerror(errno));
    }
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp_.c_str());
      throw std::runtime_error("rename '" + tmp_.string() + "' -> '" + path_.string() + "': " + std::strerror(err));
    }
    const int dfd = ::open(path_.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  static constexpr std::size_t kBuf = 8u << 20;
  void flush() {
    raw_write(buf_.data(), buf_.size());
    buf_.clear();
  }
  void raw_write(const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error("write '" + tmp_.string() + "': " + std::strerror(errno));
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }

  fs::path path_, tmp_;
  int fd_ = -1;
  std::vector<char> buf_;
  std::uint64_t written_ = 0;
};

std::uint64_t write_text_atomic(const fs::path& p, const std::string& text) {
  write_file_atomic(p.string(), text);
  return text.size();
}

// ---- tensors -------------------------------------------------------------------------------------

enum class Init { normal, ones, constant, ramp };  // ramp: element i = value * (1 + i/4)

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  Init init = Init::normal;
  float value = 0;  // stddev (normal) or the constant
  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

int dtype_bytes(const std::string& dt) { return dt == "f32" ? 4 : 2; }
const char* st_dtype(const std::string& dt) { return dt == "f32" ? "F32" : dt == "f16" ? "F16" : "BF16"; }

std::vector<TensorSpec> tensor_specs(const SynthOptions& o, int head_dim) {
  const std::int64_t D = o.hidden, F = o.ffn, V = o.vocab, Q = static_cast<std::int64_t>(o.heads) * head_dim,
                     KV = static_cast<std::int64_t>(o.kv_heads) * head_dim;
  auto sd = [](std::int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))); };
  std::vector<TensorSpec> t;
  // Untied: embedding rows of unit RMS, classifier 1/sqrt(D). Tied: one matrix serves both, at
  // D^(-1/4), so neither the input nor the logits are degenerate.
  const float emb_sd = o.tie_embeddings ? static_cast<float>(std::pow(static_cast<double>(D), -0.25)) : 1.0f;
  t.push_back({"model.embed_tokens.weight", {V, D}, Init::normal, emb_sd});
  for (int i = 0; i < o.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {D}, Init::ones, 1});
    if (o.arch == "deepseek_v3") {  // MLA (load_hf.cpp load_mla_layer): q_proj, the latent and its norm, kv_b
      const std::int64_t H = o.heads, R = o.kv_lora_rank, QK = o.qk_nope_head_dim + o.qk_rope_head_dim,
                         VH = static_cast<std::int64_t>(o.heads) * o.v_head_dim;
      t.push_back({p + "self_attn.q_proj.weight", {H * QK, D}, Init::normal, sd(D)});
      t.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {R + o.qk_rope_head_dim, D}, Init::normal, sd(D)});
      t.push_back({p + "self_attn.kv_a_layernorm.weight", {R}, Init::ones, 1});
      t.push_back({p + "self_attn.kv_b_proj.weight", {H * (o.qk_nope_head_dim + o.v_head_dim), R}, Init::normal, sd(R)});
      t.push_back({p + "self_attn.o_proj.weight", {D, VH}, Init::normal, sd(VH)});
    } else {
      t.push_back({p + "self_attn.q_proj.weight", {Q, D}, Init::normal, sd(D)});
      t.push_back({p + "self_attn.k_proj.weight", {KV, D}, Init::normal, sd(D)});
      t.push_back({p + "self_attn.v_proj.weight", {KV, D}, Init::normal, sd(D)});
      t.push_back({p + "self_attn.o_proj.weight", {D, Q}, Init::normal, sd(Q)});
    }
    if (o.arch == "qwen2") {
      t.push_back({p + "self_attn.q_proj.bias", {Q}, Init::normal, 0.1f});
      t.push_back({p + "self_attn.k_proj.bias", {KV}, Init::normal, 0.1f});
      t.push_back({p + "self_attn.v_proj.bias", {KV}, Init::normal, 0.1f});
    }
    if (o.arch == "qwen3") {
      t.push_back({p + "self_attn.q_norm.weight", {head_dim}, Init::ones, 1});
      t.push_back({p + "self_attn.k_norm.weight", {head_dim}, Init::ones, 1});
    }
    if (o.kv_scale > 0 && o.kv_scale_per_head) {  // [kv_heads]: distinct per head and layer, K != V
      const float layer_f = 1.0f + 0.125f * static_cast<float>(i);
      t.push_back({p + "self_attn.k_scale", {std::int64_t{o.kv_heads}}, Init::ramp, o.kv_scale * layer_f});
      t.push_back({p + "self_attn.v_scale", {std::int64_t{o.kv_heads}}, Init::ramp, o.kv_scale * 0.75f * layer_f});
    } else if (o.kv_scale > 0) {
      t.push_back({p + "self_attn.k_scale", {}, Init::constant, o.kv_scale});
      t.push_back({p + "self_attn.v_scale", {}, Init::constant, o.kv_scale});
    }
    t.push_back({p + "post_attention_layernorm.weight", {D}, Init::ones, 1});
    t.push_back({p + "mlp.gate_proj.weight", {F, D}, Init::normal, sd(D)});
    t.push_back({p + "mlp.up_proj.weight", {F, D}, Init::normal, sd(D)});
    t.push_back({p + "mlp.down_proj.weight", {D, F}, Init::normal, sd(F)});
  }
  t.push_back({"model.norm.weight", {D}, Init::ones, 1});
  if (!o.tie_embeddings) t.push_back({"lm_head.weight", {V, D}, Init::normal, sd(D)});
  return t;
}

// ---- chunked, parallel generation ---------------------------------------------------------------

// Every tensor is cut into chunks of kSynthChunk elements; chunk k of tensor `name` draws from its
// own stream, seeded from (seed, name, k) alone, so chunks can be generated in any order by any
// thread. Chunk 0's stream is the tensor's stream of the single-threaded generator (seed ^ FNV-1a
// of the name through splitmix64), so a tensor of at most one chunk keeps its earlier bytes.
constexpr std::size_t kSynthChunk = std::size_t{1} << 20;  // even: Box-Muller pairs never straddle chunks

std::uint64_t chunk_stream_seed(std::uint64_t seed, const std::string& name, std::uint64_t chunk) {
  std::uint64_t x = seed ^ fnv1a64(name);
  std::uint64_t s = splitmix64(x);
  if (chunk == 0) return s;
  std::uint64_t y = s ^ (chunk * 0xD1B54A32D192ED03ull);
  return splitmix64(y);
}

struct ChunkJob {
  const TensorSpec* t;
  std::uint64_t index;  // chunk number within the tensor
  std::size_t count;    // elements
};

// Chunk `j` of tensor t, as stored bytes of o.dtype, into `bytes` (scratch: kSynthChunk floats).
void generate_chunk(const ChunkJob& j, const SynthOptions& o, std::vector<float>& scratch, std::uint8_t* bytes) {
  const TensorSpec& t = *j.t;
  float* v = scratch.data();
  if (t.init == Init::normal) {
    SynthRng rng(chunk_stream_seed(o.seed, t.name, j.index));
    synth_normals(rng, t.value, v, j.count);
  } else if (t.init == Init::ramp) {
    for (std::size_t i = 0; i < j.count; ++i)
      v[i] = t.value * (1.0f + 0.25f * static_cast<float>(j.index * kSynthChunk + i));
  } else {
    std::fill(v, v + j.count, t.value);
  }
  if (o.dtype == "f32") {
    std::memcpy(bytes, v, j.count * 4);
    return;
  }
  const bool bf = o.dtype == "bf16";
  for (std::size_t i = 0; i < j.count; ++i) {
    const std::uint16_t h = bf ? f32_to_bf16_rne(v[i]) : f32_to_f16_rne(v[i]);
    std::memcpy(bytes + 2 * i, &h, 2);  // little-endian hosts (x86-64, aarch64)
  }
}

// Generates the chunks of `ts` (in order) on o.threads threads and writes them to f in order. The
// memory is bounded: at most `window` generated chunks wait for the writer (the calling thread).
void write_tensor_data(AtomicFile& f, const std::vector<const TensorSpec*>& ts, const SynthOptions& o) {
  std::vector<ChunkJob> jobs;
  for (const TensorSpec* t : ts)
    for (std::uint64_t done = 0, k = 0, n = t->numel(); done < n; done += kSynthChunk, ++k)
      jobs.push_back({t, k, static_cast<std::size_t>(std::min<std::uint64_t>(kSynthChunk, n - done))});
  const std::size_t eb = static_cast<std::size_t>(dtype_bytes(o.dtype));
  const int workers = std::min<int>(resolve_threads(o.threads), static_cast<int>(std::max<std::size_t>(jobs.size(), 1)));
  if (workers <= 1) {
    std::vector<float> scratch(kSynthChunk);
    std::vector<std::uint8_t> bytes(kSynthChunk * eb);
    for (const ChunkJob& j : jobs) {
      generate_chunk(j, o, scratch, bytes.data());
      f.write(bytes.data(), j.count * eb);
    }
    return;
  }
  const std::size_t window = 2 * static_cast<std::size_t>(workers);
  std::vector<std::vector<std::uint8_t>> slot(window, std::vector<std::uint8_t>(kSynthChunk * eb));
  std::vector<char> ready(window, 0);
  std::mutex mu;
  std::condition_variable cv_ready, cv_space;
  std::size_t next = 0, written = 0;  // next job to claim; jobs written so far
  bool stop = false;
  std::exception_ptr error;
  auto worker = [&] {
    std::vector<float> scratch(kSynthChunk);
    for (;;) {
      std::size_t j;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv_space.wait(lk, [&] { return stop || next >= jobs.size() || next < written + window; });
        if (stop || next >= jobs.size()) return;
        j = next++;
      }
      try {
        generate_chunk(jobs[j], o, scratch, slot[j % window].data());
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!error) error = std::current_exception();
        stop = true;
        cv_ready.notify_all();
        cv_space.notify_all();
        return;
      }
      std::lock_guard<std::mutex> lk(mu);
      ready[j % window] = 1;
      cv_ready.notify_all();
    }
  };
  std::vector<std::thread> pool;
  auto halt = [&] {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv_space.notify_all();
    for (auto& th : pool) th.join();
    pool.clear();
  };
  try {
    for (int k = 0; k < workers; ++k) {
      try {
        pool.emplace_back(worker);
      } catch (const std::system_error&) {
        if (pool.empty()) throw;
        break;  // fewer threads: the ones started do the work
      }
    }
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv_ready.wait(lk, [&] { return error || ready[j % window]; });
        if (error) std::rethrow_exception(error);
      }
      f.write(slot[j % window].data(), jobs[j].count * eb);  // only this thread touches a ready slot
      {
        std::lock_guard<std::mutex> lk(mu);
        ready[j % window] = 0;
        written = j + 1;
      }
      cv_space.notify_all();
    }
  } catch (...) {
    halt();
    throw;
  }
  halt();
}

std::uint64_t write_safetensors(const fs::path& path, const std::vector<const TensorSpec*>& ts, const SynthOptions& o,
                                const std::uint64_t seed_meta) {
  json h = json::object();
  std::uint64_t off = 0;
  const int eb = dtype_bytes(o.dtype);
  for (const TensorSpec* t : ts) {
    const std::uint64_t nb = t->numel() * static_cast<std::uint64_t>(eb);
    h[t->name] = {{"dtype", st_dtype(o.dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  h["__metadata__"] = {{"format", "pt"}, {"generator", "kvgate synth"}, {"seed", std::to_string(seed_meta)}};
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');
  AtomicFile f(path);
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(hs.size()) >> (8 * i));
  f.write(len, 8);
  f.write(hs);
  write_tensor_data(f, ts, o);  // data in header-offset order (the order of `ts`)
  f.commit();
  return f.written();
}

// ---- tokenizer -----------------------------------------------------------------------------------

// Training text for the merges (written for this project).
const char* const kCorpus =
    "The cache keeps the keys and the values of every token that came before, so the next token can look "
    "back at them. When the cache is stored in fewer bits, it holds more tokens in the same memory, and "
    "the question is what that costs. A format that rounds each value to the nearest step keeps the error "
    "within half a step; a format that shares one scale across a block of thirty-two values must say how "
    "it treats the value that sets the scale. The gates check every element against the bound the format "
    "declares, and the model-level checks compare the next-token distributions with and without the "
    "quantized cache. In the morning the team ran the matrix on the new machine: the numbers for the "
    "eight-bit formats were within a percent of the float baseline, and the four-bit rotation needed a "
    "second look at the counting probe. There were 128 heads, 32 layers, 4096 positions and 16 tokens per "
    "page. Don't trust a result you haven't seen fail; we'll write the mutant first, and then the test "
    "that kills it. It's the same lesson every time: if it can't go red, it isn't a gate.\n"
    "Once upon a time there was a little model that wanted to remember everything it had read. Its "
    "memory was small, so it learned to write the keys in smaller numbers and the values even smaller, "
    "and it checked, each night, that it could still find the needle in the haystack.\n";

struct Tok {
  std::vector<std::string> vocab;  // byte-level strings, index = id
  std::vector<std::pair<std::string, std::string>> merges;
};

Tok build_tokenizer(int n_regular, PreTokenizer pre) {
  Tok tk;
  std::unordered_set<std::string> have;
  for (int b = 0; b < 256; ++b) {
    tk.vocab.push_back(byte_to_unicode_utf8(static_cast<std::uint8_t>(b)));
    have.insert(tk.vocab.back());
  }
  // Words of the corpus as symbol sequences, with counts.
  std::map<std::string, int> words;
  for (const std::string& piece : pre_tokenize(kCorpus, pre)) ++words[piece];
  std::vector<std::pair<std::vector<std::string>, int>> ws;
  for (const auto& [w, n] : words) {
    std::vector<std::string> sym;
    for (unsigned char c : w) sym.push_back(byte_to_unicode_utf8(c));
    ws.emplace_back(std::move(sym), n);
  }
  auto add = [&](const std::string& a, const std::string& b) {
    tk.merges.emplace_back(a, b);
    tk.vocab.push_back(a + b);
    have.insert(a + b);
  };
  // Greedy BPE training on the corpus: most frequent pair, ties by the smaller pair.
  while (static_cast<int>(tk.vocab.size()) < n_regular) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& [sym, n] : ws)
      for (std::size_t i = 0; i + 1 < sym.size(); ++i) counts[{sym[i], sym[i + 1]}] += n;
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 1;
    for (const auto& [pr, n] : counts)
      if (n > best_n && !have.count(pr.first + pr.second)) {
        best_n = n;
        best = &pr;
      }
    if (!best) break;
    const auto pr = *best;
    add(pr.first, pr.second);
    for (auto& [sym, n] : ws) {
      std::vector<std::string> next;
      for (std::size_t i = 0; i < sym.size();) {
        if (i + 1 < sym.size() && sym[i] == pr.first && sym[i + 1] == pr.second) {
          next.push_back(pr.first + pr.second);
          i += 2;
        } else {
          next.push_back(sym[i++]);
        }
      }
      sym.swap(next);
    }
  }
  // Fill the rest with deterministic merges of existing tokens (bounded length).
  SynthRng rng(0x6B7667617465ull);  // fixed: the tokenizer depends on the vocab size only
  while (static_cast<int>(tk.vocab.size()) < n_regular) {
    const std::size_t n = tk.vocab.size();
    const std::string& a = tk.vocab[rng.next() % n];
    const std::string& b = tk.vocab[rng.next() % n];
    std::string raw_a, raw_b;
    byte_level_decode(a, &raw_a);
    byte_level_decode(b, &raw_b);
    if (raw_a.size() + raw_b.size() > 12 || have.count(a + b)) continue;
    const std::string aa = a, bb = b;
    add(aa, bb);
  }
  return tk;
}

const char* const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
const char* const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

std::string tokenizer_json(const SynthOptions& o) {
  const bool qwen = o.arch == "qwen2" || o.arch == "qwen3";
  const PreTokenizer pre = qwen ? PreTokenizer::qwen2 : PreTokenizer::llama3;
  const Tok tk = build_tokenizer(o.vocab - 2, pre);
  json vocab = json::object();
  for (std::size_t i = 0; i < tk.vocab.size(); ++i) vocab[tk.vocab[i]] = i;
  json merges = json::array();
  for (const auto& [a, b] : tk.merges) merges.push_back(a + " " + b);
  auto special = [](int id, const char* s) {
    return json{{"id", id}, {"content", s}, {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", {special(o.vocab - 2, "<|begin_of_text|>"), special(o.vocab - 1, "<|end_of_text|>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", qwen ? kQwen2Regex : kLlama3Regex}}}, {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      // As the families' own files: Llama 3 adds <|begin_of_text|>, Qwen2/3 add nothing (their
      // config.json declares bos_token_id all the same).
      {"post_processor", qwen ? json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                                     {"use_regex", false}}
                              : json{{"type", "TemplateProcessing"},
                                     {"single", json::array({json{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                                             json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                                     {"pair", json::array()},
                                     {"special_tokens",
                                      {{"<|begin_of_text|>",
                                        {{"id", "<|begin_of_text|>"},
                                         {"ids", json::array({o.vocab - 2})},
                                         {"tokens", json::array({"<|begin_of_text|>"})}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j.dump(1) + "\n";
}

std::string config_json(const SynthOptions& o, int head_dim) {
  static const std::map<std::string, std::pair<const char*, const char*>> names = {
      {"llama", {"LlamaForCausalLM", "llama"}},
      {"mistral", {"MistralForCausalLM", "mistral"}},
      {"qwen2", {"Qwen2ForCausalLM", "qwen2"}},
      {"qwen3", {"Qwen3ForCausalLM", "qwen3"}},
      {"deepseek_v3", {"DeepseekV3ForCausalLM", "deepseek_v3"}}};
  const bool qwen = o.arch == "qwen2" || o.arch == "qwen3";
  const double theta = o.rope_theta > 0 ? o.rope_theta : (qwen ? 1000000.0 : 10000.0);
  json j = {{"architectures", {names.at(o.arch).first}},
            {"model_type", names.at(o.arch).second},
            {"hidden_size", o.hidden},
            {"intermediate_size", o.ffn},
            {"num_hidden_layers", o.layers},
            {"num_attention_heads", o.heads},
            {"num_key_value_heads", o.kv_heads},
            {"head_dim", head_dim},
            {"vocab_size", o.vocab},
            {"max_position_embeddings", o.max_seq_len},
            {"rms_norm_eps", qwen ? 1e-6 : 1e-5},
            {"rope_theta", theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", o.tie_embeddings},
            {"bos_token_id", o.vocab - 2},
            {"eos_token_id", o.vocab - 1},
            {"torch_dtype", o.dtype == "f32" ? "float32" : o.dtype == "f16" ? "float16" : "bfloat16"},
            {"kvgate_synth", {{"seed", o.seed}, {"generator", "kvgate synth v1"}}}};
  if (o.arch == "mistral") j["sliding_window"] = nullptr;
  if (o.arch == "deepseek_v3") {  // DeepseekV3Config: MLA without q LoRA, every layer dense (no router runs)
    j["head_dim"] = o.qk_rope_head_dim;  // transformers' convention: head_dim is the RoPE width
    j["num_key_value_heads"] = o.heads;
    j["kv_lora_rank"] = o.kv_lora_rank;
    j["q_lora_rank"] = nullptr;
    j["qk_rope_head_dim"] = o.qk_rope_head_dim;
    j["qk_nope_head_dim"] = o.qk_nope_head_dim;
    j["qk_head_dim"] = o.qk_nope_head_dim + o.qk_rope_head_dim;
    j["v_head_dim"] = o.v_head_dim;
    j["rope_interleave"] = true;
    j["first_k_dense_replace"] = o.layers;
    j["n_routed_experts"] = 4;
    j["num_experts_per_tok"] = 2;
    j["moe_intermediate_size"] = o.ffn;
    j["n_shared_experts"] = 0;
    j["n_group"] = 1;
    j["topk_group"] = 1;
    j["norm_topk_prob"] = true;
    j["routed_scaling_factor"] = 1.0;
    j["rms_norm_eps"] = 1e-6;
  }
  if (o.rope == "llama3") {  // Llama 3.1 / 3.2 / 3.3, in transformers 5's spelling
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "llama3"},
                            {"rope_theta", theta},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}};
  }
  if (!o.kv_algo.empty() && o.kv_algo_file == "config")
    j["quantization_config"] = {{"kv_cache_quant_algo", o.kv_algo}};
  return j.dump(2) + "\n";
}

void check_options(const SynthOptions& o) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("synth: " + m); };
  if (o.arch != "llama" && o.arch != "mistral" && o.arch != "qwen2" && o.arch != "qwen3" && o.arch != "deepseek_v3")
    bad("--arch must be llama, mistral, qwen2, qwen3 or deepseek_v3 (got '" + o.arch + "')");
  if (o.arch == "deepseek_v3") {
    if (o.kv_lora_rank < 1 || o.kv_lora_rank > (1 << 16)) bad("--kv-lora-rank must be in 1..65536");
    if (o.qk_rope_head_dim < 2 || o.qk_rope_head_dim > 512 || o.qk_rope_head_dim % 2 != 0)
      bad("--qk-rope-head-dim must be even and in 2..512 (RoPE rotates pairs)");
    if (o.qk_nope_head_dim < 1 || o.qk_nope_head_dim > (1 << 14)) bad("--qk-nope-head-dim must be in 1..16384");
    if (o.v_head_dim < 1 || o.v_head_dim > o.qk_nope_head_dim + o.qk_rope_head_dim)
      bad("--v-head-dim must be in 1..qk_nope_head_dim + qk_rope_head_dim");
  }
  if (o.layers < 1 || o.layers > 1024) bad("--layers must be in 1..1024");
  if (o.hidden < 2 || o.hidden > (1 << 17)) bad("--hidden must be in 2..131072");
  if (o.ffn < 1 || o.ffn > (1 << 20)) bad("--ffn must be in 1..1048576");
  if (o.heads < 1) bad("--heads must be >= 1");
  if (o.arch != "deepseek_v3" && (o.kv_heads < 1 || o.heads % o.kv_heads != 0))  // MLA: one KV head per query head
    bad("--heads and --kv-heads must be >= 1 and --kv-heads must divide --heads");
  if (o.head_dim == 0 && o.hidden % o.heads != 0 && o.arch != "deepseek_v3")
    bad("--hidden must be a multiple of --heads when --head-dim is 0");
  const int hd = o.head_dim ? o.head_dim : o.hidden / o.heads;
  if (o.arch != "deepseek_v3" && (hd < 2 || hd % 2 != 0)) bad("head_dim must be even and >= 2 (RoPE rotates pairs), got " + std::to_string(hd));
  if (o.vocab < 258 || o.vocab > (1 << 20)) bad("--vocab must be in 258..1048576 (256 bytes + bos + eos)");
  if (o.max_seq_len < 1) bad("--max-seq-len must be >= 1");
  if (o.dtype != "f32" && o.dtype != "f16" && o.dtype != "bf16") bad("--dtype must be f32, f16 or bf16");
  if (o.kv_algo_file != "config" && o.kv_algo_file != "hf_quant_config")
    bad("--kv-algo-file must be config or hf_quant_config");
  if (!(o.kv_scale >= 0) || !std::isfinite(o.kv_scale)) bad("--kv-scale must be a finite value >= 0");
  if (o.shards < 1 || o.shards > 999) bad("--shards must be in 1..999");
  if (o.threads < 0 || o.threads > 1024) bad("--threads must be in 0..1024 (0: all cores)");
  if (!o.rope.empty() && o.rope != "llama3") bad("--rope must be empty (plain RoPE) or llama3 (got '" + o.rope + "')");
  if (o.out.empty()) bad("--out is required");
}

}  // namespace

SynthResult synth_hf(const SynthOptions& o) {
  check_options(o);
  const int hd = o.head_dim ? o.head_dim : o.hidden / o.heads;
  const fs::path dir(o.out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw std::runtime_error("synth: cannot create directory '" + o.out + "'");

  SynthResult r;
  const std::vector<TensorSpec> specs = tensor_specs(o, hd);
  for (const auto& t : specs) r.n_params += t.numel();

  // The tokenizer (seconds for a 128K vocabulary) is built while the weights are generated.
  auto make_tokenizer = [&o] { return tokenizer_json(o); };
  std::future<std::string> tokenizer;
  try {
    tokenizer = std::async(std::launch::async, make_tokenizer);
  } catch (const std::system_error&) {  // no thread to spare: build it after the weights
    tokenizer = std::async(std::launch::deferred, make_tokenizer);
  }
  // Weights first, config last: a directory with a config.json is complete.
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (o.shards == 1) {
    r.bytes_written += write_safetensors(single, [&] {
      std::vector<const TensorSpec*> v;
      for (const auto& t : specs) v.push_back(&t);
      return v;
    }(), o, o.seed);
    r.files.push_back(single.string());
    fs::remove(index, ec);
  } else {
    const int eb = dtype_bytes(o.dtype);
    std::uint64_t total = 0;
    for (const auto& t : specs) total += t.numel() * static_cast<std::uint64_t>(eb);
    const std::uint64_t per = (total + static_cast<std::uint64_t>(o.shards) - 1) / static_cast<std::uint64_t>(o.shards);
    std::vector<std::vector<const TensorSpec*>> groups(static_cast<std::size_t>(o.shards));
    std::uint64_t acc = 0;
    for (const auto& t : specs) {
      std::size_t g = static_cast<std::size_t>(std::min<std::uint64_t>(acc / std::max<std::uint64_t>(per, 1),
                                                                        static_cast<std::uint64_t>(o.shards - 1)));
      groups[g].push_back(&t);
      acc += t.numel() * static_cast<std::uint64_t>(eb);
    }
    json wm = json::object();
    for (int s = 0; s < o.shards; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, o.shards);
      r.bytes_written += write_safetensors(dir / name, groups[static_cast<std::size_t>(s)], o, o.seed);
      r.files.push_back((dir / name).string());
      for (const TensorSpec* t : groups[static_cast<std::size_t>(s)]) wm[t->name] = name;
    }
    const json ij = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
    r.bytes_written += write_text_atomic(index, ij.dump(2) + "\n");
    r.files.push_back(index.string());
    fs::remove(single, ec);
  }

  r.bytes_written += write_text_atomic(dir / "tokenizer.json", tokenizer.get());
  r.files.push_back((dir / "tokenizer.json").string());
  const fs::path legacy = dir / "hf_quant_config.json";
  if (!o.kv_algo.empty() && o.kv_algo_file == "hf_quant_config") {
    const json lj = {{"producer", {{"name", "kvgate synth"}}}, {"quantization", {{"kv_cache_quant_algo", o.kv_algo}}}};
    r.bytes_written += write_text_atomic(legacy, lj.dump(2) + "\n");
    r.files.push_back(legacy.string());
  } else {
    fs::remove(legacy, ec);  // a stale declaration from an earlier run must not leak into this model
  }
  r.bytes_written += write_text_atomic(dir / "config.json", config_json(o, hd));
  r.files.push_back((dir / "config.json").string());
  return r;
}

}  // namespace kvgate
