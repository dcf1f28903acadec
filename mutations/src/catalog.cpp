#include <unistd.h>

#include "kvgate/json_limits.hpp"
#include "kvgate_mutations/catalog.hpp"

#include <cctype>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "kvgate_mutations/json_schema.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, std::string_view text) {
  // Atomically: a temp file next to it, then rename, so a reader (or a hard kill) never sees half a
  // file. The file keeps its permissions (a mutated script stays executable).
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const fs::path tmp = p.string() + ".kvgate-tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error("short write to " + tmp.string());
    }
  }
  std::error_code ec;
  if (const auto st = fs::status(p, ec); !ec && fs::exists(st)) fs::permissions(tmp, st.permissions(), ec);
  fs::rename(tmp, p, ec);
  if (ec) {
    std::error_code ec2;
    fs::remove(tmp, ec2);
    throw std::runtime_error("cannot replace " + p.string() + ": " + ec.message());
  }
}

const Mutant* Catalog::find(std::string_view id) const {
  for (const auto& m : mutants)
    if (m.id == id) return &m;
  return nullptr;
}

const Mutant* Catalog::canary() const {
  for (const auto& m : mutants)
    if (m.is_canary()) return &m;
  return nullptr;
}

namespace {

std::string text_field(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += "\n";
    s += v[i].get<std::string>();
  }
  return s;
}

std::vector<std::string> string_list(const json& rec, const char* key) {
  std::vector<std::string> r;
  if (rec.contains(key))
    for (const auto& x : rec.at(key)) r.push_back(x.get<std::string>());
  return r;
}

}  // namespace

Catalog parse_catalog(const json& doc, const json& schema, const std::string& path) {
  // The number of mutants before the schema walks them or any is copied (CATALOG_MUTANTS).
  if (doc.is_object() && doc.contains("mutants") && doc["mutants"].is_array())
    limits::check(limits::kCatalogMutants, doc["mutants"].size(), path, "/mutants (entries)");
  const auto errs = validate_json(doc, schema);
  if (!errs.empty()) {
    std::string msg = path + " does not match its schema:\n";
    for (std::size_t i = 0; i < errs.size() && i < 30; ++i) {
      std::string where = errs[i].instance_path;
      // Name the mutant: /mutants/<n>/... -> the record's id.
      if (where.rfind("/mutants/", 0) == 0) {
        const std::size_t n = std::stoul(where.substr(9));
        if (doc.contains("mutants") && n < doc["mutants"].size() && doc["mutants"][n].contains("id") &&
            doc["mutants"][n]["id"].is_string())
          where += " (" + limits::brief(doc["mutants"][n]["id"], 64) + ")";  // bounded: ids come from the file
      }
      msg += "  " + (where.empty() ? std::string("/") : where) + ": " + errs[i].message + "\n";
    }
    throw CatalogError(msg);
  }
  Catalog c;
  c.path = path;
  std::string problems;
  std::set<std::string> ids;
  int canaries = 0;
  for (const auto& rec : doc.at("mutants")) {
    Mutant m;
    m.id = rec.at("id").get<std::string>();
    m.category = rec.at("category").get<std::string>();
    m.file = rec.at("file").get<std::string>();
    m.anchor = text_field(rec.at("anchor"));
    m.replacement = text_field(rec.at("replacement"));
    m.occurrences = rec.value("occurrences", 1);
    m.description = rec.at("description").get<std::string>();
    m.rationale = rec.at("rationale").get<std::string>();
    m.expect_killed_by = string_list(rec, "expect_killed_by");
    m.requires_ = string_list(rec, "requires");
    m.timeout_scale = rec.value("timeout_scale", 1.0);
    if (!ids.insert(m.id).second) problems += "  duplicate mutant id '" + m.id + "'\n";
    if (m.is_canary()) ++canaries;
    const fs::path fp(m.file);
    if (fp.is_absolute() || m.file.find("..") != std::string::npos)
      problems += "  " + m.id + ": file must be relative to the source root without '..' (" + m.file + ")\n";
    if (m.anchor == m.replacement) problems += "  " + m.id + ": replacement equals the anchor\n";
    if (m.anchor.empty()) problems += "  " + m.id + ": empty anchor\n";
    if (!m.is_canary() && m.expect_killed_by.empty())
      problems += "  " + m.id + ": expect_killed_by must name at least one gate\n";
    c.mutants.push_back(std::move(m));
  }
  if (canaries > 1) problems += "  more than one mutant has category 'canary'\n";
  if (!problems.empty()) throw CatalogError(path + ": invalid catalog:\n" + problems);
  return c;
}

