#include "kvgate/json_schema.hpp"

#include <cmath>
#include <exception>
#include <map>
#include <regex>
#include <set>

#include "kvgate/json_limits.hpp"

namespace kvgate::json_schema {

using nlohmann::json;

namespace {

// Keywords that carry no assertion (annotations and containers for $ref targets).
const std::set<std::string> kAnnotations{"$schema", "$id",      "$comment", "title",    "description", "examples",
                                         "default", "definitions", "$defs", "format",   "readOnly",    "writeOnly",
                                         "deprecated"};
// Assertion keywords this validator implements. Any keyword in neither list is an error.
const std::set<std::string> kSupported{"$ref",          "type",        "enum",        "const",
                                       "required",      "properties",  "additionalProperties",
                                       "patternProperties", "items",   "minItems",    "maxItems",
                                       "uniqueItems",   "minLength",   "maxLength",   "pattern",
                                       "minimum",       "maximum",     "exclusiveMinimum",
                                       "exclusiveMaximum", "oneOf",    "anyOf",       "allOf",
                                       "not",           "minProperties", "maxProperties"};

struct Ctx {
  const SchemaLoader& load;
  std::set<const json*> checked;  // schema documents whose keywords were checked
  std::map<std::string, std::regex> regexes;
  const std::regex& re(const std::string& p) {
    auto it = regexes.find(p);
    if (it == regexes.end()) it = regexes.emplace(p, std::regex(p, std::regex::ECMAScript)).first;
    return it->second;
  }
};

std::string escape_pointer_token(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '~') r += "~0";
    else if (c == '/') r += "~1";
    else r += c;
  }
  return r;
}

bool type_is(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "number") return v.is_number();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return std::isfinite(d) && std::floor(d) == d;
    }
    return false;
  }
  return false;
}

// A count keyword (minLength, maxItems, ...) as a size: a negative, fractional, huge or
// non-numeric value is reported, never cast (a float -> integer cast out of range is undefined).
bool count_kw(const json& k, const std::string& name, const std::string& path, std::vector<SchemaError>& errs,
              std::size_t* out) {
  if (k.is_number_unsigned()) {
    *out = static_cast<std::size_t>(k.get<std::uint64_t>());
    return true;
  }
  if (k.is_number_integer() && k.get<std::int64_t>() >= 0) {
    *out = static_cast<std::size_t>(k.get<std::int64_t>());
    return true;
  }
  std::uint64_t u = 0;
  if (k.is_number_float() && std::floor(k.get<double>()) == k.get<double>() &&
      limits::double_to_int<std::uint64_t>(k.get<double>(), 0, std::numeric_limits<std::uint64_t>::max(), &u)) {
    *out = static_cast<std::size_t>(u);
    return true;
  }
  errs.push_back({path, "schema keyword '" + name + "' = " + limits::brief(k) + " is not a non-negative integer"});
  return false;
}

// The schema's pattern checks run std::regex, whose matcher recurses per character: a subject
// longer than the limits policy allows is reported instead of matched (no stack overflow).
bool pattern_match(const std::string& subject, const std::string& pattern, Ctx& c, const std::string& path,
                   std::vector<SchemaError>& errs) {
  const std::uint64_t max = limits::max_of(limits::kPatternSubject);
  if (subject.size() > max) {
    errs.push_back({path, "string of " + std::to_string(subject.size()) + " bytes exceeds the limit " +
                              std::to_string(max) + " on the " + limits::kPatternSubject.what + " (pattern " + pattern +
                              "; " + limits::override_hint(limits::kPatternSubject) + ")"});
    return false;
  }
  return std::regex_search(subject, c.re(pattern));
}

std::size_t utf8_length(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0u) != 0x80u) ++n;
  return n;
}

// Every keyword of every subschema the validator can descend into must be one it knows: a schema
// is refused as a whole, before any document is checked against it, so a typo in a branch the
// document does not reach is caught too. `at` is the JSON pointer of `s` inside its schema file.
void check_keywords(const json& s, const std::string& at, const std::string& file, std::vector<SchemaError>& errs) {
  if (s.is_boolean()) return;
  if (!s.is_object()) {
    errs.push_back({"", "schema " + file + "#" + at + " is neither an object nor a boolean"});
    return;
  }
  for (const auto& [k, sub] : s.items()) {
    const std::string here = at + "/" + escape_pointer_token(k);
    if (!kAnnotations.count(k) && !kSupported.count(k)) {
      errs.push_back({"", "schema " + file + "#" + at + " uses keyword '" + k +
                              "', which this validator does not implement (a typo? the supported keywords are "
                              "listed in reports/json_schema/src/json_schema.cpp)"});
      continue;
    }
    if (k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions") {
      if (sub.is_object())
        for (const auto& [name, ss] : sub.items()) check_keywords(ss, here + "/" + escape_pointer_token(name), file, errs);
    } else if (k == "allOf" || k == "anyOf" || k == "oneOf" || (k == "items" && sub.is_array())) {
      for (std::size_t i = 0; i < sub.size(); ++i) check_keywords(sub[i], here + "/" + std::to_string(i), file, errs);
    } else if (k == "items" || k == "additionalProperties" || k == "not") {
      check_keywords(sub, here, file, errs);
    }
  }
}

