// The sign-off's quality engines on the GPU (built with the CUDA backend): kvgate::cuda::CudaEngine
// per format, all sharing one upload of the weights.
#include <memory>

#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

namespace {

namespace kc = kvgate::cuda;

class CudaLogits final : public LogitsEngine {
 public:
  CudaLogits(const Model& m, kc::CudaEngineOptions o, QualityPath path) : e_(m, std::move(o)), path_(path) {}
  void reset() override { e_.reset(); }
  std::vector<float> append(std::span<const int> t) override {
    if (path_ == QualityPath::chunked_prefill) return e_.forward_all_logits(t);
    const std::size_t V = static_cast<std::size_t>(e_.vocab_size());
    std::vector<float> out(t.size() * V);
    for (std::size_t i = 0; i < t.size(); ++i) {
      // The first token of the sequence is a one-row prefill (no context to decode against); every
      // later one takes CudaEngine::decode, the decode kernel generation runs.
      const std::vector<float>& l = e_.position() == 0 ? e_.prefill(t.subspan(i, 1)) : e_.decode(t[i]);
      std::copy(l.begin(), l.end(), out.begin() + static_cast<std::ptrdiff_t>(i * V));
    }
    return out;
  }
  int max_context() const override { return e_.max_context(); }
  std::string effective() const override { return e_.stats().effective_kv; }

 private:
  kc::CudaEngine e_;
  QualityPath path_;
};

}  // namespace

EngineFactory device_engine_factory(const Model& model, const std::string& device, int threads, int chunk, int max_context,
                                    const std::string& cuda_weights) {
  if (device == "cpu") return cpu_engine_factory(model, threads, chunk, max_context);
  if (device != "cuda") throw PolicyError("--device must be cpu or cuda, not '" + device + "'");
  const auto& st = kc::device_status();
  if (!st.available) throw PolicyError("--device cuda: no usable CUDA device: " + st.reason);
  if (cuda_weights != "f32" && cuda_weights != "bf16")
    throw PolicyError("--cuda-weights must be f32 or bf16, not '" + cuda_weights + "'");
  kc::register_capability();  // resolve_kv(backend "cuda") refuses what the kernels cannot run
  const kc::WeightType wt = cuda_weights == "bf16" ? kc::WeightType::bf16 : kc::WeightType::f32;
  std::shared_ptr<const kc::CudaModel> weights;  // uploaded on the first engine, shared by all
  return [&model, chunk, max_context, wt, weights](const std::string& f, QualityPath path) mutable -> std::unique_ptr<LogitsEngine> {
    const auto k = parse_kv_format(f);
    if (!k) throw PolicyError("unknown KV format '" + f + "'; known: " + known_formats_text());
    if (!weights) weights = std::make_shared<const kc::CudaModel>(model, wt);
    kc::CudaEngineOptions co;
    co.engine.block_size = 16;
    KvRequest req;
    req.flag = *k;
    req.backend = "cuda";
    co.engine.kv = resolve_kv(req, model.config, co.engine.block_size);
    co.engine.max_context = max_context;
    co.engine.prefill_chunk = path == QualityPath::chunked_prefill ? chunk : 1;
    co.weights = wt;
    co.shared_weights = weights;
    return std::make_unique<CudaLogits>(model, co, path);
  };
}

}  // namespace kvgate::signoff