Catalog load_catalog(const fs::path& catalog, const fs::path& schema) {
  json doc, sch;
  try {
    doc = limits::parse_json(read_text(catalog), catalog.string());
  } catch (const json::parse_error& e) {
    throw CatalogError(catalog.string() + ": not valid JSON: " + e.what());
  }
  try {
    sch = json::parse(read_text(schema));
  } catch (const json::parse_error& e) {
    throw CatalogError(schema.string() + ": not valid JSON: " + e.what());
  }
  return parse_catalog(doc, sch, catalog.string());
}

std::size_t count_occurrences(std::string_view hay, std::string_view needle) {
  if (needle.empty()) return 0;
  std::size_t n = 0;
  for (std::size_t pos = hay.find(needle); pos != std::string_view::npos; pos = hay.find(needle, pos + needle.size()))
    ++n;
  return n;
}

std::string AnchorCheck::message() const {
  if (file_missing) return "STALE " + id + ": file " + file + " does not exist";
  if (found == static_cast<std::size_t>(expected)) return "ok " + id;
  if (applied)
    return "APPLIED " + id + ": " + file + " holds this mutant's replacement where its anchor should be (found " +
           std::to_string(found) + " of " + std::to_string(expected) +
           " time(s)): the mutant looks applied by hand; restore the file (git checkout -- " + file +
           ") before a run, or the scratch copy builds the mutant into the baseline";
  return "STALE " + id + ": anchor found " + std::to_string(found) + " time(s) in " + file + ", expected " +
         std::to_string(expected) + " (the file changed: re-read it and update the anchor)";
}

AnchorCheck check_anchor(const Mutant& m, const fs::path& root) {
  AnchorCheck c{m.id, m.file, m.occurrences, 0, false};
  const fs::path p = root / m.file;
  if (!fs::is_regular_file(p)) {
    c.file_missing = true;
    return c;
  }
  const std::string text = read_text(p);
  c.found = count_occurrences(text, m.anchor);
  const bool distinct = !m.replacement.empty() && m.replacement.find(m.anchor) == std::string::npos;
  if (c.found < static_cast<std::size_t>(m.occurrences) && distinct) {
    // Count the replacement outside the anchors still there (a replacement may be part of its anchor).
    std::string rest;
    std::size_t pos = 0;
    for (std::size_t hit = text.find(m.anchor); hit != std::string::npos; hit = text.find(m.anchor, pos)) {
      rest.append(text, pos, hit - pos).push_back('\0');
      pos = hit + m.anchor.size();
    }
    rest.append(text, pos, std::string::npos);
    c.applied = count_occurrences(rest, m.replacement) >= static_cast<std::size_t>(m.occurrences) - c.found;
  }
  return c;
}

std::string apply_mutant(std::string_view original, const Mutant& m) {
  const std::size_t n = count_occurrences(original, m.anchor);
  if (n != static_cast<std::size_t>(m.occurrences))
    throw CatalogError("STALE " + m.id + ": anchor found " + std::to_string(n) + " time(s) in " + m.file +
                       ", expected " + std::to_string(m.occurrences));
  std::string out;
  out.reserve(original.size() + m.occurrences * (m.replacement.size() + 1));
  std::size_t pos = 0;
  for (std::size_t hit = original.find(m.anchor); hit != std::string_view::npos;
       hit = original.find(m.anchor, pos)) {
    out.append(original.substr(pos, hit - pos));
    out.append(m.replacement);
    pos = hit + m.anchor.size();
  }
  out.append(original.substr(pos));
  return out;
}

std::map<std::string, std::vector<std::pair<int, int>>> changed_lines(std::string_view diff) {
  std::map<std::string, std::vector<std::pair<int, int>>> out;
  std::string file;
  std::size_t pos = 0;
  while (pos < diff.size()) {
    std::size_t nl = diff.find('\n', pos);
    if (nl == std::string_view::npos) nl = diff.size();
    const std::string_view line = diff.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.substr(0, 6) == "+++ b/") {
      file = std::string(line.substr(6));
    } else if (line.substr(0, 4) == "+++ ") {
      file.clear();  // /dev/null: the file was deleted
    } else if (line.substr(0, 3) == "@@ " && !file.empty()) {
      // @@ -a[,b] +c[,d] @@
      const std::size_t plus = line.find(" +");
      if (plus == std::string_view::npos) continue;
      int c = 0, d = 1;
      std::size_t i = plus + 2;
      while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) c = c * 10 + (line[i++] - '0');
      if (i < line.size() && line[i] == ',') {
        d = 0;
        ++i;
        while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) d = d * 10 + (line[i++] - '0');
      }
      if (d == 0) out[file].push_back({c, c + 1});  // a deletion after line c
      else out[file].push_back({c, c + d - 1});
    }
  }
  return out;
}