// `root` is the schema document that `s` belongs to: local $refs resolve in it.
void validate_at(const json& v, const json& s, const json& root, const std::string& path, Ctx& c,
                 std::vector<SchemaError>& errs, int depth);

bool valid_under(const json& v, const json& s, const json& root, const std::string& path, Ctx& c, int depth) {
  std::vector<SchemaError> tmp;
  validate_at(v, s, root, path, c, tmp, depth);
  return tmp.empty();
}

void validate_at(const json& v, const json& s, const json& root, const std::string& path, Ctx& c,
                 std::vector<SchemaError>& errs, int depth) {
  if (depth > 64) {
    errs.push_back({path, "schema nesting deeper than 64 ($ref cycle?)"});
    return;
  }
  if (s.is_boolean()) {
    if (!s.get<bool>()) errs.push_back({path, "no value is allowed here (schema false)"});
    return;
  }
  if (!s.is_object()) {
    errs.push_back({path, "schema is neither an object nor a boolean"});
    return;
  }
  if (auto it = s.find("$ref"); it != s.end()) {
    const std::string ref = it->get<std::string>();
    const std::size_t hash = ref.find('#');
    const std::string file = ref.substr(0, hash);
    const std::string pointer = hash == std::string::npos ? "" : ref.substr(hash + 1);
    const json* doc = &root;
    if (!file.empty()) {
      if (!c.load) {
        errs.push_back({path, "$ref '" + ref + "' names another schema file, and no loader was given"});
        return;
      }
      try {
        doc = &c.load(file);
      } catch (const std::exception& e) {
        errs.push_back({path, "$ref '" + ref + "': " + e.what()});
        return;
      }
      if (c.checked.insert(doc).second) {
        std::vector<SchemaError> kw;
        check_keywords(*doc, "", file, kw);
        if (!kw.empty()) {
          errs.insert(errs.end(), kw.begin(), kw.end());
          return;
        }
      }
    }
    json::json_pointer ptr;
    try {
      ptr = json::json_pointer(pointer);
    } catch (const std::exception&) {
      errs.push_back({path, "$ref '" + ref + "' is not a JSON pointer"});
      return;
    }
    if (!doc->contains(ptr)) {
      errs.push_back({path, "$ref '" + ref + "' does not resolve"});
      return;
    }
    validate_at(v, doc->at(ptr), *doc, path, c, errs, depth + 1);
  }
  if (auto it = s.find("type"); it != s.end()) {
    bool ok = false;
    std::string want;
    if (it->is_string()) {
      ok = type_is(v, it->get<std::string>());
      want = it->get<std::string>();
    } else {
      for (const auto& t : *it) {
        ok = ok || type_is(v, t.get<std::string>());
        want += (want.empty() ? "" : "|") + t.get<std::string>();
      }
    }
    if (!ok) {
      errs.push_back({path, "expected type " + want + ", got " + std::string(v.type_name())});
      return;  // the remaining keywords would only repeat the problem
    }
  }
  if (auto it = s.find("enum"); it != s.end()) {
    bool found = false;
    for (const auto& e : *it) found = found || e == v;
    if (!found) errs.push_back({path, "value " + limits::brief(v) + " is not one of " + it->dump()});
  }
  if (auto it = s.find("const"); it != s.end() && *it != v)
    errs.push_back({path, "value " + limits::brief(v) + " must equal " + limits::brief(*it)});
  if (auto it = s.find("allOf"); it != s.end())
    for (const auto& sub : *it) validate_at(v, sub, root, path, c, errs, depth + 1);
  if (auto it = s.find("anyOf"); it != s.end()) {
    bool any = false;
    for (const auto& sub : *it) any = any || valid_under(v, sub, root, path, c, depth + 1);
    if (!any) errs.push_back({path, "value matches none of the anyOf alternatives"});
  }
  if (auto it = s.find("oneOf"); it != s.end()) {
    int n = 0;
    for (const auto& sub : *it) n += valid_under(v, sub, root, path, c, depth + 1) ? 1 : 0;
    if (n != 1) errs.push_back({path, "value matches " + std::to_string(n) + " of the oneOf alternatives (need 1)"});
  }
  if (auto it = s.find("not"); it != s.end() && valid_under(v, *it, root, path, c, depth + 1))
    errs.push_back({path, "value must not match the 'not' schema"});

  std::size_t n_kw = 0;  // a count keyword's value (count_kw)
  if (v.is_number()) {
    const double d = v.get<double>();
    if (auto it = s.find("minimum"); it != s.end() && d < it->get<double>())
      errs.push_back({path, "value " + limits::brief(v) + " < minimum " + limits::brief(*it)});
    if (auto it = s.find("maximum"); it != s.end() && d > it->get<double>())
      errs.push_back({path, "value " + limits::brief(v) + " > maximum " + limits::brief(*it)});
    if (auto it = s.find("exclusiveMinimum"); it != s.end() && it->is_number() && d <= it->get<double>())
      errs.push_back({path, "value " + limits::brief(v) + " <= exclusiveMinimum " + limits::brief(*it)});
    if (auto it = s.find("exclusiveMaximum"); it != s.end() && it->is_number() && d >= it->get<double>())
      errs.push_back({path, "value " + limits::brief(v) + " >= exclusiveMaximum " + limits::brief(*it)});
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    if (auto it = s.find("minLength"); it != s.end() && count_kw(*it, "minLength", path, errs, &n_kw) && utf8_length(str) < n_kw)
      errs.push_back({path, "string shorter than minLength " + limits::brief(*it)});
    if (auto it = s.find("maxLength"); it != s.end() && count_kw(*it, "maxLength", path, errs, &n_kw) && utf8_length(str) > n_kw)
      errs.push_back({path, "string longer than maxLength " + limits::brief(*it)});
    if (auto it = s.find("pattern"); it != s.end() && !pattern_match(str, it->get<std::string>(), c, path, errs))
      errs.push_back({path, "string " + limits::brief(v) + " does not match pattern " + limits::brief(*it)});
  }
  if (v.is_array()) {
    if (auto it = s.find("minItems"); it != s.end() && count_kw(*it, "minItems", path, errs, &n_kw) && v.size() < n_kw)
      errs.push_back({path, "array has fewer than " + limits::brief(*it) + " items"});
    if (auto it = s.find("maxItems"); it != s.end() && count_kw(*it, "maxItems", path, errs, &n_kw) && v.size() > n_kw)
      errs.push_back({path, "array has more than " + limits::brief(*it) + " items"});
    if (auto it = s.find("uniqueItems"); it != s.end() && it->get<bool>()) {
      for (std::size_t i = 0; i < v.size(); ++i)
        for (std::size_t j = i + 1; j < v.size(); ++j)
          if (v[i] == v[j]) errs.push_back({path, "items " + std::to_string(i) + " and " + std::to_string(j) +
                                                      " are equal (uniqueItems)"});
    }
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) {
        for (std::size_t i = 0; i < v.size() && i < it->size(); ++i)
          validate_at(v[i], (*it)[i], root, path + "/" + std::to_string(i), c, errs, depth + 1);
      } else {
        for (std::size_t i = 0; i < v.size(); ++i)
          validate_at(v[i], *it, root, path + "/" + std::to_string(i), c, errs, depth + 1);
      }
    }
  }
  if (v.is_object()) {
    if (auto it = s.find("minProperties"); it != s.end() && count_kw(*it, "minProperties", path, errs, &n_kw) && v.size() < n_kw)
      errs.push_back({path, "object has fewer than " + limits::brief(*it) + " properties"});
    if (auto it = s.find("maxProperties"); it != s.end() && count_kw(*it, "maxProperties", path, errs, &n_kw) && v.size() > n_kw)
      errs.push_back({path, "object has more than " + limits::brief(*it) + " properties"});
    if (auto it = s.find("required"); it != s.end())
      for (const auto& r : *it)
        if (!v.contains(r.get<std::string>()))
          errs.push_back({path, "missing required property '" + r.get<std::string>() + "'"});
    const json* props = s.contains("properties") ? &s.at("properties") : nullptr;
    const json* pprops = s.contains("patternProperties") ? &s.at("patternProperties") : nullptr;
    const json* addl = s.contains("additionalProperties") ? &s.at("additionalProperties") : nullptr;
    for (const auto& [k, val] : v.items()) {
      const std::string sub = path + "/" + escape_pointer_token(k);
      bool matched = false;
      if (props && props->contains(k)) {
        matched = true;
        validate_at(val, props->at(k), root, sub, c, errs, depth + 1);
      }
      if (pprops)
        for (const auto& [pat, ps] : pprops->items())
          if (pattern_match(k, pat, c, sub, errs)) {
            matched = true;
            validate_at(val, ps, root, sub, c, errs, depth + 1);
          }
      if (!matched && addl) {
        if (addl->is_boolean() && !addl->get<bool>())
          errs.push_back({path, "property '" + k + "' is not allowed (additionalProperties: false)"});
        else
          validate_at(val, *addl, root, sub, c, errs, depth + 1);
      }
    }
  }
}

}  // namespace

std::vector<SchemaError> validate_json(const json& doc, const json& schema, const SchemaLoader& load) {
  Ctx c{load, {}, {}};
  std::vector<SchemaError> errs;
  check_keywords(schema, "", "", errs);
  if (!errs.empty()) return errs;  // a schema this validator cannot fully check proves nothing
  c.checked.insert(&schema);
  validate_at(doc, schema, schema, "", c, errs, 0);
  return errs;
}

std::string format_errors(const std::vector<SchemaError>& errs, std::size_t max_lines) {
  std::string s;
  for (std::size_t i = 0; i < errs.size() && i < max_lines; ++i)
    s += "  " + (errs[i].instance_path.empty() ? std::string("/") : errs[i].instance_path) + ": " + errs[i].message +
         "\n";
  if (errs.size() > max_lines) s += "  ... and " + std::to_string(errs.size() - max_lines) + " more\n";
  return s;
}

}  // namespace kvgate::json_schema
