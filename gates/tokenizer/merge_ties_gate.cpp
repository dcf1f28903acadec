// MOD.tok.merge_ties: BPE merge ties go to the LEFTMOST pair, in all three tokenizers the runtime
// ships: the llama2.c / GGUF SentencePiece-by-score tokenizer (SpTokenizer), the byte-level BPE
// by merge rank (BpeTokenizer, tokenizer.json and GGUF gpt2 vocabularies) and the
// SentencePiece-style BPE of tokenizer.json (SpBpeTokenizer). A tie is two adjacent pairs of the
// same score (or the same pair, hence the same rank, at two positions: "aaa" holds (a,a) twice).
// The class it closes: a merge loop that takes the last (or an arbitrary) pair of the best score,
// which is invisible on the shipped vocabularies' common words and changes the ids of any text
// with a repeated mergeable pair.
//
// Outside reference: llama2.c run.c `encode` (scans the pairs left to right and replaces the best
// only on a strictly higher score), SentencePiece bpe_model.cc (its agenda orders equal scores by
// the left symbol's position) and the `tokenizers` library's BPE Word::merge_all (a heap of
// (rank, position): equal ranks pop the lowest position first). The expected ids are derived by hand
// below, not by running a merge loop that could share the bug.
//
// Bound: exact ids. Anti-vacuity: every case lists the ids a last-pair rule gives, which differ
// from the expected ones (checked), so each case alone separates the two rules.
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "kvgate/tokenizer_json.hpp"
#include "kvgate/tokenizer_sp.hpp"

using namespace kvgate;

namespace {

struct TieCase {
  std::string text;
  std::vector<int> leftmost;   // expected (the references' rule)
  std::vector<int> rightmost;  // what a last-pair rule gives (anti-vacuity)
};

void check_cases(const Tokenizer& tok, const std::vector<TieCase>& cases) {
  for (const TieCase& c : cases) {
    INFO("text '" << c.text << "'");
    REQUIRE(c.leftmost != c.rightmost);
    CHECK(tok.encode(c.text, false) == c.leftmost);
  }
}

}  // namespace

TEST_CASE("MOD.tok.merge_ties SentencePiece by score (llama2.c run.c, GGUF llama): equal scores merge the leftmost pair",
          "[gate:MOD][fmt:none]") {
  // ids: 0 <unk>, 1 <s>, 2 </s>, 3 " ", 4 a, 5 b, 6 c, 7 aa (-1), 8 ab (-2), 9 bc (-2); single
  // characters score -10 (they are never a merge result here). encode adds the dummy-prefix " ".
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", " ", "a", "b", "c", "aa", "ab", "bc"};
  const std::vector<float> scores = {0, 0, 0, -10, -10, -10, -10, -1, -2, -2};
  const SpTokenizer tok(pieces, scores, 1, 2, 0);
  // "aaa": [" ",a,a,a]; (a,a) at 1 and at 2 tie (-1): leftmost -> [" ",aa,a]; " aa", "aaa" are
  //        no pieces: done. Last pair: [" ",a,aa].
  // "abc": [" ",a,b,c]; ab (-2) at 1 and bc (-2) at 2 tie: leftmost -> [" ",ab,c]; "abc" is no
  //        piece: done. Last pair: [" ",a,bc].
  // "aaaaa": (a,a) at 1..4 tie: [" ",aa,a,a,a] -> (aa,a) is no piece, (a,a) at 2 and 3 tie ->
  //        [" ",aa,aa,a] ("aaaa" is no piece): done. Last pair: [" ",a,a,a,aa] -> [" ",a,aa,aa].
  // "cab c": ties only inside a word; [" ",c,a,b," ",c]: ab is the only piece pair -> [" ",c,ab," ",c].
  //        (no tie: the control; both rules agree, so it is not in the list below.)
  check_cases(tok, {{"aaa", {3, 7, 4}, {3, 4, 7}},
                    {"abc", {3, 8, 6}, {3, 4, 9}},
                    {"aaaaa", {3, 7, 7, 4}, {3, 4, 7, 7}}});
  CHECK(tok.encode("cab c", false) == std::vector<int>{3, 6, 8, 3, 6});
}

TEST_CASE("MOD.tok.merge_ties byte-level BPE by rank (tokenizers BPE, GGUF gpt2): a repeated pair merges from the left",
          "[gate:MOD][fmt:none]") {
  // ids: 0 a, 1 b, 2 aa, 3 ab; merges: rank 0 "a a", rank 1 "a b"; no pre-tokenizer split.
  // "aaa": (a,a) at 0 and 1 (rank 0): the lowest position first -> [aa,a]; (aa,a) is no merge.
  //        Last pair: [a,aa].
  // "aaaaa": [aa,a,a,a] -> (a,a) at 2 (position 1's pair is gone) -> [aa,aa,a]. Last pair:
  //        [a,a,a,aa] -> [a,aa,aa].
  BpeTokenizer::Options o;
  o.pre = PreTokenizer::none;
  const BpeTokenizer tok({"a", "b", "aa", "ab"}, std::vector<std::pair<std::string, std::string>>{{"a", "a"}, {"a", "b"}}, o);
  REQUIRE(tok.merge_count() == 2);
  check_cases(tok, {{"aaa", {2, 0}, {0, 2}}, {"aaaaa", {2, 2, 0}, {0, 2, 2}}});
  // Rank order across different pairs (no tie, the control): "aab": (a,a) rank 0 before (a,b) -> [aa,b].
  CHECK(tok.encode("aab", false) == std::vector<int>{2, 1});
}

TEST_CASE("MOD.tok.merge_ties SentencePiece-style BPE of tokenizer.json (tokenizers Word::merge_all): equal ranks merge leftmost",
          "[gate:MOD][fmt:none]") {
  // ids: 0 <unk>, 1 a, 2 b, 3 aa, 4 ab; merges: rank 0 (a,a), rank 1 (a,b); no normalizer, no
  // pre-tokenizer (the text is one word). The heap pops (rank, position) in order:
  // "aaa": (0,0) and (0,1): position 0 first -> [aa,a]. Last pair: [a,aa].
  // "aaaaa": (0,0) -> [aa,a,a,a]; (0,1) expired; (0,2) -> [aa,aa,a]; (0,3) expired. Last pair
  //        first: (0,3) -> [a,a,a,aa]; (0,2) expired; (0,1) -> [a,aa,aa].
  // "aaab": (0,0) -> [aa,a,b]; (0,1) expired; (a,b) at 2, rank 1 -> [aa,ab]. Last pair first:
  //        (0,1) -> [a,aa,b]; then (a,b) is gone (aa,b is no merge) -> [a,aa,b].
  SpBpeTokenizer::Spec spec;
  spec.vocab = {"<unk>", "a", "b", "aa", "ab"};
  spec.merges = {{"a", "a"}, {"a", "b"}};
  spec.unk_id = 0;
  spec.path = "merge_ties fixture";
  const SpBpeTokenizer tok(spec);
  check_cases(tok, {{"aaa", {3, 1}, {1, 3}}, {"aaaaa", {3, 3, 1}, {1, 3, 3}}, {"aaab", {3, 4}, {1, 3, 2}}});
}