TextSpan anchor_span(std::string_view original, std::string_view anchor) {
  TextSpan s;
  const std::size_t hit = original.find(anchor);
  if (hit == std::string_view::npos) return s;
  auto pos_of = [&](std::size_t off) {
    TextPos p;
    for (std::size_t i = 0; i < off; ++i) {
      if (original[i] == '\n') {
        ++p.line;
        p.column = 1;
      } else {
        ++p.column;
      }
    }
    return p;
  };
  s.start = pos_of(hit);
  s.end = pos_of(hit + anchor.size());
  return s;
}

namespace {
std::vector<std::string_view> split_lines(std::string_view t) {
  std::vector<std::string_view> r;
  std::size_t pos = 0;
  while (pos < t.size()) {
    const std::size_t nl = t.find('\n', pos);
    if (nl == std::string_view::npos) {
      r.push_back(t.substr(pos));
      break;
    }
    r.push_back(t.substr(pos, nl - pos + 1));
    pos = nl + 1;
  }
  return r;
}
}  // namespace

std::string unified_diff(std::string_view a, std::string_view b, const std::string& path, int context) {
  const auto A = split_lines(a), B = split_lines(b);
  // Trim the common prefix and suffix, then an LCS over the (small) middle.
  std::size_t pre = 0;
  while (pre < A.size() && pre < B.size() && A[pre] == B[pre]) ++pre;
  std::size_t suf = 0;
  while (suf < A.size() - pre && suf < B.size() - pre && A[A.size() - 1 - suf] == B[B.size() - 1 - suf]) ++suf;
  const std::size_t n = A.size() - pre - suf, m = B.size() - pre - suf;
  if (n == 0 && m == 0) return {};
  // ops over the whole file: ' ' keep, '-' delete, '+' insert; each op carries its line.
  struct Op {
    char kind;
    std::string_view line;
  };
  std::vector<Op> ops;
  for (std::size_t i = 0; i < pre; ++i) ops.push_back({' ', A[i]});
  if (n * m > 25'000'000) {  // too large for the table: plain replace
    for (std::size_t i = 0; i < n; ++i) ops.push_back({'-', A[pre + i]});
    for (std::size_t j = 0; j < m; ++j) ops.push_back({'+', B[pre + j]});
  } else {
    std::vector<std::uint32_t> L((n + 1) * (m + 1), 0);
    auto at = [&](std::size_t i, std::size_t j) -> std::uint32_t& { return L[i * (m + 1) + j]; };
    for (std::size_t i = n; i-- > 0;)
      for (std::size_t j = m; j-- > 0;)
        at(i, j) = A[pre + i] == B[pre + j] ? at(i + 1, j + 1) + 1 : std::max(at(i + 1, j), at(i, j + 1));
    std::size_t i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && A[pre + i] == B[pre + j]) {
        ops.push_back({' ', A[pre + i]});
        ++i;
        ++j;
      } else if (i < n && (j == m || at(i + 1, j) >= at(i, j + 1))) {
        ops.push_back({'-', A[pre + i]});
        ++i;
      } else {
        ops.push_back({'+', B[pre + j]});
        ++j;
      }
    }
  }
  for (std::size_t i = A.size() - suf; i < A.size(); ++i) ops.push_back({' ', A[i]});

  std::string out = "--- a/" + path + "\n+++ b/" + path + "\n";
  const std::size_t N = ops.size();
  std::size_t k = 0;
  while (k < N) {
    while (k < N && ops[k].kind == ' ') ++k;
    if (k == N) break;
    // hunk: from k - context to the last change followed by > 2*context keeps
    std::size_t start = k >= static_cast<std::size_t>(context) ? k - context : 0;
    std::size_t end = k;
    std::size_t last_change = k;
    while (end < N) {
      if (ops[end].kind != ' ') last_change = end;
      if (end - last_change > static_cast<std::size_t>(2 * context)) break;
      ++end;
    }
    end = std::min(N, last_change + 1 + context);
    // line numbers
    std::size_t a0 = 1, b0 = 1;
    for (std::size_t q = 0; q < start; ++q) {
      if (ops[q].kind != '+') ++a0;
      if (ops[q].kind != '-') ++b0;
    }
    std::size_t na = 0, nb = 0;
    for (std::size_t q = start; q < end; ++q) {
      if (ops[q].kind != '+') ++na;
      if (ops[q].kind != '-') ++nb;
    }
    out += "@@ -" + std::to_string(na ? a0 : a0 - 1) + "," + std::to_string(na) + " +" +
           std::to_string(nb ? b0 : b0 - 1) + "," + std::to_string(nb) + " @@\n";
    for (std::size_t q = start; q < end; ++q) {
      out += ops[q].kind;
      out.append(ops[q].line);
      if (ops[q].line.empty() || ops[q].line.back() != '\n') out += "\n\\ No newline at end of file\n";
    }
    k = end;
  }
  return out;
}

}  // namespace kvgate::mutate
