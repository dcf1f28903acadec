// `kvgate synth`: writes a deterministic random-weight Hugging Face directory (runtime/synth.hpp).
#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "kvgate/synth.hpp"

namespace kvgate::cli {

void register_synth(CLI::App& app) {
  auto o = std::make_shared<SynthOptions>();
  auto* sub = app.add_subcommand("synth", "Write a deterministic random-weight Hugging Face model directory");
  sub->add_option("--arch", o->arch, "llama | mistral | qwen2 | qwen3 | deepseek_v3 (MLA attention, dense MLP)")
      ->capture_default_str();
  sub->add_option("--layers", o->layers, "num_hidden_layers")->capture_default_str();
  sub->add_option("--hidden", o->hidden, "hidden_size")->capture_default_str();
  sub->add_option("--ffn", o->ffn, "intermediate_size")->capture_default_str();
  sub->add_option("--heads", o->heads, "num_attention_heads")->capture_default_str();
  sub->add_option("--kv-heads", o->kv_heads, "num_key_value_heads")->capture_default_str();
  sub->add_option("--head-dim", o->head_dim, "head_dim (0: hidden / heads)")->capture_default_str();
  sub->add_option("--vocab", o->vocab, "vocab_size (>= 258: 256 bytes, merges, bos, eos)")->capture_default_str();
  sub->add_option("--seed", o->seed, "PRNG seed (same seed, same bytes)")->capture_default_str();
  sub->add_option("--max-seq-len", o->max_seq_len, "max_position_embeddings")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "tensor dtype: f32 | f16 | bf16")->capture_default_str();
  sub->add_option("--kv-algo", o->kv_algo, "declare kv_cache_quant_algo (e.g. FP8, INT8)");
  sub->add_option("--kv-algo-file", o->kv_algo_file,
                  "where to declare it: config (config.json quantization_config) | hf_quant_config (legacy file)")
      ->capture_default_str();
  sub->add_option("--kv-scale", o->kv_scale, "write per-layer self_attn.k_scale/v_scale = S (0: none)");
  sub->add_flag("--kv-scale-per-head", o->kv_scale_per_head,
                "with --kv-scale S: [kv_heads] scales, layer i head h: K = S(1+i/8)(1+h/4), V = 0.75 K");
  sub->add_flag("--tie", o->tie_embeddings, "tie_word_embeddings (no lm_head.weight)");
  sub->add_option("--rope-theta", o->rope_theta, "rope_theta (0: 1e4 for llama/mistral, 1e6 for qwen)");
  sub->add_option("--rope", o->rope,
                  "RoPE scaling: llama3 (Llama 3.1: factor 8, low/high 1/4, original 8192); default: plain");
  sub->add_option("--kv-lora-rank", o->kv_lora_rank, "deepseek_v3: kv_lora_rank (the MLA latent width)")
      ->capture_default_str();
  sub->add_option("--qk-rope-head-dim", o->qk_rope_head_dim, "deepseek_v3: qk_rope_head_dim")->capture_default_str();
  sub->add_option("--qk-nope-head-dim", o->qk_nope_head_dim, "deepseek_v3: qk_nope_head_dim")->capture_default_str();
  sub->add_option("--v-head-dim", o->v_head_dim, "deepseek_v3: v_head_dim")->capture_default_str();
  sub->add_option("--shards", o->shards, "split the weights into N safetensors shards + index")->capture_default_str();
  sub->add_option("--threads", o->threads, "generator threads (0: all cores; the bytes are the same for any count)")
      ->capture_default_str();
  sub->add_option("--out", o->out, "output directory")->required();
  on_run(sub, [o] {
    const auto t0 = std::chrono::steady_clock::now();
    const SynthResult r = synth_hf(*o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("synth: wrote %s (%s, %d layers, %.3f M params, %s, %.1f MB in %zu files) in %.2f s\n",
                o->out.c_str(), o->arch.c_str(), o->layers, static_cast<double>(r.n_params) / 1e6, o->dtype.c_str(),
                static_cast<double>(r.bytes_written) / 1e6, r.files.size(), s);
    return 0;
  });
}

}  // namespace kvgate::cli
