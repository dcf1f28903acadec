// `kvgate chat`: an interactive conversation for people. Each line read from stdin is one turn:
// its tokens are appended to the conversation, only they are prefilled, the reply is printed, and
// with --conv-id the conversation's KV file is saved after the turn (same flags as `kvgate run`).
// A later `kvgate chat` or `kvgate run` with the same --conv-id hydrates it.
//
// Each turn takes the conversation's lock; when another process advanced the conversation in the
// meantime, the turn hydrates from its file instead of the KV held in memory.
// Lines starting with '/' are commands: /stats, /quit.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kv_flags.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_cache_dir.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"

namespace kvgate::cli {

namespace {

struct ChatOpts : EngineFlags {  // the flags shared with `kvgate run` (kv_flags.hpp), and:
  std::string system;
  int steps = 128;
};

int run_chat(const ChatOpts& o) {
  if (o.steps < 1) throw std::invalid_argument("--steps must be >= 1");
  check_engine_flags(o);
  std::optional<KvFormat> flag;
  if (!o.kv.empty()) {
    flag = parse_kv_format(o.kv);
    if (!flag) throw std::invalid_argument("unknown KV format '" + o.kv + "' (" + known_formats_text() + ")");
  }
  const Model model = load_model(o.model, o.tokenizer);
  const Tokenizer* tok = model.tokenizer.get();
  if (!tok) throw ModelError("model '" + o.model + "' has no tokenizer; pass --tokenizer PATH");
  KvRequest req;
  req.flag = flag;
  req.strict = o.strict;
  req.mla_latent = o.mla_cache == "latent";
  Engine engine(model, engine_options(o, resolve_kv(req, model.config, o.block_size), model.config));
  std::optional<KvCacheDir> dir;
  if (!o.cache.conv_id.empty()) dir.emplace(open_kv_cache(o.cache));

  const bool tty = ::isatty(STDIN_FILENO) != 0;
  std::fprintf(stderr, "kvgate chat: kv %s (requested %s), %s%s. /quit ends, /stats shows the engine stats.\n",
               engine.stats().effective_kv.c_str(), engine.stats().requested_kv.c_str(),
               dir ? ("conversation " + o.cache.conv_id + " in " + dir->dir()).c_str() : "no conversation file",
               o.cache.resident > 0 ? (", streaming with a " + std::to_string(o.cache.resident) + "-token window").c_str()
                                    : "");
  std::vector<int> transcript;  // every id of the conversation, including the last sampled one
  bool first = true;
  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/stats") {
      const EngineStats& st = engine.stats();
      std::fprintf(stderr,
                   "position %d, kv_bytes %zu, hydrated %d, ttft %.3f ms, prefill %.1f tok/s, decode %.1f tok/s, "
                   "block lookups %lld, misses %lld, bytes moved %lld\n",
                   st.position, st.kv_bytes, st.hydrated_tokens, st.ttft_ms, st.prefill_tok_s(), st.decode_tok_s(),
                   st.kv_block_lookups, st.kv_block_misses, st.kv_bytes_moved);
      continue;
    }
    std::optional<Conversation> conv;
    if (dir) conv.emplace(*dir, o.cache.conv_id);
    // The conversation so far: the file's transcript when another process advanced it, else ours.
    std::vector<int> so_far = transcript;
    if (conv && conv->has_file() && (first || conv->transcript() != transcript)) so_far = conv->transcript();
    const bool continuing = !so_far.empty();
    std::string text = line;
    if (first && !o.system.empty() && !continuing) text = o.system + "\n" + line;
    std::vector<int> prompt = so_far;
    const std::vector<int> fresh = tok->encode(text, !continuing);
    prompt.insert(prompt.end(), fresh.begin(), fresh.end());
    if (prompt.empty()) continue;
    if (conv) {
      try {
        check_conversation_room(*conv, so_far.size(), prompt.size(), engine.max_context());
      } catch (const std::invalid_argument& e) {  // the session goes on: /quit, or a shorter line
        std::fprintf(stderr, "kvgate chat: %s\n", e.what());
        continue;
      }
    }
    // What the engine already holds is reused when it is a prefix of the prompt; else hydrate.
    const auto hist = engine.history();
    std::size_t start = 0;
    if (!hist.empty() && hist.size() < prompt.size() && std::equal(hist.begin(), hist.end(), prompt.begin())) {
      start = hist.size();
    } else if (conv && conv->has_file()) {
      start = static_cast<std::size_t>(conv->hydrate(engine, prompt));
    } else {
      engine.reset();
    }
    first = false;
    const SamplerOptions so = sampler_options(o);
    int prev = prompt.back();
    const GenerateResult r = engine.generate(std::span<const int>(prompt).subspan(start), o.steps, so, [&](int id) {
      const std::string p = tok->decode_piece(prev, id);
      prev = id;
      if (printable_piece(p)) {
        std::fwrite(p.data(), 1, p.size(), stdout);
        std::fflush(stdout);
      }
    });
    std::printf("\n");
    std::fflush(stdout);
    transcript = prompt;
    transcript.insert(transcript.end(), r.tokens.begin(), r.tokens.end());
    const EngineStats& st = engine.stats();
    std::fprintf(stderr, "[reused %zu tokens, prefilled %lld, ttft %.3f ms, %s]\n", start, st.prefill_tokens, st.ttft_ms,
                 r.stop_reason.c_str());
    if (conv) {
      const std::size_t in_kv = engine.history().size();
      const KvBudgetReport b = conv->save(engine, std::span<const int>(transcript).subspan(std::min(in_kv, transcript.size())));
      if (!b.message.empty()) std::fputs(b.message.c_str(), stderr);
    }
  }
  return 0;
}

}  // namespace

void register_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOpts>();
  auto* sub = app.add_subcommand("chat", "Interactive conversation (one turn per line) with persistent, streamable KV");
  add_model_flags(sub, *o);
  sub->add_option("--system", o->system, "text put before the first line of a new conversation");
  sub->add_option("--steps", o->steps, "most tokens per reply")->capture_default_str();
  add_engine_flags(sub, *o);
  add_kv_cache_flags(sub, o->cache);
  on_run(sub, [o] { return run_chat(*o); });
}

}  // namespace kvgate::cli
