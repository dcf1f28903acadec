// Shared by tokenizer_json.cpp and tokenizer_bpe.cpp (not installed).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kvgate/model.hpp"
#include "kvgate/tokenizer_bpe.hpp"

namespace kvgate::detail {

// The byte-level BPE of a parsed tokenizer.json `j` read from `path`, with the given rule.
std::unique_ptr<BpeTokenizer> bpe_from_json(const nlohmann::json& j, const std::string& path, int bos_id, int eos_id,
                                            SpecialsRule rule);

// The rule of tokenizer.json's `post_processor` (null, ByteLevel: none).
SpecialsRule rule_from_post_processor(const nlohmann::json& j, const std::string& path);

// tokenizer.json's model.vocab (an object piece -> id) and model.merges (a list) under the limits
// (kvgate/limits.hpp): at most VOCAB entries, each piece at most TOKEN_BYTES, each non-negative
// id at most TOKEN_ID, at most MERGES merges. Called before any table is sized by them; a refusal
// is a LimitError naming `path`, the field, the value, the limit and KVGATE_LIMIT_<NAME>.
void check_vocab_limits(const nlohmann::json& model, const std::string& path);

}  // namespace kvgate::detail
