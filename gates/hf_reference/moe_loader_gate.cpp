// STO.loader gates for the mixture-of-experts part of the Hugging Face loader, on copies of the
// transformers-made reference directories (datasets/models/hf_refs/models/{qwen3_moe,mixtral}):
//
//  STO.loader.moe_fused  the same experts saved fused (transformers 5's in-memory layout:
//                        mlp.experts.gate_up_proj [E, 2I, H], gate rows first, and
//                        mlp.experts.down_proj [E, H, I]) load to exactly the per-expert weights
//                        (and the same fingerprint); a fused tensor of the wrong shape is refused.
//  STO.loader.moe_count  an expert count in config.json that disagrees with the tensors (more, fewer,
//                        a fused stack of another size, top-k above the count, the count under two
//                        names with two values) is refused naming the file, the field and the fix.
//  STO.loader.mla_config DeepSeek-V3 MLA / routing dimensions that disagree refused; the engine
//                        reports the cache layout (expanded K/V, not the latent).
#include <functional>
#include <string>
#include <vector>

#include "../loaders_resolution/fixtures.hpp"
#include "catch_compat.hpp"
#include "hf_ref_harness.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/loaders.hpp"

using namespace kvgate;
namespace fs = std::filesystem;
using nlohmann::json;
using kvgate::gates::has;
using kvgate::gates::model_error;
using kvgate::gates::StFile;
using kvgate::gates::TempDir;

namespace {

// A copy of reference case `name` in `t` (every file of the directory).
std::string copy_case(const TempDir& t, const std::string& name, const std::string& as) {
  const fs::path src = fs::path(gates::hf_ref::refs_root()) / "models" / name;
  INFO("reference directory " << src.string());
  REQUIRE(fs::is_directory(src));
  const fs::path dst = t.path() / as;
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.is_regular_file()) fs::copy_file(e.path(), dst / e.path().filename());
  return dst.string();
}

template <class F>
void edit_config(const std::string& dir, F&& edit) {
  auto cj = gates::read_json_file(fs::path(dir) / "config.json");
  edit(cj);
  gates::write_json_file(fs::path(dir) / "config.json", cj);
}

std::string tensor_bytes(const StFile& f, const std::string& name) {
  const json& e = f.header.at(name);
  const auto b = e["data_offsets"][0].get<std::size_t>(), n = e["data_offsets"][1].get<std::size_t>() - b;
  return f.data.substr(b, n);
}

void put(StFile& f, const std::string& name, const std::vector<std::int64_t>& shape, const std::string& bytes) {
  const std::size_t b = f.data.size();
  f.data += bytes;
  f.header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {b, f.data.size()}}};
}

// Rewrites the per-expert tensors of every MoE layer of `dir` as the fused pair (prefix p =
// mlp or block_sparse_moe; names gate/up/down = gate_proj/up_proj/down_proj or w1/w3/w2).
// stack_experts: how many experts the fused tensors stack (E normally; others for bad inputs).
void fuse(const std::string& dir, int n_layers, int E, int I, int H, const std::string& p, const char* gate,
          const char* up, const char* down, int stack_experts) {
  const fs::path st = fs::path(dir) / "model.safetensors";
  StFile f = gates::read_st(st);
  for (int l = 0; l < n_layers; ++l) {
    const std::string base = "model.layers." + std::to_string(l) + "." + p + ".experts.";
    if (!f.header.contains(base + "0." + gate + ".weight")) continue;  // a dense layer
    std::string gu, dn;
    for (int e = 0; e < stack_experts; ++e) {
      const std::string x = base + std::to_string(e % E) + ".";
      gu += tensor_bytes(f, x + gate + ".weight") + tensor_bytes(f, x + up + ".weight");
      dn += tensor_bytes(f, x + down + ".weight");
    }
    for (int e = 0; e < E; ++e)
      for (const char* leaf : {gate, up, down}) f.header.erase(base + std::to_string(e) + "." + leaf + ".weight");
    put(f, base + "gate_up_proj", {stack_experts, 2 * I, H}, gu);
    put(f, base + "down_proj", {stack_experts, H, I}, dn);
  }
  gates::write_st(st, f);
}

