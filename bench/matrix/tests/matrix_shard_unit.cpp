// `kvgate bench --shard k/n` + `kvgate bench merge` (bench/matrix/src/shard.cpp): the formats split
// by position mod n, and the merged matrix equal to the unsharded one (rows, per-format entries,
// config) on stories260K without timing; every refusal names the file, the field and the fix.
#include <filesystem>
#include <string>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "kvgate/matrix.hpp"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace kvgate;

json run(const Model& model, const std::vector<std::string>& formats) {
  matrix::MatrixOptions mo = matrix::default_matrix_options(model, true);
  mo.formats = formats;
  mo.lengths = {64};
  mo.windows = {0, 64};
  mo.timing = false;  // no clock: the rows of two runs are equal
  mo.probes = false;
  const fs::path corpus = fs::path(KVGATE_MATRIX_TEST_SOURCE_DIR) / "datasets" / "corpora" / "stories260K_tf.json";
  mo.corpus_path = corpus.string();
  const json prov = {{"git_commit", "c0ffee"}, {"git_dirty", false}, {"model", {{"sha256", "ab"}}}};
  return matrix::run_matrix(model, mo, prov, nullptr);
}

json sharded(const Model& model, const std::vector<std::string>& all, int k, int n) {
  json m = run(model, matrix::shard_formats(all, k, n));
  m["shard"] = {{"index", k}, {"count", n}, {"formats", matrix::shard_formats(all, 0, 1)}};
  return m;
}

std::string refusal(const std::vector<std::pair<std::string, json>>& shards) {
  try {
    matrix::merge_matrices(shards);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("bench shard: formats by position mod n, f32 on every shard") {
  const std::vector<std::string> all{"f32", "f16", "int8", "k8v4", "f16", "q4_0"};
  CHECK(matrix::shard_formats(all, 0, 1) == std::vector<std::string>{"f16", "int8", "k8v4", "q4_0"});
  CHECK(matrix::shard_formats(all, 0, 3) == std::vector<std::string>{"f16", "q4_0"});
  CHECK(matrix::shard_formats(all, 1, 3) == std::vector<std::string>{"int8"});
  CHECK(matrix::shard_formats(all, 2, 3) == std::vector<std::string>{"k8v4"});
  CHECK(matrix::shard_formats(all, 3, 5) == std::vector<std::string>{"q4_0"});
  CHECK(matrix::shard_formats(all, 4, 5).empty());  // more shards than formats: only the baseline
}

TEST_CASE("bench shard: 3 shards merged equal the unsharded matrix; refusals") {
  const std::string path = matrix::find_model("stories260K/stories260K.bin", KVGATE_MATRIX_TEST_SOURCE_DIR);
  REQUIRE(!path.empty());  // KVGATE_MODELS (the shared test models)
  const Model model = load_model(path);
  const std::vector<std::string> all{"f16", "int8", "k8v4", "q4_0"};
  const json full = run(model, all);
  std::vector<std::pair<std::string, json>> shards;
  for (int k = 0; k < 3; ++k) shards.emplace_back("s" + std::to_string(k) + "/matrix.json", sharded(model, all, k, 3));
  CHECK(shards[0].second["config"]["formats"] == json::array({"f32", "f16", "q4_0"}));
  const json merged = matrix::merge_matrices({shards[2], shards[0], shards[1]});  // any order
  REQUIRE(full["rows"].size() == 10);  // 5 formats x 2 windows
  CHECK(merged["rows"] == full["rows"]);
  CHECK(merged["formats"] == full["formats"]);
  CHECK(merged["config"] == full["config"]);
  CHECK(merged["shard"]["merged_shards"] == 3);
  CHECK(matrix::rows_csv(merged) == matrix::rows_csv(full));
  // Anti-vacuity: the rows differ between formats, so a wrong order would show.
  CHECK(full["rows"][2]["kl_mean"] != full["rows"][4]["kl_mean"]);

  CHECK(refusal({shards[0], shards[1]}).find("shard 2/3 is missing; fix: run kvgate bench --shard 2/3") == 0);
  CHECK(refusal({shards[0], shards[1], shards[1], shards[2]}).find("s1/matrix.json: field /shard/index is 1, and so is") == 0);
  auto edited = [&](const std::string& ptr, const json& v) {
    auto s = shards;
    s[2].second[json::json_pointer(ptr)] = v;
    return refusal(s);
  };
  CHECK(edited("/provenance/git_commit", "deadbeef").find("s2/matrix.json: field /provenance/git_commit is \"deadbeef\" but s0/matrix.json has \"c0ffee\"") == 0);
  CHECK(edited("/config/lengths", json::array({128})).find("field /config/lengths") != std::string::npos);
  CHECK(edited("/shard/count", 4).find("field /shard/count") != std::string::npos);
  CHECK(edited("/config/formats", json::array({"f32", "int8"})).find("field /config/formats") != std::string::npos);
  CHECK(edited("/kind", "probe").find("field /kind") != std::string::npos);
  for (const std::string& why : {edited("/provenance/git_commit", "x"), refusal({shards[0], shards[1]})})
    CHECK(why.find("fix: ") != std::string::npos);
  auto unsharded = shards;
  unsharded[1].second.erase("shard");
  CHECK(refusal(unsharded).find("s1/matrix.json: field /shard is missing") == 0);
  auto again = shards;
  again[0].second = merged;
  CHECK(refusal(again).find("field /shard/merged_shards") != std::string::npos);
}
