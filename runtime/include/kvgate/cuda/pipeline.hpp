// The layer split of the CUDA forward over devices (pipeline parallel, docs/CUDA.md "Layer split"):
// stage i holds the weights of model layers [first_i, end_i) and the KV pages of those layers on
// devices[i]; a call runs the stages in order on the same rows, each stage's residual rows [rows][dim]
// copied to the next stage's device (cudaMemcpyDefault: a peer copy where the devices allow it,
// staged through the host otherwise). The first stage embeds, the last computes the logits. The
// ranges are the CPU split's (kvgate::pipeline_ranges, EngineOptions::pipeline_stages /
// pipeline_layers), so both place every layer alike. A device may appear twice: two stages on one
// GPU run the split's code path (stage stores, hand-over, per-stage graphs) where only one GPU is.
// Every stage computes exactly what the unsplit forward computes for its layers, in the same order,
// so the logits are bitwise the unsplit forward's (gate PAR.cuda.pp).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/model.hpp"

namespace kvgate::cuda {

struct PipelineOptions {
  std::vector<int> devices;        // one CUDA device per stage, in layer order (repeats allowed)
  std::vector<int> stage_layers;   // layers per stage (EngineOptions::pipeline_layers); empty: even
  WeightType weights = WeightType::f32;
  StoreConfig store;               // the unsplit store (n_layers = the model's); each stage takes its layers
  CudaForwardOptions forward;
  // Makes stage i's device store from its config (stage_store_config: its layers, first_layer, its
  // scales), called with the stage's device current, before its forward is made. The engine's
  // streaming (--kv-resident) returns a view over the stage's own device window here (the window and
  // its host mirror stay the caller's; they must outlive the pipeline). Null: a CudaKvStore of its own.
  std::function<std::unique_ptr<CudaKvStore>(int stage, const StoreConfig& cfg)> make_store;
};

// Makes `device` current for the scope and restores the caller's device after it.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

// The parts of a split over devices (the pipeline's stages, the tensor-parallel ranks) share these:
// `devices` checked against the machine (EngineError "<who>device D is not on this machine ..."), and
// a sequence created, freed or released in every part's store in step, each on its part's device
// (`part` names a part in messages: "stage", "rank").
void check_device_indices(const std::vector<int>& devices, const std::string& who);
struct DeviceStore {
  int device = 0;
  CudaKvStore* store = nullptr;
};
SeqId create_sequence_in_step(std::span<const DeviceStore> parts, const std::string& who, const char* part);
void free_sequence_in_step(std::span<const DeviceStore> parts, SeqId s);
int release_before_in_step(std::span<const DeviceStore> parts, SeqId s, int first_kept_pos);  // part 0's count

class CudaPipeline {
 public:
  // Throws EngineError (no devices, a device index the machine lacks, ranges that do not split the
  // model), ModelError / KvStoreError / std::runtime_error as the stage parts do.
  CudaPipeline(const Model& m, PipelineOptions o);
  ~CudaPipeline();
  CudaPipeline(const CudaPipeline&) = delete;
  CudaPipeline& operator=(const CudaPipeline&) = delete;

  // A sequence in every stage's store (the same id in each: the stores are created and used in step).
  SeqId create_sequence();
  void free_sequence(SeqId s);
  // CudaKvStore::release_before on every stage's store (each on its device); returns stage 0's count.
  int release_before(SeqId s, int first_kept_pos);
  // As CudaForward::forward_chunk / forward_decode over the whole model.
  void forward_chunk(SeqId s, std::span<const int> tokens, float* logits, bool all_logits, int* argmax = nullptr);
  void forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, float* logits, int* argmax = nullptr);

  struct Stage {
    int device = 0;
    LayerRange range;
    std::unique_ptr<CudaModel> model;
    std::unique_ptr<CudaKvStore> store;
    std::unique_ptr<CudaForward> forward;
  };
  int n_stages() const { return static_cast<int>(stages_.size()); }
  const Stage& stage(int i) const { return stages_[static_cast<std::size_t>(i)]; }
  Stage& stage(int i) { return stages_[static_cast<std::size_t>(i)]; }
  // "2 stages: layers 0-2 on cuda:0, 3-4 on cuda:0 (same device)" for reports.
  std::string topology() const;

 private:
  std::vector<DeviceStore> stores() const;
  std::vector<Stage> stages_;
};

}  // namespace kvgate::cuda