void drop_expert(const std::string& dir, int layer, const std::string& p, int e, std::initializer_list<const char*> leaves) {
  const fs::path st = fs::path(dir) / "model.safetensors";
  StFile f = gates::read_st(st);
  for (const char* leaf : leaves)
    f.header.erase("model.layers." + std::to_string(layer) + "." + p + ".experts." + std::to_string(e) + "." + leaf +
                   ".weight");
  gates::write_st(st, f);
}

}  // namespace

TEST_CASE("STO.loader.moe_fused fused expert tensors == the per-expert ones (Qwen3-MoE and Mixtral); wrong shapes refused",
          "[gate:STO][fmt:none]") {
  TempDir t;
  struct Fam {
    const char* ref;
    const char* prefix;
    const char* gate;
    const char* up;
    const char* down;
  };
  for (const Fam& fam : {Fam{"qwen3_moe", "mlp", "gate_proj", "up_proj", "down_proj"},
                         Fam{"mixtral", "block_sparse_moe", "w1", "w3", "w2"}}) {
    INFO("case " << fam.ref);
    const std::string per = copy_case(t, fam.ref, std::string(fam.ref) + "_per_expert");
    const Model a = load_model(per);
    const ModelConfig& c = a.config;
    const int E = c.moe.n_experts, I = c.moe.expert_dim, H = c.dim;
    // Anti-vacuity: the reference is an MoE model with distinct experts and at least one sparse layer.
    REQUIRE(E >= 2);
    REQUIRE(c.moe.any());
    int sparse = 0;
    for (int l = 0; l < c.n_layers; ++l) sparse += c.moe.is_moe(l);
    REQUIRE(sparse >= 1);
    const std::string fused = copy_case(t, fam.ref, std::string(fam.ref) + "_fused");
    fuse(fused, c.n_layers, E, I, H, fam.prefix, fam.gate, fam.up, fam.down, E);
    const Model b = load_model(fused);
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights &x = a.weights.layers[static_cast<std::size_t>(l)], &y = b.weights.layers[static_cast<std::size_t>(l)];
      INFO("layer " << l);
      CHECK(x.router == y.router);
      CHECK(x.ew1 == y.ew1);
      CHECK(x.ew3 == y.ew3);
      CHECK(x.ew2 == y.ew2);
      if (c.moe.is_moe(l)) {
        CHECK(x.ew1 != x.ew3);  // gate and up are different matrices (a swap would show)
        CHECK(!x.ew1.empty());
      }
    }
    CHECK(a.fingerprint == b.fingerprint);
    // A fused gate_up_proj with the halves' width wrong (rows 2I+... ) is refused naming the tensor.
    const std::string bad = copy_case(t, fam.ref, std::string(fam.ref) + "_bad_shape");
    edit_config(bad, [&](json& cj) {
      cj[std::string(fam.ref) == "mixtral" ? "intermediate_size" : "moe_intermediate_size"] = I + 2;
    });
    fuse(bad, c.n_layers, E, I, H, fam.prefix, fam.gate, fam.up, fam.down, E);
    const std::string m = model_error([&] { load_model(bad); });
    INFO(m);
    CHECK(has(m, "model.safetensors"));
    CHECK(has(m, ".experts.gate_up_proj' field 'shape'"));
    CHECK(has(m, "[" + std::to_string(E) + ", " + std::to_string(2 * (I + 2)) + ", " + std::to_string(H) + "]"));
  }
}

