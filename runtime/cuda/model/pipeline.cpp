// The layer split of the CUDA forward (kvgate/cuda/pipeline.hpp).
#include "kvgate/cuda/pipeline.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/common.cuh"

namespace kvgate::cuda {

DeviceScope::DeviceScope(int device) {
  KVGATE_CUDA_CHECK(cudaGetDevice(&prev_));
  KVGATE_CUDA_CHECK(cudaSetDevice(device));
}
DeviceScope::~DeviceScope() { (void)cudaSetDevice(prev_); }

void check_device_indices(const std::vector<int>& devices, const std::string& who) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess) {
    (void)cudaGetLastError();
    n_dev = 0;
  }
  for (int d : devices)
    if (d < 0 || d >= n_dev)
      throw EngineError(who + "device " + std::to_string(d) + " is not on this machine (it has " + std::to_string(n_dev) +
                        " CUDA device" + (n_dev == 1 ? "" : "s") + "); give indices below that in --devices");
}

SeqId create_sequence_in_step(std::span<const DeviceStore> parts, const std::string& who, const char* part) {
  SeqId id = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    DeviceScope on(parts[i].device);
    const SeqId s = parts[i].store->create_sequence();
    if (i == 0) id = s;
    else if (s != id)
      throw EngineError(who + part + " " + std::to_string(i) + " made sequence " + std::to_string(s) + " where " + part +
                        " 0 made " + std::to_string(id) + " (the " + part + " stores are out of step)");
  }
  return id;
}

void free_sequence_in_step(std::span<const DeviceStore> parts, SeqId s) {
  for (const DeviceStore& p : parts) {
    DeviceScope on(p.device);
    p.store->free_sequence(s);
  }
}

int release_before_in_step(std::span<const DeviceStore> parts, SeqId s, int first_kept_pos) {
  int n0 = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    DeviceScope on(parts[i].device);
    const int n = parts[i].store->release_before(s, first_kept_pos);
    if (i == 0) n0 = n;
  }
  return n0;
}

CudaPipeline::CudaPipeline(const Model& m, PipelineOptions o) {
  const ModelConfig& c = m.config;
  if (o.devices.empty()) throw EngineError("cuda pipeline: no devices given (one per stage, e.g. --devices 0,1)");
  check_device_indices(o.devices, "cuda pipeline: ");
  if (o.store.n_layers != c.n_layers)
    throw EngineError("cuda pipeline: the store config holds " + std::to_string(o.store.n_layers) +
                      " layers; give the unsplit model's (" + std::to_string(c.n_layers) + ")");
  EngineOptions eo;  // the CPU split's ranges and per-stage store configs
  eo.pipeline_stages = static_cast<int>(o.devices.size());
  eo.pipeline_layers = o.stage_layers;
  eo.kv.effective = o.store.format;
  const auto ranges = pipeline_ranges(c, eo);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const auto [l0, l1] = ranges[i];
    Stage st;
    st.device = o.devices[i];
    st.range = LayerRange{l0, l1};
    DeviceScope on(st.device);
    st.model = std::make_unique<CudaModel>(m, o.weights, st.range);
    const StoreConfig stage_sc = stage_store_config(o.store, eo, l0, l1);
    st.store = o.make_store ? o.make_store(static_cast<int>(i), stage_sc) : std::make_unique<CudaKvStore>(stage_sc);
    st.forward = std::make_unique<CudaForward>(*st.model, *st.store, o.forward);
    if (i > 0) st.forward->set_input(stages_.back().forward.get());
    stages_.push_back(std::move(st));
  }
}

CudaPipeline::~CudaPipeline() {
  for (auto it = stages_.rbegin(); it != stages_.rend(); ++it) {  // each stage's parts on its device
    (void)cudaSetDevice(it->device);
    it->forward.reset();
    it->store.reset();
    it->model.reset();
  }
}

std::vector<DeviceStore> CudaPipeline::stores() const {
  std::vector<DeviceStore> v;
  for (const Stage& st : stages_) v.push_back({st.device, st.store.get()});
  return v;
}

SeqId CudaPipeline::create_sequence() { return create_sequence_in_step(stores(), "cuda pipeline: ", "stage"); }
void CudaPipeline::free_sequence(SeqId s) { free_sequence_in_step(stores(), s); }
int CudaPipeline::release_before(SeqId s, int first_kept_pos) {
  return release_before_in_step(stores(), s, first_kept_pos);
}

void CudaPipeline::forward_chunk(SeqId s, std::span<const int> tokens, float* logits, bool all_logits, int* argmax) {
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    DeviceScope on(stages_[i].device);
    const bool last = i + 1 == stages_.size();
    stages_[i].forward->forward_chunk(s, tokens, last ? logits : nullptr, all_logits, last ? argmax : nullptr);
  }
}

void CudaPipeline::forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, float* logits, int* argmax) {
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    DeviceScope on(stages_[i].device);
    const bool last = i + 1 == stages_.size();
    stages_[i].forward->forward_decode(seqs, tokens, last ? logits : nullptr, last ? argmax : nullptr);
  }
}

std::string CudaPipeline::topology() const {
  std::string t = std::to_string(stages_.size()) + " stage" + (stages_.size() == 1 ? "" : "s") + ":";
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const Stage& st = stages_[i];
    bool shared = false;
    for (std::size_t j = 0; j < stages_.size(); ++j) shared |= j != i && stages_[j].device == st.device;
    t += std::string(i ? "," : "") + " layers " + std::to_string(st.range.first) + "-" + std::to_string(st.range.end - 1) +
         " on cuda:" + std::to_string(st.device) + (shared ? " (shared device)" : "");
  }
  return t;
}

}  // namespace kvgate::cuda
