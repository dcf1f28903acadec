// The sign-off's quality engines on the GPU (built with the CUDA backend): kvgate::cuda::CudaEngine
// per format, all sharing one upload of the weights.
#include <memory>

#include "engine_logits.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

namespace {

namespace kc = kvgate::cuda;

using CudaLogits = detail::EngineLogits<kc::CudaEngine, kc::CudaEngineOptions>;

}  // namespace

EngineFactory device_engine_factory(const Model& model, const std::string& device, int threads, int chunk, int max_context,
                                    const std::string& cuda_weights, bool mla_latent) {
  if (device == "cpu") return cpu_engine_factory(model, threads, chunk, max_context, mla_latent);
  if (device != "cuda") throw PolicyError("--device must be cpu or cuda, not '" + device + "'");
  const auto& st = kc::device_status();
  if (!st.available) throw PolicyError("--device cuda: no usable CUDA device: " + st.reason);
  if (cuda_weights != "f32" && cuda_weights != "bf16")
    throw PolicyError("--cuda-weights must be f32 or bf16, not '" + cuda_weights + "'");
  kc::register_capability();  // resolve_kv(backend "cuda") refuses what the kernels cannot run
  const kc::WeightType wt = cuda_weights == "bf16" ? kc::WeightType::bf16 : kc::WeightType::f32;
  std::shared_ptr<const kc::CudaModel> weights;  // uploaded on the first engine, shared by all
  return [&model, chunk, max_context, wt, weights, mla_latent](const std::string& f,
                                                              QualityPath path) mutable -> std::unique_ptr<LogitsEngine> {
    kc::CudaEngineOptions co;
    co.engine = detail::quality_engine_options(model, f, path, chunk, max_context, "cuda", mla_latent);
    if (!weights) weights = std::make_shared<const kc::CudaModel>(model, wt);
    co.weights = wt;
    co.shared_weights = weights;
    return std::make_unique<CudaLogits>(model, co, path);
  };
}

}  // namespace kvgate::signoff