TEST_CASE("STO.loader.moe_count an expert count disagreeing with the tensors is refused with the file, the field and "
          "the fix",
          "[gate:STO][fmt:none]") {
  TempDir t;
  const Model ref = load_model(copy_case(t, "qwen3_moe", "q_ok"));
  const int E = ref.config.moe.n_experts;
  REQUIRE(E == 4);
  const char* field = "num_local_experts";  // how transformers 5 writes Qwen3-MoE's count
  auto refused = [&](const std::string& dir) {
    const std::string m = model_error([&] { load_model(dir); });
    INFO(m);
    CHECK(m != "<no ModelError>");
    return m;
  };
  SECTION("config says more experts than the checkpoint has: the router's shape names the count field") {
    const std::string d = copy_case(t, "qwen3_moe", "q_more");
    edit_config(d, [&](json& cj) { cj[field] = E + 1; });
    const std::string m = refused(d);
    CHECK(has(m, "mlp.gate.weight' field 'shape' = [4, 64]"));
    CHECK(has(m, "field '" + std::string(field) + "'"));
    CHECK(has(m, "config.json"));
    CHECK(has(m, "fix"));
  }
  SECTION("config says fewer experts than the checkpoint has") {
    const std::string d = copy_case(t, "qwen3_moe", "q_fewer");
    edit_config(d, [&](json& cj) { cj[field] = E - 1; });
    const std::string m = refused(d);
    CHECK(has(m, "scores 4 experts"));
    CHECK(has(m, "field '" + std::string(field) + "' (= 3)"));
  }
  SECTION("the router agrees but an expert's tensors are missing") {
    const std::string d = copy_case(t, "mixtral", "m_missing");
    drop_expert(d, 1, "block_sparse_moe", 3, {"w1", "w2", "w3"});
    const std::string m = refused(d);
    CHECK(has(m, "missing tensor 'model.layers.1.block_sparse_moe.experts.3.w1.weight'"));
    CHECK(has(m, "field 'num_local_experts' = 4"));
    CHECK(has(m, "fix config.json"));
  }
  SECTION("the router agrees but the tensors hold an extra expert") {
    const std::string d = copy_case(t, "qwen3_moe", "q_extra");
    const fs::path st = fs::path(d) / "model.safetensors";
    StFile f = gates::read_st(st);
    for (const char* leaf : {"gate_proj", "up_proj", "down_proj"}) {
      const std::string src = std::string("model.layers.1.mlp.experts.0.") + leaf + ".weight";
      f.header[std::string("model.layers.1.mlp.experts.4.") + leaf + ".weight"] = f.header[src];
    }
    gates::write_st(st, f);
    const std::string m = refused(d);
    CHECK(has(m, "tensor 'model.layers.1.mlp.experts.4.gate_proj.weight' exists"));
    CHECK(has(m, "more experts than the config"));
    CHECK(has(m, "field '" + std::string(field) + "'"));
  }
  SECTION("a fused stack of another size than the count") {
    const std::string d = copy_case(t, "qwen3_moe", "q_fused_stack");
    fuse(d, ref.config.n_layers, E, ref.config.moe.expert_dim, ref.config.dim, "mlp", "gate_proj", "up_proj",
         "down_proj", E + 1);
    const std::string m = refused(d);
    CHECK(has(m, "experts.gate_up_proj' field 'shape' = [5, 64, 64]"));
    CHECK(has(m, "stacks 5 experts"));
    CHECK(has(m, "field '" + std::string(field) + "' (= 4)"));
  }
  SECTION("top-k above the count, and the count under two names with two values") {
    const std::string d = copy_case(t, "qwen3_moe", "q_topk");
    edit_config(d, [&](json& cj) { cj["num_experts_per_tok"] = E + 1; });
    const std::string m = refused(d);
    CHECK(has(m, "config.json': field 'num_experts_per_tok' = 5 exceeds num_experts = 4"));
    const std::string d2 = copy_case(t, "qwen3_moe", "q_two_names");
    edit_config(d2, [&](json& cj) { cj["num_experts"] = E + 2; });
    const std::string m2 = refused(d2);
    CHECK(has(m2, "config.json': field 'num_local_experts' = 4 disagrees with num_experts = 6"));
    const std::string d3 = copy_case(t, "mixtral", "m_topk");
    edit_config(d3, [&](json& cj) { cj["num_experts_per_tok"] = 9; });
    CHECK(has(refused(d3), "field 'num_experts_per_tok' = 9 exceeds num_local_experts = 4"));
  }
}

