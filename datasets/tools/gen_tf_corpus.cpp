// Generates the teacher-forcing corpus of the MOD gates: sequences sampled from a model with the
// runtime at f32 KV (temperature sampling with fixed seeds), written as token ids in JSON.
//
//   kvgate_gen_tf_corpus --model ../shared/models/stories260K/stories260K.bin
//       --out datasets/corpora/stories260K_tf.json [--sequences 8] [--length 256]
//       [--seed0 1] [--temperature 1.0] [--top-p 0.9]
//
// Sequence i (0-based) starts with BOS and is sampled with seed seed0 + i; sampling does not stop
// at EOS/BOS (llama2.c models start a new story after the delimiter; teacher forcing goes on).
// Same build, same model, same flags => the same file, byte for byte.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "kvgate/atomic_file.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/model.hpp"
#include "kvgate/sampler.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "kvgate_gen_tf_corpus: %s\nusage: kvgate_gen_tf_corpus --model PATH --out FILE [--tokenizer PATH]"
               " [--sequences N] [--length N] [--seed0 S] [--temperature T] [--top-p P]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, out_path, tok_path;
  int n_seq = 8, length = 256;
  unsigned long long seed0 = 1;
  float temperature = 1.0f, top_p = 0.9f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--model") model_path = val();
      else if (a == "--out") out_path = val();
      else if (a == "--tokenizer") tok_path = val();
      else if (a == "--sequences") n_seq = std::stoi(val());
      else if (a == "--length") length = std::stoi(val());
      else if (a == "--seed0") seed0 = std::stoull(val());
      else if (a == "--temperature") temperature = std::stof(val());
      else if (a == "--top-p") top_p = std::stof(val());
      else usage("unknown argument " + a);
    } catch (const std::logic_error&) {
      usage("bad value for " + a);
    }
  }
  if (model_path.empty() || out_path.empty()) usage("--model and --out are required");
  if (n_seq < 1 || length < 2) usage("--sequences >= 1 and --length >= 2");
  try {
    const kvgate::Model model = kvgate::load_model(model_path, tok_path);
    if (length > model.config.max_seq_len) usage("--length exceeds the model's max_seq_len");
    kvgate::Engine engine(model, kvgate::engine_options_for(kvgate::KvFormat{kvgate::HalfFormat::f32, kvgate::HalfFormat::f32}));
    std::ostringstream js;
    js << "{\n  \"description\": \"Teacher-forcing corpus for the MOD gates: sequences sampled from the model at f32 KV"
          " by kvgate's runtime (datasets/tools/gen_tf_corpus.cpp). Sequence i starts with BOS and uses sampler seed"
          " seed0 + i; sampling continues past EOS/BOS.\",\n"
       << "  \"model\": \"" << std::filesystem::path(model_path).filename().string() << "\",\n"
       << "  \"model_fingerprint\": \"" << model.fingerprint << "\",\n"
       << "  \"kv\": \"f32\",\n"
       << "  \"sampler\": {\"temperature\": " << temperature << ", \"top_p\": " << top_p << ", \"top_k\": 0, \"seed0\": "
       << seed0 << "},\n"
       << "  \"command\": \"kvgate_gen_tf_corpus --model " << std::filesystem::path(model_path).filename().string()
       << " --sequences " << n_seq << " --length " << length << " --seed0 " << seed0 << " --temperature " << temperature
       << " --top-p " << top_p << "\",\n"
       << "  \"sequences\": [\n";
    for (int s = 0; s < n_seq; ++s) {
      kvgate::SamplerOptions so;
      so.temperature = temperature;
      so.top_p = top_p;
      so.seed = seed0 + static_cast<unsigned long long>(s);
      kvgate::Sampler sampler(engine.vocab_size(), so);
      engine.reset();
      std::vector<int> toks{model.config.bos_id};
      std::vector<float> logits = engine.prefill(toks);
      while (static_cast<int>(toks.size()) < length) {
        const int t = sampler.sample(logits);
        toks.push_back(t);
        if (static_cast<int>(toks.size()) < length) logits = engine.decode(t);
      }
      js << "    {\"seed\": " << so.seed << ", \"tokens\": [";
      for (std::size_t i = 0; i < toks.size(); ++i) js << (i ? "," : "") << toks[i];
      js << "]}" << (s + 1 < n_seq ? "," : "") << "\n";
    }
    js << "  ]\n}\n";
    kvgate::write_file_atomic(out_path, js.str());
    std::fprintf(stderr, "kvgate_gen_tf_corpus: wrote %d x %d tokens to %s\n", n_seq, length, out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvgate_gen_tf_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