// STO.loader.mla_config: DeepSeek-V3 configs whose MLA or V3-routing dimensions are inconsistent are
// refused naming the file and the field; a tensor of another shape than the dimensions imply names
// the tensor. The engine's resolution output says what the cache rows hold (expanded per-head K/V,
// not the latent), so a K/V format is never reported as applied to a latent it does not touch.
TEST_CASE("STO.loader.mla_config inconsistent MLA / V3-routing dimensions refused with the file and the field; "
          "the cache layout is reported",
          "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string ok = copy_case(t, "deepseek_v3", "ds_ok");
  const Model m = load_model(ok);
  REQUIRE(m.config.mla.any());
  CHECK(m.config.head_dim == m.config.mla.nope_dim + m.config.mla.rope_dim);
  {
    EngineOptions o = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
    o.max_context = 8;
    Engine e(m, o);
    const std::string layout = e.stats().kv_layout;
    INFO(layout);
    CHECK(has(layout, "mla_expanded"));
    CHECK(has(layout, "latent c_kv (kv_lora_rank 32) is not cached"));
    // A dense model reports plain K/V heads.
    const Model q = load_model(copy_case(t, "qwen3_moe", "q_layout"));
    Engine eq(q, o);
    CHECK(eq.stats().kv_layout == "kv_heads");
  }
  struct Bad {
    const char* name;
    std::function<void(json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Bad> bads = {
      {"head_dim", [](json& cj) { cj["head_dim"] = 16; }, {"field 'head_dim' = 16 differs from qk_rope_head_dim = 8"}},
      {"qk_head_dim", [](json& cj) { cj["qk_head_dim"] = 30; }, {"field 'qk_head_dim' = 30 is not qk_nope_head_dim + qk_rope_head_dim = 24"}},
      {"v_head_dim", [](json& cj) { cj["v_head_dim"] = 40; }, {"field 'v_head_dim' = 40 is wider than"}},
      {"rope_odd", [](json& cj) { cj["qk_rope_head_dim"] = 7; }, {"field 'qk_rope_head_dim' = 7 is odd"}},
      {"n_group", [](json& cj) { cj["n_group"] = 3; }, {"field 'n_group' = 3 does not divide n_routed_experts = 8"}},
      {"topk_group", [](json& cj) { cj["topk_group"] = 3; }, {"field 'topk_group' = 3 exceeds n_group = 2"}},
      {"top_k", [](json& cj) { cj["num_experts_per_tok"] = 5; }, {"field 'num_experts_per_tok' = 5 exceeds the experts of topk_group = 1 groups of 4"}},
      {"kv_lora", [](json& cj) { cj["kv_lora_rank"] = 30; }, {"kv_a_proj_with_mqa.weight' field 'shape' = [40, 64]", "[38, 64]"}},
      {"experts", [](json& cj) { cj["n_routed_experts"] = 6; cj["n_group"] = 2; }, {"mlp.gate.weight' field 'shape' = [8, 64]", "field 'n_routed_experts' (= 6)"}},
      {"missing", [](json& cj) { cj.erase("kv_lora_rank"); }, {"field 'kv_lora_rank' is missing"}},
  };
  for (const Bad& b : bads) {
    const std::string d = copy_case(t, "deepseek_v3", std::string("ds_bad_") + b.name);
    edit_config(d, b.edit);
    const std::string msg = model_error([&] { load_model(d); });
    INFO("bad input " << b.name << ": " << msg);
    CHECK(has(msg, d));  // the file (config.json or model.safetensors of that directory)
    for (const auto& e : b.expect) CHECK(has(msg, e));
  }
}
